"""kssched.config and kssched.variables: the one place the environment is read, and
the settings table of the docs agrees with it."""

import re

import pytest

from kssched import config, variables
from tests.helpers import REPO

HEADER = "| variable | default | allowed | meaning |"
# A settings table row: | `NAME` | default | allowed | meaning |
ROW = re.compile(
    r"^\| `(?P<name>[A-Z0-9_]+)` \| (?P<default>[^|]*) \| (?P<allowed>[^|]*) \|"
)


def documented() -> dict[str, tuple[str, str]]:
    """The rows of the settings table: name -> (default, allowed)."""
    found = {}
    for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        in_table = False
        for line in path.read_text().splitlines():
            if line.strip() == HEADER:
                in_table = True
            elif not line.startswith("|"):
                in_table = False
            elif in_table and (row := ROW.match(line)):
                found.setdefault(
                    row["name"], (row["default"].strip(), row["allowed"].strip())
                )
    return found


@pytest.mark.parametrize("variable", variables.VARIABLES, ids=lambda v: v.name)
def test_the_settings_table_gives_each_variable_its_default_and_allowed_values(
    variable,
):
    rows = documented()
    assert variable.name in rows, f"{variable.name} is missing from the settings table"
    default, allowed = rows[variable.name]
    if variable.default:
        assert default.startswith(f"`{variable.default}`"), (variable.name, default)
    assert allowed == variable.kind.allowed


def test_the_settings_table_has_no_variable_that_is_not_read():
    assert set(documented()) <= set(variables.BY_NAME)


def test_no_module_reads_the_environment_but_the_variables_module():
    """kssched.variables parses every variable; kssched.config and settings.py take
    their values from it, and no other module of the project reads one itself."""
    reads = re.compile(r"os\.environ\.get\(|os\.getenv\(|os\.environ\[[^\]]+\](?!\s*=)")
    offenders = [
        f"{path.relative_to(REPO)}:{number}"
        for package in ("kssched", "history", "extender")
        for path in sorted((REPO / package).rglob("*.py"))
        if path.name != "variables.py"
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if reads.search(line)
    ]
    assert offenders == []


def test_defaults_and_types():
    loaded = config.load({})
    assert loaded.bind == "0.0.0.0:8080"
    assert loaded.extender_bind == "127.0.0.1:8081"
    assert loaded.extender_read_timeout == 2.0
    assert loaded.listener == "web"
    assert loaded.read_timeout == loaded.web_read_timeout == 10.0
    extender = config.load({"KSSCHED_LISTENER": "extender"})
    assert extender.read_timeout == 2.0


@pytest.mark.parametrize(
    ("environ", "message"),
    [
        (
            {"KSSCHED_LISTENER": "admin"},
            "KSSCHED_LISTENER='admin' is not valid: one of",
        ),
        ({"KSSCHED_EXTENDER_READ_TIMEOUT": "soon"}, "a number of seconds > 0"),
        ({"KSSCHED_EXTENDER_READ_TIMEOUT": "0"}, "a number of seconds > 0"),
        ({"WEB_CONCURRENCY": "2.5"}, "WEB_CONCURRENCY='2.5' is not valid: a whole"),
        ({"KSSCHED_TLS_CA_FILE": "ca.crt"}, "only with KSSCHED_TLS_CERT_FILE"),
        ({"KSSCHED_LOG_FORMAT": "xml"}, "one of text, json"),
        ({"KSSCHED_BIND": "8080"}, "HOST:PORT"),
        ({"KSSCHED_EXTENDER_BIND": "0.0.0.0:8081"}, "a loopback address"),
    ],
)
def test_bad_values_are_refused_with_the_setting_named(environ, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        config.load(environ)

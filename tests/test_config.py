"""kssched.config: the one place the settings outside Django are read, and the
settings table of the docs agrees with it."""

import re

import pytest

from kssched import config
from tests.helpers import REPO

HEADER = "| variable | default | meaning |"
# A settings table row: | `NAME` (or `NAME` / `_OTHER`) | default | meaning |
ROW = re.compile(r"^\| `(?P<name>[A-Z0-9_]+)`[^|]*\| (?P<default>[^|]*) \|")


def documented_defaults() -> dict[str, str]:
    """The rows of the settings table (in the README or docs/): name -> default."""
    found = {}
    for path in [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]:
        in_table = False
        for line in path.read_text().splitlines():
            if line.strip() == HEADER:
                in_table = True
            elif not line.startswith("|"):
                in_table = False
            elif in_table and (row := ROW.match(line)):
                found.setdefault(row["name"], row["default"].strip())
    return found


@pytest.mark.parametrize("name", sorted(config.DEFAULTS))
def test_the_settings_table_gives_each_default_of_the_config_module(name):
    documented = documented_defaults()
    assert name in documented, f"{name} is missing from the settings table"
    default = config.DEFAULTS[name]
    if default:
        assert documented[name].startswith(f"`{default}`"), (name, documented[name])
    else:
        assert documented[name].startswith("("), (name, documented[name])


def test_no_module_of_kssched_reads_the_environment_but_the_config_and_settings():
    """kssched/settings.py reads Django's own settings through django-environ; the
    settings the other processes share come from kssched.config only."""
    reads = re.compile(r"os\.environ\.get\(|os\.getenv\(|os\.environ\[[^\]]+\](?!\s*=)")
    offenders = [
        f"{path.name}:{number}"
        for path in sorted((REPO / "kssched").glob("*.py"))
        if path.name not in ("config.py", "settings.py")
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
        ({"KSSCHED_LISTENER": "admin"}, "KSSCHED_LISTENER must be 'web' or 'extender'"),
        ({"KSSCHED_EXTENDER_READ_TIMEOUT": "soon"}, "must be a number"),
        ({"KSSCHED_EXTENDER_READ_TIMEOUT": "0"}, "must be above 0"),
        ({"WEB_CONCURRENCY": "2.5"}, "WEB_CONCURRENCY must be a number"),
        ({"KSSCHED_TLS_CA_FILE": "ca.crt"}, "need KSSCHED_TLS_CERT_FILE"),
        ({"KSSCHED_LOG_FORMAT": "xml"}, "must be 'text' or 'json'"),
    ],
)
def test_bad_values_are_refused_with_the_setting_named(environ, message):
    with pytest.raises(ValueError, match=message):
        config.load(environ)

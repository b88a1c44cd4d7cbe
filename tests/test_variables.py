"""kssched.variables: what each kind of setting accepts and refuses."""

import pytest

from extender.scoring.strategies import STRATEGIES
from kssched import variables
from kssched.variables import SettingError, read


@pytest.mark.parametrize("value", ["0", "-3", "abc", "nan", "inf", "1e3", "7days", ""])
def test_half_life_takes_only_a_plain_positive_number(value):
    with pytest.raises(SettingError) as raised:
        read({"SECRET_KEY": "k", "KSSCHED_HALF_LIFE_DAYS": value})
    assert str(raised.value) == (
        f"KSSCHED_HALF_LIFE_DAYS={value!r} is not valid: a number of days > 0 (e.g. 7)"
    )


@pytest.mark.parametrize(
    ("value", "parsed"), [("7", 7.0), ("0.5", 0.5), (" 14 ", 14.0)]
)
def test_plain_numbers_are_read_as_written(value, parsed):
    assert (
        read({"SECRET_KEY": "k", "KSSCHED_HALF_LIFE_DAYS": value})[
            "KSSCHED_HALF_LIFE_DAYS"
        ]
        == parsed
    )


def test_whole_numbers_refuse_fractions_and_zero_where_it_means_nothing():
    with pytest.raises(SettingError, match="a whole number >= 1"):
        read({"SECRET_KEY": "k", "KSSCHED_WEBHOOK_MAX_NODES": "0"})
    with pytest.raises(SettingError, match="a whole number of seconds >= 0"):
        read({"SECRET_KEY": "k", "CONN_MAX_AGE": "1.5"})
    assert read({"SECRET_KEY": "k", "CONN_MAX_AGE": "0"})["CONN_MAX_AGE"] == 0
    assert read({"SECRET_KEY": "k"})["CONN_MAX_AGE"] is None


@pytest.mark.parametrize(
    "key", ["ks-pipeline", "example.com/pipeline", "a", "team.build_id", "A1"]
)
def test_valid_label_keys(key):
    assert (
        read({"SECRET_KEY": "k", "KSSCHED_PIPELINE_LABEL": key})[
            "KSSCHED_PIPELINE_LABEL"
        ]
        == key
    )


@pytest.mark.parametrize(
    "key",
    ["Bad_Label!", "", "-lead", "trail-", "x" * 64, "Example.com/p", "/p", "a/b/c"],
)
def test_invalid_label_keys(key):
    with pytest.raises(SettingError, match="a Kubernetes label key"):
        read({"SECRET_KEY": "k", "KSSCHED_PIPELINE_LABEL": key})


@pytest.mark.parametrize("value", ["maybe", "", "2"])
def test_switches_take_only_true_or_false(value):
    with pytest.raises(SettingError, match="true or false"):
        read({"SECRET_KEY": "k", "KSSCHED_HISTORY_CACHE": value})


@pytest.mark.parametrize(
    ("value", "ok"),
    [
        ("0.0.0.0:9100", True),
        ("[::1]:9100", True),
        ("localhost:9100", True),
        ("", True),
        ("9100", False),
        ("0.0.0.0:", False),
        ("0.0.0.0:70000", False),
        ("0.0.0.0:0", False),
        ("[::1:9100", False),
        ("unix:/tmp/s", False),
    ],
)
def test_the_watcher_metrics_bind(value, ok):
    environ = {"SECRET_KEY": "k", "KSSCHED_WATCHER_METRICS_BIND": value}
    if ok:
        assert read(environ)["KSSCHED_WATCHER_METRICS_BIND"] == value
    else:
        with pytest.raises(SettingError, match="HOST:PORT"):
            read(environ)


def test_the_watcher_metrics_listen_on_loopback_unless_configured():
    assert read({"SECRET_KEY": "k"})["KSSCHED_WATCHER_METRICS_BIND"] == "127.0.0.1:9100"


@pytest.mark.parametrize(
    ("port", "bind"), [("9100", "0.0.0.0:9100"), ("0", ""), ("9200", "0.0.0.0:9200")]
)
def test_the_old_metrics_port_still_reads_as_before_with_a_warning(port, bind):
    environ = {"SECRET_KEY": "k", "KSSCHED_WATCHER_METRICS_PORT": port}
    assert read(environ)["KSSCHED_WATCHER_METRICS_BIND"] == bind
    assert variables.unknown(environ) == [
        "KSSCHED_WATCHER_METRICS_PORT is deprecated: use "
        "KSSCHED_WATCHER_METRICS_BIND=HOST:PORT"
    ]
    both = {**environ, "KSSCHED_WATCHER_METRICS_BIND": "127.0.0.1:1"}
    assert read(both)["KSSCHED_WATCHER_METRICS_BIND"] == "127.0.0.1:1"


def test_database_urls():
    for url in ("postgres://u:p@h:5432/db", "sqlite:////tmp/x.db", ""):
        assert read({"SECRET_KEY": "k", "DATABASE_URL": url})["DATABASE_URL"] == url
    for url in ("garbage", "mysql://u@h/db", "http://h/db"):
        with pytest.raises(SettingError, match="DATABASE_URL"):
            read({"SECRET_KEY": "k", "DATABASE_URL": url})


def test_rules_over_two_variables():
    with pytest.raises(SettingError, match="above KSSCHED_WATCH_TIMEOUT_MIN"):
        read(
            {
                "SECRET_KEY": "k",
                "KSSCHED_WATCH_TIMEOUT_MIN": "600",
                "KSSCHED_WATCH_TIMEOUT_MAX": "300",
            }
        )
    with pytest.raises(SettingError, match="SECRET_KEY='' is not valid: required"):
        read({})
    assert read({"DEBUG": "true"})["SECRET_KEY"] is None


def test_unknown_variables_are_named_with_the_nearest_setting():
    assert variables.unknown({"KSSCHED_HALF_LIFE": "7", "KSSCHED_ZZZ": "1"}) == [
        "KSSCHED_HALF_LIFE is not a setting and is ignored "
        "(did you mean KSSCHED_HALF_LIFE_DAYS?)",
        "KSSCHED_ZZZ is not a setting and is ignored",
    ]
    assert variables.unknown({"KSSCHED_SCORING": "warm", "HOME": "/root"}) == []


def test_the_dot_env_file_is_read_under_the_environment(tmp_path, monkeypatch):
    dot_env = tmp_path / ".env"
    dot_env.write_text("# a comment\nSECRET_KEY='from-file'\nKSSCHED_SCORING=seed\n")
    monkeypatch.setattr(variables, "DOT_ENV", dot_env)
    parsed = read({"KSSCHED_READ_DOT_ENV": "1", "KSSCHED_SCORING": "warm"})
    assert parsed["SECRET_KEY"] == "from-file"
    assert parsed["KSSCHED_SCORING"] == "warm"
    assert read({"KSSCHED_READ_DOT_ENV": "0", "SECRET_KEY": "k"})["SECRET_KEY"] == "k"


def test_the_scoring_names_are_the_strategies():
    assert set(variables.SCORING_NAMES) == set(STRATEGIES)

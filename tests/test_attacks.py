"""Every slow-client attack, on both listeners and on a TLS port, against the real
gunicorn: honest calls keep their latency (p50 within a generous ratio of the
baseline measured just before), none fails, every probe answers, and no worker is
restarted. The bounds are counts of failures and ratios, for a busy 2-core machine;
tools/bench/attacks.py prints the same measures as a table."""

import functools

import orjson
import pytest

from history.ledger import increment_key_nodes
from tests.attacks import (
    ATTACKS,
    PRIORITIZE,
    TLS_ATTACKS,
    WEBHOOK,
    Result,
    attack,
    kinds,
    measure,
    request,
)
from tests.helpers import load_fixture, log_path, run_servers
from tests.test_listeners import port_of
from tests.test_security import (  # noqa: F401 - pki is a fixture
    client_context,
    pki,
    tls_env,
)
from tests.test_webhook import new_pod, review

pytestmark = pytest.mark.django_db(transaction=True)

SECONDS = 2.5
# Honest p50 under attack at most this many times the baseline (plus 5 ms of
# scheduling noise); the target measured by tools/bench/attacks.py is 2x.
RATIO = 3.0


def held(baseline: Result, under: Result) -> bool:
    return (
        under.failed == 0
        and under.calls >= 5
        and under.probes > 0
        and under.probes_ok == under.probes
        and under.p50 <= RATIO * baseline.p50 + 0.005
    )


def no_worker_restarted(web: str, workers: int) -> None:
    log = log_path(f"serve-{port_of(web)}").read_text()
    assert "WORKER TIMEOUT" not in log
    assert "Traceback" not in log
    assert log.count("Booting worker") == workers, log[-3000:]


def run_attacks(port, attacks, sent, honest, probe, context=None) -> int:
    """Every attack in turn; returns how many connections the attackers made."""
    # Workers may still be starting (they load Django first) on a busy machine.
    for _ in range(3):
        assert honest(timeout=30)[0] == 200
    baseline = measure(honest, probe, SECONDS)
    assert baseline.failed == 0, baseline
    connections = 0
    for name, groups in attacks.items():
        under, made = attack(port, groups, sent, honest, probe, SECONDS, context)
        connections += made
        if not held(baseline, under):
            # Once more, with a new baseline: the machine may have been busy with
            # something else (a held worker fails every time).
            baseline = measure(honest, probe, SECONDS)
            under, made = attack(port, groups, sent, honest, probe, SECONDS, context)
            connections += made
            assert held(baseline, under), (name, baseline, under)
    return connections


def test_every_attack_on_the_extender_listener_delays_no_call():
    prioritize = load_fixture("prioritize-nodenames.json")
    env = {"KSSCHED_EXTENDER_READ_TIMEOUT": "1"}
    with run_servers(env, web_workers=1, extender_workers=2) as (web, extender, _):
        port = port_of(extender)
        honest = functools.partial(request, port, "POST", PRIORITIZE, prioritize)
        probe = functools.partial(request, port, "GET", "/healthz", timeout=3)
        made = run_attacks(port, ATTACKS, kinds(PRIORITIZE), honest, probe)
        # Dropped after the read timeout, the attackers reconnected.
        assert made > sum(n for groups in ATTACKS.values() for _, n in groups)
    no_worker_restarted(web, 3)


def test_every_attack_on_the_web_listener_delays_no_review_nor_probe():
    increment_key_nodes(keys=["ci", "java", "app"], node="n1")
    body = orjson.dumps(review(new_pod()))
    with run_servers(web_workers=2, extender_workers=1) as (web, _extender, _):
        port = port_of(web)
        honest = functools.partial(request, port, "POST", WEBHOOK, body)
        probe = functools.partial(request, port, "GET", "/healthz", timeout=3)
        run_attacks(port, ATTACKS, kinds(WEBHOOK), honest, probe)
    no_worker_restarted(web, 3)


def test_every_attack_on_the_tls_web_port_delays_no_review_nor_probe(pki):  # noqa: F811
    """The webhook overlay: stalled handshakes, and every attack above after a
    finished handshake."""
    directory, _address = pki
    increment_key_nodes(keys=["ci", "java", "app"], node="n1")
    body = orjson.dumps(review(new_pod()))
    context = client_context(directory)
    env = {**tls_env(directory, with_ca=False), "KSSCHED_WEB_READ_TIMEOUT": "2"}
    with run_servers(env, web_workers=2, extender_workers=1) as (web, _extender, _):
        port = port_of(web)
        honest = functools.partial(request, port, "POST", WEBHOOK, body, context)
        probe = functools.partial(
            request, port, "GET", "/healthz", context=context, timeout=3
        )
        attacks = {**TLS_ATTACKS, **ATTACKS}
        run_attacks(port, attacks, kinds(WEBHOOK), honest, probe, context)
    no_worker_restarted(web, 3)

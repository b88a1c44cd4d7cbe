"""Helpers the tests share: recorded requests, placements through the real ledger,
threads started together, and the real gunicorn on a free port.
"""

import os
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

from tests.servers import free_port, wait_for_port

REPO = Path(__file__).resolve().parent.parent
# ExtenderArgs bodies exactly as kube-scheduler sends them.
FIXTURES = REPO / "tests" / "fixtures"

IS_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")

__all__ = ["IS_CI", "REPO", "free_port", "wait_for_port"]


def default_scoring() -> str:
    """The strategy a pod runs with when KSSCHED_SCORING is not set: kssched.settings
    read in a fresh process with nothing of the shell's settings (tests/settings.py
    sets another for the suite)."""
    env = {
        "SECRET_KEY": "x" * 50,
        "PATH": os.environ.get("PATH", ""),
        "DATA_PATH": str(Path(os.environ.get("TMPDIR", "/tmp")) / "unused.db"),
    }
    code = "import kssched.settings as s; print(s.KSSCHED_SCORING)"
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return result.stdout.strip()


def load_fixture(name: str) -> bytes:
    """The raw bytes of a recorded kube-scheduler request body."""
    return (FIXTURES / name).read_bytes()


def place(uid, label, node, *, ago=None, finished=False, finished_ago=None):
    """Record a placement through the real service, `ago` (a timedelta) in the past;
    finished now with `finished`, or `finished_ago` (a timedelta) in the past."""
    from datetime import timedelta

    from django.utils import timezone

    from history.ledger import finish_placement, record_placement

    record_placement(
        pod_uid=uid,
        namespace="ci",
        name=f"pod-{uid}",
        label=label,
        node=node,
        bound_at=timezone.now() - (ago or timedelta()),
    )
    if finished:
        finish_placement(pod_uid=uid)
    if finished_ago is not None:
        finish_placement(pod_uid=uid, finished_at=timezone.now() - finished_ago)


def succeeded(uid, label, warmth, startup, run, *, node="n1"):
    """A pod of `label` placed with `warmth` that ended now and Succeeded after
    `startup` and `run` seconds, as the watcher records it: what the process's book
    of what warmth is worth reads (`history.worth_feed`)."""
    from history.ledger import finish_placement, record_outcome, record_placement

    record_placement(
        pod_uid=uid,
        namespace="ci",
        name=f"pod-{uid}",
        label=label,
        node=node,
        warmth=warmth,
    )
    finish_placement(pod_uid=uid)
    record_outcome(pod_uid=uid, startup=startup, run=run, outcome="Succeeded")


def ran(label, node, *, now=None, times=1):
    """History as if `times` pods of `label` had run on `node` at `now`: every key a
    placement counts under (`labels.placement_keys`), without ledger rows."""
    from history.labels import placement_keys
    from history.ledger import increment_key_nodes

    for _ in range(times):
        increment_key_nodes(keys=placement_keys(label), node=node, now=now)


def watch_once(server, tmp_path, **settings):
    """One pass of the real `manage.py watch_pods --once` against the test API
    server `server` (list, then the events queued), with `settings` overridden."""
    import io
    import signal

    from django.core.management import call_command
    from django.test import override_settings

    from tests.fakeapi import write_kubeconfig

    kubeconfig = str(write_kubeconfig(tmp_path, server.url))
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with override_settings(
            KSSCHED_HEARTBEAT_PATH=str(tmp_path / "hb"),
            KSSCHED_WATCHER_METRICS_BIND="",
            **settings,
        ):
            call_command(
                "watch_pods",
                kubeconfig=kubeconfig,
                once=True,
                no_nodes=True,
                stdout=io.StringIO(),
            )
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def placement_counts(*placements: tuple[str, str]) -> dict[tuple[str, str], int]:
    """The KeyNode counts {(key, node): count} the placements (label, node) make:
    every key of `labels.placement_keys`, segments and label path, once each."""
    from collections import Counter

    from history.labels import placement_keys

    counts: Counter = Counter()
    for label, node in placements:
        for key in placement_keys(label):
            counts[key, node] += 1
    return dict(counts)


def log_in(client, username: str, password: str, **extra) -> None:
    """Log `client` in through the admin's login form, as a person does, so the
    login throttling sees it (Client.login() would bypass it); `extra` goes into
    the request's environ (e.g. REMOTE_ADDR). Fails the test when refused."""
    response = client.post(
        "/admin/login/",
        {"username": username, "password": password, "next": "/admin/"},
        **extra,
    )
    assert response.status_code == 302, (
        f"login as {username!r} was refused with {response.status_code}"
    )


def run_concurrently(threads: int, work) -> list[Exception]:
    """Run `work()` in `threads` threads started together; return what they raised.

    Each thread closes its own database connection when done.
    """
    import threading

    from django.db import connection

    errors: list[Exception] = []
    barrier = threading.Barrier(threads)

    def run():
        try:
            barrier.wait()
            work()
        except Exception as exc:  # noqa: BLE001 - returned to the test
            errors.append(exc)
        finally:
            connection.close()

    started = [threading.Thread(target=run) for _ in range(threads)]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join()
    return errors


def database_env() -> dict[str, str]:
    """Environment that points a subprocess at the database the tests use now."""
    from django.db import connection

    settings_dict = connection.settings_dict
    env = {
        "SECRET_KEY": os.environ["SECRET_KEY"],
        "DEBUG": "0",
        "PATH": os.environ.get("PATH", ""),
        "PYTHONPATH": str(REPO),
        # A developer's .env (written by `make run`) must not leak into tests.
        "KSSCHED_READ_DOT_ENV": "0",
        "LOG_LEVEL": "INFO",
        # The subprocess scores as the tests do (tests/settings.py pins it).
        "KSSCHED_SCORING": os.environ.get("KSSCHED_SCORING", "seed"),
    }
    if connection.vendor == "sqlite":
        env["DATA_PATH"] = str(settings_dict["NAME"])
    else:
        user = settings_dict.get("USER") or ""
        password = settings_dict.get("PASSWORD") or ""
        auth = f"{user}:{password}@" if password else (f"{user}@" if user else "")
        host = settings_dict.get("HOST") or "127.0.0.1"
        port = settings_dict.get("PORT") or 5432
        env["DATABASE_URL"] = f"postgres://{auth}{host}:{port}/{settings_dict['NAME']}"
        if settings_dict.get("DISABLE_SERVER_SIDE_CURSORS"):
            # Through a transaction pooler, as the tests are (make pytest-pgbouncer).
            env["KSSCHED_PG_TRANSACTION_POOLER"] = "true"
    return env


@contextmanager
def run_gunicorn(
    extra_env: dict[str, str] | None = None,
    workers: int = 2,
    host: str = "127.0.0.1",
    app: str = "kssched.wsgi",
):
    """Run the real server with the shipped config on a free loopback port.

    One gunicorn: the web listener alone (which answers the extender routes too, to
    loopback callers). `host="0.0.0.0"` binds every address (the URL still names
    127.0.0.1); `app` is the WSGI application gunicorn loads. Yields (base_url,
    process); stops it with SIGTERM and waits. Its output goes to a log file in the
    test data directory, shown if it fails to start.
    """
    port = free_port()
    env = {**database_env(), **(extra_env or {})}
    env["KSSCHED_BIND"] = f"{host}:{port}"
    env["WEB_CONCURRENCY"] = str(workers)
    command = ["-m", "gunicorn", "-c", "kssched/gunicorn_conf.py", app]
    with _running(command, env, [port], f"gunicorn-{port}") as process:
        yield f"http://127.0.0.1:{port}", process


@contextmanager
def run_servers(
    extra_env: dict[str, str] | None = None,
    web_workers: int = 2,
    extender_workers: int = 2,
):
    """Run both listeners as deployed: `python -m kssched.serve`, on free ports.

    Yields (web_url, extender_url, process), the extender URL without the
    `/scheduler` prefix; stops them with SIGTERM and waits.
    """
    web_port, extender_port = free_port(), free_port()
    env = {**database_env(), **(extra_env or {})}
    env["KSSCHED_BIND"] = f"127.0.0.1:{web_port}"
    env["KSSCHED_EXTENDER_BIND"] = f"127.0.0.1:{extender_port}"
    env["WEB_CONCURRENCY"] = str(web_workers)
    env["KSSCHED_EXTENDER_WORKERS"] = str(extender_workers)
    with _running(
        ["-m", "kssched.serve"], env, [web_port, extender_port], f"serve-{web_port}"
    ) as process:
        yield (
            f"http://127.0.0.1:{web_port}",
            f"http://127.0.0.1:{extender_port}",
            process,
        )


def log_path(name: str) -> Path:
    """Where a server started by these helpers writes its output."""
    from django.conf import settings

    return settings.TEST_DATA_DIR / f"{name}.log"


@contextmanager
def _running(arguments: list[str], env: dict[str, str], ports: list[int], name):
    path = log_path(name)
    log = open(path, "wb")  # noqa: SIM115 - closed in finally
    process = subprocess.Popen(
        [sys.executable, *arguments], cwd=REPO, env=env, stdout=log, stderr=log
    )
    try:
        try:
            for port in ports:
                wait_for_port(port, process)
        except (RuntimeError, TimeoutError) as exc:
            raise RuntimeError(
                f"{arguments} did not start: {path.read_text()}"
            ) from exc
        yield process
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def in_other_connection(work) -> None:
    """Run `work` in a thread, so on its own database connection; re-raise what it
    raised."""
    import threading

    from django.db import connection

    errors: list[BaseException] = []

    def run():
        try:
            work()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            errors.append(exc)
        finally:
            connection.close()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    if errors:
        raise errors[0]


def pod_body(label=None, nodes=("node1", "node2")):
    """An extender call's body (prioritize, filter, explain) for a pod of `label`
    (none: a pod without the label) and the candidate `nodes`."""
    labels = {"app": "x"} if label is None else {"ks-pipeline": label}
    return {
        "Pod": {"metadata": {"name": "p", "namespace": "ns", "labels": labels}},
        "Nodes": None,
        "NodeNames": list(nodes),
    }

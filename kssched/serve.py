"""Serve ks-scheduler: `python -m kssched.serve`.

Starts two gunicorn processes with `kssched/gunicorn_conf.py`, each with its own
workers, and keeps them together:

- the web listener on `KSSCHED_BIND` (default 0.0.0.0:8080): admin, history API,
  /metrics, /healthz, /readyz, /version;
- the extender listener on `KSSCHED_EXTENDER_BIND` (default 127.0.0.1:8081,
  loopback only): the `/scheduler/` routes kube-scheduler calls.

Two worker pools, because one gunicorn shares its workers between all its addresses:
a client stalling on the pod port would hold the workers kube-scheduler waits for.

Both write their metrics to one PROMETHEUS_MULTIPROC_DIR (emptied here at start; a
private temporary directory when the variable is unset), so /metrics on the web
listener reports the totals of every worker of both. SIGTERM, SIGINT, SIGQUIT and
SIGHUP are passed on to both gunicorns. When one of them exits on its own, the other
is stopped and this process exits with status 1, so the container restarts whole.
"""

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from types import FrameType

from kssched import config, variables

CONFIG = Path(__file__).resolve().with_name("gunicorn_conf.py")
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGQUIT, signal.SIGHUP)


def urls(env: dict[str, str]) -> dict[str, str]:
    """The base URL of each listener, from the bind addresses in `env`."""
    settings = config.load(env)
    return {
        "web": f"http://{settings.bind}",
        "extender": f"http://{settings.extender_bind}{config.EXTENDER_PREFIX[:-1]}",
    }


def prepare_metrics_directory(env: dict[str, str]) -> str | None:
    """Give both listeners one empty PROMETHEUS_MULTIPROC_DIR; return the path of
    a temporary one made here (to remove at exit), else None."""
    made = None
    path = config.load(env).metrics_dir
    if not path:
        made = path = tempfile.mkdtemp(prefix="kssched-metrics-")
        env["PROMETHEUS_MULTIPROC_DIR"] = path
    empty_metrics_directory(path)
    env[config.METRICS_DIR_READY] = "1"
    return made


def empty_metrics_directory(path: str) -> None:
    """Empty (or create) a PROMETHEUS_MULTIPROC_DIR: files of processes from an
    earlier start would be added to the new totals."""
    directory = Path(path)
    directory.mkdir(parents=True, exist_ok=True)
    # Empty it rather than delete it: it may be a volume's mount point.
    for entry in directory.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def start(listener: str, env: dict[str, str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "gunicorn", "-c", str(CONFIG), "kssched.wsgi"],
        env={**env, "KSSCHED_LISTENER": listener},
    )


def say(message: str) -> None:
    print(f"kssched.serve: {message}", file=sys.stderr, flush=True)


def main() -> int:
    env = dict(os.environ)
    # Every variable, before any gunicorn starts: a bad value stops here, in one line.
    variables.check(env)
    made = prepare_metrics_directory(env)
    children: dict[str, subprocess.Popen[bytes]] = {}
    stopping: list[int] = []

    def forward(signum: int, frame: FrameType | None) -> None:
        if signum != signal.SIGHUP:
            stopping.append(signum)
        for child in children.values():
            if child.poll() is None:
                child.send_signal(signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    try:
        for listener in ("extender", "web"):
            children[listener] = start(listener, env)
        where = urls(env)
        say(
            f"web listener (admin, API, metrics, probes) on {where['web']}, "
            f"extender listener (kube-scheduler) on {where['extender']}"
        )
        status = 0
        while any(child.poll() is None for child in children.values()):
            for listener, child in children.items():
                if child.poll() is not None and not stopping:
                    say(f"the {listener} gunicorn exited with {child.returncode}")
                    status = 1
                    stopping.append(signal.SIGTERM)
                    for other in children.values():
                        if other.poll() is None:
                            other.terminate()
            time.sleep(0.2)
        if not status and any(child.returncode for child in children.values()):
            status = 1
        return status
    finally:
        for child in children.values():
            if child.poll() is None:
                child.kill()
                child.wait()
        if made:
            shutil.rmtree(made, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

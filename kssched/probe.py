"""Liveness probe of the extender listener: `python -m kssched.probe [URL]`.

Exits 0 when URL (default `http://<KSSCHED_EXTENDER_BIND>/healthz`) answers 200 within
two seconds, else 1. The kubelet's httpGet probes reach only the pod IP, that is the
web listener, whose workers a client on the network can keep busy; this checks the
listener kube-scheduler depends on, from inside the container. Standard library only,
so it starts in a few tens of milliseconds.
"""

import sys
import urllib.request

from kssched import config


def main(argv: list[str]) -> int:
    try:
        bind = config.load().extender_bind
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 1
    url = argv[0] if argv else f"http://{bind}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            ok = response.status == 200
    except OSError as exc:
        print(f"{url}: {exc}", file=sys.stderr)
        return 1
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

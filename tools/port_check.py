"""Is a listener's address free? Checked before `make run` serves and before `make demo`
touches its database, so a taken port stops either at once with one line naming the
variable that moves it and a free alternative (gunicorn would retry five times, then
fail with no hint).

    python -m tools.port_check run KSSCHED_BIND=0.0.0.0:8080 KSSCHED_EXTENDER_BIND=...

exits 1 with that line for the first address in use. Standard library only: it runs
before anything is installed or migrated.
"""

from __future__ import annotations

import socket
import sys

# How many further ports (10 apart) to try for a free alternative.
TRIES = 20


def split(address: str) -> tuple[str, int]:
    """ "host:port", "[::1]:port" -> (host, port)."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def in_use(host: str, port: int) -> str | None:
    """Why `host:port` cannot be bound now ("Address already in use"), or None.

    SO_REUSEADDR as gunicorn binds: a port left in TIME_WAIT is free."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            listener.bind((host, port))
        except OSError as exc:
            return exc.strerror or str(exc)
    return None


def free_port_after(host: str, port: int) -> int | None:
    """The first of port+10, port+20, ... that is free on `host` now."""
    for candidate in range(port + 10, min(port + 10 * TRIES, 65535) + 1, 10):
        if in_use(host, candidate) is None:
            return candidate
    return None


def problem(
    command: str, name: str, address: str, *, port_only: bool = False
) -> str | None:
    """One line for `make COMMAND` when `address` (`name`'s value, or with `port_only`
    the address `name`'s port makes) is taken, or None when it is free."""
    host, port = split(address)
    why = in_use(host, port)
    if why is None:
        return None
    free = free_port_after(host, port)
    shown = f"[{host}]" if ":" in host else host
    if port_only:
        what, value = "port", str(free or "PORT")
    else:
        what, value = "address", f"{shown}:{free or 'PORT'}"
    return (
        f"make {command}: {address} is in use ({why}): set {name} to a free "
        f"{what}, e.g. make {command} {name}={value}"
    )


def main(argv: list[str]) -> int:
    command, *pairs = argv
    for pair in pairs:
        name, _, address = pair.partition("=")
        line = problem(command, name, address)
        if line:
            print(line, file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

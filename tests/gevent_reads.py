"""Reads of one label from many greenlets under gevent's monkey patching, as the
gevent worker serves requests: `python -m tests.gevent_reads LABEL NODE,NODE,...`
with the test database in the environment (`helpers.database_env`). Prints, as
JSON, how many readers and Django connections the greenlets used, the fetches of
rows the reads made and the rows the last read saw."""

from gevent import monkey

monkey.patch_all()

import os  # noqa: E402
import sys  # noqa: E402

import orjson  # noqa: E402

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "kssched.settings")

import django  # noqa: E402

django.setup()

import gevent  # noqa: E402
from django.db import connection, connections  # noqa: E402

from history.reader import history_reader  # noqa: E402
from history.reader.cache import CachedReader  # noqa: E402

GREENLETS = 20


def main() -> None:
    label, nodes = sys.argv[1], sys.argv[2].split(",")
    fetches: list[list[str]] = []
    fetch = CachedReader._fetch

    def counted(self, keys):
        fetches.append(sorted(keys))
        return fetch(self, keys)

    CachedReader._fetch = counted  # type: ignore[method-assign]
    readers, wrappers, seen = [], [], []

    def read() -> None:
        reader = history_reader()
        history = reader.read(keys=label.split("-"), label=label, nodes=nodes)
        readers.append(reader)
        # Django's connection of this greenlet (patched threading.local).
        wrappers.append(connections["default"])
        seen.append({key: dict(rows) for key, rows in history.by_key.items()})
        connection.close()

    gevent.spawn(read).join()
    gevent.joinall([gevent.spawn(read) for _ in range(GREENLETS - 1)], raise_error=True)
    print(
        orjson.dumps(
            {
                "readers": len({id(reader) for reader in readers}),
                "connections": len({id(wrapper) for wrapper in wrappers}),
                "fetches": fetches,
                "rows": seen[-1],
                "agree": all(rows == seen[0] for rows in seen),
            }
        ).decode()
    )


if __name__ == "__main__":
    main()

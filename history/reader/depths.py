"""Workspace depths: how many other pipelines were placed on a node since a pipeline
last was (0: it was the last one there).

A node's caches are bounded, so a pipeline's workspace goes once enough other
pipelines ran there; `outcomes --workspaces` measures from how many on a cluster's
own ledger (`history.workspaces`), and KSSCHED_WORKSPACE_DEPTH tells `warm` to
count a workspace as gone from that depth on (`rules.workspace_gone`).

The depth is read from the pipeline-key rows (`...-app1$`): each holds when that
pipeline was last placed on that node (`last_placed_at`, written by the watcher
with the placement). A node's *recent* pipelines are its DEEPEST + 1 pipeline
keys last placed there, most recent first (ties by key, descending); a pipeline's
depth is its place in them, and DEEPEST for one further back. Depths past DEEPEST
are not told apart: the readers keep DEEPEST + 1 keys per node, whatever the
history holds. A pipeline-key row never placed by the watcher (made by hand) has
no depth on a node with fewer recent pipelines than that, and DEEPEST on one with
as many. The statement reads the index `keynode_recent_idx` alone.
"""

from __future__ import annotations

import sys
from bisect import insort
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from history.labels import PIPELINE_MARK
from history.models import KeyNode
from history.reader.model import row_counts

DEEPEST = 16
KEPT = DEEPEST + 1


@dataclass(frozen=True, slots=True)
class Recent:
    """A node's recent pipelines: their keys, most recent first, and when each was
    last placed there (Unix seconds)."""

    keys: tuple[str, ...]
    times: tuple[float, ...]

    def placed(self, key: str, at: float | None) -> Recent | None:
        """These recent pipelines once `key`'s row on the node says it was last
        placed `at` (None: the row is gone, or was never placed); None when that
        cannot be told without reading the node again (a gap at the end)."""
        full = len(self.keys) == KEPT
        # (time, key), oldest first: the order `recent_sql` reads, reversed.
        pairs = zip(reversed(self.times), reversed(self.keys), strict=True)
        oldest_first = list(pairs)
        kept = [entry for entry in oldest_first if entry[1] != key]
        was_in = len(kept) < len(oldest_first)
        if at is None:
            return None if was_in and full else _recent(kept)
        entry = (at, key)
        if full and not was_in and entry < oldest_first[0]:
            return self  # older than every kept one: still out
        insort(kept, entry)
        if was_in and full and kept[0] == entry:
            return None  # moved to the end: one further back may come before it
        return _recent(kept[-KEPT:])


def _recent(oldest_first: list[tuple[float, str]]) -> Recent:
    newest = oldest_first[::-1]
    return Recent(tuple(k for _, k in newest), tuple(t for t, _ in newest))


def depth_in(keys: Sequence[str], key: str) -> int | None:
    """The depth of pipeline `key` on a node whose recent pipelines' keys are
    `keys`: its place there, else DEEPEST if they are all kept there is room for
    (None: it has no placement time, see the module's doc)."""
    if key in keys:
        return min(keys.index(key), DEEPEST)
    return DEEPEST if len(keys) >= KEPT else None


def depths_of(
    key: str, nodes: Iterable[str], recent: Mapping[str, Recent | Sequence[str]]
) -> dict[str, int]:
    """node -> the depth of pipeline `key` there, for `nodes` (where it ran)."""
    found = {}
    get = recent.get
    for node in nodes:
        kept = get(node, ())
        depth = depth_in(kept.keys if isinstance(kept, Recent) else kept, key)
        if depth is not None:
            found[node] = depth
    return found


def counts_as_gone(depth: int | None, limit: int) -> bool:
    """Whether a workspace `depth` deep counts as gone with KSSCHED_WORKSPACE_DEPTH
    `limit` (0: never; None: the pipeline did not run there, or depths are off)."""
    return depth is not None and 0 < limit <= depth


def pipeline_key(keys: Sequence[str]) -> str | None:
    """The pipeline key among a label's keys (the last of `labels.path_keys`), if
    they hold it: `seed`'s segments do not."""
    return keys[-1] if keys and keys[-1].endswith(PIPELINE_MARK) else None


def ran_on(
    rows: Mapping[str, tuple[int, float, float]], replaced: Mapping[str, float]
) -> list[str]:
    """The nodes of a pipeline key's rows where they count (`model.row_counts`:
    count > 0, and placed since the node was last replaced)."""
    if not replaced:
        return [node for node, row in rows.items() if row[0] > 0]
    return [
        node
        for node, (count, _, at) in rows.items()
        if count > 0 and row_counts(at, replaced.get(node))
    ]


# The condition of the index `keynode_recent_idx` (migration 0021), as each
# database writes it: a statement that repeats it reads the index alone.
PIPELINE_KEY_CONDITION = {
    "sqlite": "key LIKE '%%$' ESCAPE '\\'",
    "postgresql": "key LIKE '%%$'",
}


def recent_sql(vendor: str, nodes: int) -> str:
    """The statement of (node, key, last_placed_at) rows: the recent pipelines of
    `nodes` nodes (given as one array parameter on PostgreSQL, one parameter each on
    SQLite), each node's KEPT newest read from the index alone."""
    condition = PIPELINE_KEY_CONDITION[vendor]
    newest = (
        f"SELECT node, key, last_placed_at FROM {KeyNode._meta.db_table} "
        f"WHERE node = {{node}} AND {condition} AND last_placed_at IS NOT NULL "
        f"ORDER BY last_placed_at DESC, key DESC LIMIT {KEPT}"
    )
    if vendor == "postgresql":
        return (
            f"SELECT recent.* FROM unnest(%s::text[]) AS asked(name) "
            f"CROSS JOIN LATERAL ({newest.format(node='asked.name')}) AS recent"
        )
    return " UNION ALL ".join([f"SELECT * FROM ({newest.format(node='%s')})"] * nodes)


def decode_recent(
    rows: Iterable[tuple[str, str, Any]], as_timestamp: Callable[[Any], float]
) -> dict[str, Recent]:
    """node -> its recent pipelines, from `recent_sql`'s rows."""
    keys: dict[str, list[str]] = {}
    times: dict[str, list[float]] = {}
    for node, key, at in rows:
        node = sys.intern(node)
        keys.setdefault(node, []).append(sys.intern(key))
        times.setdefault(node, []).append(as_timestamp(at))
    return {node: Recent(tuple(keys[node]), tuple(times[node])) for node in keys}

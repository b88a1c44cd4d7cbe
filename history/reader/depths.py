"""Workspace depths: how many other pipelines were placed on a node since a pipeline
last was (0: it was the last one there).

A node's caches are bounded, so a pipeline's workspace goes once enough other
pipelines ran there; `outcomes --workspaces` measures from how many on a cluster's
own ledger (`history.workspaces`), and KSSCHED_WORKSPACE_DEPTH tells `warm` to
count a workspace as gone from that depth on (`rules.workspace_gone`).

The depth is read from the pipeline-key rows (`...-app1$`): each holds when that
pipeline was last placed on that node (`last_placed_at`, written by the watcher
with the placement). A node's *recent* pipelines are its DEEPEST + 1 pipeline
keys last placed there, most recent first (ties by key); a pipeline's depth is its
place in them, and DEEPEST for one further back. Depths past DEEPEST are not told
apart: the readers keep DEEPEST + 1 keys per node, whatever the history holds.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Mapping, Sequence

from history.labels import PIPELINE_MARK
from history.models import KeyNode
from history.reader.model import row_counts

DEEPEST = 16


def depth_in(recent: Sequence[str], key: str) -> int:
    """The depth of pipeline `key` on a node whose recent pipelines are `recent`
    (their keys, most recent first): its place there, else DEEPEST."""
    try:
        return min(recent.index(key), DEEPEST)
    except ValueError:
        return DEEPEST


def depths_of(
    key: str, nodes: Iterable[str], recent: Mapping[str, Sequence[str]]
) -> dict[str, int]:
    """node -> the depth of pipeline `key` there, for `nodes` (where it ran)."""
    return {node: depth_in(recent.get(node, ()), key) for node in nodes}


def pipeline_key(keys: Sequence[str]) -> str | None:
    """The pipeline key among a label's keys (the last of `labels.path_keys`), if
    they hold it: `seed`'s segments do not."""
    return keys[-1] if keys and keys[-1].endswith(PIPELINE_MARK) else None


def ran_on(
    rows: Mapping[str, tuple[int, float, float]], replaced: Mapping[str, float]
) -> list[str]:
    """The nodes of a pipeline key's rows where they count (`model.row_counts`:
    count > 0, and placed since the node was last replaced)."""
    return [
        node
        for node, (count, _, at) in rows.items()
        if count > 0 and row_counts(at, replaced.get(node))
    ]


def recent_sql(condition: str) -> str:
    """The statement of (node, label) rows: the recent pipelines of the nodes that
    `condition` selects (one parameter, then the key pattern and the row limit),
    most recent first on each node. Served by the node index."""
    return (
        f"SELECT node, key FROM (SELECT node, key, ROW_NUMBER() OVER "
        f"(PARTITION BY node ORDER BY last_placed_at DESC, key) AS place "
        f"FROM {KeyNode._meta.db_table} WHERE {condition} AND key LIKE %s "
        f"AND last_placed_at IS NOT NULL) AS ranked WHERE place <= %s "
        f"ORDER BY node, place"
    )


RECENT_PARAMS = (f"%{PIPELINE_MARK}", DEEPEST + 1)


def decode_recent(rows: Iterable[tuple[str, str]]) -> dict[str, tuple[str, ...]]:
    """node -> its recent pipelines' keys, from `recent_sql`'s rows."""
    found: dict[str, list[str]] = {}
    for node, key in rows:
        found.setdefault(sys.intern(node), []).append(sys.intern(key))
    return {node: tuple(keys) for node, keys in found.items()}

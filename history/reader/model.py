"""The read model: what scoring knows about one pipeline label's history.

Every store answers with the same typed value, `LabelHistory`, so the strategies,
`explain`, the admin's pipeline page, warmth classification and the simulator read
history in one shape, and the rule that decides which rows count lives here once.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from history.recency import Row

# Rows per node: node -> the (key, count, decayed_weight, decayed_at) rows of the
# label's keys on that node, count > 0, at most one row per key.
NodeRows = Mapping[str, Sequence[Row]]


@dataclass(frozen=True, slots=True)
class Policies:
    """The per-key policy rows of a label's keys, as plain data.

    `keys` maps a key to (enabled, weight) from KeyPolicy; `nodes` maps a key to
    {node: "pin" | "ban"} from NodePolicy.
    """

    keys: Mapping[str, tuple[bool, float]] = field(default_factory=dict)
    nodes: Mapping[str, Mapping[str, str]] = field(default_factory=dict)


NO_POLICIES = Policies()


@dataclass(frozen=True, slots=True)
class Revision:
    """Where a cached label's history stands, for readers that keep derived data.

    Within one `epoch`, `changes` only grows: it lists, in order, the nodes whose
    rows changed since the epoch began, so a caller holding something derived from
    the rows of epoch E after seeing N changes re-examines `changes[N:]` only. A new
    epoch (a new number, never reused in the process) means start over: the store
    was reloaded, node replacements or policies changed, or the log grew too long.
    """

    epoch: int
    changes: Sequence[str]


@dataclass(frozen=True, slots=True)
class LabelHistory:
    """Everything a strategy needs to score one label on a set of nodes.

    - `keys`: the label's segments, general to specific (may repeat).
    - `rows`: node -> its rows for the label's keys with count > 0, before the
      replacement rule (`rows_that_count` applies it). Without a `revision` only
      the nodes asked about are present; with one, or when no nodes were named,
      every node with such rows.
    - `replaced`: node -> Unix seconds since which its history counts, for nodes
      seen replaced (a new UID under the same name).
    - `active`: node -> pods of this very label running now; `busy`: node -> all
      pipeline pods running now (idle nodes absent from both).
    - `policies`: the policy rows of the label's keys.
    - `revision`: set by caching stores (see `Revision`), None otherwise.

    A cached value shares the store's mappings: read it before the next read on the
    same thread, and never change it.
    """

    keys: tuple[str, ...]
    rows: NodeRows
    replaced: Mapping[str, float]
    active: Mapping[str, int]
    busy: Mapping[str, int]
    policies: Policies = NO_POLICIES
    revision: Revision | None = None

    def rows_that_count(self, node: str) -> Sequence[Row]:
        """`node`'s rows that count for scoring (see `rows_that_count`)."""
        return rows_that_count(self.rows.get(node, ()), self.replaced.get(node))


def rows_that_count(rows: Sequence[Row], since: float | None) -> Sequence[Row]:
    """The rows of one node that count: history from before the node was replaced
    (a row last placed before `since`) does not. `since` None keeps every row.

    The one home of the node-replacement rule: the strategies, explain, warmth and
    the simulator all go through it. A node seen for the first time is not
    "replaced": its history from before ks-scheduler knew its UID counts.
    """
    if since is None:
        return rows
    return tuple(row for row in rows if row[3] >= since)


def empty_history(keys: Sequence[str] = ()) -> LabelHistory:
    """The history of a label that has none (or of a pod with no label)."""
    return LabelHistory(keys=tuple(keys), rows={}, replaced={}, active={}, busy={})


class HistoryReader(Protocol):
    """One store's way of answering `read`; one implementation per store."""

    def read(
        self, *, keys: Sequence[str], label: str, nodes: Sequence[str] | None
    ) -> LabelHistory:
        """The history of pipeline `label` (segments `keys`, non-empty) on `nodes`,
        or on every node with history for it when `nodes` is None."""
        ...

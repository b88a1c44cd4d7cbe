"""The read model: what scoring knows about one pipeline label's history.

Every store answers with the same typed value, `LabelHistory`, so the strategies,
`explain`, the admin's pipeline page, warmth classification and the simulator read
history in one shape, and the rule that decides which rows count lives here once.

History is held key-major: each of a label's keys maps its nodes to their row. A
caching store hands out its own per-key mappings without copying them, so a general
key such as `jenkins`, shared by thousands of labels and present on every node, is
held once per worker, and reading a label costs a dict lookup per key.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import TYPE_CHECKING, Any, Protocol

from history.labels import distinct_keys
from history.reader.memo import NodeRule, NodeValues, apply_rule
from history.recency import Row

if TYPE_CHECKING:
    from history.reader.memo import MemoView

# One key's rows: node -> (count, decayed_weight, decayed_at), count > 0.
KeyRows = Mapping[str, tuple[int, float, float]]
# Rows per node: node -> the (key, count, decayed_weight, decayed_at) rows of the
# label's keys on that node, count > 0, at most one row per key.
NodeRows = Mapping[str, Sequence[Row]]

NO_ROWS: KeyRows = {}


class Small(IntEnum):
    """The kinds of row of one history statement (`sql.history_sql`): the small
    tables, and the KeyNode rows when asked for. Every reader decodes them with
    `decode`."""

    RUNNING = 0
    KEY_POLICY = 1
    NODE_POLICY = 2
    REPLACED = 3
    ROW = 4
    # The running pods' point in the change feed, in `first`: PostgreSQL's
    # snapshot, SQLite's last pod log id.
    SNAPSHOT = 5


class Change(IntEnum):
    """The kinds of row of the PostgreSQL change log (migrations 0005, 0010)."""

    KEY_NODE = 0  # a KeyNode row of (key, node) changed
    OTHER = 1  # a policy, node record or ledger statement
    START_OVER = 2  # a TRUNCATE
    POD_STARTED = 3  # a pipeline pod of (label in `key`, node) runs
    POD_STOPPED = 4  # it no longer does


@dataclass(frozen=True, slots=True)
class Policies:
    """The per-key policy rows of a label's keys, as plain data.

    `keys` maps a key to (enabled, weight) from KeyPolicy; `nodes` maps a key to
    {node: "pin" | "ban"} from NodePolicy; `worth` a key to its KeyPolicy's worth
    mode where it is not "auto".
    """

    keys: Mapping[str, tuple[bool, float]] = field(default_factory=dict)
    nodes: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    worth: Mapping[str, str] = field(default_factory=dict)


NO_POLICIES = Policies()


@dataclass(frozen=True, slots=True)
class LabelHistory:
    """Everything a strategy needs to score one label on a set of nodes.

    - `keys`: the label's segments, general to specific (may repeat).
    - `by_key`: each distinct key -> its rows, before the replacement rule
      (`rows_that_count` applies it). Rows with count 0 count as absent. A store
      may include nodes that were not asked about; scoring looks up the nodes it
      scores.
    - `replaced`: node -> Unix seconds since which its history counts, for nodes
      seen replaced (a new UID under the same name).
    - `active`: node -> pods of this very label running now; `busy`: node -> all
      pipeline pods running now (idle nodes absent from both).
    - `policies`: the policy rows of the label's keys.
    - `memo`: set by stores that keep history between reads: where callers keep
      what they derive from the keys' rows (see `derive` and `combined`).
    - `depths`: node -> the depth of the label's own workspace there (`depths`),
      for the nodes where the label itself ran; read only when asked for
      (`read(..., depths=True)`), else empty.

    A cached value shares the store's mappings, which the store does not change
    while the value's `memo` view lives (it replaces them): never change them
    either.
    """

    keys: tuple[str, ...]
    by_key: Mapping[str, KeyRows]
    replaced: Mapping[str, float]
    active: Mapping[str, int]
    busy: Mapping[str, int]
    policies: Policies = NO_POLICIES
    memo: MemoView | None = None
    depths: Mapping[str, int] = field(default_factory=dict)

    def derive(self, key: str, tag: Hashable, rule: NodeRule) -> NodeValues:
        """`rule` applied to each of `key`'s rows: node -> the value it gave, and
        the nodes it left UNSETTLED. A store that keeps history between reads keeps
        the result per (key, tag) and applies the rule again only to the nodes whose
        rows changed (`memo.KeyMemo`), so `rule` must depend on nothing but the node,
        its row, the tag and `replaced` (a change of replacements starts every key
        over)."""
        rows = self.by_key.get(key, NO_ROWS)
        if self.memo is None:
            return apply_rule(rule, rows)
        return self.memo.derive(key, tag, rows, rule)

    def combined(
        self, tag: Hashable, maps: Sequence[Mapping[str, int]]
    ) -> Mapping[str, int] | None:
        """node -> its value in the last of `maps` that has it, where `maps` were
        derived (`derive`) from the label's distinct keys, general to specific,
        under `tag`: kept by the store for a label called again, None when it keeps
        none (then combine the maps per call)."""
        if self.memo is None:
            return None
        return self.memo.combined(self.general_to_specific, tag, maps)

    @property
    def general_to_specific(self) -> list[str]:
        """The label's distinct keys, each at its most specific position, general
        to specific."""
        where = positions(self.keys)
        return sorted(where, key=where.__getitem__)

    @property
    def unique(self) -> tuple[str, ...]:
        """The label's distinct keys, general to specific."""
        return tuple(distinct_keys(self.keys))

    def node_rows(self, node: str) -> list[Row]:
        """`node`'s rows for the label's keys (one per distinct key it has)."""
        found = []
        for key in self.unique:
            row = self.by_key.get(key, NO_ROWS).get(node)
            if row is not None and row[0] > 0:
                found.append((key, *row))
        return found

    def rows_that_count(self, node: str) -> Sequence[Row]:
        """`node`'s rows that count for scoring (see `rows_that_count`)."""
        return rows_that_count(self.node_rows(node), self.replaced.get(node))

    def nodes(self) -> set[str]:
        """Every node with a row for one of the label's keys."""
        found: set[str] = set()
        for key in self.unique:
            found.update(
                node
                for node, row in self.by_key.get(key, NO_ROWS).items()
                if row[0] > 0
            )
        return found

    @property
    def rows(self) -> dict[str, list[Row]]:
        """Node-major rows (node -> its rows), built on each use: for pages and
        explanations, not for the scoring path."""
        return {node: self.node_rows(node) for node in sorted(self.nodes())}


def positions(keys: Sequence[str]) -> dict[str, int]:
    """key -> its most specific index in `keys` (general to specific)."""
    return {key: index for index, key in enumerate(keys)}


def rows_that_count(rows: Sequence[Row], since: float | None) -> Sequence[Row]:
    """The rows of one node that count: history from before the node was replaced
    (a row last placed before `since`) does not. `since` None keeps every row.

    The one home of the node-replacement rule: the strategies, explain, warmth and
    the simulator all go through it (per key, `row_counts`). A node seen for the
    first time is not "replaced": its history from before ks-scheduler knew its
    UID counts.
    """
    if since is None:
        return rows
    return tuple(row for row in rows if row_counts(row[3], since))


def row_counts(at: float, since: float | None) -> bool:
    """Whether a row last placed at `at` counts on a node replaced at `since`."""
    return since is None or at >= since


def empty_history(keys: Sequence[str] = ()) -> LabelHistory:
    """The history of a label that has none (or of a pod with no label)."""
    return LabelHistory(keys=tuple(keys), by_key={}, replaced={}, active={}, busy={})


@dataclass(frozen=True, slots=True)
class Decoded:
    """A history statement's rows decoded (see `Small`)."""

    rows: dict[str, dict[str, tuple[int, float, float]]]  # key -> node -> row
    active: dict[str, dict[str, int]]  # label -> node -> running pods
    busy: dict[str, int]  # node -> running pipeline pods
    policies: Policies
    replaced: dict[str, float]
    snapshot: str | None = None


def decode(
    found: Iterable[tuple[Any, ...]], as_timestamp: Callable[[Any], float]
) -> Decoded:
    """Decode rows of (kind, first, second, third, number, real, real2)."""
    rows: dict[str, dict[str, tuple[int, float, float]]] = {}
    active: dict[str, dict[str, int]] = {}
    busy: dict[str, int] = {}
    key_policies: dict[str, tuple[bool, float]] = {}
    worth: dict[str, str] = {}
    node_policies: dict[str, dict[str, str]] = {}
    replaced: dict[str, float] = {}
    snapshot = None
    for kind, first, second, third, number, real, real2 in found:
        if kind == Small.ROW:
            rows.setdefault(second, {})[first] = (number, real, real2)
        elif kind == Small.RUNNING:
            active.setdefault(second, {})[first] = number
            busy[first] = busy.get(first, 0) + number
        elif kind == Small.KEY_POLICY:
            key_policies[first] = (bool(number), float(real))
            if third and third != "auto":
                worth[first] = third
        elif kind == Small.NODE_POLICY:
            node_policies.setdefault(first, {})[second] = third
        elif kind == Small.SNAPSHOT:
            snapshot = first
        else:
            replaced[first] = as_timestamp(second)
    return Decoded(
        rows=rows,
        active=active,
        busy=busy,
        policies=Policies(keys=key_policies, nodes=node_policies, worth=worth),
        replaced=replaced,
        snapshot=snapshot,
    )


class HistoryReader(Protocol):
    """One store's way of answering `read`; one implementation per store."""

    def read(
        self,
        *,
        keys: Sequence[str],
        label: str,
        nodes: Sequence[str] | None,
        depths: bool = False,
    ) -> LabelHistory:
        """The history of pipeline `label` (segments `keys`, non-empty) on `nodes`,
        or on every node with history for it when `nodes` is None; with `depths`,
        its workspace depths too (when `keys` hold its pipeline key)."""
        ...

    def pool(self, *, now: float, days: float) -> tuple[str, ...]:
        """The pipeline pool at `now` (see `history.reader.pool`), sorted."""
        ...

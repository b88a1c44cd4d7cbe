"""Scoring strategies: read a label's history once, then score with the rules.

The live prioritize endpoint uses `get_strategy()`; the strategy is chosen by the
KSSCHED_SCORING setting. Each call asks `history_reader()` once for the label's
`LabelHistory` and scores it with pure functions: `keyscores` for the scores of
many nodes at once, `rules` for explanations. What is kept between calls (each
key's node scores) is kept by the store, per key (`LabelHistory.derive`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any, Protocol

from django.conf import settings

from extender.scoring.keyscores import seed_fast, warm_fast
from extender.scoring.rules import (
    MIN_SCORE,
    NO_HISTORY_SCORE,
    NO_POLICY,
    Policy,
    WarmRules,
    resolve_policy,
    seed_matches,
    seed_score,
    warm_explain,
    with_worth,
)
from history.depth_feed import process_depth
from history.labels import path_keys, split_pipeline_label
from history.reader import HistoryReader, LabelHistory, history_reader
from history.recency import half_life_seconds, weigh
from history.worth import Estimate
from history.worth_feed import process_worth


class WorthSource(Protocol):
    """Where `warm` learns what warmth is worth to a pipeline: a `WorthBook`, or a
    process's book fed from the ledger (`history.worth_feed.LedgerWorth`)."""

    def estimate(self, label: str) -> Estimate: ...


def worth_why(estimate: Estimate) -> str:
    """The words explain and the pipeline page give for a learned weight."""
    if estimate.weight == 1.0 and estimate.credited is None:
        return ""
    return f"learned {estimate.weight:g}: {estimate.reason}"


class Strategy(Protocol):
    name: str

    def keys_of(self, label: str | None) -> list[str]: ...

    @property
    def reads_depths(self) -> bool: ...

    def score(
        self, *, label: str | None, nodes: list[str], now: float | None = None
    ) -> list[int]: ...

    def explain(
        self, *, label: str | None, nodes: list[str], now: float | None = None
    ) -> list[dict[str, Any]]: ...


def _read(
    reader: HistoryReader | None,
    keys: Sequence[str],
    label: str,
    nodes: Sequence[str] | None,
    depths: bool = False,
) -> LabelHistory:
    return (reader or history_reader()).read(
        keys=keys, label=label, nodes=nodes, depths=depths
    )


class SeedStrategy:
    """The formula of the tool ks-scheduler replaces (see `rules.seed_score`)."""

    name = "seed"

    def __init__(self, reader: HistoryReader | None = None):
        self.reader = reader

    # `seed` is the Go tool's formula: workspace depths do not change it.
    reads_depths = False

    def keys_of(self, label: str | None) -> list[str]:
        """The keys `seed` reads for `label`: its segments."""
        return split_pipeline_label(label)

    def score(
        self, *, label: str | None, nodes: list[str], now: float | None = None
    ) -> list[int]:
        """Integer scores 0..10 for `nodes`, in order, for a pod with `label`."""
        keys = split_pipeline_label(label)
        if not keys:
            return [MIN_SCORE] * len(nodes)
        history = _read(self.reader, keys, label or "", nodes)
        return seed_fast(history, nodes)

    def explain(
        self, *, label: str | None, nodes: list[str], now: float | None = None
    ) -> list[dict[str, Any]]:
        """Why each node gets its score: one dict per node, in order.

        Keys: node, matched_segment (None when cold), segment_index, raw_count,
        score. Strategies with more rules add their own keys.
        """
        keys = split_pipeline_label(label)
        matches = {}
        if keys:
            history = _read(self.reader, keys, label or "", nodes)
            by_node = {node: history.node_rows(node) for node in nodes}
            matches = seed_matches(keys=keys, rows=by_node, nodes=nodes)
        rows = []
        for node in nodes:
            index, count = matches.get(node, (None, 0))
            if not keys:
                score = 0
            elif index is None:
                score = NO_HISTORY_SCORE
            else:
                score = seed_score(index=index, count=count, segments=len(keys))
            rows.append(
                {
                    "node": node,
                    "matched_segment": None if index is None else keys[index],
                    "segment_index": index,
                    "raw_count": count,
                    "score": score,
                }
            )
        return rows


class WarmStrategy:
    """Hierarchy, recency, saturation, anti-hotspot and per-key policy.

    The rules are in `extender.scoring.rules` (pure functions the simulator calls
    too); this class reads their inputs once per call: the label's rows on the
    candidate nodes (rows from before a node replacement left out by
    `LabelHistory.rows_that_count`), carried to `now`, its active pods, every
    node's pipeline pods, and the policies.

    `score` answers from each key's kept node scores (`keyscores.warm_fast`),
    `explain` weighs every row at `now`; both give the same scores.
    """

    name = "warm"

    def __init__(
        self,
        rules: WarmRules | None = None,
        reader: HistoryReader | None = None,
        half_life: float | None = None,
        worth: WorthSource | None = None,
    ):
        self.rules = rules or WarmRules()
        self.reader = reader
        self.half_life = half_life
        # What warmth is worth to each pipeline (`history.worth`); None: weight 1
        # for every pipeline (`get_strategy` passes the process's book unless
        # KSSCHED_WORTH is off).
        self.worth = worth

    @property
    def reads_depths(self) -> bool:
        """Whether scoring needs workspace depths (KSSCHED_WORKSPACE_DEPTH on)."""
        return self.rules.workspace_depth > 0

    def _half_life(self) -> float:
        """Seconds per halving: as given, else KSSCHED_HALF_LIFE_DAYS."""
        return self.half_life or half_life_seconds()

    def keys_of(self, label: str | None) -> list[str]:
        """The keys `warm` reads for `label`: its label path (`labels.path_keys`)."""
        return path_keys(label)

    def read(
        self, label: str | None, nodes: Sequence[str]
    ) -> tuple[LabelHistory, Policy] | None:
        """The label's path history on `nodes` and its policy (from the policies of
        its segments), or None for a pod without a pipeline label."""
        keys = path_keys(label)
        if not keys:
            return None
        history = _read(self.reader, keys, label or "", nodes, self.reads_depths)
        policy = resolve_policy(
            keys=split_pipeline_label(label), policies=history.policies
        )
        if self.worth is not None:
            estimate = self.worth.estimate(label or "")
            policy = with_worth(policy, estimate.weight, worth_why(estimate))
        else:
            # Nothing learned (KSSCHED_WORTH off): a key policy's worth "off" still
            # takes the warm pull away.
            policy = with_worth(policy, 1.0, "")
        return history, policy

    def inputs(
        self, *, label: str | None, nodes: Sequence[str], now: float | None = None
    ) -> dict[str, Any]:
        """The plain data `warm_explain` takes, read at `now`."""
        found = self.read(label, nodes)
        if found is None:
            return warm_inputs(None, None, nodes, 0.0, 1.0)
        now = time.time() if now is None else now
        return warm_inputs(*found, nodes, now, self._half_life())

    def score(
        self, *, label: str | None, nodes: list[str], now: float | None = None
    ) -> list[int]:
        """Integer scores 0..10 for `nodes`, in order, for a pod with `label`."""
        found = self.read(label, nodes)
        if found is None:
            return [MIN_SCORE] * len(nodes)
        history, policy = found
        now = time.time() if now is None else now
        return warm_fast(
            history,
            nodes,
            now=now,
            half_life=self._half_life(),
            rules=self.rules,
            policy=policy,
        )

    def explain(
        self, *, label: str | None, nodes: list[str], now: float | None = None
    ) -> list[dict[str, Any]]:
        """Why each node gets its score: one dict per node, in order.

        Keys: node, matched_segment (the label-path key that made the node warm),
        segment_index, raw_count, decayed_weight, active_pods, excess_load,
        base_score, hotspot_penalty, load_penalty, penalty, policy, score (see
        `rules.warm_explain`).
        """
        data = self.inputs(label=label, nodes=nodes, now=now)
        return warm_explain(nodes=nodes, rules=self.rules, **data)


def warm_inputs(
    history: LabelHistory | None,
    policy: Policy | None,
    nodes: Sequence[str],
    now: float,
    half_life: float,
) -> dict[str, Any]:
    """The keyword arguments of `warm_explain` for `nodes`: the rows
    that count weighed at `now`, the active pods, the load and the policy."""
    if history is None:
        return {
            "keys": [],
            "history": {},
            "active": {},
            "busy": {},
            "policy": NO_POLICY,
            "depths": {},
        }
    return {
        "keys": list(history.keys),
        "history": {
            node: weigh(rows, now, half_life)
            for node in nodes
            if (rows := history.rows_that_count(node))
        },
        "active": history.active,
        "busy": history.busy,
        "policy": policy or NO_POLICY,
        "depths": history.depths,
    }


STRATEGIES: dict[str, type[SeedStrategy] | type[WarmStrategy]] = {
    SeedStrategy.name: SeedStrategy,
    WarmStrategy.name: WarmStrategy,
}


def get_strategy(
    name: str | None = None, *, reader: HistoryReader | None = None
) -> SeedStrategy | WarmStrategy:
    """The strategy called `name`, or the configured one (KSSCHED_SCORING), reading
    from `reader` (default: `history_reader()` at each call)."""
    name = name or settings.KSSCHED_SCORING
    if name == WarmStrategy.name:
        auto = settings.KSSCHED_WORTH == "auto"
        return WarmStrategy(
            WarmRules(workspace_depth=process_depth().current()),
            reader=reader,
            worth=process_worth() if auto else None,
        )
    try:
        return STRATEGIES[name](reader=reader)
    except KeyError:
        raise ValueError(
            f"unknown scoring strategy {name!r}; choose from {sorted(STRATEGIES)}"
        ) from None

"""Scoring strategies: read a label's history once, then score with the rules.

The live prioritize endpoint uses `get_strategy()`; the strategy is chosen by the
KSSCHED_SCORING setting. Each call asks `history_reader()` once for the label's
`LabelHistory`. Where the reader keeps the history between calls (a `revision` is
set), the strategies keep what they derive from it per label and thread, and bring
it up to date from the revision's log of changed nodes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import repeat
from typing import Any, Protocol

from django.conf import settings

from extender.scoring.rules import (
    MIN_SCORE,
    NO_HISTORY_SCORE,
    NO_POLICY,
    WarmRules,
    resolve_policy,
    seed_matches,
    seed_score,
    seed_scores,
    warm_explain,
    warm_scores,
)
from extender.scoring.window import WarmWindow
from history.labels import split_pipeline_label
from history.reader import HistoryReader, LabelHistory, history_reader
from history.recency import MAX_HALVINGS, Row, half_life_seconds, weigh

# `warm` scores are kept for time windows of this many half-lives (about 50 minutes
# for the default of 7 days; see WarmStrategy): over one, a weight falls by 0.35 %,
# so only a node in a few hundred sits near a boundary and is worked out per call.
WARM_WINDOW_HALF_LIVES = 1 / 200
# Derived data kept per thread for at most this many labels (then dropped).
MAX_DERIVED = 256


class Strategy(Protocol):
    name: str

    def score(
        self, *, label: str | None, nodes: list[str], now: float | None = None
    ) -> list[int]: ...

    def explain(
        self, *, label: str | None, nodes: list[str], now: float | None = None
    ) -> list[dict]: ...


@dataclass
class _Derived:
    """Something derived from a cached label's rows, as of (epoch, seen changes)."""

    epoch: int
    seen: int
    value: Any
    start: float = 0.0


class _DerivedByLabel(threading.local):
    """Per-thread derived data, keyed by label (and whatever else it depends on)."""

    def __init__(self) -> None:
        self.entries: dict[tuple, _Derived] = {}

    def get(self, key: tuple) -> _Derived | None:
        return self.entries.get(key)

    def put(self, key: tuple, entry: _Derived) -> None:
        if len(self.entries) >= MAX_DERIVED:
            self.entries.clear()
        self.entries[key] = entry


_SEED = _DerivedByLabel()
_WARM = _DerivedByLabel()


def _read(reader: HistoryReader | None, keys, label: str, nodes) -> LabelHistory:
    return (reader or history_reader()).read(keys=keys, label=label, nodes=nodes)


class SeedStrategy:
    """The formula of the tool ks-scheduler replaces (see `rules.seed_score`)."""

    name = "seed"

    def __init__(self, reader: HistoryReader | None = None):
        self.reader = reader

    def score(
        self, *, label: str | None, nodes: list[str], now: float | None = None
    ) -> list[int]:
        """Integer scores 0..10 for `nodes`, in order, for a pod with `label`."""
        keys = split_pipeline_label(label)
        if not keys:
            return [MIN_SCORE] * len(nodes)
        history = _read(self.reader, keys, label or "", nodes)
        revision = history.revision
        if revision is None:
            matches = seed_matches(keys=keys, rows=history.rows, nodes=nodes)
            return seed_scores(segments=len(keys), matches=matches, nodes=nodes)
        # The label's scores for every node with history, kept up to date.
        entry = _SEED.get(history.keys)
        if entry is None or entry.epoch != revision.epoch:
            scores = self._scores(keys, history, history.rows)
            entry = _Derived(revision.epoch, len(revision.changes), scores)
            _SEED.put(history.keys, entry)
        elif entry.seen < len(revision.changes):
            changed = set(revision.changes[entry.seen :])
            for node in changed:
                entry.value.pop(node, None)
            entry.value.update(self._scores(keys, history, changed))
            entry.seen = len(revision.changes)
        return list(map(entry.value.get, nodes, repeat(NO_HISTORY_SCORE)))

    @staticmethod
    def _scores(keys, history: LabelHistory, nodes) -> dict[str, int]:
        segments = len(keys)
        matches = seed_matches(keys=keys, rows=history.rows, nodes=nodes)
        by_match = {
            match: seed_score(index=match[0], count=match[1], segments=segments)
            for match in set(matches.values())
        }
        return {node: by_match[match] for node, match in matches.items()}

    def explain(
        self, *, label: str | None, nodes: list[str], now: float | None = None
    ) -> list[dict]:
        """Why each node gets its score: one dict per node, in order.

        Keys: node, matched_segment (None when cold), segment_index, raw_count,
        score. Strategies with more rules add their own keys.
        """
        keys = split_pipeline_label(label)
        matches = {}
        if keys:
            history = _read(self.reader, keys, label or "", nodes)
            matches = seed_matches(keys=keys, rows=history.rows, nodes=nodes)
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

    Where the reader keeps the history (a `revision`), `score` keeps per label (and
    rules and half-life) a `window.WarmWindow`: the scores that hold at every
    instant of the time window containing `now` (windows are
    WARM_WINDOW_HALF_LIVES of a half-life long, aligned on multiples of their
    length). Its answer is exactly the uncached computation's with the same `now`,
    to the integer: a node's kept score is used only where it is proven constant
    over the window (`window.settled`); the other nodes are weighed at `now` on
    every call, as are the penalties of nodes with active pods or excess load. A
    node whose rows change is re-examined alone; a new window or a new epoch
    (policies or node replacements changed) rebuilds the label's window.
    `explain` always weighs every row at `now`.
    """

    name = "warm"

    def __init__(
        self,
        rules: WarmRules | None = None,
        reader: HistoryReader | None = None,
        half_life: float | None = None,
    ):
        self.rules = rules or WarmRules()
        self.reader = reader
        self.half_life = half_life

    def _half_life(self) -> float:
        """Seconds per halving: as given, else KSSCHED_HALF_LIFE_DAYS."""
        return self.half_life or half_life_seconds()

    def inputs(
        self, *, label: str | None, nodes: Sequence[str], now: float | None = None
    ) -> dict:
        """The plain data `warm_scores` and `warm_explain` take, read at `now`."""
        keys = split_pipeline_label(label)
        if not keys:
            return warm_inputs(None, nodes, 0.0, 1.0)
        now = time.time() if now is None else now
        history = _read(self.reader, keys, label or "", nodes)
        return warm_inputs(history, nodes, now, self._half_life())

    def score(
        self, *, label: str | None, nodes: list[str], now: float | None = None
    ) -> list[int]:
        """Integer scores 0..10 for `nodes`, in order, for a pod with `label`."""
        keys = split_pipeline_label(label)
        if not keys:
            return [MIN_SCORE] * len(nodes)
        now = time.time() if now is None else now
        half_life = self._half_life()
        history = _read(self.reader, keys, label or "", nodes)
        if history.revision is None:
            data = warm_inputs(history, nodes, now, half_life)
            return warm_scores(nodes=nodes, rules=self.rules, **data)
        window = self._window(history, now, half_life)
        unsettled = {
            node: weigh(history.rows_that_count(node), now, half_life)
            for node in window.unsettled
            if node in history.rows
        }
        return window.scores(
            nodes=nodes, active=history.active, busy=history.busy, history=unsettled
        )

    def _window(self, history: LabelHistory, now: float, half_life: float):
        """The label's WarmWindow for the window holding `now`, up to date."""
        revision = history.revision
        assert revision is not None
        length = half_life * WARM_WINDOW_HALF_LIVES
        start = (now // length) * length
        end = start + length
        if not start <= now <= end:
            start = end = now
        key = (history.keys, self.rules, half_life)
        entry = _WARM.get(key)
        if entry is not None and entry.epoch == revision.epoch and entry.start == start:
            if entry.seen < len(revision.changes):
                for node in set(revision.changes[entry.seen :]):
                    rows = history.rows_that_count(node)
                    _set_node(entry.value, node, rows, start, end, half_life)
                entry.seen = len(revision.changes)
            return entry.value
        window = WarmWindow(
            keys=history.keys,
            policy=resolve_policy(keys=history.keys, policies=history.policies),
            rules=self.rules,
        )
        for node in history.rows:
            rows = history.rows_that_count(node)
            _set_node(window, node, rows, start, end, half_life)
        _WARM.put(key, _Derived(revision.epoch, len(revision.changes), window, start))
        return window

    def explain(
        self, *, label: str | None, nodes: list[str], now: float | None = None
    ) -> list[dict]:
        """Why each node gets its score: one dict per node, in order.

        Keys: node, matched_segment, segment_index, raw_count, decayed_weight,
        active_pods, excess_load, base_score, hotspot_penalty, load_penalty,
        penalty, policy, score (see `rules.warm_explain`).
        """
        data = self.inputs(label=label, nodes=nodes, now=now)
        return warm_explain(nodes=nodes, rules=self.rules, **data)


def warm_inputs(
    history: LabelHistory | None, nodes: Sequence[str], now: float, half_life: float
) -> dict:
    """The keyword arguments of `warm_scores`/`warm_explain` for `nodes`: the rows
    that count weighed at `now`, the active pods, the load and the policy."""
    if history is None:
        return {
            "keys": [],
            "history": {},
            "active": {},
            "busy": {},
            "policy": NO_POLICY,
        }
    rows = history.rows
    return {
        "keys": list(history.keys),
        "history": {
            node: weigh(history.rows_that_count(node), now, half_life)
            for node in nodes
            if node in rows
        },
        "active": history.active,
        "busy": history.busy,
        "policy": resolve_policy(keys=history.keys, policies=history.policies),
    }


def _set_node(
    window: WarmWindow,
    node: str,
    rows: Sequence[Row],
    start: float,
    end: float,
    half_life: float,
) -> None:
    """Give `window` a node's rows weighed at its start and end."""
    # Weights that are the same number whenever they are asked for in the window:
    # `decayed_weight` returns the stored weight up to `at` and stops halving after
    # MAX_HALVINGS half-lives; a row without `at` weighs its count.
    constant = all(
        not at or at >= end or (start - at) / half_life >= MAX_HALVINGS
        for _, _, _, at in rows
    )
    window.set_node(
        node,
        weigh(rows, start, half_life),
        weigh(rows, end, half_life),
        constant=constant,
    )


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
    try:
        return STRATEGIES[name](reader=reader)
    except KeyError:
        raise ValueError(
            f"unknown scoring strategy {name!r}; choose from {sorted(STRATEGIES)}"
        ) from None

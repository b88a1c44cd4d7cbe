"""Scoring strategies: fetch what a strategy needs in one query, then score.

The live prioritize endpoint uses `get_strategy()`; the strategy is chosen by the
KSSCHED_SCORING setting.
"""

from __future__ import annotations

import time
from itertools import repeat

from django.conf import settings

from extender.scoring import (
    NO_HISTORY_SCORE,
    NO_POLICY,
    WarmRules,
    WarmWindow,
    resolve_policy,
    seed_score,
    seed_score_map,
    seed_scores,
    warm_explain,
    warm_scores,
)
from history.services import (
    MAX_HALVINGS,
    active_pods,
    best_matches,
    decayed_weight,
    derive_best_matches,
    half_life_seconds,
    key_node_history,
    scoring_policies,
    split_pipeline_label,
    warm_state,
)

# `warm` scores are kept for time windows of this many half-lives (about 50 minutes
# for the default of 7 days; see WarmStrategy): over one, a weight falls by 0.35 %,
# so only a node in a few hundred sits near a boundary and is worked out per call.
WARM_WINDOW_HALF_LIVES = 1 / 200


class SeedStrategy:
    """The formula of the tool ks-scheduler replaces (see `scoring.seed_score`)."""

    name = "seed"

    def score(self, *, label: str | None, nodes: list[str]) -> list[int]:
        """Integer scores 0..10 for `nodes`, in order, for a pod with `label`."""
        keys = split_pipeline_label(label)
        if keys:
            # The label's scores for every node, kept until its history changes.
            by_node = derive_best_matches(keys=keys, derive=seed_score_map)
            if by_node is not None:
                return list(map(by_node.get, nodes, repeat(NO_HISTORY_SCORE)))
        matches = best_matches(keys=keys, nodes=nodes) if keys else {}
        return seed_scores(segments=len(keys), matches=matches, nodes=nodes)

    def explain(self, *, label: str | None, nodes: list[str]) -> list[dict]:
        """Why each node gets its score: one dict per node, in order.

        Keys: node, matched_segment (None when cold), segment_index, raw_count,
        score. Strategies with more rules add their own keys.
        """
        keys = split_pipeline_label(label)
        matches = best_matches(keys=keys, nodes=nodes) if keys else {}
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

    The rules are in `extender.scoring` (pure functions the simulator calls too);
    this class only fetches their inputs: the KeyNode rows of the label's segments
    on the candidate nodes (recency state carried to `now`, rows from before a node
    replacement left out), the active pods of the label per node, and the policies.

    On SQLite outside a transaction the inputs come from this thread's
    `history.matchcache.MatchCache`: one PRAGMA per call while nothing was
    committed; when something was, the ledger rows added since name the KeyNode
    rows to re-read, and active pods, policies and node replacements are re-read.

    `score` then keeps, per label (and rules and half-life), a `scoring.WarmWindow`:
    the scores that hold at every instant of the time window containing `now`
    (windows are WARM_WINDOW_HALF_LIVES of a half-life long, aligned on multiples
    of their length). Its answer is exactly the uncached computation's with the
    same `now`, to the integer: a node's kept score is used only where it is proven
    constant over the window (`scoring._settled`); the other nodes are weighed at
    `now` on every call, as are the penalties of nodes with active pods or excess
    load. A node whose history changes is re-examined alone; a new window, a
    policy change or a node replacement rebuilds the label's window. `explain`
    always weighs every row at `now`. Elsewhere (PostgreSQL, inside a
    transaction): five small queries per request, none per node.
    """

    name = "warm"

    def __init__(self, rules: WarmRules | None = None):
        self.rules = rules or WarmRules()

    def inputs(
        self,
        *,
        label: str | None,
        nodes: list[str],
        now: float | None = None,
        settle: bool = False,
    ):
        """The plain data `warm_scores` and `warm_explain` take, from the database.

        `settle` (for scores only) leaves out rows that cannot decide a node's
        score (see `key_node_history`); explanations need every row.
        """
        keys = split_pipeline_label(label)
        if not keys:
            return {
                "keys": [],
                "history": {},
                "active": {},
                "busy": {},
                "policy": NO_POLICY,
            }
        now = time.time() if now is None else now
        half_life = half_life_seconds()
        state = warm_state(keys=keys, label=label)
        if state is None:
            rows = key_node_history(
                keys=keys,
                nodes=nodes,
                settled=(self.rules.min_weight, now, half_life) if settle else None,
            )
            key_policies, node_policies = scoring_policies(keys=keys)
            active, busy = active_pods(label=label)
        else:
            cache, warm = state
            known = warm.history
            rows = {node: known[node] for node in nodes if node in known}
            key_policies, node_policies = cache.policies
            active, busy = cache.active.get(label, {}), cache.busy
        return {
            "keys": keys,
            "history": _weighed(rows, now, half_life),
            "active": active,
            "busy": busy,
            "policy": resolve_policy(
                keys=keys, key_policies=key_policies, node_policies=node_policies
            ),
        }

    def score(
        self, *, label: str | None, nodes: list[str], now: float | None = None
    ) -> list[int]:
        """Integer scores 0..10 for `nodes`, in order, for a pod with `label`."""
        keys = split_pipeline_label(label)
        state = warm_state(keys=keys, label=label) if keys else None
        if state is None:
            data = self.inputs(label=label, nodes=nodes, now=now, settle=True)
            return warm_scores(nodes=nodes, rules=self.rules, **data)
        cache, warm = state
        now = time.time() if now is None else now
        window = self._window(cache, warm, keys, now)
        history = warm.history
        unsettled = {
            node: history[node] for node in window.unsettled if node in history
        }
        return window.scores(
            nodes=nodes,
            active=cache.active.get(label, {}),
            busy=cache.busy,
            history=_weighed(unsettled, now, half_life_seconds()),
        )

    def _window(self, cache, warm, keys, now: float) -> WarmWindow:
        """The label's WarmWindow for the window holding `now`, up to date."""
        half_life = half_life_seconds()
        length = half_life * WARM_WINDOW_HALF_LIVES
        start = (now // length) * length
        end = start + length
        if not start <= now <= end:
            start = end = now
        memo_key = ("warm", warm.keys, self.rules, half_life)
        memo = cache.memo.get(memo_key)
        if (
            memo is not None
            and memo["warm"] is warm
            and memo["start"] == start
            and memo["policies"] is cache.policies
        ):
            window = memo["window"]
            changes = warm.changes
            if memo["seen"] < len(changes):
                for node in set(changes[memo["seen"] :]):
                    rows = warm.history.get(node, ())
                    _set_node(window, node, rows, start, end, half_life)
                memo["seen"] = len(changes)
            return window
        key_policies, node_policies = cache.policies
        window = WarmWindow(
            keys=keys,
            policy=resolve_policy(
                keys=keys, key_policies=key_policies, node_policies=node_policies
            ),
            rules=self.rules,
        )
        for node, rows in warm.history.items():
            _set_node(window, node, rows, start, end, half_life)
        cache.memo[memo_key] = {
            "warm": warm,
            "start": start,
            "policies": cache.policies,
            "window": window,
            "seen": len(warm.changes),
        }
        return window

    def explain(
        self, *, label: str | None, nodes: list[str], now: float | None = None
    ) -> list[dict]:
        """Why each node gets its score: one dict per node, in order.

        Keys: node, matched_segment, segment_index, raw_count, decayed_weight,
        active_pods, excess_load, base_score, hotspot_penalty, load_penalty,
        penalty, policy, score (see `scoring.warm_explain`).
        """
        data = self.inputs(label=label, nodes=nodes, now=now)
        return warm_explain(nodes=nodes, rules=self.rules, **data)


def _set_node(
    window: WarmWindow, node: str, rows, start: float, end: float, half_life: float
) -> None:
    """Give `window` a node's rows weighed at its start and end."""
    # Weights that are the same number whenever they are asked for in the window:
    # `decayed_weight` returns the stored weight up to `at` and stops halving after
    # _MAX_HALVINGS half-lives; a row without `at` weighs its count.
    constant = all(
        not at or at >= end or (start - at) / half_life >= MAX_HALVINGS
        for _, _, _, at in rows
    )
    window.set_node(
        node,
        _weigh(rows, start, half_life),
        _weigh(rows, end, half_life),
        constant=constant,
    )


def _weigh(rows, now: float, half_life: float) -> list[tuple[str, int, float]]:
    """(key, count, weight at `now`) for (key, count, decayed_weight, decayed_at)
    rows; a row made by hand has no recency state and weighs its count."""
    return [
        (
            key,
            count,
            decayed_weight(weight=weight, at=at, now=now, half_life=half_life)
            if at
            else float(count),
        )
        for key, count, weight, at in rows
    ]


def _weighed(history, now: float, half_life: float) -> dict:
    return {node: _weigh(rows, now, half_life) for node, rows in history.items()}


STRATEGIES = {SeedStrategy.name: SeedStrategy, WarmStrategy.name: WarmStrategy}


def get_strategy(name: str | None = None):
    """The strategy called `name`, or the configured one (KSSCHED_SCORING)."""
    name = name or settings.KSSCHED_SCORING
    try:
        return STRATEGIES[name]()
    except KeyError:
        raise ValueError(
            f"unknown scoring strategy {name!r}; choose from {sorted(STRATEGIES)}"
        ) from None

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
    resolve_policy,
    seed_score,
    seed_score_map,
    seed_scores,
    warm_explain,
    warm_scores,
)
from history.services import (
    active_pods,
    best_matches,
    decayed_weight,
    derive_best_matches,
    half_life_seconds,
    key_node_history,
    scoring_policies,
    split_pipeline_label,
)


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
    Five small queries per request, none per node.
    """

    name = "warm"

    def __init__(self, rules: WarmRules | None = None):
        self.rules = rules or WarmRules()

    def inputs(self, *, label: str | None, nodes: list[str], now: float | None = None):
        """The plain data `warm_scores` and `warm_explain` take, from the database."""
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
        history = {
            node: [
                (
                    key,
                    count,
                    # A row made by hand has no recency state: it weighs its count.
                    decayed_weight(weight=weight, at=at, now=now, half_life=half_life)
                    if at
                    else float(count),
                )
                for key, count, weight, at in rows
            ]
            for node, rows in key_node_history(keys=keys, nodes=nodes).items()
        }
        key_policies, node_policies = scoring_policies(keys=keys)
        active, busy = active_pods(label=label)
        return {
            "keys": keys,
            "history": history,
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
        data = self.inputs(label=label, nodes=nodes, now=now)
        return warm_scores(nodes=nodes, rules=self.rules, **data)

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

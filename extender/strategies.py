"""Scoring strategies: fetch what a strategy needs in one query, then score.

The live prioritize endpoint uses `get_strategy()`; the strategy is chosen by the
KSSCHED_SCORING setting.
"""

from __future__ import annotations

from django.conf import settings

from extender.scoring import NO_HISTORY_SCORE, seed_score, seed_scores
from history.services import best_matches, split_pipeline_label


class SeedStrategy:
    """The formula of the tool ks-scheduler replaces (see `scoring.seed_score`)."""

    name = "seed"

    def score(self, *, label: str | None, nodes: list[str]) -> list[int]:
        """Integer scores 0..10 for `nodes`, in order, for a pod with `label`."""
        keys = split_pipeline_label(label)
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


STRATEGIES = {SeedStrategy.name: SeedStrategy}


def get_strategy(name: str | None = None):
    """The strategy called `name`, or the configured one (KSSCHED_SCORING)."""
    name = name or settings.KSSCHED_SCORING
    try:
        return STRATEGIES[name]()
    except KeyError:
        raise ValueError(
            f"unknown scoring strategy {name!r}; choose from {sorted(STRATEGIES)}"
        ) from None

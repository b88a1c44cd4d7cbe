"""Scoring rules: pure functions from plain data to integer scores 0..10.

They know nothing about requests or the database; `extender.strategies` feeds them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

MIN_SCORE = 0
MAX_SCORE = 10
# A node with no history for any segment of a labelled pod.
NO_HISTORY_SCORE = 1


def seed_score(*, index: int, count: int, segments: int) -> int:
    """The score of the tool ks-scheduler replaces, capped at 10.

    `index` is the most specific warm segment (0-based from the general end) of a
    label with `segments` segments, and `count` its count on the node:
    `int(index * s + s + count // 10)` with `s = 10 / segments`.
    """
    step = MAX_SCORE / segments
    return min(MAX_SCORE, int(index * step + step + count // 10))


def seed_scores(
    *,
    segments: int,
    matches: Mapping[str, tuple[int, int]],
    nodes: Sequence[str],
) -> list[int]:
    """Seed scores for `nodes`, in order, from the best match per node.

    `matches` maps a node to (most specific segment index, count), as returned by
    `history.services.best_matches`; nodes missing from it score 1. With no
    segments (the pod has no pipeline label) every node scores 0.
    """
    if segments == 0:
        return [MIN_SCORE] * len(nodes)
    by_match = {
        match: seed_score(index=match[0], count=match[1], segments=segments)
        for match in set(matches.values())
    }
    node_scores = {node: by_match[match] for node, match in matches.items()}
    return [node_scores.get(node, NO_HISTORY_SCORE) for node in nodes]

"""Scores per key, combined by specificity: the strategies' answer for thousands of
candidate nodes without a Python step per node.

A node's `seed` or `warm` score comes from the most specific of the label's keys it
has history for. So each key's rows are turned once into a node -> score mapping
for the key's position in the label by a rule per node (`seed_rule`, `WarmKey`),
kept by the store per key (`LabelHistory.derive`) and brought up to date node by
node as rows change: the store applies the rule again to the nodes that changed,
and the strategies never see which. A general key such as `jenkins`, on every node
and shared by thousands of labels, is worked out once per process and position, not
per label. A call then looks every candidate up in each key's mapping, general to
specific, with `map` (`combine`); only the few nodes with running pods, load above
the mean, a policy rule or a weight near a threshold are worked out one by one.

`warm` weights fall with time. A `WarmKey` gives the scores valid at every instant
of a time window (WINDOW_HALF_LIVES of a half-life, aligned on multiples of its
length): a node's score at this key is kept only where it is proven constant over
the window (`warm_settled`); the others (UNSETTLED) are worked out per call at
the instant asked about. The answer equals the `score` of `rules.warm_explain` at
that instant, to the integer (tests/test_strategies.py holds them equal).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Mapping, Sequence
from itertools import repeat

from extender.scoring.rules import (
    GONE_SCORE,
    MAX_SCORE,
    MIN_SCORE,
    NO_HISTORY_SCORE,
    SEED_COUNT_CLAMP,
    Policy,
    WarmRules,
    band_position,
    best_segment,
    excess_over,
    load_allowed,
    load_points,
    seed_score,
    warm_band,
    warm_steps,
    workspace_gone,
)
from history.reader import UNSETTLED, LabelHistory, NodeRule, NodeValues, Unsettled
from history.reader.model import positions, row_counts
from history.recency import MAX_HALVINGS, decayed_weight, weigh

# Window length in half-lives (about 50 minutes for the default of 7 days): over
# one, a weight falls by 0.35 %, so only a node in a few hundred sits near a
# boundary and is worked out per call.
WINDOW_HALF_LIVES = 1 / 200
# Relative margin around a threshold: far above the rounding error of the weight
# (a few ulps of 0.5 ** x for x <= 1000, about 1e-13) and of the band position.
_MARGIN = 1e-9


def combine(
    nodes: Sequence[str], maps: Sequence[Mapping[str, int]], default: int
) -> list[int]:
    """Each node's value in the last of `maps` (general to specific) that has it,
    else `default`; a C-level lookup per node and map."""
    found: list[int] = list(repeat(default, len(nodes)))
    for scores in maps:
        if scores:
            found = list(map(scores.get, nodes, found))
    return found


def combined(
    history: LabelHistory,
    nodes: Sequence[str],
    tag: Hashable,
    maps: Sequence[Mapping[str, int]],
) -> list[int]:
    """`combine` for a label's keys, through the label's combined mapping where the
    store keeps one (a label called again: one lookup per node, not one per key)."""
    value = history.combined(tag, maps)
    if value is not None:
        return list(map(value.get, nodes, repeat(NO_HISTORY_SCORE)))
    return combine(nodes, maps, NO_HISTORY_SCORE)


# --- seed ---------------------------------------------------------------------------


def seed_rule(index: int, segments: int) -> NodeRule:
    """The seed score of a node whose most specific key with history is the one at
    `index` of a label with `segments` segments, from its row of that key."""
    step_scores: dict[int, int] = {}

    def rule(node: str, row: tuple[int, float, float]) -> int | None:
        count = row[0]
        if count <= 0:
            return None
        count = count if count < SEED_COUNT_CLAMP else SEED_COUNT_CLAMP
        bucket = count // 10
        score = step_scores.get(bucket)
        if score is None:
            score = step_scores[bucket] = seed_score(
                index=index, count=count, segments=segments
            )
        return score

    return rule


def seed_fast(history: LabelHistory, nodes: Sequence[str]) -> list[int]:
    """`seed` scores of `nodes`, in order (equal to `rules.seed_score` of each node's
    `rules.seed_matches`)."""
    segments = len(history.keys)
    where = positions(history.keys)
    maps = []
    for key in history.general_to_specific:
        index = where[key]
        rule = seed_rule(index, segments)
        maps.append(history.derive(key, ("seed", index, segments), rule).values)
    return combined(history, nodes, ("seed", segments), maps)


# --- warm ---------------------------------------------------------------------------


class WarmKey:
    """The rule for one key's `warm` base scores at one position of a label, valid
    at every instant of a time window [start, end]: a node's base score when it is
    warm at this key throughout the window, UNSETTLED when its outcome at this key
    may change within it, None when it is cold at this key throughout (or its row
    does not count)."""

    __slots__ = ("low", "high", "rules", "start", "end", "half_life", "replaced")

    def __init__(
        self,
        *,
        index: int,
        segments: int,
        rules: WarmRules,
        start: float,
        end: float,
        half_life: float,
        replaced: Mapping[str, float],
    ):
        self.low, self.high = warm_band(index=index, segments=segments)
        self.rules = rules
        self.start, self.end, self.half_life = start, end, half_life
        self.replaced = replaced

    def __call__(
        self, node: str, row: tuple[int, float, float]
    ) -> int | None | Unsettled:
        count, weight, at = row
        if count <= 0 or not row_counts(at, self.replaced.get(node)):
            return None
        rules = self.rules
        start, end, half_life = self.start, self.end, self.half_life
        constant = None
        if not at:
            constant = float(count)
        elif at >= end or (start - at) / half_life >= MAX_HALVINGS:
            constant = min(
                decayed_weight(weight=weight, at=at, now=start, half_life=half_life),
                count,
            )
        if constant is not None:
            # The same weight at every instant: scored as `rules.warm_steps` does.
            if constant >= rules.min_weight:
                return self.low + round(
                    band_position(constant, self.low, self.high, rules)
                )
            return None
        early = min(
            decayed_weight(weight=weight, at=at, now=start, half_life=half_life), count
        )
        late = min(
            decayed_weight(weight=weight, at=at, now=end, half_life=half_life), count
        )
        base = warm_settled(early, late, self.low, self.high, rules)
        if base is None:
            return UNSETTLED
        return base or None


def warm_settled(
    early: float, late: float, low: int, high: int, rules: WarmRules
) -> int | None:
    """The base score a row holds at every instant between two valuations of its
    weight (`early` at the window's start, `late` at its end, both capped at the
    count): 0 when it is below `min_weight` throughout, None when that cannot be
    proven (it crosses `min_weight` or a rounding boundary of its band).

    Over the window a weight only falls, and so does the band position
    w / (w + saturation); if neither end is within the margin of `min_weight` and
    the positions at both ends round the same, away from a half-integer, every
    instant between gives the same outcome. The margins cover the floating-point
    error of evaluating the rules.
    """
    if rules.saturation < 0:
        return None
    above = rules.min_weight * (1 + _MARGIN)
    below = rules.min_weight * (1 - _MARGIN)
    if early < below:
        return 0
    if late < above:
        return None
    if late + rules.saturation <= 0:
        return None
    rounded = set()
    for weight in (early, late):
        position = band_position(weight, low, high, rules)
        if abs(position - int(position) - 0.5) < _MARGIN:
            return None
        rounded.add(round(position))
    if len(rounded) != 1:
        return None
    return low + rounded.pop()


def window(now: float, half_life: float) -> tuple[float, float]:
    """The time window holding `now`."""
    length = half_life * WINDOW_HALF_LIVES
    start = (now // length) * length
    end = start + length
    if not start <= now <= end:
        start = end = now
    return start, end


def warm_fast(
    history: LabelHistory,
    nodes: Sequence[str],
    *,
    now: float,
    half_life: float,
    rules: WarmRules,
    policy: Policy,
) -> list[int]:
    """`warm` scores of `nodes`, in order (equal to `rules.warm_explain` at `now`)."""
    keys = history.keys
    segments = len(keys)
    if not keys or not policy.enabled:
        return [MIN_SCORE] * len(nodes)
    start, end = window(now, half_life)
    where = positions(keys)
    replaced = history.replaced
    kept: list[NodeValues] = []
    for key in history.general_to_specific:
        index = where[key]
        rule = WarmKey(
            index=index,
            segments=segments,
            rules=rules,
            start=start,
            end=end,
            half_life=half_life,
            replaced=replaced,
        )
        tag = ("warm", index, segments, rules, half_life, start)
        kept.append(history.derive(key, tag, rule))
    scores = combined(
        history,
        nodes,
        ("warm", segments, rules, half_life, start),
        [value.values for value in kept],
    )
    if policy.weight != 1.0:
        # A weight (a policy's, or what warmth is worth to the pipeline) scales the
        # bonus above the cold score: one lookup per node (`weighted`).
        scores = list(map(weighted(policy.weight).__getitem__, scores))
    # Nodes whose kept score may not be theirs: weights near a threshold, pods of
    # the label, load above the mean, pinned or banned.
    special: set[str] = set(history.active)
    special.update(policy.nodes)
    # Nodes where the pipeline's own workspace counts as gone: at most GONE_SCORE.
    gone: set[str] = set()
    if rules.workspace_depth:
        gone = {n for n, d in history.depths.items() if workspace_gone(d, rules)}
    for value in kept:
        special |= value.unsettled
    busy = history.busy
    allowed = load_allowed(busy, nodes, rules)
    loaded: set[str] = set()
    if allowed is not None:
        if len(busy) < len(nodes):
            loaded = {node for node, pods in busy.items() if pods > allowed}
        else:
            get = busy.get
            loaded = {node for node in nodes if get(node, 0) > allowed}
    if not special and not loaded and not gone:
        return scores
    asked = set(nodes)
    special &= asked
    loaded = (loaded & asked) - special
    changed = warm_exact(
        history, special, nodes, now, half_life, rules, policy, allowed
    )
    bases = dict(zip(nodes, scores, strict=True)) if loaded or gone else {}
    if loaded:
        # Settled nodes under load, with no pod of the label and no rule: only the
        # load penalty applies (`warm_penalties` with no active pod, weight 1). It
        # depends on the base score and the pod count alone, so it is worked out
        # once per pair: a cluster running thousands of pipeline pods has
        # thousands of such nodes and a few dozen pairs.
        assert allowed is not None
        after: dict[tuple[int, int], int] = {}
        for node in loaded:
            pair = (bases[node], busy[node])
            score = after.get(pair)
            if score is None:
                base, pods = pair
                points = load_points(base, pods - allowed, rules, policy.pull)
                score = after[pair] = base - points
            changed[node] = score
    for node in (gone & asked) - special:
        # Settled, with no pod of the label and no rule (`warm_penalties`).
        changed[node] = min(changed.get(node, bases[node]), GONE_SCORE)
    return list(map(changed.get, nodes, scores))


def weighted(weight: float) -> list[int]:
    """base score -> its score under `weight` with no pod, load or rule, as
    `rules.warm_penalties` scales it, for every base score 0..MAX_SCORE (the
    bonus above the cold score, NO_HISTORY_SCORE = 1, is what is scaled)."""
    return [
        max(MIN_SCORE, min(MAX_SCORE, NO_HISTORY_SCORE + round((b - 1) * weight)))
        for b in range(MAX_SCORE + 1)
    ]


def warm_exact(
    history: LabelHistory,
    asked: Iterable[str],
    nodes: Sequence[str],
    now: float,
    half_life: float,
    rules: WarmRules,
    policy: Policy,
    allowed: float | None,
) -> dict[str, int]:
    """The `warm` scores of the `asked` nodes among the candidate `nodes`, each
    worked out from its rows weighed at `now` (as `rules.warm_explain` does);
    `allowed` is `rules.load_allowed` of `nodes`."""
    where = positions(history.keys)
    segments = len(history.keys)
    excess = excess_over(history.busy, allowed)
    active, rule, depth = history.active, policy.nodes.get, history.depths.get
    found = {}
    for node in asked:
        rows = weigh(history.rows_that_count(node), now, half_life)
        best = best_segment(rows, where, rules.min_weight)
        gone = workspace_gone(depth(node), rules)
        found[node] = warm_steps(
            best, segments, active.get(node, 0), excess(node), rule(node), policy,
            rules, gone,
        )[3]  # fmt: skip
    return found

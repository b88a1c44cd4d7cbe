"""`warm` scores kept between calls, exact at every instant of a time window."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import repeat

from extender.scoring.rules import (
    MIN_SCORE,
    Policy,
    WarmRules,
    best_segment,
    excess_load,
    warm_band,
    warm_steps,
)

# --- `warm` scores kept between calls -----------------------------------------------
#
# Recency makes every weight fall continuously, but with a half-life of days a score
# (an integer) changes only when a weight crosses `min_weight` or a rounding boundary
# of its band. `WarmWindow` holds a label's scores valid for every instant of a time
# window [start, end]: each node's rows are weighed at both ends, and a node counts as
# settled when the outcome provably cannot change in between (see `settled`). Only
# the few unsettled nodes, and the nodes with active pods or load, are worked out per
# call, with the same `best_segment` and `warm_steps` as `warm_scores`.

# Relative margin around a threshold: far above the rounding error of the weight
# (a few ulps of 0.5 ** x for x <= 1000, about 1e-13) and of the band position.
_MARGIN = 1e-9


def settled(early, late, positions, rules, segments) -> bool:
    """True when a node's best segment and base score are the same at every instant
    between the two valuations of its rows (`early` at the window's start, `late` at
    its end, row for row).

    Over the window each weight only falls (decay is monotone and `min(weight,
    count)` keeps it so), the set of rows at or above `min_weight` only shrinks, and
    the band position w / (w + saturation) only falls. So if at both ends no row is
    within the margin of `min_weight`, the best segment is the same at both ends and
    the band position at both ends is more than the margin away from a half-integer
    and rounds the same, every instant between gives the same best segment and base
    score. The margins cover the floating-point error of evaluating the rules.
    """
    if rules.saturation < 0:
        return False
    above, below = rules.min_weight * (1 + _MARGIN), rules.min_weight * (1 - _MARGIN)
    for (key, count, first), (_, _, last) in zip(early, late, strict=True):
        if key in positions and below <= min(first, count) and min(last, count) < above:
            return False
    first = best_segment(early, positions, rules.min_weight)
    last = best_segment(late, positions, rules.min_weight)
    if first is None or last is None:
        return first is None and last is None
    if first[0] != last[0] or first[3] + rules.saturation <= 0:
        return False
    low, high = warm_band(index=first[0], segments=segments)
    rounded = set()
    for weight in (first[3], last[3]):
        position = weight / (weight + rules.saturation) * (high - low)
        if abs(position - int(position) - 0.5) < _MARGIN:
            return False
        rounded.add(round(position))
    return len(rounded) == 1


class WarmWindow:
    """One label's `warm` scores, valid for every instant of a time window.

    Fed per node with its rows weighed at the start and at the end of the window
    (`set_node`); `scores` then answers exactly what `warm_scores` answers with the
    rows weighed at any instant of the window, given the exact rows of the
    `unsettled` nodes at that instant.
    """

    def __init__(self, *, keys: Sequence[str], policy: Policy, rules: WarmRules):
        self.keys = list(keys)
        self.segments = len(self.keys)
        self.positions = {key: index for index, key in enumerate(self.keys)}
        self.policy = policy
        self.rules = rules
        self.enabled = bool(self.keys) and policy.enabled
        # Settled nodes: the best segment and the score without pods or load.
        self.best: dict[str, tuple[int, str, int, float] | None] = {}
        self.fixed: dict[str, int] = {}
        self.unsettled: set[str] = set()
        # Settled node -> (pods, load, score) of the last call that penalised it.
        self.penalised: dict[str, tuple[int, float, int]] = {}
        self.cold = MIN_SCORE
        if self.enabled:
            self.cold = warm_steps(None, self.segments, 0, 0.0, None, policy, rules)[3]
            for node in policy.nodes:
                self._fix(node, None)

    def _fix(self, node: str, best) -> None:
        self.best[node] = best
        self.fixed[node] = warm_steps(
            best,
            self.segments,
            0,
            0.0,
            self.policy.nodes.get(node),
            self.policy,
            self.rules,
        )[3]

    def set_node(self, node: str, early, late, constant: bool = False) -> None:
        """A node's (key, raw count, weight) rows at the window's start and end
        (empty when the node has no history for the label). `constant` says the
        weights are the very same numbers at every instant of the window (rows made
        by hand, placed after the window or decayed to the bound on halvings)."""
        if not self.enabled:
            return
        self.unsettled.discard(node)
        self.penalised.pop(node, None)
        if not early:
            if node in self.policy.nodes:
                self._fix(node, None)
            else:
                self.best.pop(node, None)
                self.fixed.pop(node, None)
        elif constant or settled(
            early, late, self.positions, self.rules, self.segments
        ):
            self._fix(node, best_segment(early, self.positions, self.rules.min_weight))
        else:
            self.unsettled.add(node)
            self.best.pop(node, None)
            self.fixed.pop(node, None)

    def scores(
        self,
        *,
        nodes: Sequence[str],
        active: Mapping[str, int],
        busy: Mapping[str, int] | None,
        history: Mapping[str, Sequence[tuple[str, int, float]]],
    ) -> list[int]:
        """`warm_scores` for `nodes`; `history` holds the rows of the unsettled
        nodes weighed at the instant asked about (other nodes are ignored)."""
        if not self.enabled:
            return [MIN_SCORE] * len(nodes)
        policy, rules, segments = self.policy, self.rules, self.segments
        fixed = self.fixed
        # Nodes whose score is not the kept one: unsettled, with pods of the label,
        # with load above the mean. Only those asked about are worked out.
        maybe = self.unsettled | active.keys()
        if busy and rules.load_penalty:
            maybe |= busy.keys() & fixed.keys()
        if not maybe:
            return list(map(fixed.get, nodes, repeat(self.cold)))
        wanted = maybe.intersection(nodes)
        excess = excess_load(busy, nodes, rules)
        rule = policy.nodes.get
        unsettled, penalised = self.unsettled, self.penalised
        changed: dict[str, int] = {}
        for node in wanted:
            pods = active.get(node, 0)
            load = excess(node)
            if node in unsettled:
                best = best_segment(
                    history.get(node, ()), self.positions, rules.min_weight
                )
                changed[node] = warm_steps(
                    best, segments, pods, load, rule(node), policy, rules
                )[3]
            elif pods or load or node not in fixed:
                last = penalised.get(node)
                if last is not None and last[0] == pods and last[1] == load:
                    changed[node] = last[2]
                    continue
                score = warm_steps(
                    self.best.get(node), segments, pods, load, rule(node), policy, rules
                )[3]
                penalised[node] = (pods, load, score)
                changed[node] = score
        # changed.get(node, fixed.get(node, cold)) for each node, without a loop.
        return list(map(changed.get, nodes, map(fixed.get, nodes, repeat(self.cold))))

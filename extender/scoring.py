"""Scoring rules: pure functions from plain data to integer scores 0..10.

They know nothing about requests or the database; `extender.strategies` feeds them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import repeat

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


def seed_score_map(
    keys: Sequence[str], matches: Mapping[str, tuple[int, int]]
) -> dict[str, int]:
    """Seed scores of every node in `matches` for a label with `keys`: {node: score}.

    The form `history.services.derive_best_matches` keeps between calls; nodes
    missing from it score NO_HISTORY_SCORE.
    """
    segments = len(keys)
    by_match = {
        match: seed_score(index=match[0], count=match[1], segments=segments)
        for match in set(matches.values())
    }
    return {node: by_match[match] for node, match in matches.items()}


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


# --- The `warm` strategy ------------------------------------------------------------
#
# Scores for a pod whose label has n segments (general -> specific):
#
# * hierarchy: the integers 2..10 are split into n bands, one per segment, the most
#   specific segment owning the top band. A node is scored from the most specific
#   segment it still has weight for, so any warm specific segment beats any general
#   one (bands never overlap; with more than 9 segments neighbouring bands merge).
#   A node without history scores 1, as in `seed`.
# * recency: the weight of a row is its placements, each halved once per half-life
#   (the caller passes weights already carried to "now"). A segment whose weight has
#   fallen below `min_weight` counts as forgotten: its workspace has most likely
#   been evicted from the node's cache.
# * saturation: within a band the position is w / (w + k), so the first runs matter
#   most and a node with 500 runs is barely ahead of one with 10. Nodes that are all
#   "warm enough" then tie, and kube-scheduler's own resource scores spread the load.
# * anti-hotspot: each active pod of the same label on a node takes
#   `hotspot_penalty` points off, but never below the low end of the node's band, so
#   a fan-out of N parallel jobs spreads over the equally warm nodes first and still
#   prefers a busy exact-warm node to a partially warm one.
# * load: each active pipeline pod (any label) a node runs beyond the mean of the
#   candidate nodes (plus `load_slack`, 10 %) takes `load_penalty` points off, down
#   to the cold score. Without
#   it every warm node keeps attracting more work (the extender's 10 points x
#   weight outweigh kube-scheduler's resource scores) and the busiest node ends up
#   with twice the mean load; with it a busy warm node loses to an idle one, which
#   becomes warm in turn. `manage.py simulate` shows the trade-off.
# * policy: a key may be opted out (every node 0, as for an unlabelled pod), weighted
#   (the bonus above the cold score is multiplied) and have nodes pinned (10) or
#   banned (0). The most specific segment with a rule decides.


@dataclass(frozen=True)
class WarmRules:
    """Tunables of the `warm` strategy, chosen with `manage.py simulate`.

    Over the documented scenarios and seeds, load_penalty 3 with 10 % slack keeps the
    busiest node near or under 1.25x the mean load while exact hits stay above
    `seed`; a stronger rule (4, or no slack) balances more but loses exact hits in
    small clusters, a weaker one (2, or 25 % slack) lets hot nodes reach 1.3x-1.5x.
    saturation 1 puts a node with one recent run halfway up its band.
    """

    saturation: float = 1.0
    hotspot_penalty: int = 2
    min_weight: float = 0.1
    load_penalty: float = 3.0
    load_slack: float = 0.1


@dataclass(frozen=True)
class Policy:
    """The per-key policy that applies to one label, resolved to plain data.

    `enabled`/`weight` come from the most specific segment with a KeyPolicy
    (`source`, None when no segment has one); `nodes` maps a node to (action, key)
    for pins and bans.
    """

    enabled: bool = True
    weight: float = 1.0
    source: str | None = None
    nodes: Mapping[str, tuple[str, str]] = field(default_factory=dict)


NO_POLICY = Policy()


def resolve_policy(
    *,
    keys: Sequence[str],
    key_policies: Mapping[str, tuple[bool, float]],
    node_policies: Mapping[str, Mapping[str, str]],
) -> Policy:
    """The policy for a label with segments `keys` (general -> specific).

    `key_policies` is {key: (enabled, weight)}, `node_policies` {key: {node: action}}
    as returned by `history.services.scoring_policies`.
    """
    enabled, weight, source = True, 1.0, None
    nodes: dict[str, tuple[str, str]] = {}
    # General to specific: a more specific segment overrides.
    for key in keys:
        if key in key_policies:
            (enabled, weight), source = key_policies[key], key
        for node, action in node_policies.get(key, {}).items():
            nodes[node] = (action, key)
    if source is None and not nodes:
        return NO_POLICY
    return Policy(enabled=enabled, weight=weight, source=source, nodes=nodes)


def warm_band(*, index: int, segments: int) -> tuple[int, int]:
    """The integer score range (low, high) of segment `index` out of `segments`."""
    low = 2 + (9 * index) // segments
    high = 1 + (9 * (index + 1)) // segments
    return low, max(low, high)


def _best_segment(
    rows: Iterable[tuple[str, int, float]],
    positions: Mapping[str, int],
    min_weight: float,
) -> tuple[int, str, int, float] | None:
    """The most specific (index, key, count, weight) among a node's rows, or None."""
    best = None
    for key, count, weight in rows:
        # The weight never exceeds the raw count, so an admin reset turns a row cold
        # and halving a count caps its weight.
        weight = min(weight, count)
        index = positions.get(key)
        if index is None or weight < min_weight:
            continue
        if best is None or index > best[0]:
            best = (index, key, count, weight)
    return best


def _warm_steps(
    best: tuple[int, str, int, float] | None,
    segments: int,
    active: int,
    excess: float,
    rule: tuple[str, str] | None,
    policy: Policy,
    rules: WarmRules,
) -> tuple[int, int, int, int, str | None]:
    """One node's (base score, hotspot penalty, load penalty, score, policy applied).

    Positional and tuple-valued: `warm_scores` calls it for thousands of nodes.
    """
    if best is None:
        base = low = NO_HISTORY_SCORE
    else:
        low, high = warm_band(index=best[0], segments=segments)
        weight = best[3]
        base = low + round(weight / (weight + rules.saturation) * (high - low))
    score, floor = base, low
    applied = None
    if policy.weight != 1.0:
        score, floor = (
            max(
                MIN_SCORE,
                min(MAX_SCORE, NO_HISTORY_SCORE + round(value * policy.weight)),
            )
            for value in (base - NO_HISTORY_SCORE, low - NO_HISTORY_SCORE)
        )
        applied = f"weight {policy.weight:g} ({policy.source})"
    # Same-label pods only reorder nodes within their band: a busy exact-warm node
    # still beats every partially warm one, so a fan-out stays on warm caches.
    hotspot = min(rules.hotspot_penalty * active, max(0, score - floor))
    # Load above the mean may take a node down to the cold score: cold, idle nodes
    # then win on kube-scheduler's resource scores and become warm in turn.
    load = min(
        round(rules.load_penalty * excess), max(0, score - hotspot - NO_HISTORY_SCORE)
    )
    score -= hotspot + load
    if rule is not None:
        action, rule_key = rule
        score = MAX_SCORE if action == "pin" else MIN_SCORE
        applied = f"{action} ({rule_key})"
    return base, hotspot, load, score, applied


def _warm_node(
    *,
    node: str,
    segments: int,
    best: tuple[int, str, int, float] | None,
    active: int,
    excess: float,
    policy: Policy,
    rules: WarmRules,
) -> dict:
    """Every step of one node's `warm` score, as a dict (see `warm_explain`)."""
    base, hotspot, load, score, applied = _warm_steps(
        best, segments, active, excess, policy.nodes.get(node), policy, rules
    )
    index, key, count, weight = best if best else (None, None, 0, 0.0)
    return {
        "node": node,
        "matched_segment": key,
        "segment_index": index,
        "raw_count": count,
        "decayed_weight": round(weight, 4),
        "active_pods": active,
        "excess_load": round(excess, 2),
        "base_score": base,
        "hotspot_penalty": hotspot,
        "load_penalty": load,
        "penalty": hotspot + load,
        "policy": applied,
        "score": score,
    }


def _excess_load(busy: Mapping[str, int] | None, nodes: Sequence[str], rules):
    """node -> active pipeline pods beyond the mean of `nodes` plus the slack."""
    if not busy or not rules.load_penalty or not nodes:
        return lambda node: 0.0
    allowed = sum(map(busy.get, nodes, repeat(0))) / len(nodes) * (1 + rules.load_slack)
    return lambda node: max(0.0, busy.get(node, 0) - allowed)


def warm_explain(
    *,
    keys: Sequence[str],
    history: Mapping[str, Sequence[tuple[str, int, float]]],
    active: Mapping[str, int],
    policy: Policy,
    nodes: Sequence[str],
    rules: WarmRules,
    busy: Mapping[str, int] | None = None,
) -> list[dict]:
    """Each node's `warm` score and how it came about, one dict per node, in order.

    `history` maps a node to its (key, raw count, weight at now) rows for `keys`;
    `active` maps a node to the active pods of the same label. Keys of each dict:
    node, matched_segment, segment_index, raw_count, decayed_weight, active_pods,
    excess_load (active pipeline pods above the mean of `nodes`, from `busy`),
    base_score, hotspot_penalty, load_penalty, penalty (their sum), policy, score.
    """
    if not keys or not policy.enabled:
        reason = None if not keys else f"opted out ({policy.source})"
        return [
            {
                "node": node,
                "matched_segment": None,
                "segment_index": None,
                "raw_count": 0,
                "decayed_weight": 0.0,
                "active_pods": active.get(node, 0),
                "excess_load": 0.0,
                "base_score": MIN_SCORE,
                "hotspot_penalty": 0,
                "load_penalty": 0,
                "penalty": 0,
                "policy": reason,
                "score": MIN_SCORE,
            }
            for node in nodes
        ]
    positions = {key: index for index, key in enumerate(keys)}
    excess = _excess_load(busy, nodes, rules)
    return [
        _warm_node(
            node=node,
            segments=len(keys),
            best=_best_segment(history.get(node, ()), positions, rules.min_weight),
            active=active.get(node, 0),
            excess=excess(node),
            policy=policy,
            rules=rules,
        )
        for node in nodes
    ]


def warm_scores(
    *,
    keys: Sequence[str],
    history: Mapping[str, Sequence[tuple[str, int, float]]],
    active: Mapping[str, int],
    policy: Policy,
    nodes: Sequence[str],
    rules: WarmRules,
    busy: Mapping[str, int] | None = None,
) -> list[int]:
    """The `warm` scores of `nodes`, in order (the `score` of `warm_explain`).

    Only nodes with history, active pods or a node rule are worked out; every other
    node gets the cold score, so thousands of cold nodes cost a dict lookup each.
    """
    if not keys or not policy.enabled:
        return [MIN_SCORE] * len(nodes)
    positions = {key: index for index, key in enumerate(keys)}
    excess = _excess_load(busy, nodes, rules)
    wanted = set(nodes)
    special = (set(history) | set(active) | set(policy.nodes)) & wanted
    segments = len(keys)
    cold = _warm_steps(None, segments, 0, 0.0, None, policy, rules)[3]
    min_weight = rules.min_weight
    scores = {}
    for node in special:
        best = _best_segment(history.get(node, ()), positions, min_weight)
        scores[node] = _warm_steps(
            best,
            segments,
            active.get(node, 0),
            excess(node),
            policy.nodes.get(node),
            policy,
            rules,
        )[3]
    return [scores.get(node, cold) for node in nodes]


# --- `warm` scores kept between calls -----------------------------------------------
#
# Recency makes every weight fall continuously, but with a half-life of days a score
# (an integer) changes only when a weight crosses `min_weight` or a rounding boundary
# of its band. `WarmWindow` holds a label's scores valid for every instant of a time
# window [start, end]: each node's rows are weighed at both ends, and a node counts as
# settled when the outcome provably cannot change in between (see `_settled`). Only
# the few unsettled nodes, and the nodes with active pods or load, are worked out per
# call, with the same `_best_segment` and `_warm_steps` as `warm_scores`.

# Relative margin around a threshold: far above the rounding error of the weight
# (a few ulps of 0.5 ** x for x <= 1000, about 1e-13) and of the band position.
_MARGIN = 1e-9


def _settled(early, late, positions, rules, segments) -> bool:
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
    first = _best_segment(early, positions, rules.min_weight)
    last = _best_segment(late, positions, rules.min_weight)
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
            self.cold = _warm_steps(None, self.segments, 0, 0.0, None, policy, rules)[3]
            for node in policy.nodes:
                self._fix(node, None)

    def _fix(self, node: str, best) -> None:
        self.best[node] = best
        self.fixed[node] = _warm_steps(
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
        elif constant or _settled(
            early, late, self.positions, self.rules, self.segments
        ):
            self._fix(node, _best_segment(early, self.positions, self.rules.min_weight))
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
        excess = _excess_load(busy, nodes, rules)
        rule = policy.nodes.get
        unsettled, penalised = self.unsettled, self.penalised
        changed: dict[str, int] = {}
        for node in wanted:
            pods = active.get(node, 0)
            load = excess(node)
            if node in unsettled:
                best = _best_segment(
                    history.get(node, ()), self.positions, rules.min_weight
                )
                changed[node] = _warm_steps(
                    best, segments, pods, load, rule(node), policy, rules
                )[3]
            elif pods or load or node not in fixed:
                last = penalised.get(node)
                if last is not None and last[0] == pods and last[1] == load:
                    changed[node] = last[2]
                    continue
                score = _warm_steps(
                    self.best.get(node), segments, pods, load, rule(node), policy, rules
                )[3]
                penalised[node] = (pods, load, score)
                changed[node] = score
        # changed.get(node, fixed.get(node, cold)) for each node, without a loop.
        return list(map(changed.get, nodes, map(fixed.get, nodes, repeat(self.cold))))

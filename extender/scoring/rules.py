"""Scoring rules: pure functions from plain data to integer scores 0..10.

They know nothing about requests, caches or the database; the strategies
(`extender.scoring.strategies`) feed them from the reader's `LabelHistory`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import repeat
from typing import Any

from history.reader import Policies
from history.reader.depths import DEEPEST, counts_as_gone
from history.recency import WARM_MIN_WEIGHT, Row

MIN_SCORE = 0
MAX_SCORE = 10
# A node with no history for any segment of a labelled pod.
NO_HISTORY_SCORE = 1
# A node where the pipeline's own workspace counts as gone (`workspace_gone`)
# scores at most this: one above cold.
GONE_SCORE = NO_HISTORY_SCORE + 1
# Counts beyond this add nothing to any score (the seed formula caps at 10); seed
# explanations report them clamped.
SEED_COUNT_CLAMP = 999_999


def seed_score(*, index: int, count: int, segments: int) -> int:
    """The score of the tool ks-scheduler replaces, capped at 10.

    `index` is the most specific warm segment (0-based from the general end) of a
    label with `segments` segments, and `count` its count on the node:
    `int(index * s + s + count // 10)` with `s = 10 / segments`.
    """
    step = MAX_SCORE / segments
    return min(MAX_SCORE, int(index * step + step + count // 10))


def seed_matches(
    *, keys: Sequence[str], rows: Mapping[str, Sequence[Row]], nodes: Iterable[str]
) -> dict[str, tuple[int, int]]:
    """For each of `nodes` with history, the most specific of `keys` it has and that
    count: {node: (index into keys, count clamped at SEED_COUNT_CLAMP)}.

    `keys` run from general to specific; a segment repeated in a label counts at
    its most specific position. `rows` are a `LabelHistory`'s rows (count > 0).
    The seed formula predates node replacement: every row counts.
    """
    positions = {key: index for index, key in enumerate(keys)}
    matches: dict[str, tuple[int, int]] = {}
    for node in nodes:
        best = None
        for key, count, _, _ in rows.get(node, ()):
            index = positions[key]
            if best is None or index > best[0]:
                best = (index, count if count < SEED_COUNT_CLAMP else SEED_COUNT_CLAMP)
        if best is not None:
            matches[node] = best
    return matches


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
# * workspace depth (KSSCHED_WORKSPACE_DEPTH, off by default): on a node where that
#   many other pipelines or more were placed since this pipeline last was, its own
#   workspace counts as gone: the node scores at most GONE_SCORE, one above cold
#   (a shared prefix may still be there), whatever its history's weight. A pin
#   still wins. `outcomes --workspaces` names the depth from a cluster's outcomes.


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
    min_weight: float = WARM_MIN_WEIGHT
    load_penalty: float = 3.0
    load_slack: float = 0.1
    # Other pipelines placed on a node since this one, from which its workspace
    # counts as gone there (`workspace_gone`); 0: never.
    workspace_depth: int = 0


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
    # The KeyPolicy's worth mode (auto, fixed, off), and what `with_worth` made of
    # it: the learned weight it multiplied `weight` by and why (explain, Events).
    worth: str = "auto"
    learned: float | None = None
    why: str = ""
    # A learned weight above 1 pulls harder: the bonus cannot grow past the top
    # score without flattening the bands, so the hotspot and load penalties are
    # divided by it instead (`warm_penalties`).
    pull: float = 1.0


NO_POLICY = Policy()


def resolve_policy(*, keys: Sequence[str], policies: Policies) -> Policy:
    """The policy for a label with segments `keys` (general -> specific), from the
    policy rows of its keys (`LabelHistory.policies`)."""
    enabled, weight, source = True, 1.0, None
    nodes: dict[str, tuple[str, str]] = {}
    # General to specific: a more specific segment overrides.
    for key in keys:
        if key in policies.keys:
            (enabled, weight), source = policies.keys[key], key
        for node, action in policies.nodes.get(key, {}).items():
            nodes[node] = (action, key)
    if source is None and not nodes:
        return NO_POLICY
    worth = policies.worth.get(source, "auto") if source is not None else "auto"
    return Policy(
        enabled=enabled, weight=weight, source=source, nodes=nodes, worth=worth
    )


def with_worth(policy: Policy, learned: float, why: str) -> Policy:
    """`policy` with what warmth is worth to the pipeline applied (`history.worth`):

    - worth "auto" (the default): a learned weight below 1 multiplies the
      policy's; one above 1 divides the hotspot and load penalties (`pull`);
    - "fixed": the policy's weight alone;
    - "off": weight 0, no warm pull (pins and bans still apply).
    """
    if not policy.enabled or policy.worth == "fixed":
        return policy
    if policy.worth == "off":
        return replace(
            policy, weight=0.0, learned=0.0, why=f"worth off ({policy.source})"
        )
    if learned == 1.0 and not why:
        return policy
    if learned > 1.0:
        return replace(policy, pull=learned, learned=learned, why=why)
    weight = min(MAX_POLICY_WEIGHT, policy.weight * learned)
    return replace(policy, weight=weight, learned=learned, why=why)


# KeyPolicy's weight range: the learned weight never takes a policy beyond it.
MAX_POLICY_WEIGHT = 10.0


def workspace_gone(depth: int | None, rules: WarmRules) -> bool:
    """Whether a pipeline's own workspace counts as gone from a node where its
    workspace `depth` is `depth` (None: it did not run there, or depths are off)."""
    return counts_as_gone(depth, rules.workspace_depth)


def gone_reason(depth: int, rules: WarmRules) -> str:
    """Why a node's workspace counts as gone, for explain."""
    since = f"{depth}+" if depth >= DEEPEST else str(depth)
    return (
        f"workspace gone: {since} other pipelines placed here since this one "
        f"(gone from {rules.workspace_depth} on: KSSCHED_WORKSPACE_DEPTH)"
    )


def warm_band(*, index: int, segments: int) -> tuple[int, int]:
    """The integer score range (low, high) of segment `index` out of `segments`."""
    low = 2 + (9 * index) // segments
    high = 1 + (9 * (index + 1)) // segments
    return low, max(low, high)


def best_segment(
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


def band_position(weight: float, low: int, high: int, rules: WarmRules) -> float:
    """Where a weight sits in its band, 0 .. high - low: w / (w + saturation) of it.
    The base score is `low + round(band_position(...))`."""
    return weight / (weight + rules.saturation) * (high - low)


def load_points(score: int, excess: float, rules: WarmRules, pull: float = 1.0) -> int:
    """The load penalty of a node scoring `score` (before it) that runs `excess`
    pipeline pods beyond the allowed: never below the cold score. A pipeline pulled
    harder (`pull` > 1, `with_worth`) feels it `pull` times less."""
    points = round(rules.load_penalty * excess / pull)
    return min(points, max(0, score - NO_HISTORY_SCORE))


def warm_steps(
    best: tuple[int, str, int, float] | None,
    segments: int,
    active: int,
    excess: float,
    rule: tuple[str, str] | None,
    policy: Policy,
    rules: WarmRules,
    gone: bool = False,
) -> tuple[int, int, int, int, str | None]:
    """One node's (base score, hotspot penalty, load penalty, score, policy applied);
    `gone`: its own workspace counts as gone (`workspace_gone`).

    Positional and tuple-valued: `keyscores.warm_exact` calls it per node.
    """
    if best is None:
        base = low = NO_HISTORY_SCORE
    else:
        low, high = warm_band(index=best[0], segments=segments)
        weight = best[3]
        base = low + round(band_position(weight, low, high, rules))
    return warm_penalties(base, low, active, excess, rule, policy, rules, gone)


def warm_penalties(
    base: int,
    low: int,
    active: int,
    excess: float,
    rule: tuple[str, str] | None,
    policy: Policy,
    rules: WarmRules,
    gone: bool = False,
) -> tuple[int, int, int, int, str | None]:
    """`warm_steps` from a node's base score and the low end of its band."""
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
        applied = f"weight {policy.weight:g} ({policy.why or policy.source})"
    # Same-label pods only reorder nodes within their band: a busy exact-warm node
    # still beats every partially warm one, so a fan-out stays on warm caches.
    hotspot = min(
        round(rules.hotspot_penalty * active / policy.pull), max(0, score - floor)
    )
    # Load above the mean may take a node down to the cold score: cold, idle nodes
    # then win on kube-scheduler's resource scores and become warm in turn.
    load = load_points(score - hotspot, excess, rules, policy.pull)
    score -= hotspot + load
    if gone:
        score = min(score, GONE_SCORE)
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
    depth: int | None,
) -> dict[str, object]:
    """Every step of one node's `warm` score, as a dict (see `warm_explain`)."""
    gone = workspace_gone(depth, rules)
    base, hotspot, load, score, applied = warm_steps(
        best, segments, active, excess, policy.nodes.get(node), policy, rules, gone
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
        "worth_weight": policy.learned,
        "worth": policy.why or None,
        "workspace_depth": depth,
        "workspace": gone_reason(depth, rules) if gone and depth is not None else None,
        "score": score,
    }


def load_allowed(
    busy: Mapping[str, int] | None, nodes: Sequence[str], rules: WarmRules
) -> float | None:
    """The active pipeline pods a node of `nodes` may run before its load counts
    against it: their mean plus the slack (None: load does not count)."""
    if not busy or not rules.load_penalty or not nodes:
        return None
    return sum(map(busy.get, nodes, repeat(0))) / len(nodes) * (1 + rules.load_slack)


def excess_load(
    busy: Mapping[str, int] | None, nodes: Sequence[str], rules: WarmRules
) -> Callable[[str], float]:
    """node -> active pipeline pods beyond the mean of `nodes` plus the slack."""
    return excess_over(busy, load_allowed(busy, nodes, rules))


def excess_over(
    busy: Mapping[str, int] | None, allowed: float | None
) -> Callable[[str], float]:
    """node -> active pipeline pods beyond `allowed` (`load_allowed`'s)."""
    if busy is None or allowed is None:
        return lambda node: 0.0
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
    depths: Mapping[str, int] | None = None,
) -> list[dict[str, Any]]:
    """Each node's `warm` score and how it came about, one dict per node, in order.

    `history` maps a node to its (key, raw count, weight at now) rows for `keys`;
    `active` maps a node to the active pods of the same label. Keys of each dict:
    node, matched_segment, segment_index, raw_count, decayed_weight, active_pods,
    excess_load (active pipeline pods above the mean of `nodes`, from `busy`),
    base_score, hotspot_penalty, load_penalty, penalty (their sum), policy,
    worth_weight (the learned weight applied, None when none is) and worth (why),
    workspace_depth (from `depths`: node -> the depth of the label's own workspace
    there; None where it did not run or depths are off) and workspace (why its
    workspace counts as gone, else None), score.
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
                "worth_weight": None,
                "worth": None,
                "workspace_depth": None,
                "workspace": None,
                "score": MIN_SCORE,
            }
            for node in nodes
        ]
    positions = {key: index for index, key in enumerate(keys)}
    excess = excess_load(busy, nodes, rules)
    return [
        _warm_node(
            node=node,
            segments=len(keys),
            best=best_segment(history.get(node, ()), positions, rules.min_weight),
            active=active.get(node, 0),
            excess=excess(node),
            policy=policy,
            rules=rules,
            depth=(depths or {}).get(node),
        )
        for node in nodes
    ]

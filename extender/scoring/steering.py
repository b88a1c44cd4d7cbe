"""Webhook mode: a label's scores as preferred node-affinity weights, and the memory
of what was steered so that the pods of a burst spread.

The webhook has no candidate list: it scores the label over every node with history
for it (plus the nodes a policy pins), through the same strategy code as prioritize,
and names the warm ones in preferred node-affinity terms. kube-scheduler then adds
the weights of the terms a node matches (see `default_profile`).

**Bursts.** Every pod of a fan-out is admitted before any is scheduled, so the
history shows none of them running. `SteeringMemory` remembers, per label and node,
the pods steered and not bound yet, and the scores count them as active pods of the
label (`with_steered`), as the anti-hotspot rule counts running ones: the next pod
of the burst finds the node just steered to penalised and is steered to the next
equally warm node. They count as the node's pipeline pods for the load rule too:
the anti-hotspot penalty stops at the low end of the node's band, so without them
every pod of a burst for a label with one warm node was steered to it (the node's
load unchanged until kube-scheduler bound them all), where prioritize, scoring pod
after pod, sees each bound one and turns the next away once the node runs more
than its share.

A steered pod counts only until it is bound. Once the watcher has recorded it, the
ledger counts it as running, and stops the moment it finishes; each pod of the
label the ledger shows bound since a steered pod was admitted retires that pod
from the memory (`SteeringMemory.steered`'s `bound`). A review whose pod never
appears (a dry run of another client, a create another webhook refused, a review
posted by hand) counts for KSSCHED_WEBHOOK_MEMORY_SECONDS at most.

The memory belongs to one process. With several gunicorn workers (or replicas) each
remembers the reviews it answered; the API server spreads a burst's reviews over
them, so up to one pod per worker may be steered to the same top node before each
memory learns of it. `manage.py simulate --webhook-memories N` measures the cost.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace

from django.conf import settings

from extender.scoring.rules import MAX_SCORE, NO_HISTORY_SCORE
from extender.scoring.strategies import Strategy, get_strategy
from history.labels import split_pipeline_label
from history.queries import bound_times
from history.reader import HistoryReader, LabelHistory, history_reader

MIN_WEIGHT = 1
MAX_WEIGHT = 100
# The lowest score that gets a term. NodeAffinity normalises by the heaviest term
# among the candidates, so whichever named node is warmest there gets the full
# 2 x 100 points, however lukewarm: a node scoring 2 pulls as hard as one scoring
# 10. Prioritize (deploy/'s weight 5) puts a node scoring s ahead of a cold one by
# (s - 1) x 50 points, so 200 points are earned from a score of about 4 up. A node
# below that (barely warm, or warm but taken down by the load rule) gets no term and
# is left to kube-scheduler's resource scores like a cold one.
MIN_TERM_SCORE = 4
# Labels remembered at once; beyond this the labels with nothing recent are dropped.
MAX_LABELS = 4096
# Steered pods remembered per label (a fan-out wider than this is rare).
MAX_PER_LABEL = 1024
# How much earlier than the webhook's clock a pod may show as bound in the ledger:
# bound_at comes from the API server's whole-second timestamps.
CLOCK_SLACK = 2.0


def weight_for(score: int) -> int:
    """The preferred-term weight (1..100) for a strategy score above the cold one.

    Linear in the score: 10 gives 100 and each point less takes 11 off (2 gives 11),
    so kube-scheduler's normalised sum keeps the strategy's proportions.
    """
    span = MAX_SCORE - NO_HISTORY_SCORE
    weight = round(MAX_WEIGHT * (score - NO_HISTORY_SCORE) / span)
    return max(MIN_WEIGHT, min(MAX_WEIGHT, weight))


class SteeringMemory:
    """Pods steered per label and node in the last few minutes, in this process.

    Thread-safe; `window` is given per call so that tests and the simulator can
    choose it (the webhook passes KSSCHED_WEBHOOK_MEMORY_SECONDS).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._steered: dict[str, deque[tuple[float, str]]] = {}

    def steered(
        self,
        label: str,
        *,
        now: float,
        window: float,
        bound: Sequence[float] = (),
    ) -> dict[str, int]:
        """node -> pods of `label` steered there in (now - window, now] and not
        bound yet.

        `bound` holds when the ledger's pods of `label` were bound, from
        `since(label)` on: each retires the oldest steered pod admitted before it
        (CLOCK_SLACK allowed), which the ledger counts from then on.
        """
        with self._lock:
            entries = self._steered.get(label)
            if not entries:
                return {}
            self._expire(entries, now - window)
            pending = [(at, node) for at, node in entries if at <= now]
        times = sorted(bound)
        counts: dict[str, int] = {}
        taken = 0
        for at, node in pending:
            while taken < len(times) and times[taken] < at - CLOCK_SLACK:
                taken += 1
            if taken < len(times):
                taken += 1  # this pod is bound: the ledger counts it
                continue
            counts[node] = counts.get(node, 0) + 1
        return counts

    def since(self, label: str, *, now: float, window: float) -> float | None:
        """Where the bound pods that can retire a steered pod of `label` start
        (the oldest one's admission less CLOCK_SLACK); None with none remembered."""
        with self._lock:
            entries = self._steered.get(label)
            if not entries:
                return None
            self._expire(entries, now - window)
            return entries[0][0] - CLOCK_SLACK if entries else None

    def remember(self, label: str, node: str, *, now: float, window: float) -> None:
        """One pod of `label` was steered to `node` at `now`."""
        with self._lock:
            entries = self._steered.get(label)
            if entries is None:
                if len(self._steered) >= MAX_LABELS:
                    self._drop_stale(now - window)
                entries = self._steered[label] = deque(maxlen=MAX_PER_LABEL)
            entries.append((now, node))

    def clear(self) -> None:
        """Forget everything."""
        with self._lock:
            self._steered.clear()

    @staticmethod
    def _expire(entries: deque[tuple[float, str]], before: float) -> None:
        while entries and entries[0][0] <= before:
            entries.popleft()

    def _drop_stale(self, before: float) -> None:
        for label in list(self._steered):
            entries = self._steered[label]
            self._expire(entries, before)
            if not entries:
                del self._steered[label]
        if len(self._steered) >= MAX_LABELS:
            # Still full of recent labels: the oldest-created half goes.
            for label in list(self._steered)[: MAX_LABELS // 2]:
                del self._steered[label]


_MEMORY = SteeringMemory()


def process_memory() -> SteeringMemory:
    """This process's steering memory (one per gunicorn worker)."""
    return _MEMORY


def with_steered(history: LabelHistory, steered: Mapping[str, int]) -> LabelHistory:
    """`history` with the steered pods added to the label's active pods and to
    their nodes' pipeline pods (the load rule's `busy`)."""
    if not steered:
        return history
    active = dict(history.active)
    busy = dict(history.busy)
    for node, pods in steered.items():
        active[node] = active.get(node, 0) + pods
        busy[node] = busy.get(node, 0) + pods
    return replace(history, active=active, busy=busy)


class FixedReader:
    """A HistoryReader that answers every read with one LabelHistory read before.

    The webhook reads the label once (every node with history, the keys the
    strategy reads: `Strategy.keys_of`) and hands the value, steered pods included,
    to the strategy; the strategy's own read gets it back. Its rows cover every
    node the strategy is asked about.
    """

    def __init__(self) -> None:
        self.history: LabelHistory | None = None

    def read(
        self,
        *,
        keys: Sequence[str],
        label: str,
        nodes: Sequence[str] | None,
        depths: bool = False,
    ) -> LabelHistory:
        if self.history is None:
            raise RuntimeError("FixedReader read before its history was set")
        return self.history

    def pool(self, *, now: float, days: float) -> tuple[str, ...]:
        """No pool of its own: the caller passes it to `plan_terms`."""
        return ()


@dataclass(frozen=True, slots=True)
class Term:
    """One preferred node-affinity term: `node` by name, with `weight`."""

    node: str
    weight: int
    score: int


@dataclass
class Plan:
    """What the webhook would inject for one pod, and the inputs behind it.

    `nodes` are the nodes scored (every node with history, pinned ones and the
    pool), with their `scores`; `terms` the warmest of them, heaviest first;
    `target` the node the pod is most likely steered to (None without terms).
    """

    label: str | None
    strategy: Strategy | None = None
    nodes: list[str] = field(default_factory=list)
    scores: list[int] = field(default_factory=list)
    terms: list[Term] = field(default_factory=list)
    steered: dict[str, int] = field(default_factory=dict)
    history: LabelHistory | None = None
    dropped: list[str] = field(default_factory=list)

    @property
    def target(self) -> str | None:
        return self.terms[0].node if self.terms else None


def _pinned(history: LabelHistory, label: str | None) -> set[str]:
    """The nodes a policy of the label's segments pins."""
    return {
        node
        for key in split_pipeline_label(label)
        for node, action in history.policies.nodes.get(key, {}).items()
        if action == "pin"
    }


def plan_terms(
    *,
    label: str | None,
    memory: SteeringMemory,
    now: float | None = None,
    window: float | None = None,
    max_nodes: int | None = None,
    reader: HistoryReader | None = None,
    make_strategy: Callable[[HistoryReader], Strategy] | None = None,
    pool: Iterable[str] = (),
    bound_since: Callable[[str, float], Sequence[float]] | None = None,
    min_score: int = MIN_TERM_SCORE,
) -> Plan:
    """The preferred terms for a pod with pipeline `label`, read from the history.

    Scores every node with history for the label (read once, steered pods added to
    the active ones and to their nodes' pipeline pods) with the configured
    strategy, or `make_strategy(reader)`.
    The nodes of `pool` (the nodes pipeline pods run on) are scored with them: the
    load rule compares a node with the mean of the nodes scored, as prioritize
    compares it with the mean of kube-scheduler's candidates, and the nodes with
    history for one label are busier than the pool. `bound_since(label, since)`
    gives when the label's pods were bound from `since` on (default: the ledger,
    `history.queries.bound_times`), which retires the steered pods they were.
    Nodes scoring below `min_score` (default MIN_TERM_SCORE) get no term; the
    `max_nodes` best of the rest do, heaviest first, equal weights broken by fewer
    running pipeline pods, then by name.
    Raises DatabaseError when the history cannot be read.
    """
    if not split_pipeline_label(label):
        return Plan(label=label)
    now = time.time() if now is None else now
    window = settings.KSSCHED_WEBHOOK_MEMORY_SECONDS if window is None else window
    max_nodes = settings.KSSCHED_WEBHOOK_MAX_NODES if max_nodes is None else max_nodes
    fixed = FixedReader()
    strategy = make_strategy(fixed) if make_strategy else get_strategy(reader=fixed)
    read = (reader or history_reader()).read(
        keys=strategy.keys_of(label),
        label=label or "",
        nodes=None,
        depths=strategy.reads_depths,
    )
    since = memory.since(label or "", now=now, window=window)
    bound: Sequence[float] = ()
    if since is not None:
        bound = (bound_since or _ledger_bound_since)(label or "", since)
    steered = memory.steered(label or "", now=now, window=window, bound=bound)
    history = with_steered(read, steered)
    fixed.history = history
    nodes = sorted(history.nodes() | _pinned(history, label) | set(pool))
    scores = strategy.score(label=label, nodes=nodes, now=now) if nodes else []
    busy = history.busy

    def order(pair: tuple[str, int]) -> tuple[int, int, str]:
        node, score = pair
        return (-score, busy.get(node, 0), node)  # steered pods included

    # Only nodes with history (or a pin) score above 1: the pool's cold nodes are
    # scored for the mean alone. Of the warm ones, those below `min_score` would
    # pull as hard as the warmest (see MIN_TERM_SCORE): they go without a term.
    threshold = max(min_score, NO_HISTORY_SCORE + 1)
    warm = sorted(
        (pair for pair in zip(nodes, scores, strict=True) if pair[1] >= threshold),
        key=order,
    )
    limit = max(0, max_nodes)
    terms = [Term(node, weight_for(score), score) for node, score in warm[:limit]]
    return Plan(
        label=label,
        strategy=strategy,
        nodes=nodes,
        scores=scores,
        terms=terms,
        steered=steered,
        history=history,
        dropped=[node for node, _ in warm[limit:]],
    )


def _ledger_bound_since(label: str, since: float) -> list[float]:
    return bound_times(label=label, since=since, limit=MAX_PER_LABEL)


def remember_plan(
    plan: Plan, *, memory: SteeringMemory, now: float, window: float | None = None
) -> None:
    """Count the pod `plan` was made for as running on its target for a while."""
    if plan.target is None or not plan.label:
        return
    window = settings.KSSCHED_WEBHOOK_MEMORY_SECONDS if window is None else window
    memory.remember(plan.label, plan.target, now=now, window=window)

"""The webhook as the simulator runs it: the real steering code, admitting each pod
of a burst before any is scheduled (the ranking that follows: `default_profile`)."""

from __future__ import annotations

import random
from collections.abc import Sequence

from extender.scoring.rules import WarmRules
from extender.scoring.steering import (
    CLOCK_SLACK,
    SteeringMemory,
    plan_terms,
    remember_plan,
)
from extender.scoring.strategies import WarmStrategy, WorthSource
from history.reader.memory import MemoryHistory


class WebhookAdmissions:
    """The webhook as the simulator runs it: each pod is admitted when it is created
    (every pod of a burst before any is scheduled) and gets the terms
    `steering.plan_terms` makes from the history at that moment.

    `workers` steering memories stand for the gunicorn workers: each review goes to
    one of them at random, as the API server's new connections do. The pool comes
    from the store as the webhook's comes from the database (`history.reader.pool`):
    the nodes with a row placed, first seen or replaced in the last `pool_days`.
    """

    def __init__(
        self,
        *,
        history: MemoryHistory,
        rules: WarmRules,
        workers: int,
        window: float,
        max_nodes: int,
        nodes: Sequence[str],
        pool_days: float,
        seed: int,
        worth: WorthSource | None = None,
    ):
        self.history = history
        # What warmth is worth to each pipeline, as the production webhook learns it.
        self.worth = worth
        self.rules = rules
        self.memories = [SteeringMemory() for _ in range(max(1, workers))]
        self.window = window
        self.max_nodes = max_nodes
        self.pool_days = pool_days
        # The watcher sees every node of the simulated cluster at the start.
        history.seen.update(dict.fromkeys(nodes, 0.0))
        self.rng = random.Random(seed + 15485863)
        # label -> when its pods were bound (the ledger's bound_at), within a window.
        self.bound: dict[str, list[float]] = {}

    def placed(self, label: str, now: float) -> None:
        """A pod of `label` was bound at `now` (the watcher records it at once)."""
        times = self.bound.setdefault(label, [])
        times.append(now)
        horizon = now - self.window - CLOCK_SLACK
        if times[0] < horizon:
            self.bound[label] = [at for at in times if at >= horizon]

    def _bound_since(self, label: str, since: float) -> list[float]:
        return [at for at in self.bound.get(label, ()) if at >= since]

    def admit(self, label: str, now: float) -> dict[str, int]:
        """The terms for a new pod of `label` at `now`: {node: weight}."""
        memory = self.rng.choice(self.memories)
        plan = plan_terms(
            label=label,
            memory=memory,
            now=now,
            window=self.window,
            max_nodes=self.max_nodes,
            reader=self.history,
            pool=self.history.pool(now=now, days=self.pool_days),
            make_strategy=lambda reader: WarmStrategy(
                rules=self.rules,
                reader=reader,
                half_life=self.history.half_life,
                worth=self.worth,
            ),
            bound_since=self._bound_since,
        )
        remember_plan(plan, memory=memory, now=now, window=self.window)
        return {term.node: term.weight for term in plan.terms}

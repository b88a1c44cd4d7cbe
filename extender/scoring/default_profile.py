"""How kube-scheduler's default profile ranks nodes for a pod with preferred terms,
and the webhook's admissions, for the simulator's `webhook` mode.

The model follows Kubernetes' own code (read at v1.31; unchanged since v1.25):

* `pkg/scheduler/apis/config/v1/default_plugins.go`: the score plugins of the
  default profile and their weights: TaintToleration 3, NodeAffinity 2,
  PodTopologySpread 2, InterPodAffinity 2, NodeResourcesFit 1,
  NodeResourcesBalancedAllocation 1, ImageLocality 1. Each plugin scores a node
  0..100 (MaxNodeScore); the node's total is the weighted sum.
* `pkg/scheduler/framework/plugins/nodeaffinity/node_affinity.go`: NodeAffinity's
  Score is the sum of the weights of the pod's preferred terms the node matches;
  NormalizeScore is `helper.DefaultNormalizeScore(100, false, scores)`: each sum
  becomes `100 * sum // max` over the scored nodes (all 0 when no node matches).
  Without preferred terms PreScore skips the plugin (every node 0).

For pipeline pods in the simulated cluster the other plugins do not rank nodes:
no node is tainted (TaintToleration gives every node 100), the pods belong to no
Service or ReplicaSet and have no pod (anti-)affinity (PodTopologySpread's system
default constraints and InterPodAffinity skip them), and every node has the images
(ImageLocality is the same everywhere). A pod requests CPU and memory in the
proportion of a node's capacity, so NodeResourcesBalancedAllocation is 100
everywhere and NodeResourcesFit (LeastAllocated) is the share of the node's CPU
left free, 0..100. So a node's total is, up to a constant,
`2 * NodeAffinity + LeastAllocated` (with the extender, `score * weight * 10` takes
NodeAffinity's place: `simulation`).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from extender.scoring.rules import WarmRules
from extender.scoring.steering import SteeringMemory, plan_terms, remember_plan
from extender.scoring.strategies import WarmStrategy
from history.reader.memory import MemoryHistory

MAX_NODE_SCORE = 100
# Score plugin weights of the default profile (default_plugins.go).
PLUGIN_WEIGHTS = {
    "TaintToleration": 3,
    "NodeAffinity": 2,
    "PodTopologySpread": 2,
    "InterPodAffinity": 2,
    "NodeResourcesFit": 1,
    "NodeResourcesBalancedAllocation": 1,
    "ImageLocality": 1,
}


def node_affinity_scores(
    terms: Mapping[str, int], candidates: Sequence[str]
) -> list[int]:
    """NodeAffinity's normalised scores (0..100) for `candidates`, in order.

    `terms` maps a node to the weight of the one term naming it (the webhook adds
    one per node); the raw score of a node is that weight, or 0.
    """
    raw = [terms.get(node, 0) for node in candidates]
    top = max(raw, default=0)
    if top == 0:
        return raw
    return [MAX_NODE_SCORE * score // top for score in raw]


def affinity_points(terms: Mapping[str, int], candidates: Sequence[str]) -> list[int]:
    """What NodeAffinity adds to each candidate's total: weight x normalised score."""
    weight = PLUGIN_WEIGHTS["NodeAffinity"]
    return [weight * score for score in node_affinity_scores(terms, candidates)]


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
    ):
        self.history = history
        self.rules = rules
        self.memories = [SteeringMemory() for _ in range(max(1, workers))]
        self.window = window
        self.max_nodes = max_nodes
        self.pool_days = pool_days
        # The watcher sees every node of the simulated cluster at the start.
        history.seen.update(dict.fromkeys(nodes, 0.0))
        self.rng = random.Random(seed + 15485863)

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
                rules=self.rules, reader=reader, half_life=self.history.half_life
            ),
        )
        remember_plan(plan, memory=memory, now=now, window=self.window)
        return {term.node: term.weight for term in plan.terms}

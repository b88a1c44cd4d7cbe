"""How kube-scheduler's default profile ranks nodes for a pod with preferred terms,
for the simulator's `webhook` mode (the admissions themselves: `admissions`), and
which nodes it scores at all (`scored_nodes`, its sampling).

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

from collections.abc import Mapping, Sequence

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


# kube-scheduler's minFeasibleNodesToFind: sampling never scores fewer nodes.
MIN_FEASIBLE_NODES = 100


def scored_nodes(
    free: list[float], cpu: float, start: int, percentage: int
) -> tuple[list[int], int]:
    """The nodes kube-scheduler scores for a pod needing `cpu`, and the next start.

    Like upstream: walk the nodes round-robin from `start`, keep those with room,
    stop once `max(100, n * percentage / 100)` are found (all of them at 100 % or
    with at most 100 nodes), and let the next pod start where this walk ended.
    """
    total = len(free)
    wanted = total
    if percentage < 100 and total > MIN_FEASIBLE_NODES:
        wanted = max(MIN_FEASIBLE_NODES, total * percentage // 100)
    found: list[int] = []
    examined = 0
    for step in range(total):
        node = (start + step) % total
        examined += 1
        if free[node] >= cpu:
            found.append(node)
            if len(found) >= wanted:
                break
    return found, (start + examined) % total

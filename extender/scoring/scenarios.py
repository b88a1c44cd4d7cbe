"""The simulated clusters: scenarios (every parameter of a run) and the workloads
they draw, or the recorded ledger replayed as one (see `simulation`)."""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass, field

from extender.scoring.rules import WarmRules
from history.labels import split_pipeline_label
from history.models import Placement

LANGUAGES = ("java", "go", "py", "node", "rust", "ruby", "dotnet", "cpp")
# The shared-names labels: `<ci-system>-<language>-<tool>-<service>`, where a share
# of the services take their name from a small vocabulary, as service names do.
CI_SYSTEMS = ("jenkins", "gitlab", "github", "tekton", "argo", "buildkite")
TOOLS = ("build", "test", "lint", "release", "scan", "deploy")
SHARED_SERVICES = (
    "api",
    "web",
    "frontend",
    "worker",
    "docs",
    "auth",
    "gateway",
    "admin",
)


@dataclass(frozen=True)
class Scenario:
    """Every parameter of a simulation run (all are `manage.py simulate` options)."""

    nodes: int = 30
    cpu: float = 16.0
    cache_slots: int = 8
    pipelines: int = 80
    languages: int = 4
    tools: int = 3
    # 0: labels `<language>-<language><tool>-p<n>`, whose segments never collide;
    # more: `<ci-system>-<language>-<tool>-<service>` over that many CI systems.
    systems: int = 0
    shared_names: float = 0.0
    zipf: float = 1.1
    runs: int = 2500
    arrival: float = 10.0
    fanout: int = 6
    fanout_share: float = 0.3
    pod_cpu: float = 2.0
    run_time: float = 600.0
    cold_extra: float = 300.0
    partial_extra: float = 120.0
    replace_every: float = 6 * 3600.0
    # What warmth is worth per pipeline (0, 0: the same cold_extra/partial_extra for
    # every pipeline): the share of pipelines whose cold start adds GAIN_LOT
    # seconds (drawn per pipeline), and the share that adds GAIN_LITTLE; the rest
    # gain nothing. A partial hit adds partial_extra/cold_extra of it.
    gain_lot: float = 0.0
    gain_little: float = 0.0
    # Each pod's startup: STARTUP_FLOOR plus its warmth's extra, each times a
    # log-normal factor of this sigma; a share of pods hangs HUNG seconds more
    # whatever the node (outliers the estimate must shrug off).
    startup_noise: float = 0.0
    hung_share: float = 0.0
    weight: int = 5
    percentage: int = 100
    # Caches here turn over in about a quarter of an hour (8 slots, a pod every few
    # minutes per node), so a placement's weight halves every 7.2 minutes. In a
    # cluster, set KSSCHED_HALF_LIFE_DAYS to about half the time a workspace
    # survives in a node's cache.
    half_life_days: float = 0.005
    saturation: float = WarmRules.saturation
    hotspot_penalty: int = WarmRules.hotspot_penalty
    min_weight: float = WarmRules.min_weight
    load_penalty: float = WarmRules.load_penalty
    load_slack: float = WarmRules.load_slack
    # Webhook mode: terms per pod, the steering memory's window and how many
    # gunicorn workers (each with its own memory) share the reviews.
    webhook_max_nodes: int = 20
    webhook_memory: float = 120.0
    webhook_workers: int = 3
    webhook_pool_days: float = 7.0
    seed: int = 1


SCENARIOS = {
    "default": Scenario(),
    # Many pipelines, each run rarely and with little fan-out: caches churn.
    "many-small": Scenario(
        pipelines=400,
        languages=6,
        tools=4,
        fanout=2,
        fanout_share=0.1,
        zipf=0.8,
        arrival=7.0,
    ),
    # A few hot pipelines with wide fan-out bursts: the hotspot case.
    "hot-fanout": Scenario(
        pipelines=12, zipf=1.3, fanout=16, fanout_share=0.6, runs=1000, arrival=30.0
    ),
    # Frequent node replacement: history about gone machines must be dropped.
    "churn": Scenario(replace_every=1800.0),
    # A large cluster where kube-scheduler scores only a sample of the nodes.
    "sampled": Scenario(
        nodes=300, pipelines=600, runs=6000, arrival=1.0, percentage=40
    ),
    # Labels `<ci-system>-<language>-<tool>-<service>` where 40 % of the services
    # are named from a small shared vocabulary (api, web, worker, ...): the most
    # specific segment alone no longer tells one pipeline from another.
    "shared-names": Scenario(systems=4, shared_names=0.4),
    # Pipelines differ in what warmth is worth: 30 % lose 60-180 s on a cold node,
    # 40 % 5-15 s, 30 % nothing; startups are noisy and 2 % of pods hang. The
    # estimate has to be learned from the simulated outcomes during the run.
    "worth": Scenario(
        gain_lot=0.3, gain_little=0.4, startup_noise=0.3, hung_share=0.02
    ),
}

# Cold-start seconds of the pipelines that gain a lot, or a little, from warmth.
GAIN_LOT = (60.0, 180.0)
GAIN_LITTLE = (5.0, 15.0)
# A pod's startup on an exact hit (image and workspace in place), before noise.
STARTUP_FLOOR = 3.0
# What a hung pod adds to its startup, whatever the node.
HUNG = (300.0, 900.0)


@dataclass
class Pod:
    """One pod to place. `cold_extra`/`partial_extra` are the seconds a cold start or
    a partial hit adds for this pod (noise included); `startup` what it takes on an
    exact hit (the floor, noise and any hang)."""

    label: str
    cpu: float
    base: float
    arrived: float
    cold_extra: float = 0.0
    partial_extra: float = 0.0
    startup: float = 0.0
    # The room its own workspace takes in a node's cache, in workspaces (1: the
    # size of every workspace when all pipelines cost the same).
    footprint: float = 1.0


@dataclass
class Workload:
    """The pods to place, in arrival order, and when which node is replaced."""

    pods: list[Pod]
    replacements: list[tuple[float, int]] = field(default_factory=list)


def pipeline_labels(scenario: Scenario) -> list[str]:
    """One label per pipeline, in popularity order: `<language>-<language><tool>-p<n>`,
    or with `systems` `<ci-system>-<language>-<tool>-<service>` (see `named_labels`)."""
    rng = random.Random(scenario.seed * 7919 + 1)
    if scenario.systems:
        return named_labels(scenario, rng)
    languages = [LANGUAGES[i % len(LANGUAGES)] for i in range(scenario.languages)]
    labels = []
    for index in range(scenario.pipelines):
        language = rng.randrange(len(languages))
        tool = rng.randrange(scenario.tools)
        name = languages[language] + (str(language) if language >= 8 else "")
        labels.append(f"{name}-{name}{tool}-p{index}")
    return labels


def _numbered(names: tuple[str, ...], count: int) -> list[str]:
    """`count` names from `names`, numbered once the list runs out (`java2`)."""
    return [
        names[i % len(names)] + (str(i // len(names) + 1) if i >= len(names) else "")
        for i in range(count)
    ]


def named_labels(scenario: Scenario, rng: random.Random) -> list[str]:
    """`<ci-system>-<language>-<tool>-<service>`, distinct: with probability
    `shared_names` the service is named from `SHARED_SERVICES`, else it has a name
    of its own (`svc<n>`)."""
    languages = _numbered(LANGUAGES, scenario.languages)
    systems = _numbered(CI_SYSTEMS, scenario.systems)
    tools = _numbered(TOOLS, scenario.tools)
    labels: list[str] = []
    taken: set[str] = set()
    for index in range(scenario.pipelines):
        for attempt in range(100):
            service = f"svc{index}"
            # A service name of its own makes the label distinct in the end.
            if attempt < 99 and rng.random() < scenario.shared_names:
                service = rng.choice(SHARED_SERVICES)
            label = "-".join(
                (rng.choice(systems), rng.choice(languages), rng.choice(tools), service)
            )
            if label not in taken:
                break
        taken.add(label)
        labels.append(label)
    return labels


def shared_name_share(labels: list[str]) -> float:
    """The share of `labels` whose last segment is also the last segment of a
    label with another first or second segment (another CI system or language)."""
    split = [split_pipeline_label(label) for label in labels]
    split = [segments for segments in split if segments]
    shared = sum(
        any(
            other[-1] == segments[-1] and other[:2] != segments[:2]
            for other in split
            if other is not segments
        )
        for segments in split
    )
    return round(shared / len(split), 4) if split else 0.0


def synthetic_workload(scenario: Scenario) -> Workload:
    """Draw the workload of `scenario` from its seed."""
    rng = random.Random(scenario.seed)
    labels = pipeline_labels(scenario)
    popularity = [1 / (rank + 1) ** scenario.zipf for rank in range(len(labels))]
    cumulative = []
    total = 0.0
    for weight in popularity:
        total += weight
        cumulative.append(total)
    costs = pipeline_costs(scenario, labels)
    footprints = cache_footprints(costs)
    noise = random.Random(scenario.seed * 31337 + 7)
    pods = []
    now = 0.0
    for _ in range(scenario.runs):
        now += rng.expovariate(1 / scenario.arrival)
        label = rng.choices(labels, cum_weights=cumulative)[0]
        size = 1
        if scenario.fanout > 1 and rng.random() < scenario.fanout_share:
            size = rng.randint(2, scenario.fanout)
        for _ in range(size):
            pod = Pod(
                label=label,
                cpu=scenario.pod_cpu,
                base=rng.expovariate(1 / scenario.run_time),
                arrived=now,
            )
            pods.append(with_costs(pod, costs[label], scenario, noise))
            pod.footprint = footprints[label]
    replacements = []
    if scenario.replace_every > 0:
        at = 0.0
        while True:
            at += rng.expovariate(1 / scenario.replace_every)
            if at >= now:
                break
            replacements.append((at, rng.randrange(scenario.nodes)))
    return Workload(pods=pods, replacements=replacements)


def pipeline_costs(
    scenario: Scenario, labels: list[str]
) -> dict[str, tuple[float, float]]:
    """label -> (cold extra, partial extra) seconds: the scenario's for every
    pipeline, or drawn per pipeline from the gain mix (`gain_lot`, `gain_little`)."""
    uniform = (scenario.cold_extra, scenario.partial_extra)
    if not scenario.gain_lot and not scenario.gain_little:
        return dict.fromkeys(labels, uniform)
    rng = random.Random(scenario.seed * 104723 + 3)
    share = scenario.partial_extra / scenario.cold_extra if scenario.cold_extra else 0
    costs = {}
    for label in labels:
        draw = rng.random()
        cold = 0.0
        if draw < scenario.gain_lot:
            cold = rng.uniform(*GAIN_LOT)
        elif draw < scenario.gain_lot + scenario.gain_little:
            cold = rng.uniform(*GAIN_LITTLE)
        costs[label] = (cold, cold * share)
    return costs


# The least room a workspace takes (a pipeline whose warmth saves nothing still
# leaves a little behind).
MIN_FOOTPRINT = 0.05


def cache_footprints(costs: dict[str, tuple[float, float]]) -> dict[str, float]:
    """label -> the room its own workspace takes in a node's cache: its cold cost
    over the mean cold cost of the pipelines, at least MIN_FOOTPRINT. What a cold
    start costs is mostly fetching what the cache holds (images, build caches), so
    the two go together; when every pipeline costs the same, every workspace
    takes 1, and the cache holds `cache_slots` of them."""
    mean = sum(cold for cold, _ in costs.values()) / len(costs) if costs else 0.0
    if not mean:
        return dict.fromkeys(costs, 1.0)
    return {
        label: max(MIN_FOOTPRINT, cold / mean) for label, (cold, _) in costs.items()
    }


def with_costs(
    pod: Pod, cost: tuple[float, float], scenario: Scenario, noise: random.Random
) -> Pod:
    """`pod` with its own extras and exact-hit startup, noise and hang drawn from
    `noise` (a stream of its own, so scenarios without noise draw nothing)."""
    cold, partial = cost
    if scenario.startup_noise:
        factor = noise.lognormvariate(0.0, scenario.startup_noise)
        cold, partial = cold * factor, partial * factor
        startup = STARTUP_FLOOR * noise.lognormvariate(0.0, scenario.startup_noise)
        if scenario.hung_share and noise.random() < scenario.hung_share:
            startup += noise.uniform(*HUNG)
    else:
        startup = 0.0
    pod.cold_extra, pod.partial_extra, pod.startup = cold, partial, startup
    return pod


def ledger_workload(scenario: Scenario) -> tuple[Workload, int]:
    """The recorded placements as a workload, and how many nodes they used.

    Pods arrive when they were bound and run for their recorded run time (from the
    first container start to the end), else from binding to the end (`run_time`
    when still running); that time is taken as the warm run time. What warmth is
    worth to each pipeline is what the ledger measured (`measured_costs`), so the
    adaptive strategies learn from the pipelines' own figures. Node replacements
    are not replayed. Pods without pipeline segments are skipped.
    """
    pods = []
    nodes = set()
    start = None
    rows = Placement.objects.order_by("bound_at", "pk").values_list(
        "label", "node", "bound_at", "finished_at", "run_seconds"
    )
    for label, node, bound_at, finished_at, run_seconds in rows.iterator():
        keys = split_pipeline_label(label)
        if not keys:
            continue
        start = start if start is not None else bound_at
        nodes.add(node)
        ran = (finished_at - bound_at).total_seconds() if finished_at else None
        if run_seconds is not None:
            ran = run_seconds
        pods.append(
            Pod(
                label="-".join(keys),
                cpu=scenario.pod_cpu,
                base=ran if ran is not None and ran >= 0 else scenario.run_time,
                arrived=(bound_at - start).total_seconds(),
            )
        )
    measured = measured_costs(scenario)
    costs = {
        pod.label: measured.get(
            pod.label, (scenario.cold_extra, scenario.partial_extra)
        )
        for pod in pods
    }
    footprints = cache_footprints(costs)
    noise = random.Random(scenario.seed * 31337 + 7)
    for pod in pods:
        with_costs(pod, costs[pod.label], scenario, noise)
        pod.footprint = footprints[pod.label]
    return Workload(pods=pods), len(nodes)


def measured_costs(scenario: Scenario) -> dict[str, tuple[float, float]]:
    """label -> (cold extra, partial extra) seconds as the ledger measured them:
    the median startup of the pipeline's successful cold (partial) runs less that
    of its exact runs, never below 0. A class without runs takes the scenario's
    proportion of the other (partial_extra / cold_extra); a pipeline without exact
    runs, or without any other, is left out (the scenario's figures apply)."""
    by_label: dict[str, dict[str, list[float]]] = {}
    rows = Placement.objects.filter(
        outcome=Placement.Outcome.SUCCEEDED, startup_seconds__isnull=False
    ).values_list("label", "warmth", "startup_seconds")
    for label, warmth, startup in rows.iterator():
        keys = split_pipeline_label(label)
        if keys and warmth and startup is not None:
            classes = by_label.setdefault("-".join(keys), {})
            classes.setdefault(warmth, []).append(startup)
    share = scenario.partial_extra / scenario.cold_extra if scenario.cold_extra else 0
    costs = {}
    for label, classes in by_label.items():
        exact = classes.get("exact")
        if not exact:
            continue
        base = statistics.median(exact)
        cold = _extra(classes.get("cold"), base)
        partial = _extra(classes.get("partial"), base)
        if cold is not None:
            costs[label] = (cold, partial if partial is not None else cold * share)
        elif partial is not None:
            costs[label] = (partial / share if share else partial, partial)
    return costs


def _extra(startups: list[float] | None, base: float) -> float | None:
    return max(0.0, statistics.median(startups) - base) if startups else None

"""What warmth is worth, end to end: pods with container start and finish times go
through the fake API server to the real watcher; the ledger's outcomes feed the
process's book (`history.worth_feed`), and the estimate, the weight, the score
order, the webhook's weights and the placement Event move the way the rule says."""

from datetime import timedelta

import pytest
from django.utils import timezone

from extender.scoring.steering import SteeringMemory, plan_terms
from extender.scoring.strategies import get_strategy
from history.corrections import create_key_node
from history.models import KeyPolicy, Placement
from history.watcher import state
from history.watcher.placement_events import PlacementEvent, with_worth
from history.worth_feed import process_worth
from history.worth_samples import MIN_RUNS
from tests.test_outcomes_watch import Cluster, catch_up, new_stream

pytestmark = pytest.mark.django_db(transaction=True)

LOT, MID, FLAT = "ci-java-lot", "ci-java-mid", "ci-java-flat"
# Seconds a cold start adds for each pipeline: the median pipeline (MID) is the unit.
COLD_EXTRA = {LOT: 180, MID: 60, FLAT: 0}


@pytest.fixture
def bookmark_interval():
    return None


@pytest.fixture
def read_timeout():
    return 2.0


def warm_node(label):
    return f"warm-{label.rsplit('-', 1)[-1]}"


@pytest.fixture
def watched(api, server, settings):
    """MIN_RUNS exact and MIN_RUNS cold runs of each pipeline, watched; scoring
    with `warm`, the default outside the test suite."""
    settings.KSSCHED_SCORING = "warm"
    for label in COLD_EXTRA:
        create_key_node(key=f"{label}$", node=warm_node(label), count=3, actor="test")
    start = timezone.now().replace(microsecond=0) - timedelta(days=1)
    cluster = Cluster(server, start)
    state.save_watch_state(name="pods", resource_version=server.resource_version)
    for i in range(MIN_RUNS):
        for label, extra in COLD_EXTRA.items():
            name = label.rsplit("-", 1)[-1]
            cluster.run(f"{name}-e{i}", label, warm_node(label), 10 + i % 3, 100)
            cold = f"{name}-cold-{i}"
            cluster.run(f"{name}-c{i}", label, cold, 10 + extra + i % 3, 100)
    stream = new_stream(api)
    catch_up(stream, server)
    return cluster, stream


def test_outcomes_through_the_watcher_give_each_pipeline_its_weight(watched):
    recorded = Placement.objects.exclude(outcome="")
    assert recorded.filter(warmth="exact").count() == 3 * MIN_RUNS
    assert recorded.filter(warmth="cold").count() == 3 * MIN_RUNS
    assert process_worth().refresh(force=True)
    lot, mid, flat = (process_worth().estimate(label) for label in (LOT, MID, FLAT))
    assert lot.seconds == pytest.approx(180, abs=2)
    assert lot.over_cold is not None and lot.over_cold.low > 0
    assert lot.runs == {"exact": MIN_RUNS, "partial": 0, "cold": MIN_RUNS}
    assert mid.seconds == pytest.approx(60, abs=2)
    # Three times a typical pipeline's saving, shrunk toward what its siblings say
    # (MID 1 and FLAT 0, up from the fleet, shrunk toward 1) by 3 runs against its
    # 8: about 2.35, bounded at 2.
    assert lot.own == pytest.approx(3.0, abs=0.1)
    assert 0.5 < lot.prior < 1
    assert lot.credited == pytest.approx((8 * lot.own + 3 * lot.prior) / 11)
    assert (lot.weight, mid.weight, flat.weight) == (2.0, 1.0, 0.0)
    assert "nothing measurable" in flat.reason
    # A pipeline with no outcomes keeps today's pull.
    assert process_worth().estimate("ci-go-new").weight == 1.0


def test_weights_move_the_scores_and_the_webhooks_terms(watched, settings):
    cluster, stream = watched
    process_worth().refresh(force=True)
    # Three pods of another pipeline still run on LOT's warm node: load above the
    # mean of the candidates.
    for i in range(3):
        cluster.run(f"busy-{i}", "ci-go-busy", warm_node(LOT), 5, end=False)
    catch_up(stream, cluster.server)
    nodes = [warm_node(LOT), warm_node(FLAT), "idle-a", "idle-b"]

    def scores(label):
        found = get_strategy().score(label=label, nodes=nodes)
        return dict(zip(nodes, found, strict=True))

    def terms(label):
        plan = plan_terms(
            label=label, memory=SteeringMemory(), pool=nodes, max_nodes=100
        )
        return {term.node: term.weight for term in plan.terms}

    learned = {label: (scores(label), terms(label)) for label in (LOT, FLAT)}
    settings.KSSCHED_WORTH = "off"
    today = {label: (scores(label), terms(label)) for label in (LOT, FLAT)}

    # FLAT saves nothing: every node ties at the cold score, no preferred term;
    # without the estimate its warm node is preferred.
    assert set(learned[FLAT][0].values()) == {1} and learned[FLAT][1] == {}
    assert today[FLAT][0][warm_node(FLAT)] > today[FLAT][0]["idle-a"]
    assert warm_node(FLAT) in today[FLAT][1]
    # LOT is pulled harder: its loaded warm node loses half the load penalty, so
    # it keeps a higher score and term weight than today, still below unloaded.
    hot = warm_node(LOT)
    assert learned[LOT][0][hot] > today[LOT][0][hot] > today[LOT][0]["idle-a"]
    assert learned[LOT][1][hot] > today[LOT][1].get(hot, 0)


def test_explain_and_the_event_name_the_weight(watched):
    process_worth().refresh(force=True)
    rows = get_strategy().explain(label=LOT, nodes=[warm_node(LOT)])
    assert rows[0]["worth_weight"] == 2.0
    assert rows[0]["worth"].startswith("learned 2: worth 2.3")
    event = PlacementEvent(
        namespace="ci",
        pod="lot-next",
        uid="u-lot-next",
        label=LOT,
        node=warm_node(LOT),
        warmth="exact",
        keys=(f"{LOT}$",),
        history=((f"{LOT}$", 11),),
    )
    note = with_worth(event).note
    assert "warm pull weight 2: worth 2.3" in note and "typical pipeline's" in note


def test_a_key_policy_overrides_the_learned_weight(watched):
    process_worth().refresh(force=True)
    nodes = [warm_node(FLAT), "idle-a"]
    KeyPolicy.objects.create(key="flat", worth=KeyPolicy.Worth.FIXED)
    fixed = get_strategy().score(label=FLAT, nodes=nodes)
    assert fixed[0] > fixed[1]  # the key's weight alone (1): today's pull
    KeyPolicy.objects.filter(key="flat").update(worth=KeyPolicy.Worth.AUTO)
    assert get_strategy().score(label=FLAT, nodes=nodes) == [1, 1]
    KeyPolicy.objects.create(key="lot", worth=KeyPolicy.Worth.OFF)
    assert get_strategy().score(label=LOT, nodes=[warm_node(LOT), "idle-a"]) == [1, 1]

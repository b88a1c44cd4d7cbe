"""Counts edited by hand move the `warm` score, the admin shows the weight scoring
uses, and KeyNode keys are label segments or steps of a label's path."""

from datetime import timedelta

import pytest
from django.core.exceptions import ValidationError
from django.utils import timezone

from extender.scoring.strategies import WarmStrategy
from history.audit import audit_counts
from history.corrections import create_key_node, set_key_node_count
from history.labels import is_valid_key, key_kind, split_pipeline_label
from history.models import CountAdjustment, KeyNode, KeyPolicy, NodePolicy
from tests.helpers import place, ran

pytestmark = pytest.mark.django_db

DAY = timedelta(days=1)


@pytest.fixture(autouse=True)
def half_life_of_a_week(settings):
    settings.KSSCHED_HALF_LIFE_DAYS = 7


def stored(key, node):
    return KeyNode.objects.values_list("count", "decayed_weight", "decayed_at").get(
        key=key, node=node
    )


def old_history(node, placements, age, label="myapp"):
    """`placements` of `label` on `node`, `age` ago; returns the row `warm` reads
    for this very pipeline (`<label>$`)."""
    for _ in range(placements):
        ran(label, node=node, now=timezone.now() - age)
    return KeyNode.objects.get(key=f"{label}$", node=node)


# --- what an edit does to the recency weight ------------------------------------


def test_raising_a_count_adds_placements_valued_at_the_edit():
    t0 = timezone.now() - 14 * DAY
    for _ in range(8):
        ran("myapp", node="n1", now=t0)
    row = KeyNode.objects.get(key="myapp", node="n1")
    edit = t0 + 14 * DAY
    assert set_key_node_count(key_node=row, count=50, actor="a", now=edit) == 42
    count, weight, at = stored("myapp", "n1")
    # 8 placements two half-lives old weigh 2; the 42 added weigh 42 now.
    assert (count, at) == (50, edit.timestamp())
    assert weight == pytest.approx(8 / 4 + 42)


def test_lowering_a_count_keeps_the_stored_weight():
    t0 = timezone.now() - 7 * DAY
    for _ in range(8):
        ran("myapp", node="n1", now=t0)
    row = KeyNode.objects.get(key="myapp$", node="n1")
    set_key_node_count(key_node=row, count=3, actor="a")
    assert stored("myapp$", "n1") == (3, 8.0, t0.timestamp())
    # The scoring caps the weight at the count: the row weighs 3 now, not 4.
    explained = WarmStrategy().explain(label="myapp", nodes=["n1"])[0]
    assert explained["decayed_weight"] == 3.0


def test_a_row_created_by_hand_weighs_its_count_valued_at_creation():
    t0 = timezone.now() - 7 * DAY
    create_key_node(key="myapp", node="n1", count=4, actor="a", now=t0)
    assert stored("myapp", "n1") == (4, 4.0, t0.timestamp())
    # A placement one half-life later finds 4 halved to 2, and adds 1.
    ran("myapp", node="n1", now=t0 + 7 * DAY)
    assert stored("myapp", "n1")[1] == pytest.approx(3.0)


def test_a_row_without_recency_state_keeps_its_count_as_weight():
    # Rows typed in before edits kept a recency state have decayed_at 0.
    KeyNode.objects.create(key="myapp", node="n1", count=7)
    now = timezone.now()
    ran("myapp", node="n1", now=now)
    assert stored("myapp", "n1") == (8, 8.0, now.timestamp())

    KeyNode.objects.create(key="myapp", node="n2", count=7)
    row = KeyNode.objects.get(key="myapp", node="n2")
    set_key_node_count(key_node=row, count=10, actor="a", now=now)
    assert stored("myapp", "n2") == (10, 10.0, now.timestamp())


def test_edits_keep_the_audit_clean():
    for uid in ("u1", "u2", "u3"):
        place(uid, "ci-myapp", "n1")
    row = KeyNode.objects.get(key="myapp", node="n1")
    set_key_node_count(key_node=row, count=30, actor="a")
    set_key_node_count(key_node=row, count=5, actor="a")
    create_key_node(key="java", node="n1", count=4, actor="a")
    assert [a.delta for a in CountAdjustment.objects.order_by("id")] == [27, -25, 4]
    # ci, myapp, ci-*, ci-myapp-*, ci-myapp$ and java on n1.
    assert audit_counts() == (6, [])


# --- what an edit does to the score ------------------------------------------------


def test_raising_a_count_raises_the_warm_score():
    # The report: 7 placements weeks old, count raised to 50, score unchanged.
    row = old_history("n1", 7, 18 * DAY)
    old_history("n2", 7, 18 * DAY)
    strategy = WarmStrategy()
    before = strategy.score(label="myapp", nodes=["n1", "n2"])
    assert before[0] == before[1] < 10
    set_key_node_count(key_node=row, count=50, actor="a")
    after = strategy.score(label="myapp", nodes=["n1", "n2"])
    assert after == [10, before[1]]


def test_an_admin_edit_raises_the_warm_score(admin_client):
    row = old_history("n1", 7, 18 * DAY, label="jenkins-myapp")
    old_history("n2", 7, 18 * DAY, label="jenkins-myapp")
    strategy = WarmStrategy()
    before = strategy.score(label="jenkins-myapp", nodes=["n1", "n2"])
    assert before[0] == before[1]
    response = admin_client.post(
        f"/admin/history/keynode/{row.pk}/change/", {"count": "50"}
    )
    assert response.status_code == 302
    after = strategy.score(label="jenkins-myapp", nodes=["n1", "n2"])
    assert after[0] > after[1] == before[1]


def test_a_row_added_in_the_admin_scores_as_placed_now(admin_client):
    response = admin_client.post(
        "/admin/history/keynode/add/", {"key": "myapp$", "node": "n1", "count": "9"}
    )
    assert response.status_code == 302
    count, weight, at = stored("myapp$", "n1")
    assert (count, weight) == (9, 9.0)
    assert at == pytest.approx(timezone.now().timestamp(), abs=60)
    # 9 placements just made: 2 + round(9 / 10 * 8).
    assert WarmStrategy().score(label="myapp", nodes=["n1"]) == [9]


# --- the admin shows the weight ------------------------------------------------------


def test_keynode_list_shows_the_weight_scoring_uses(admin_client):
    old_history("n1", 4, 7 * DAY)
    KeyNode.objects.create(key="typed", node="n2", count=5)
    response = admin_client.get("/admin/history/keynode/")
    assert response.status_code == 200
    assert b"Weight now" in response.content
    assert b"Raising a count adds the difference as placements" in response.content
    cells = {
        (row.key, row.node): response.context["cl"].model_admin.weight(row)
        for row in response.context["cl"].result_list
    }
    # 4 placements one half-life old; a row without recency state weighs its count.
    assert cells == {
        ("myapp", "n1"): "2.00",
        ("myapp$", "n1"): "2.00",
        ("myapp-*", "n1"): "2.00",
        ("typed", "n2"): "5.00",
    }
    assert b'<td class="field-weight">2.00</td>' in response.content


def test_keynode_detail_shows_the_weight_capped_at_the_count(admin_client):
    row = old_history("n1", 8, 7 * DAY)
    set_key_node_count(key_node=row, count=2, actor="a")
    response = admin_client.get(f"/admin/history/keynode/{row.pk}/change/")
    assert response.status_code == 200
    content = response.content.decode()
    assert "Weight now" in content
    assert "never exceeds the count" in content
    # 8 placements one half-life old weigh 4, capped at the count of 2.
    assert '<div class="readonly">2.00</div>' in content


# --- keys are one segment or one step of a label path -------------------------------


@pytest.mark.parametrize(
    "key",
    ["jenkins", "myapp", "1", "java_17", "v1.2", "_b", "a" * 63],
)
def test_single_segments_are_valid_keys(key):
    assert is_valid_key(key)
    assert split_pipeline_label(key) == [key]
    assert key_kind(key) == "segment"


@pytest.mark.parametrize(
    ("key", "kind"),
    [
        ("a-*", "prefix"),
        ("jenkins-java-*", "prefix"),
        ("a$", "pipeline"),
        ("jenkins-java-maven-myapp$", "pipeline"),
        ("a" * 63 + "-*", "prefix"),
    ],
)
def test_label_path_keys_are_valid_keys(key, kind):
    assert is_valid_key(key)
    assert key_kind(key) == kind


@pytest.mark.parametrize(
    "key",
    [
        "",
        None,
        "jenkins-java-maven-myapp",
        "-",
        "-*",
        "$",
        "a-",
        "a-*-b",
        "a*",
        "a$-*",
        "a" * 64 + "$",
        "a" * 64,
        "my app",
        "java/17",
        "naïve",
        "a\x00b",
        17,
    ],
)
def test_other_values_are_not_keys(key):
    assert not is_valid_key(key)


def test_keynode_refuses_a_full_label_as_key():
    row = KeyNode(key="jenkins-java-maven-myapp", node="n1", count=1)
    with pytest.raises(ValidationError) as refused:
        row.full_clean()
    assert "is none of these" in str(refused.value)
    for key in ("myapp", "jenkins-java-*", "jenkins-java-maven-myapp$"):
        KeyNode(key=key, node="n1", count=1).full_clean()


def test_admin_add_form_refuses_a_full_label_and_explains_keys(admin_client):
    form = admin_client.get("/admin/history/keynode/add/").content.decode()
    assert "One segment of a pipeline label" in form
    response = admin_client.post(
        "/admin/history/keynode/add/",
        {"key": "jenkins-java-maven-myapp", "node": "n1", "count": "3"},
    )
    assert response.status_code == 200
    assert "a label prefix ending in" in response.content.decode()
    response = admin_client.post(
        "/admin/history/keynode/add/",
        {"key": "x" * 64, "node": "n1", "count": "3"},
    )
    assert response.status_code == 200
    assert not KeyNode.objects.exists()
    assert not CountAdjustment.objects.exists()


@pytest.mark.parametrize("key", ["jenkins-java-*", "jenkins-java-maven-myapp$", "a-b"])
def test_policies_refuse_label_path_keys(key):
    """Policies are looked up by the label's segments: one on a path key would
    never apply, so the form says so instead of saving it."""
    for policy in (
        KeyPolicy(key=key, weight=2.0),
        NodePolicy(key=key, node="n1", action="pin"),
    ):
        with pytest.raises(ValidationError) as refused:
            policy.full_clean()
        assert "is not a label segment" in str(refused.value)
    KeyPolicy(key="jenkins", weight=2.0).full_clean()
    NodePolicy(key="myapp", node="n1", action="ban").full_clean()

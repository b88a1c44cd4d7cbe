"""Distinct labels are distinct pipelines: `team--build` and `team-build` share
their first prefix (`team-*`) and nothing else, through the real watcher, prioritize,
the webhook and migration 0015, which rebuilds the rows written by the old rule."""

import orjson
import pytest
from django.core.management import call_command
from rest_framework.test import APIClient

from history import audit
from history.labels import key_kind, path_keys, placement_keys
from history.ledger import increment_key_nodes, record_placement
from history.models import KeyNode, Placement
from tests.admission_reviews import answer, new_pod, patched, preferred_nodes, review
from tests.fakeapi import make_pod
from tests.helpers import watch_once

pytestmark = pytest.mark.django_db(transaction=True)

# node -> the pipeline that ran there three times.
RAN = {
    "double-dash": "team--build",
    "single-dash": "team-build",
    "sibling": "team-test",
}
NODES = [*RAN, "fresh"]


def test_path_keys_keep_empty_segments():
    assert path_keys("team--build") == ["team-*", "team--*", "team--build$"]
    assert path_keys("team-build") == ["team-*", "team-build$"]
    shared = set(placement_keys("team--build")) & set(placement_keys("team-build"))
    assert {key for key in shared if key_kind(key) != "segment"} == {"team-*"}
    # Segment keys (what `seed` reads and the import writes) ignore empty segments.
    assert placement_keys("team--build")[:2] == ["team", "build"]


@pytest.fixture
def history(server, tmp_path, warm):
    for node, label in RAN.items():
        for i in range(3):
            server.add_pod(
                make_pod(f"{node}-{i}", label=label, node=node, phase="Succeeded")
            )
    watch_once(server, tmp_path)
    assert Placement.objects.count() == 9


def prioritize(label):
    body = {
        "Pod": {"metadata": {"name": "p", "labels": {"ks-pipeline": label}}},
        "Nodes": None,
        "NodeNames": NODES,
    }
    response = APIClient().post(
        "/scheduler/priorities/pipeline",
        orjson.dumps(body),
        content_type="application/json",
    )
    assert response.status_code == 200, response.content
    return {entry["Host"]: entry["Score"] for entry in orjson.loads(response.content)}


@pytest.mark.parametrize(
    ("label", "own", "other"),
    [
        ("team-build", "single-dash", "double-dash"),
        ("team--build", "double-dash", "single-dash"),
    ],
)
def test_the_other_label_is_only_a_shared_prefix(history, label, own, other):
    scores = prioritize(label)
    assert scores[own] > scores[other] == scores["sibling"] > scores["fresh"]
    pod = new_pod(label=label)
    weights = preferred_nodes(patched(pod, answer(APIClient(), review(pod))))
    # A shared prefix alone may score below steering.MIN_TERM_SCORE: no term (0).
    assert weights[own] > weights.get(other, 0) == weights.get("sibling", 0)


def old_path_keys(label):
    segments = [segment for segment in label.split("-") if segment]
    return [
        *("-".join(segments[:n]) + "-*" for n in range(1, len(segments) + 1)),
        "-".join(segments) + "$",
    ]


def path_rows():
    return {
        (row.key, row.node): (row.count, round(row.decayed_weight, 6))
        for row in KeyNode.objects.all()
        if key_kind(row.key) != "segment"
    }


def test_migration_0015_rebuilds_the_rows_the_old_rule_wrote():
    for i, (label, node) in enumerate(
        [("team--build", "n1"), ("team-build", "n1"), ("team--build", "n2")] * 2
    ):
        record_placement(
            pod_uid=f"u{i}", namespace="ci", name=f"p{i}", label=label, node=node
        )
    written = path_rows()
    # The rows the old rule wrote for `team--build`: under `team-build`'s keys.
    for node, number in (("n1", 2), ("n2", 2)):
        new = [k for k in placement_keys("team--build") if key_kind(k) != "segment"]
        KeyNode.objects.filter(key__in=new, node=node).exclude(key="team-*").update(
            count=0
        )
        KeyNode.objects.filter(count=0).delete()
        increment_key_nodes(
            keys=[k for k in old_path_keys("team--build") if k != "team-*"],
            node=node,
            by=number,
        )
    assert path_rows() != written
    assert audit.audit_counts()[1] != []

    call_command("migrate", "history", "0014", verbosity=0)
    call_command("migrate", "history", verbosity=0)

    rebuilt = path_rows()
    assert {pair: count for pair, (count, _) in rebuilt.items()} == {
        pair: count for pair, (count, _) in written.items()
    }
    assert audit.audit_counts()[1] == []

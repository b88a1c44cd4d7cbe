"""Webhook mode: `POST /webhook/mutate` answers AdmissionReviews for pipeline pods.

Reviews are shaped as the API server sends them; every patch is applied to the pod
and the result validated against the Pod schema of kubernetes-validate.
"""

import copy
import time

import orjson
import pytest
from django.db import connection
from django.test import override_settings
from rest_framework.test import APIClient

from extender.scoring.steering import process_memory
from history.ledger import record_placement
from history.models import NodePolicy
from tests.admission_reviews import (
    PREFERRED,
    UID,
    answer,
    apply_patch,
    decoded_patch,
    new_pod,
    patched,
    post,
    preferred_nodes,
    review,
)
from tests.helpers import ran

EXPLAIN_URL = "/scheduler/explain?mode=webhook"

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("warm")]


@pytest.fixture
def client():
    return APIClient()


@pytest.fixture
def history():
    """ci-java-app: exact on n1 and n3, java on n2, ci on n4; n5 ran another label."""
    for node, keys, times in [
        ("n1", ["ci", "java", "app"], 5),
        ("n2", ["ci", "java"], 3),
        ("n3", ["ci", "java", "app"], 5),
        ("n4", ["ci"], 40),
        ("n5", ["go"], 9),
    ]:
        for _ in range(times):
            ran("-".join(keys), node)


def heaviest(response):
    """The node of the first (heaviest) term the patch adds."""
    return next(iter(preferred_nodes(apply_patch(new_pod(), decoded_patch(response)))))


# --- the patch ------------------------------------------------------------------------


def test_pipeline_pod_gets_one_preferred_term_per_warm_node(client, history):
    pod = new_pod()
    response = answer(client, review(pod))
    assert set(response) == {"uid", "allowed", "patchType", "patch"}
    assert decoded_patch(response) == [
        {
            "op": "add",
            "path": "/spec/affinity",
            "value": {
                "nodeAffinity": {
                    PREFERRED: [
                        {
                            "weight": weight,
                            "preference": {
                                "matchFields": [
                                    {
                                        "key": "metadata.name",
                                        "operator": "In",
                                        "values": [node],
                                    }
                                ]
                            },
                        }
                        for node, weight in [
                            ("n1", 100),
                            ("n3", 100),
                            ("n2", 56),
                            ("n4", 33),
                        ]
                    ]
                }
            },
        }
    ]
    result = patched(pod, response)
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in str(result)
    # Nothing but the affinity changed.
    del result["spec"]["affinity"]
    assert result == pod


def test_at_most_max_nodes_are_named(client, history):
    with override_settings(KSSCHED_WEBHOOK_MAX_NODES=2):
        response = answer(client, review(new_pod()))
    assert preferred_nodes(patched(new_pod(), response)) == {"n1": 100, "n3": 100}


def test_busy_nodes_get_lighter_weights_and_pins_count(client, history):
    record_placement(
        pod_uid="u1", namespace="ci", name="a", label="ci-java-app", node="n3"
    )
    NodePolicy.objects.create(key="java", node="n9", action="pin")
    NodePolicy.objects.create(key="ci", node="n4", action="ban")
    weights = preferred_nodes(patched(new_pod(), answer(client, review(new_pod()))))
    # n3 runs a pod of the label: anti-hotspot (-2) and load above the mean of the
    # nodes with history (-2) take it from 10 to 6; n9 is pinned, n4 banned.
    assert weights == {"n9": 100, "n1": 100, "n3": 56, "n2": 56}


EXISTING = {
    "pod anti-affinity only": {
        "podAntiAffinity": {
            PREFERRED: [
                {
                    "weight": 50,
                    "podAffinityTerm": {
                        "labelSelector": {"matchLabels": {"app": "x"}},
                        "topologyKey": "kubernetes.io/hostname",
                    },
                }
            ]
        }
    },
    "required node affinity": {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {
                                "key": "kubernetes.io/arch",
                                "operator": "In",
                                "values": ["amd64"],
                            }
                        ]
                    }
                ]
            }
        }
    },
    "own preferred terms": {
        "nodeAffinity": {
            PREFERRED: [
                {
                    "weight": 7,
                    "preference": {
                        "matchExpressions": [
                            {"key": "pool", "operator": "In", "values": ["ci"]}
                        ]
                    },
                }
            ]
        }
    },
}


@pytest.mark.parametrize("name", sorted(EXISTING))
def test_existing_affinity_and_tolerations_are_kept(client, history, name):
    pod = new_pod(affinity=copy.deepcopy(EXISTING[name]))
    pod["spec"]["tolerations"].append(
        {"key": "ci", "operator": "Equal", "value": "true", "effect": "NoSchedule"}
    )
    result = patched(pod, answer(client, review(pod)))
    assert result["spec"]["tolerations"] == pod["spec"]["tolerations"]
    affinity = result["spec"]["affinity"]
    for key, value in EXISTING[name].items():
        if key != "nodeAffinity":
            assert affinity[key] == value
            continue
        for field, original in value.items():
            if field == PREFERRED:
                assert affinity[key][field][: len(original)] == original
            else:
                assert affinity[key][field] == original
    terms = affinity["nodeAffinity"][PREFERRED]
    own = len(EXISTING[name].get("nodeAffinity", {}).get(PREFERRED, []))
    assert len(terms) == own + 4
    assert {t["weight"] for t in terms[own:]} == {100, 56, 33}


# --- no patch -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (review(new_pod(), operation="UPDATE"), "not a create"),
        (review(new_pod(), kind="Deployment", group="apps"), "not a pod"),
        (review(new_pod(label=None)), "no pipeline label"),
        (review(new_pod(label="")), "no segment"),
        (review(new_pod(nodeName="n1")), "node already named"),
        (review(new_pod(schedulerName="ks-scheduler")), "the extender scores it"),
        (review(new_pod(label="never-ran")), "no history"),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_no_patch_and_no_warning(client, history, body, why):
    assert answer(client, body) == {"uid": UID, "allowed": True}, why


# --- errors ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b"[1, 2]", "must be a JSON object (AdmissionReview), not list"),
        (b'{"apiVersion": "admission.k8s.io/v1"', "malformed JSON"),
        (b"", "expected apiVersion admission.k8s.io/v1 and kind AdmissionReview"),
        (
            {**review(new_pod()), "apiVersion": "admission.k8s.io/v1beta1"},
            "expected apiVersion admission.k8s.io/v1 and kind AdmissionReview",
        ),
        ({**review(new_pod()), "kind": "Pod"}, "kind AdmissionReview, got"),
        ({**review(new_pod()), "request": None}, "request must be an object"),
        (
            {**review(new_pod()), "request": {"object": new_pod()}},
            "request.uid must be a string",
        ),
    ],
)
def test_not_an_admission_review_is_a_400_with_a_message(client, body, message):
    response = post(client, body)
    assert response.status_code == 400
    assert message in orjson.loads(response.content)["detail"]


def test_a_body_that_is_not_json_is_a_400(client):
    response = post(client, b"uid=1", content_type="application/x-www-form-urlencoded")
    assert response.status_code == 400
    assert "Unsupported media type" in orjson.loads(response.content)["detail"]


def spec_with(**fields):
    pod = new_pod()
    pod["spec"].update(fields)
    return pod


@pytest.mark.parametrize(
    ("pod", "message"),
    [
        ("a pod", "the review carries no Pod object"),
        ({"metadata": [], "spec": {}}, "Pod.metadata must be an object"),
        (
            {"metadata": {"labels": "x"}, "spec": {}},
            "Pod.metadata.labels must be an object",
        ),
        (
            {"metadata": {"labels": {"ks-pipeline": 3}}},
            "Pod label 'ks-pipeline' must be a string",
        ),
        ({"metadata": {"labels": {"ks-pipeline": "ci-java-app"}}}, "spec is missing"),
        (spec_with(affinity=[]), "spec.affinity is not an object"),
        (spec_with(affinity={"nodeAffinity": 1}), "nodeAffinity is not an object"),
        (
            spec_with(affinity={"nodeAffinity": {PREFERRED: {}}}),
            f"{PREFERRED} is not a list",
        ),
    ],
)
def test_a_pod_that_cannot_be_handled_is_admitted_with_a_warning(
    client, history, pod, message
):
    response = answer(client, review(pod))
    assert set(response) == {"uid", "allowed", "warnings"}
    (warning,) = response["warnings"]
    assert warning.startswith("ks-scheduler: no node preferences added: ")
    assert message in warning


def test_a_database_error_admits_the_pod_with_a_warning_fast(client, history):
    table = connection.ops.quote_name("history_keynode")
    with connection.cursor() as cursor:
        cursor.execute(f"ALTER TABLE {table} RENAME TO kssched_moved_away")
    started = time.perf_counter()
    response = answer(client, review(new_pod()))
    assert time.perf_counter() - started < 0.5
    assert response == {
        "uid": UID,
        "allowed": True,
        "warnings": ["ks-scheduler: no node preferences added: history unavailable"],
    }


# --- bursts ---------------------------------------------------------------------------


def test_a_burst_of_reviews_is_spread_over_the_equally_warm_nodes(client, history):
    targets = [heaviest(answer(client, review(new_pod()))) for _ in range(6)]
    # The steered pods count for the load rule too: once n1 and n3 each run one
    # above the pool's mean, n2 (warm for ci-java only) is ahead of them.
    assert targets == ["n1", "n3", "n2", "n1", "n3", "n2"]
    # The second pod of the burst finds n1 with a pod of the label (10 -> 8) and a
    # pipeline pod above the mean (8 -> 6, weight 56).
    process_memory().clear()
    answer(client, review(new_pod()))
    weights = preferred_nodes(patched(new_pod(), answer(client, review(new_pod()))))
    assert weights == {"n3": 100, "n1": 56, "n2": 56, "n4": 33}


def test_steered_pods_are_forgotten_after_the_window(client, history):
    with override_settings(KSSCHED_WEBHOOK_MEMORY_SECONDS=0.2):
        first = heaviest(answer(client, review(new_pod())))
        second = heaviest(answer(client, review(new_pod())))
        time.sleep(0.3)
        third = heaviest(answer(client, review(new_pod())))
    assert (first, second, third) == ("n1", "n3", "n1")


def test_dry_runs_and_explain_leave_the_memory_alone(client, history):
    for _ in range(3):
        response = answer(client, review(new_pod(), dry_run=True))
        assert heaviest(response) == "n1"
    explained = post(client, {"Pod": new_pod(), "NodeNames": ["n1"]}, EXPLAIN_URL)
    assert explained.status_code == 200
    assert heaviest(answer(client, review(new_pod()))) == "n1"
    assert heaviest(answer(client, review(new_pod()))) == "n3"


# --- explain --------------------------------------------------------------------------


def test_explain_in_webhook_mode_shows_the_terms_and_why(client, history):
    answer(client, review(new_pod()))
    with override_settings(KSSCHED_WEBHOOK_MAX_NODES=3):
        response = post(client, {"Pod": new_pod()}, EXPLAIN_URL)
    assert response.status_code == 200
    body = orjson.loads(response.content)
    assert body["mode"] == "webhook"
    assert body["strategy"] == "warm"
    assert body["label"] == "ci-java-app"
    assert body["patched"] is True
    assert [t["weight"] for t in body["terms"]] == [100, 56, 56]
    assert body["patch"][0]["path"] == "/spec/affinity"
    rows = {row["node"]: row for row in body["nodes"]}
    assert set(rows) == {"n1", "n2", "n3", "n4"}
    assert rows["n1"]["steered_pods"] == 1
    assert rows["n1"]["active_pods"] == 1
    assert rows["n1"]["hotspot_penalty"] == 2
    assert rows["n1"]["load_penalty"] == 2
    assert rows["n1"]["term"] == "weight 56 from score 6"
    assert rows["n3"]["weight"] == 100
    assert rows["n4"]["weight"] is None
    assert rows["n4"]["term"] == "none: beyond the 3 warmest nodes"


def test_explain_in_webhook_mode_says_why_a_pod_gets_nothing(client, history):
    body = orjson.loads(
        post(
            client, {"Pod": new_pod(schedulerName="ks-scheduler")}, EXPLAIN_URL
        ).content
    )
    assert body["patched"] is False and body["terms"] == [] and body["nodes"] == []
    assert "the extender scores it" in body["reason"]
    body = orjson.loads(post(client, {"Pod": new_pod("zz-top")}, EXPLAIN_URL).content)
    assert body["reason"] == "no node with history scores 4 or more"


def test_explain_refuses_an_unknown_mode(client):
    response = post(client, {"Pod": new_pod()}, "/scheduler/explain?mode=sidecar")
    assert response.status_code == 400
    assert "unknown mode 'sidecar'" in orjson.loads(response.content)["Error"]

"""Node names the API server would reject never enter the history, and rows stored
before the rule never reach a webhook patch; a system check lists them."""

import base64
import io

import orjson
import pytest
from django.core.management import call_command

from history.models import KeyNode, NodePolicy
from history.nodenames import is_valid_node_name
from tests.helpers import ran

pytestmark = pytest.mark.django_db

BAD_NAMES = ["Worker_7", "Pinned.Node-UPPER", "node-", "-node", "a..b", "n" * 254]
GOOD_NAMES = ["worker-7", "ip-10-0-1-7.ec2.internal", "n" * 253, "7"]


def test_the_rule_is_kubernetes_dns_subdomain():
    assert [is_valid_node_name(name) for name in GOOD_NAMES] == [True] * 4
    assert [is_valid_node_name(name) for name in BAD_NAMES] == [False] * 6
    assert not is_valid_node_name("node\n")
    assert not is_valid_node_name("node\x00")


@pytest.mark.parametrize(
    "node, message",
    [
        ("Worker_7", "is not a Kubernetes node name"),
        ("Pinned.Node-UPPER", "is not a Kubernetes node name"),
        ("n" * 254, "has at most 253 characters"),
    ],
)
def test_the_admin_refuses_a_key_on_a_node_kubernetes_would_reject(
    admin_client, node, message
):
    response = admin_client.post(
        "/admin/history/keynode/add/", {"key": "gitlab", "node": node, "count": "3"}
    )
    assert response.status_code == 200
    assert message in response.content.decode()
    assert not KeyNode.objects.exists()


def test_the_admin_refuses_a_node_policy_kubernetes_would_reject(admin_client):
    response = admin_client.post(
        "/admin/history/nodepolicy/add/",
        {"key": "gitlab", "node": "Pinned.Node-UPPER", "action": "pin", "note": ""},
    )
    assert response.status_code == 200
    assert "is not a Kubernetes node name" in response.content.decode()
    assert not NodePolicy.objects.exists()
    response = admin_client.post(
        "/admin/history/nodepolicy/add/",
        {"key": "gitlab", "node": "pinned.node-7", "action": "pin", "note": ""},
    )
    assert response.status_code == 302
    assert NodePolicy.objects.get().node == "pinned.node-7"


def stored_bad_rows():
    """History and a pin written before node names were checked."""
    for _ in range(5):
        ran("gitlab", node="worker-1")
        ran("gitlab", node="Worker_7")
    NodePolicy.objects.create(key="gitlab", node="Pinned.Node-UPPER", action="pin")


def mutate(client, label="gitlab"):
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"namespace": "ci", "name": "p", "labels": {"ks-pipeline": label}},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }
    body = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "u-1",
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "operation": "CREATE",
            "namespace": "ci",
            "object": pod,
        },
    }
    response = client.post("/webhook/mutate", body, content_type="application/json")
    assert response.status_code == 200
    return orjson.loads(response.content)["response"]


@pytest.mark.usefixtures("warm")
def test_stored_bad_names_never_reach_a_webhook_patch(client):
    stored_bad_rows()
    answer = mutate(client)
    patch = orjson.loads(base64.b64decode(answer["patch"]))
    terms = patch[0]["value"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    named = [term["preference"]["matchFields"][0]["values"][0] for term in terms]
    assert named == ["worker-1"]


@pytest.mark.usefixtures("warm")
def test_explain_says_a_bad_name_gets_no_term(client):
    stored_bad_rows()
    body = {"Pod": {"metadata": {"labels": {"ks-pipeline": "gitlab"}}, "spec": {}}}
    response = client.post(
        "/scheduler/explain?mode=webhook", body, content_type="application/json"
    )
    assert response.status_code == 200
    data = orjson.loads(response.content)
    named = [t["preference"]["matchFields"][0]["values"][0] for t in data["terms"]]
    assert named == ["worker-1"]
    rows = {row["node"]: row["term"] for row in data["nodes"]}
    assert rows["Worker_7"] == "none: not a Kubernetes node name (see manage.py check)"
    assert rows["Pinned.Node-UPPER"].startswith("none: not a Kubernetes node name")


def test_a_system_check_lists_stored_bad_names():
    stored_bad_rows()
    out, err = io.StringIO(), io.StringIO()
    call_command("check", databases=["default"], stdout=out, stderr=err)
    text = out.getvalue() + err.getvalue()
    assert "(history.W001) 1 node name(s) in keys on nodes" in text
    assert "'Worker_7'" in text
    assert "(history.W002) 1 node name(s) in node policies" in text
    assert "'Pinned.Node-UPPER'" in text

"""`decide`: when a pod state counts, and how. Pure: no database, no server."""

from datetime import UTC, datetime

import pytest

from history.watcher.options import Options
from history.watcher.pods import (
    FINISH,
    IGNORE,
    RECORD,
    REJECT,
    SKIP,
    Decision,
    NewPlacement,
    decide,
)
from tests.fakeapi import make_pod

OPTIONS = Options(scheduler_name="ks-scheduler", pipeline_label="ks-pipeline")
RUNNING = Options(
    scheduler_name="ks-scheduler", pipeline_label="ks-pipeline", count_when="running"
)


def pod(**kw):
    kw.setdefault("uid", "u-1")
    kw.setdefault("namespace", "ci")
    return make_pod("p", **kw)


def test_a_bound_pipeline_pod_is_recorded_with_its_fields():
    decision = decide(
        pod(node="n1", label="jenkins-java", rv="7"),
        options=OPTIONS,
        event_type="MODIFIED",
    )
    assert decision == Decision(
        RECORD,
        "u-1",
        placement=NewPlacement(
            pod_uid="u-1",
            namespace="ci",
            name="p",
            label="jenkins-java",
            node="n1",
            bound_at=datetime(2026, 1, 1, tzinfo=UTC),
            resource_version="7",
        ),
        finish=False,
    )


@pytest.mark.parametrize("event_type", ["LISTED", "ADDED", "MODIFIED", "DELETED"])
def test_every_event_type_and_a_listed_item_record_a_bound_pod(event_type):
    decision = decide(pod(node="n1"), options=OPTIONS, event_type=event_type)
    assert decision.action == RECORD
    assert decision.finish is (event_type == "DELETED")


@pytest.mark.parametrize(
    "kw",
    [
        {"label": "pipe"},  # not bound yet
        {"node": "n1", "label": None},  # no pipeline label
        {"node": "n1", "scheduler": "default-scheduler"},
    ],
)
def test_pods_that_do_not_count_are_ignored(kw):
    assert decide(pod(**kw), options=OPTIONS, event_type="ADDED").action == IGNORE


def test_another_schedulers_pod_is_ignored_even_when_it_ends():
    other = pod(node="n1", scheduler="default-scheduler", phase="Failed")
    assert decide(other, options=OPTIONS, event_type="DELETED").action == IGNORE


@pytest.mark.parametrize("phase", ["Succeeded", "Failed"])
def test_an_ended_pod_is_recorded_and_finished(phase):
    decision = decide(pod(node="n1", phase=phase), options=OPTIONS, event_type="ADDED")
    assert (decision.action, decision.finish) == (RECORD, True)


def test_a_deleted_event_without_the_label_is_not_an_end():
    # The label was removed: the pod still runs, and its placement stays open.
    decision = decide(pod(node="n1", label=None), options=OPTIONS, event_type="DELETED")
    assert decision.action == IGNORE
    assert decision.finish is False


def test_an_unbound_pod_never_finishes():
    decision = decide(pod(phase="Failed"), options=OPTIONS, event_type="DELETED")
    assert (decision.action, decision.finish) == (IGNORE, False)


@pytest.mark.parametrize("label", ["--", "jenkins-java$", "a" * 64])
def test_a_pod_whose_label_is_not_a_label_value_is_skipped_but_finishes(label):
    decision = decide(
        pod(node="n1", label=label, phase="Succeeded"),
        options=OPTIONS,
        event_type="MODIFIED",
    )
    assert (decision.action, decision.uid, decision.finish) == (SKIP, "u-1", True)
    assert decision.label == label
    assert "not a valid Kubernetes label value" in decision.reason
    # The ended pod's times go with it: here none are usable.
    assert decision.timings is not None and decision.timings.unusable


@pytest.mark.parametrize(
    ("phase", "action", "finish"),
    [
        ("Pending", IGNORE, False),
        ("Running", RECORD, False),
        ("Succeeded", RECORD, True),
        ("Failed", FINISH, True),  # never ran: not counted, but closed if recorded
    ],
)
def test_count_when_running_waits_for_the_running_phase(phase, action, finish):
    decision = decide(pod(node="n1", phase=phase), options=RUNNING, event_type="ADDED")
    assert (decision.action, decision.finish) == (action, finish)


def test_bound_at_is_none_without_a_true_pod_scheduled_condition():
    bound = pod(node="n1")
    bound["status"]["conditions"][0]["status"] = "False"
    decision = decide(bound, options=OPTIONS, event_type="ADDED")
    assert decision.placement.bound_at is None


@pytest.mark.parametrize(
    "obj",
    [
        None,
        "text",
        {},
        {"metadata": {"name": "p"}, "spec": {}},  # no uid
        {"metadata": {"uid": "u"}, "spec": "not a dict"},
        {"metadata": {"uid": "u"}, "spec": {}, "status": ["not a dict"]},
        {"metadata": ["not a dict"], "spec": {}},
    ],
)
def test_objects_that_are_not_readable_pods_are_invalid(obj):
    assert decide(obj, options=OPTIONS, event_type="ADDED").action == REJECT


def test_labels_and_node_names_that_are_not_strings_do_not_count():
    odd = pod(node="n1")
    odd["metadata"]["labels"]["ks-pipeline"] = {"not": "text"}
    assert decide(odd, options=OPTIONS, event_type="ADDED").action == IGNORE
    odd = pod(node="n1")
    odd["spec"]["nodeName"] = 7
    assert decide(odd, options=OPTIONS, event_type="ADDED").action == IGNORE


def test_missing_spec_and_status_mean_a_pod_of_no_scheduler():
    bare = {"metadata": {"uid": "u", "name": "p"}}
    assert decide(bare, options=OPTIONS, event_type="ADDED").action == IGNORE

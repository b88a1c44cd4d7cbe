"""Webhook mode: the watcher counts pipeline pods whatever scheduler placed them."""

import pytest
from django.test import override_settings

from history.models import KeyNode, Placement
from history.watcher.heartbeat import Heartbeat
from history.watcher.loop import Stream
from history.watcher.options import Options
from history.watcher.pods import PodHandler
from tests.fakeapi import (
    ListAction,
    WatchAction,
    event,
    make_pod,
)
from tests.helpers import placement_counts

pytestmark = pytest.mark.django_db(transaction=True)


def stream_for(api_client, **settings_overrides):
    with override_settings(**settings_overrides):
        options = Options.from_settings(server_timeout=(2, 3))
    return Stream(
        api_client, PodHandler(options), options=options, heartbeat=Heartbeat(None)
    )


EVENTS = [
    event("ADDED", make_pod("a", uid="u-a", node="n1", label="ci-java")),
    event(
        "ADDED",
        make_pod(
            "b", uid="u-b", node="n2", label="ci-go", scheduler="default-scheduler"
        ),
    ),
    event(
        "ADDED",
        make_pod("c", uid="u-c", node="n2", label=None, scheduler="default-scheduler"),
    ),
]


def test_any_scheduler_setting_counts_pods_of_the_default_scheduler(server, api):
    server.script(ListAction([], "1"), WatchAction(EVENTS))
    stream = stream_for(api, KSSCHED_WATCH_ANY_SCHEDULER=True)
    stream.start()
    assert stream.watch_once() is True
    assert set(Placement.objects.values_list("pod_uid", flat=True)) == {"u-a", "u-b"}
    counts = {(k.key, k.node): k.count for k in KeyNode.objects.all()}
    assert counts == placement_counts(("ci-java", "n1"), ("ci-go", "n2"))
    assert counts[("ci-java$", "n1")] == counts[("go", "n2")] == 1
    watch = server.watch_requests("pods")[0]
    assert watch.query["labelSelector"] == "ks-pipeline"
    assert "fieldSelector" not in watch.query or not watch.query["fieldSelector"]


def test_without_the_setting_only_ks_scheduler_pods_count(server, api):
    server.script(ListAction([], "1"), WatchAction(EVENTS))
    stream = stream_for(api, KSSCHED_WATCH_ANY_SCHEDULER=False)
    stream.start()
    assert stream.watch_once() is True
    assert list(Placement.objects.values_list("pod_uid", flat=True)) == ["u-a"]
    watch = server.watch_requests("pods")[0]
    assert watch.query["fieldSelector"] == "spec.schedulerName=ks-scheduler"

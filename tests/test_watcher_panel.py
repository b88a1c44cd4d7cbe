"""The admin's watcher panel tells the truth: lists count, every stream shows, and a
heartbeat older than the probe's limit is marked stale."""

import io
import re
import signal
from datetime import timedelta

import pytest
from django.core.management import call_command
from django.test import override_settings
from django.utils import timezone

from history.models import WatchState
from history.watcher.heartbeat import default_max_age
from tests.fakeapi import FakeApiServer, make_node, make_pod, write_kubeconfig


def stream_row(html: str, name: str) -> str:
    """The text of one stream's row in the panel, tags removed."""
    row = re.search(rf'<tr id="ks-stream-{name}".*?</tr>', html, re.S)
    assert row, f"no row for the {name} stream"
    return " ".join(re.sub(r"<[^>]+>", " ", row.group(0)).split())


def heartbeat_note(html: str) -> str:
    note = re.search(
        r'<p class="[^"]*" id="ks-watcher-heartbeat">(.*?)</p>', html, re.S
    )
    return " ".join(re.sub(r"<[^>]+>", " ", note.group(1)).split())


@pytest.mark.django_db(transaction=True)
def test_a_first_list_shows_in_the_panel(admin_client, tmp_path):
    with FakeApiServer(bookmark_interval=0.3) as server:
        for number in range(3):
            server.add_node(make_node(f"node-{number}"))
        server.add_pods(
            make_pod(f"build-{n}", label="ci-java", node=f"node-{n % 3}")
            for n in range(40)
        )
        previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
        try:
            with override_settings(
                KSSCHED_HEARTBEAT_PATH=str(tmp_path / "heartbeat"),
                KSSCHED_WATCHER_METRICS_BIND="",
                KSSCHED_WATCH_READ_TIMEOUT=1.0,
                KSSCHED_WATCH_SERVER_TIMEOUT_MIN=1,
                KSSCHED_WATCH_SERVER_TIMEOUT_MAX=2,
            ):
                call_command(
                    "watch_pods",
                    kubeconfig=str(write_kubeconfig(tmp_path, server.url)),
                    once=True,
                    stdout=io.StringIO(),
                )
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
    html = admin_client.get("/admin/").content.decode()
    pods = stream_row(html, "pods")
    assert "40 placements" in pods
    assert "none since the list" in pods
    assert "never" not in pods
    assert "stale" not in heartbeat_note(html)


@pytest.mark.django_db
@override_settings(KSSCHED_WATCH_NODES=True)
def test_every_stream_is_shown_even_before_it_reports(admin_client):
    WatchState.objects.create(name="pods", heartbeat_at=timezone.now(), relists=1)
    html = admin_client.get("/admin/").content.decode()
    assert "not reported yet" in stream_row(html, "nodes")
    assert "not reported" not in stream_row(html, "pods")


@pytest.mark.django_db
@pytest.mark.parametrize(
    "seconds_over_limit, is_stale", [(-60, False), (20, True), (3600, True)]
)
def test_a_heartbeat_older_than_the_probe_allows_is_stale(
    admin_client, seconds_over_limit, is_stale
):
    age = default_max_age() + seconds_over_limit
    WatchState.objects.create(
        name="pods",
        heartbeat_at=timezone.now() - timedelta(seconds=age),
        last_event_at=timezone.now() - timedelta(seconds=age),
        events=12,
        relists=1,
    )
    note = heartbeat_note(admin_client.get("/admin/").content.decode())
    assert ("stale" in note) is is_stale, note
    assert f"{int(default_max_age())} s" in note

"""history.watcher.health: the one reading of the watcher's progress that the admin,
/metrics, /readyz and `watcher_health` share."""

from datetime import timedelta

import pytest
from django.utils import timezone

from history.watcher import state
from history.watcher.health import (
    first_line,
    has_reported,
    seconds_since,
    stream_health,
    with_skipped_events,
)


def test_first_line_keeps_the_first_line_of_the_text():
    error = RuntimeError('connection refused\nDETAIL:  password "secret"')
    assert first_line(error) == "connection refused"


def test_first_line_of_an_error_without_text_is_its_type():
    assert first_line(ValueError("  ")) == "ValueError"


def test_seconds_since():
    now = timezone.now()
    assert seconds_since(None, now) is None
    assert seconds_since(now - timedelta(seconds=90), now) == 90


@pytest.mark.django_db
def test_streams_their_progress_and_skipped_events():
    assert not has_reported()
    assert stream_health() == []
    now = timezone.now()
    state.save_watch_state(name="pods", resource_version="7", events=3, now=now)
    state.save_watch_state(name="nodes", skipped="ADDED node a: bad", now=now)
    assert has_reported()
    streams = stream_health()
    assert [s.name for s in streams] == ["nodes", "pods"]
    nodes, pods = streams
    assert (pods.events, pods.resource_version, pods.skipped_events) == (3, "7", 0)
    assert pods.last_progress_at == now
    assert (nodes.skipped_events, nodes.last_skipped) == (1, "ADDED node a: bad")
    assert with_skipped_events(streams) == [nodes]

"""`history.timings`: a pod's startup and run time, read from its own status."""

from datetime import UTC, datetime, timedelta

import pytest

from history.timings import (
    END_BEFORE_START,
    MISSING_TIME,
    NEGATIVE_STARTUP,
    Timings,
    pod_timings,
)
from tests.fakeapi import make_pod, pod_status

T0 = datetime(2026, 11, 20, 9, 0, tzinfo=UTC)


def at(seconds):
    return T0 + timedelta(seconds=seconds)


def pod(**status):
    body = make_pod("build-1", node="n1", label="ci-java")
    body["status"] = pod_status(scheduled=T0, **status)
    return body


def test_a_pending_pod_carries_nothing_yet():
    assert pod_timings(pod()) is None
    assert pod_timings(make_pod("unbound")) is None
    assert pod_timings({"metadata": {}}) is None


def test_a_running_pod_carries_its_startup():
    assert pod_timings(pod(started=at(42))) == Timings(42.0, None, "")


def test_an_ended_pod_carries_startup_run_and_outcome():
    assert pod_timings(pod(started=at(42), finished=at(642))) == Timings(
        42.0, 600.0, "Succeeded"
    )
    assert pod_timings(pod(started=at(5), finished=at(65), exit_code=2)) == Timings(
        5.0, 60.0, "Failed"
    )


def test_init_containers_are_ignored():
    # The workspace restore runs in an init container: it lands in startup.
    timings = pod_timings(pod(init=(at(1), at(30)), started=at(31), finished=at(91)))
    assert timings == Timings(31.0, 60.0, "Succeeded")


def test_a_restarted_container_counts_from_its_first_attempt():
    timings = pod_timings(
        pod(restarted=(at(10), at(20)), started=at(25), finished=at(85))
    )
    assert timings == Timings(10.0, 75.0, "Succeeded")


def test_several_containers_earliest_start_latest_finish():
    body = pod(started=at(10), finished=at(100))
    sidecar = {
        "name": "cache",
        "state": {"terminated": {"startedAt": "2026-11-20T09:00:08Z",
                                 "finishedAt": "2026-11-20T09:02:00Z"}},
    }  # fmt: skip
    body["status"]["containerStatuses"].append(sidecar)
    assert pod_timings(body) == Timings(8.0, 112.0, "Succeeded")
    # An ended pod with a container that never terminated has no run time.
    sidecar["state"] = {"running": {"startedAt": "2026-11-20T09:00:08Z"}}
    assert pod_timings(body).unusable == MISSING_TIME


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        # Failed before any container started (image never pulled, evicted).
        ({"finished": at(60), "phase": "Failed"}, MISSING_TIME),
        ({"started": at(-5)}, NEGATIVE_STARTUP),
        ({"started": at(-5), "finished": at(60)}, NEGATIVE_STARTUP),
        ({"started": at(60), "finished": at(30)}, END_BEFORE_START),
        ({"started": "not a time", "finished": at(30)}, MISSING_TIME),
        ({"started": "2026-11-20T09:00:10", "finished": at(30)}, MISSING_TIME),
    ],
)
def test_missing_or_nonsensical_times_are_unusable(status, reason):
    timings = pod_timings(pod(**status))
    assert timings.unusable == reason
    assert (timings.startup, timings.run) == (None, None)


def test_without_a_scheduled_condition_the_times_are_unusable():
    body = make_pod("p", node="n1")
    body["status"] = pod_status(scheduled=None, started=at(3), finished=at(9))
    assert pod_timings(body) == Timings(None, None, "Succeeded", MISSING_TIME)

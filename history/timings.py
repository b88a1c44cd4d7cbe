"""How long a pipeline pod took to start and to run, read from its own status.

Pure: a Pod as the API server returns it (a dict) in, plain values out. The watcher
passes every pod state it sees; `ledger.record_outcome` keeps the first values.

- startup: from the PodScheduled condition's `lastTransitionTime` to the earliest
  `startedAt` of the pod's containers (running or terminated state, and the last
  terminated state of a restarted container). Image pulls and workspace restores
  land here.
- run: from that start to the latest container `finishedAt`, once the pod has ended
  (phase Succeeded or Failed) and every container has terminated.

Init containers are ignored. A pod whose times are missing or make no sense has
none: `Timings.unusable` names the reason, one of `UNUSABLE_REASONS`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

ENDED_PHASES = ("Succeeded", "Failed")

MISSING_TIME = "missing_time"
NEGATIVE_STARTUP = "negative_startup"
END_BEFORE_START = "end_before_start"
UNUSABLE_REASONS = (MISSING_TIME, NEGATIVE_STARTUP, END_BEFORE_START)


@dataclass(frozen=True)
class Timings:
    """What one pod state says about the pod's times and how it ended.

    `startup` is set once a container has started, `run` once the pod has ended;
    `outcome` is the final phase ("" while the pod has not ended). When `unusable`
    names a reason, `startup` and `run` are None.
    """

    startup: float | None
    run: float | None
    outcome: str
    unusable: str = ""


def pod_timings(pod: dict[str, Any]) -> Timings | None:
    """The times pod state `pod` carries, or None when it carries none yet.

    None: the pod has neither started a container nor ended (pending, pulling
    images), so there is nothing to record. An ended pod always gives Timings, with
    `unusable` set when its times cannot be used.
    """
    status = pod.get("status")
    if not isinstance(status, dict):
        return None
    phase = status.get("phase")
    outcome = phase if phase in ENDED_PHASES else ""
    containers = [
        c for c in status.get("containerStatuses") or [] if isinstance(c, dict)
    ]
    started = _earliest_start(containers)
    if started is None and not outcome:
        return None
    scheduled = scheduled_at(status)
    if started is None or scheduled is None:
        return Timings(None, None, outcome, MISSING_TIME)
    startup = (started - scheduled).total_seconds()
    if startup < 0:
        return Timings(None, None, outcome, NEGATIVE_STARTUP)
    if not outcome:
        return Timings(startup, None, outcome)
    finished = _latest_finish(containers)
    if finished is None:
        return Timings(None, None, outcome, MISSING_TIME)
    run = (finished - started).total_seconds()
    if run < 0:
        return Timings(None, None, outcome, END_BEFORE_START)
    return Timings(startup, run, outcome)


def scheduled_at(status: dict[str, Any]) -> datetime | None:
    """When the pod was bound: the PodScheduled=True condition's transition time."""
    for condition in status.get("conditions") or []:
        if (
            isinstance(condition, dict)
            and condition.get("type") == "PodScheduled"
            and condition.get("status") == "True"
        ):
            return _instant(condition.get("lastTransitionTime"))
    return None


def _earliest_start(containers: list[dict[str, Any]]) -> datetime | None:
    starts = []
    for container in containers:
        state = container.get("state") or {}
        # A restarted container's first attempt is only left in lastState.
        last = container.get("lastState") or {}
        for holder in (
            state.get("running"),
            state.get("terminated"),
            last.get("terminated"),
        ):
            if isinstance(holder, dict):
                starts.append(_instant(holder.get("startedAt")))
    known = [start for start in starts if start is not None]
    return min(known, default=None)


def _latest_finish(containers: list[dict[str, Any]]) -> datetime | None:
    """The last container's finish; None unless every container has one."""
    if not containers:
        return None
    finishes = []
    for container in containers:
        terminated = (container.get("state") or {}).get("terminated")
        finished = (
            _instant(terminated.get("finishedAt"))
            if isinstance(terminated, dict)
            else None
        )
        if finished is None:
            return None
        finishes.append(finished)
    return max(finishes)


def _instant(value: Any) -> datetime | None:
    """An RFC 3339 time as the API server writes it; None if missing or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    # A time without a zone cannot be compared with the others.
    return moment if moment.tzinfo is not None else None

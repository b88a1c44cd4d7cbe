"""What the pod watcher records about a pipeline pod's run: startup, run time and
outcome, from each pod state it sees (see `history.timings`)."""

from __future__ import annotations

from typing import Any

from history import ledger, metrics
from history.timings import pod_timings


def record_run(*, pod_uid: str, pod: dict[str, Any]) -> ledger.RecordedOutcome | None:
    """Record the times and outcome pod state `pod` carries, inside the caller's
    transaction; the first observation wins (`ledger.record_outcome`).

    Returns what `record_outcome` recorded (None when nothing ended now). The
    watcher metrics are updated once the transaction commits.
    """
    timings = pod_timings(pod)
    if timings is None:
        return None
    recorded = ledger.record_outcome(
        pod_uid=pod_uid,
        startup=timings.startup,
        run=timings.run,
        outcome=timings.outcome,
    )
    metrics.observe_outcome(recorded, unusable=timings.unusable)
    return recorded

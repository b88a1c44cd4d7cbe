"""What the pod watcher records about a pipeline pod's run: startup, run time and
outcome, from each pod state it sees (see `history.timings`)."""

from __future__ import annotations

from history import ledger
from history.timings import Timings
from history.watcher import metrics


def record_run(*, pod_uid: str, timings: Timings) -> ledger.RecordedOutcome | None:
    """Record the times and outcome a pod state carries (`timings.pod_timings`),
    inside the caller's transaction; the first observation wins
    (`ledger.record_outcome`).

    Returns what `record_outcome` recorded (None when nothing ended now). The
    watcher metrics are updated once the transaction commits.
    """
    recorded = ledger.record_outcome(
        pod_uid=pod_uid,
        startup=timings.startup,
        run=timings.run,
        outcome=timings.outcome,
    )
    metrics.observe_outcome(recorded, unusable=timings.unusable)
    return recorded

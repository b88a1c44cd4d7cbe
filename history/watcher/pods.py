"""Pipeline pods: when a pod state counts (`decide`), and writing what it means.

`decide` is a pure function of one pod object (a plain dict, as the API server sent
it) and the options: record a placement, finish one, ignore the pod, or reject an
object that is not a readable pod. `PodHandler` gives the list/watch loop its
selectors and writes decisions through `history.ledger`; every placement is keyed
on the pod UID, so writing a decision twice changes nothing.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from typing import Any

from django.conf import settings
from django.db import transaction

from history import labels, ledger
from history.timings import Timings, pod_timings, scheduled_at
from history.watcher import metrics, placement_events, runs
from history.watcher.handler import RECEIVED, RELISTING, Selectors, Step
from history.watcher.options import Options
from history.watcher.placement_events import PlacementEvents
from history.watcher.state import PODS

# Pod UIDs remembered as committed to the ledger (about 100 bytes each).
IN_LEDGER_MEMORY = 50_000
logger = logging.getLogger(__name__)

RECORD = "record"
FINISH = "finish"
IGNORE = "ignore"
REJECT = "reject"
# The pod's pipeline label is not a valid Kubernetes label value: skipped, counted.
SKIP = "skip"

# What writing a decision did (the watcher's placement metrics count these).
RECORDED = "recorded"
DUPLICATE = "duplicate"
IGNORED = "ignored"
REJECTED = "rejected"
INVALID_LABEL = "invalid_label"


@dataclass(frozen=True)
class NewPlacement:
    """The fields of a placement to record (the ledger's `record_placement`), before
    it is a `history.models.Placement` row."""

    pod_uid: str
    namespace: str
    name: str
    label: str
    node: str
    bound_at: datetime | None
    resource_version: str


@dataclass(frozen=True)
class Decision:
    """What one pod state means for the ledger.

    `action` is RECORD (with `placement`; `finish` too when the pod has already
    ended), FINISH (close the pod's ledger row, if it has one), IGNORE or REJECT
    (with `reason`), or SKIP (with `label` and `reason`: the label is not a valid
    Kubernetes label value; `finish` when the pod ended, for a row recorded before).
    """

    action: str
    uid: str = ""
    placement: NewPlacement | None = None
    finish: bool = False
    # The startup, run time and outcome this pod state carries, if any.
    timings: Timings | None = None
    reason: str = ""
    label: str = ""


def decide(pod: Any, *, options: Options, event_type: str) -> Decision:
    """Does this pod state count, and how? Pure: no database, no clock.

    A pod counts when its schedulerName is ours (or any, with `any_scheduler`), its
    pipeline label is a valid Kubernetes label value (else SKIP) with at least
    one segment, and it is bound to a node (with `count_when="running"`: once it
    runs or has succeeded). It ends when it succeeded or failed, or on a DELETED
    event that still carries the label; a DELETED event without the label means
    the label was removed while the pod keeps running.
    """
    meta, spec, status = (_mapping(pod, key) for key in ("metadata", "spec", "status"))
    if meta is None or spec is None or status is None or not meta.get("uid"):
        return Decision(REJECT, reason="no uid or spec")
    uid = meta["uid"]
    if (
        not options.any_scheduler
        and spec.get("schedulerName") != options.scheduler_name
    ):
        return Decision(IGNORE, uid, reason="another scheduler")
    label = _text((_mapping(meta, "labels") or {}).get(options.pipeline_label))
    node = _text(spec.get("nodeName"))
    phase = status.get("phase")
    ended = bool(node) and (
        phase in ("Succeeded", "Failed") or (event_type == "DELETED" and bool(label))
    )
    problem = (
        labels.label_value_problem(options.pipeline_label, label) if label else None
    )
    if label and problem:
        # The API server admits no such value; a source that does (a proxy, a
        # test server) must not write keys no real pod has (`java$` from
        # `jenkins-java$`). An ended pod still closes a row recorded before.
        return Decision(
            SKIP,
            uid,
            finish=ended,
            timings=pod_timings(pod),
            reason=problem,
            label=label,
        )
    counts_now = options.count_when == "bound" or phase in ("Running", "Succeeded")
    if label and node and counts_now and labels.split_pipeline_label(label):
        placement = NewPlacement(
            pod_uid=uid,
            namespace=meta.get("namespace", ""),
            name=meta.get("name", ""),
            label=label,
            node=node,
            bound_at=scheduled_at(status),
            resource_version=str(meta.get("resourceVersion") or ""),
        )
        return Decision(
            RECORD, uid, placement=placement, finish=ended, timings=pod_timings(pod)
        )
    if ended:
        return Decision(FINISH, uid, finish=True, timings=pod_timings(pod))
    return Decision(IGNORE, uid, reason="not counted yet", timings=pod_timings(pod))


def _mapping(obj: Any, key: str) -> dict[str, Any] | None:
    """obj[key] when obj is a dict and the value is one (a missing value is {})."""
    if not isinstance(obj, dict):
        return None
    value = obj.get(key)
    if value is None:
        return {}
    return value if isinstance(value, dict) else None


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


class PodHandler:
    """The pod stream's part of the loop: selectors, decisions, ledger writes."""

    name = PODS
    resource = "pods"
    keeps_checkpoint = True

    def __init__(
        self, options: Options, *, events: PlacementEvents | None = None
    ) -> None:
        self.options = options
        # Writes an Event on each pod entered into the ledger (None: off).
        self.events = events
        # Pods this process has seen committed to the ledger, most recent last: a
        # later event of the same pod (running, finished) skips the ledger's
        # duplicate check. Bounded; a pod that fell out is checked in the database.
        self._in_ledger: OrderedDict[str, None] = OrderedDict()
        # Invalid label values seen: each logged once (a bounded set), all counted.
        self.invalid_labels = labels.InvalidLabels()
        self.selectors = Selectors(
            namespace=options.namespace,
            label_selector=options.pipeline_label,
            field_selector=""
            if options.any_scheduler
            else f"spec.schedulerName={options.scheduler_name}",
        )

    def decide(self, type_: str, obj: dict[str, Any]) -> Decision | None:
        """The decision for one pod state; None when it has nothing to write (a
        pod ignored with no times to record: the loop then opens no transaction)."""
        decision = decide(obj, options=self.options, event_type=type_)
        if decision.action == IGNORE and decision.timings is None:
            return None
        if decision.action == REJECT:
            logger.warning("Skipping pod without uid or spec: %.300r", obj)
        elif decision.action == SKIP and self.invalid_labels.is_first(decision.label):
            meta = obj.get("metadata") or {}
            logger.warning(
                "Skipping pod %s/%s and every later pod of this label: %s",
                meta.get("namespace", ""),
                meta.get("name", ""),
                decision.reason,
            )
        return decision

    def urgent(self, event: Any) -> bool:
        """A bound pod this process has not entered in the ledger yet (or an
        event it cannot read): written at once, since prioritize counts each
        node's bound pods pod after pod. Later states of a pod (running, ended)
        may wait for the events behind them (`arrivals.LINGER_SECONDS`), and so
        may a bookmark."""
        if isinstance(event, dict) and event.get("type") == "BOOKMARK":
            return False
        obj = event.get("object") if isinstance(event, dict) else None
        meta = obj.get("metadata") if isinstance(obj, dict) else None
        spec = obj.get("spec") if isinstance(obj, dict) else None
        if not isinstance(meta, dict) or not isinstance(spec, dict):
            return True
        return bool(spec.get("nodeName")) and meta.get("uid") not in self._in_ledger

    def write(self, decisions: list[Decision]) -> list[str]:
        """Apply decisions (inside the caller's transaction); one outcome each."""
        return [self._write_one(decision) for decision in decisions]

    def _write_one(self, decision: Decision) -> str:
        if decision.action == REJECT:
            return REJECTED
        outcome = INVALID_LABEL if decision.action == SKIP else IGNORED
        if decision.placement is not None and decision.uid in self._in_ledger:
            self._in_ledger.move_to_end(decision.uid)
            outcome = DUPLICATE
        elif decision.placement is not None:
            placement = decision.placement
            entered = ledger.enter_placement(
                **vars(placement), depth=settings.KSSCHED_WORKSPACE_DEPTH != 0
            )
            outcome = RECORDED if entered is not None else DUPLICATE
            transaction.on_commit(partial(self._remember, placement.pod_uid))
            if entered is not None and self.events is not None:
                event = placement_events.recorded(
                    pod_uid=placement.pod_uid,
                    namespace=placement.namespace,
                    name=placement.name,
                    label=placement.label,
                    node=placement.node,
                    keys=labels.path_keys(placement.label),
                    entered=entered,
                )
                # After the commit: a rolled-back (retried) write says nothing.
                transaction.on_commit(partial(self.events.submit, event))
        if decision.finish:
            ledger.finish_placement(pod_uid=decision.uid)
        if decision.timings is not None:
            runs.record_run(pod_uid=decision.uid, timings=decision.timings)
        return outcome

    def _remember(self, uid: str) -> None:
        self._in_ledger[uid] = None
        if len(self._in_ledger) > IN_LEDGER_MEMORY:
            self._in_ledger.popitem(last=False)

    def observe(self, step: Step) -> None:
        """Feed the watcher's metrics; called once a step has committed."""
        if step.kind == RECEIVED:
            metrics.mark_event()
        elif step.kind == RELISTING:
            metrics.RELISTS.inc()
        else:
            metrics.WATCH_EVENTS.labels(step.kind).inc(step.number)
        for outcome in step.outcomes:
            if outcome == RECORDED:
                metrics.PLACEMENTS_RECORDED.inc()
            elif outcome == DUPLICATE:
                metrics.PLACEMENTS_DUPLICATE.inc()
            elif outcome == INVALID_LABEL:
                metrics.PODS_INVALID_LABEL.inc()

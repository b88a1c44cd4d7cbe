"""Scripted answers and injected faults: what a request gets instead of the cluster.

``FakeApiServer.script`` queues actions and ``FakeApiServer.inject`` arms faults;
``next_action`` picks the one a request consumes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.fakeapi.objects import RESOURCES, qualified_name
from tests.fakeapi.routing import RecordedRequest
from tests.fakeapi.wire import status_body

STREAM_ENDINGS = ("close", "abort", "truncate", "silent", "drip")


@dataclass
class ListAction:
    """Answer a list request with these items (200, ``<Kind>List``)."""

    items: list[dict[str, Any]]
    resource_version: str | int = "1"
    kind: str = "PodList"
    api_version: str = "v1"
    continue_token: str | None = None
    resource: str | None = None


@dataclass
class WatchAction:
    """Answer with a 200 chunked stream of events, then end as ``end`` says.

    ``end``: close (0-chunk terminator), abort (RST), truncate (half a chunk, then
    RST), silent (send nothing until the server stops or ``release()``), drip
    (``drip_count`` bookmarks ``drip_interval`` seconds apart, then close).
    """

    events: list[dict[str, Any]] = field(default_factory=list)
    end: str = "close"
    interval: float = 0.0
    drip_count: int = 3
    drip_interval: float = 1.0
    bookmark_rv: str | int | None = None
    resource: str | None = None

    def __post_init__(self) -> None:
        if self.end not in STREAM_ENDINGS:
            raise ValueError(f"unknown stream ending {self.end!r}")


@dataclass
class RawAction:
    """Answer with a 200 chunked stream of these exact chunks, then end."""

    chunks: list[bytes]
    end: str = "close"
    interval: float = 0.0
    resource: str | None = None


@dataclass
class StatusAction:
    """Answer with an HTTP error status and a ``Status`` body."""

    code: int
    reason: str | None = None
    message: str | None = None
    retry_after: int | None = None
    details: dict[str, Any] | None = None
    resource: str | None = None

    def body(self) -> dict[str, Any]:
        return status_body(self.code, self.reason, self.message, self.details)


@dataclass
class JsonAction:
    """Answer with any status and JSON body."""

    code: int
    body: Any
    headers: dict[str, str] = field(default_factory=dict)
    resource: str | None = None


@dataclass
class ClusterWatch:
    """Serve the watch from the cluster, but end after ``max_events`` events.

    Only ADDED/MODIFIED/DELETED count; ``end`` is one of the stream endings
    (``drip`` behaves like ``close`` here).
    """

    max_events: int
    end: str = "abort"
    resource: str | None = None


Action = ListAction | WatchAction | RawAction | StatusAction | JsonAction | ClusterWatch


def too_large_rv(requested: str | int, current: str | int) -> StatusAction:
    """The 504 the API server sends for a resourceVersion from the future."""
    return StatusAction(
        504,
        "Timeout",
        f"Too large resource version: {requested}, current: {current}",
        details={
            "causes": [
                {
                    "reason": "ResourceVersionTooLarge",
                    "message": "Too large resource version",
                }
            ],
            "retryAfterSeconds": 1,
        },
    )


def conflict(name: str, resource: str = "leases") -> StatusAction:
    """The 409 an update with a stale resourceVersion gets."""
    return StatusAction(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on {qualified_name(resource)} "{name}": the '
        "object has been modified; please apply your changes to the latest "
        "version and try again",
        details={"name": name, "group": RESOURCES[resource][2], "kind": resource},
    )


@dataclass
class Injection:
    """An armed fault: ``action`` for the next ``times`` matching requests."""

    action: Action
    times: int
    verb: str | None
    resource: str | None


def next_action(
    injections: list[Injection], queue: list[Action], rec: RecordedRequest
) -> Action | None:
    """Take the action this request consumes, or None to serve it from the cluster.

    An injected fault whose verb and resource fit wins; otherwise the first queued
    action whose resource fits. Consumed entries are removed from the lists
    (call with the server's lock held).
    """
    for inj in injections:
        if (inj.verb is None or inj.verb == rec.verb) and (
            inj.resource is None or inj.resource == rec.resource
        ):
            inj.times -= 1
            if inj.times <= 0:
                injections.remove(inj)
            return inj.action
    for i, action in enumerate(queue):
        if action.resource is None or action.resource == rec.resource:
            return queue.pop(i)
    return None

"""What a watched resource gives the list/watch loop (`loop.Stream`).

A handler says which objects to select, what one object means (a decision), how to
write decisions inside the loop's transaction (returning what happened), and is told
each step once it has committed. `pods.PodHandler` and `nodes.NodeHandler` are the two.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

# Step kinds besides the watch event types (ADDED, MODIFIED, DELETED, BOOKMARK).
RECEIVED = "RECEIVED"  # a raw event arrived (before anything is written)
RELISTING = "RELISTING"  # a full list starts
LISTED = "LISTED"  # a batch of listed objects committed
UNREADABLE = "INVALID"  # an unreadable event was skipped (metrics say INVALID)


@dataclass(frozen=True)
class Selectors:
    """Which objects a stream lists and watches."""

    namespace: str | None = None
    label_selector: str = ""
    field_selector: str = ""


@dataclass(frozen=True)
class Step:
    """Something the stream did: `number` objects of `kind`, and what writing did."""

    kind: str
    number: int = 1
    outcomes: Sequence[Any] = ()


class Handler(Protocol):
    """What one watched resource means to ks-scheduler."""

    name: str  # the stream's name in logs and its WatchState row
    resource: str  # "pods" or "nodes"
    selectors: Selectors
    keeps_checkpoint: bool  # resume from the saved resourceVersion (else relist)

    def decide(self, type_: str, obj: dict[str, Any]) -> Any | None:
        """What one object means; None when nothing needs writing."""

    def urgent(self, event: Any) -> bool:
        """Whether a raw watch event must be written without waiting for the
        events behind it (`arrivals.received_together`)."""

    def write(self, decisions: list[Any]) -> list[Any]:
        """Apply decisions inside the caller's transaction; one outcome each."""

    def observe(self, step: Step) -> None:
        """Told each step once it has committed (metrics, in-memory caches)."""

"""Node identity: remember which UID each node name has, so a replaced node is
noticed (history from before the replacement stops counting).

Nodes change status every few seconds; only a name with a new UID needs a write.
The stream keeps no checkpoint: node identity is level-based, so every start
relists.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from history.watcher import state
from history.watcher.handler import Selectors, Step

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class NodeSeen:
    """Node `name` was seen with `uid`, which this process has not recorded yet."""

    name: str
    uid: str


class NodeHandler:
    """The node stream's part of the loop."""

    name = state.NODES
    resource = "nodes"
    keeps_checkpoint = False
    selectors = Selectors()

    def __init__(self) -> None:
        self._known: dict[str, str] = {}

    def decide(self, type_: str, obj: dict[str, Any]) -> NodeSeen | None:
        meta = obj.get("metadata") or {}
        name, uid = meta.get("name"), meta.get("uid")
        if type_ == "DELETED" or not name or not uid or self._known.get(name) == uid:
            return None
        return NodeSeen(name, uid)

    def urgent(self, event: Any) -> bool:
        """Node identity can wait for the events behind it."""
        return False

    def write(self, decisions: list[NodeSeen]) -> list[tuple[NodeSeen, str]]:
        """Record each UID (inside the caller's transaction): new, same or replaced."""
        return [
            (seen, state.record_node_seen(name=seen.name, uid=seen.uid))
            for seen in decisions
        ]

    def observe(self, step: Step) -> None:
        for seen, outcome in step.outcomes:
            if outcome == "replaced":
                logger.info("Node %s was replaced (new uid %s)", seen.name, seen.uid)
            self._known[seen.name] = seen.uid

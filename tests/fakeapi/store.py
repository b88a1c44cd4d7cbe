"""The in-memory resource store behind cluster mode.

Pods, Nodes and Leases share one monotonically increasing resourceVersion. Every
change is kept as an event in its resource's history until ``compact`` forgets it;
a watch that asks for a forgotten resourceVersion gets 410 Gone.
"""

from __future__ import annotations

import copy
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from tests.fakeapi.objects import CREATION_TIMESTAMP, DEFAULT_NAMESPACE, RESOURCES
from tests.fakeapi.wire import event

Key = tuple[str | None, str]


@dataclass
class StoredEvent:
    """One committed change; ``old`` is the object before a MODIFIED or DELETED."""

    rv: int
    type: str
    obj: dict[str, Any]
    old: dict[str, Any] | None


class Collection:
    """Objects of one resource, keyed by (namespace, name), with their history."""

    def __init__(self) -> None:
        self.objects: dict[Key, dict[str, Any]] = {}
        self.history: list[StoredEvent] = []


class Store:
    """Every resource's objects and history, the current and the compacted rv.

    All methods take ``cond``'s lock (the server's, so it is reentrant) and a commit
    notifies it, which wakes waiting watches. Callers that read several fields
    together hold ``cond`` themselves.
    """

    def __init__(self, cond: threading.Condition) -> None:
        self.cond = cond
        self.collections = {name: Collection() for name in RESOURCES}
        self.rv = 1
        self.compacted = 0

    @staticmethod
    def key(resource: str, namespace: str | None, name: str) -> Key:
        """Return the lookup key; cluster-scoped resources ignore the namespace."""
        return (namespace if RESOURCES[resource][3] else None, name)

    def compact(self, rv: str | int | None = None) -> None:
        """Forget history up to ``rv`` (default: now); older watches get 410."""
        with self.cond:
            point = self.rv if rv is None else int(rv)
            self.compacted = max(self.compacted, point)
            for collection in self.collections.values():
                collection.history = [
                    e for e in collection.history if e.rv > self.compacted
                ]

    def events(self, resource: str) -> list[dict[str, Any]]:
        """The kept history of one resource as watch events."""
        with self.cond:
            return [
                event(e.type, copy.deepcopy(e.obj))
                for e in self.collections[resource].history
            ]

    def objects(self, resource: str) -> list[dict[str, Any]]:
        """Copies of the current objects of one resource."""
        with self.cond:
            return copy.deepcopy(list(self.collections[resource].objects.values()))

    def get(
        self, resource: str, name: str, namespace: str | None
    ) -> dict[str, Any] | None:
        """A copy of one object, or None."""
        with self.cond:
            obj = self.collections[resource].objects.get(
                self.key(resource, namespace, name)
            )
            return copy.deepcopy(obj)

    def add(self, resource: str, obj: dict[str, Any]) -> dict[str, Any]:
        """Create an object, filling in kind, namespace, uid and creationTimestamp.

        Returns the stored copy with its new resourceVersion; KeyError if it exists.
        """
        with self.cond:
            obj = copy.deepcopy(obj)
            meta = obj.setdefault("metadata", {})
            kind, api_version, _, namespaced = RESOURCES[resource]
            obj.setdefault("kind", kind)
            obj.setdefault("apiVersion", api_version)
            if namespaced:
                meta.setdefault("namespace", DEFAULT_NAMESPACE)
            else:
                meta.pop("namespace", None)
            meta.setdefault("uid", str(uuid.uuid4()))
            meta.setdefault("creationTimestamp", CREATION_TIMESTAMP)
            key = self.key(resource, meta.get("namespace"), meta["name"])
            if key in self.collections[resource].objects:
                raise KeyError(f"{resource} {key} already exists")
            return self.commit(resource, "ADDED", obj, None)

    def modify(
        self,
        resource: str,
        name: str,
        changes: Callable[[dict[str, Any]], Any] | dict[str, Any],
        namespace: str | None,
    ) -> dict[str, Any]:
        """Change an object (callable mutating a copy, or a dict deep-merged)."""
        with self.cond:
            collection = self.collections[resource]
            key = self.key(resource, namespace, name)
            if key not in collection.objects:
                raise KeyError(f"{resource} {namespace}/{name} does not exist")
            new = copy.deepcopy(collection.objects[key])
            if callable(changes):
                changes(new)
            else:
                merge(new, changes)
            return self.commit(resource, "MODIFIED", new, collection.objects[key])

    def delete(self, resource: str, name: str, namespace: str | None) -> dict[str, Any]:
        """Delete an object; KeyError if it does not exist."""
        with self.cond:
            collection = self.collections[resource]
            key = self.key(resource, namespace, name)
            if key not in collection.objects:
                raise KeyError(f"{resource} {namespace}/{name} does not exist")
            old = collection.objects[key]
            return self.commit(resource, "DELETED", copy.deepcopy(old), old)

    def commit(self, resource: str, type_: str, obj, old) -> dict[str, Any]:
        """Give ``obj`` the next resourceVersion, store it and record the event.

        ``obj`` is kept as is (callers pass a copy); returns another copy.
        """
        with self.cond:
            self.rv += 1
            obj["metadata"]["resourceVersion"] = str(self.rv)
            collection = self.collections[resource]
            key = self.key(
                resource, obj["metadata"].get("namespace"), obj["metadata"]["name"]
            )
            if type_ == "DELETED":
                collection.objects.pop(key, None)
            else:
                collection.objects[key] = obj
            collection.history.append(StoredEvent(self.rv, type_, obj, old))
            self.cond.notify_all()
            return copy.deepcopy(obj)


def merge(target: dict, changes: dict) -> None:
    """Deep-merge ``changes`` into ``target``: nested dicts merge, the rest replaces."""
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            merge(target[key], value)
        else:
            target[key] = copy.deepcopy(value)

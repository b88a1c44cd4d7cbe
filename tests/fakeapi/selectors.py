"""Label and field selectors: parsing the query parameters and matching objects."""

from __future__ import annotations

from typing import Any


class SelectorError(Exception):
    """A selector the fake does not understand; the request gets a 400."""


def lookup(obj: dict[str, Any], dotted: str) -> str | None:
    """Return the value at a dotted field path (``spec.nodeName``) as a string."""
    value: Any = obj
    for part in dotted.split("."):
        if not isinstance(value, dict):
            return None
        value = value.get(part)
    return None if value is None else str(value)


def parse_label_selector(text: str) -> list[tuple[str, str, str | None]]:
    """Return (op, key, value) terms; set-based terms (``in``, ``notin``) fail."""
    terms: list[tuple[str, str, str | None]] = []
    for raw in filter(None, (t.strip() for t in text.split(","))):
        if " in " in raw or " notin " in raw or "(" in raw:
            raise SelectorError(f"unsupported label selector {raw!r}")
        if "!=" in raw:
            key, value = raw.split("!=", 1)
            terms.append(("!=", key.strip(), value.strip()))
        elif "==" in raw or "=" in raw:
            key, value = raw.replace("==", "=").split("=", 1)
            terms.append(("=", key.strip(), value.strip()))
        elif raw.startswith("!"):
            terms.append(("!", raw[1:].strip(), None))
        else:
            terms.append(("exists", raw, None))
    return terms


def parse_field_selector(text: str) -> list[tuple[str, str, str]]:
    """Return (op, field, value) terms; only ``=``, ``==`` and ``!=`` exist."""
    terms: list[tuple[str, str, str]] = []
    for raw in filter(None, (t.strip() for t in text.split(","))):
        if "!=" in raw:
            key, value = raw.split("!=", 1)
            terms.append(("!=", key.strip(), value.strip()))
        elif "=" in raw:
            key, value = raw.replace("==", "=").split("=", 1)
            terms.append(("=", key.strip(), value.strip()))
        else:
            raise SelectorError(f"invalid field selector {raw!r}")
    return terms


class Selector:
    """The namespace, label and field selectors of one list or watch request."""

    def __init__(self, query: dict[str, str], namespace: str | None) -> None:
        self.namespace = namespace
        self.labels = parse_label_selector(query.get("labelSelector", ""))
        self.fields = parse_field_selector(query.get("fieldSelector", ""))

    def matches(self, obj: dict[str, Any] | None) -> bool:
        if obj is None:
            return False
        meta = obj.get("metadata", {})
        if self.namespace is not None and meta.get("namespace") != self.namespace:
            return False
        labels = meta.get("labels") or {}
        for op, key, value in self.labels:
            if op == "exists" and key not in labels:
                return False
            if op == "!" and key in labels:
                return False
            if op == "=" and labels.get(key) != value:
                return False
            if op == "!=" and labels.get(key) == value:
                return False
        for op, key, value in self.fields:
            actual = lookup(obj, key) or ""
            if (op == "=") != (actual == value):
                return False
        return True

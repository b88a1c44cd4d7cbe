"""Wire shapes of the extender protocol, as kube-scheduler speaks it.

kube-scheduler marshals Go structs without JSON tags, so keys are the Go field names
(`Pod`, `Nodes`, `NodeNames`; `FailedNodes`, `Error`; `Host`, `Score`) and it decodes
replies case-insensitively. Requests are read the way Go's encoding/json reads them:
an exact key wins, otherwise any letter case matches. Replies use the exact Go names.

These are plain functions rather than DRF Serializer classes: a prioritize call
carries up to thousands of nodes and the scheduler waits for the answer, so each
request is checked in one pass without building a field object per node.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import orjson
from rest_framework.exceptions import ValidationError

from extender.admission import PodShapeError, pod_label
from history.validation import first_nul_index, has_nul, nul_message


class ExtenderArgsError(ValidationError):
    """The request body is not a valid ExtenderArgs object; the message says why."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def _field(data: dict[str, Any], name: str) -> object:
    """Return data[name] the way Go matches struct fields: exact, then any case."""
    if name in data:
        return data[name]
    lowered = name.lower()
    for key, value in data.items():
        if key.lower() == lowered:
            return value
    return None


@dataclass(slots=True)
class ExtenderArgs:
    """The body of a filter or prioritize call (Go type `ExtenderArgs`).

    `nodes` is the NodeList exactly as received (`nodeCacheCapable: false`),
    `node_names` the list of names (`nodeCacheCapable: true`); the unused one is None.
    """

    pod: dict[str, Any]
    nodes: dict[str, Any] | None
    node_names: list[str] | None

    def candidate_names(self) -> list[str]:
        """The candidate node names, from whichever list the scheduler sent."""
        if self.node_names is not None:
            return self.node_names
        if self.nodes is None:
            return []
        names = []
        for position, item in enumerate(self.nodes.get("items") or ()):
            metadata = item.get("metadata") if isinstance(item, dict) else None
            name = metadata.get("name") if isinstance(metadata, dict) else None
            if not isinstance(name, str):
                raise ExtenderArgsError(
                    f"Nodes.items[{position}] has no metadata.name string"
                )
            names.append(name)
        if has_nul("".join(names)):
            raise ExtenderArgsError(
                nul_message(f"Nodes.items[{first_nul_index(names)}].metadata.name")
            )
        return names

    def candidate_count(self) -> int:
        """How many candidate nodes the scheduler sent, names unchecked."""
        if self.node_names is not None:
            return len(self.node_names)
        items = self.nodes.get("items") if self.nodes is not None else None
        return len(items or ())

    def pod_label(self, label: str) -> str | None:
        """The value of the pod's label `label`, or None when the pod lacks it.

        Raises ExtenderArgsError (a 400) for a value the API server would never
        admit (over 63 characters, or characters a label value cannot hold), before
        any history is read for it.
        """
        try:
            value = pod_label(self.pod, label)
        except PodShapeError as exc:
            raise ExtenderArgsError(exc.message) from None
        if value is None:
            return None
        return value

    def pod_ref(self) -> str:
        """`namespace/name` of the pod, for logs."""
        metadata = self.pod.get("metadata")
        if not isinstance(metadata, dict):
            return "?/?"
        return f"{metadata.get('namespace', '?')}/{metadata.get('name', '?')}"


def parse_extender_args(data: object) -> ExtenderArgs:
    """Check a decoded request body and return it as ExtenderArgs.

    Raises ExtenderArgsError (a 400) naming the first problem found: a body that is
    not an object, a missing or non-object Pod, Nodes that is not a NodeList,
    NodeNames that is not a list of strings, or a name holding a NUL character.
    """
    if not isinstance(data, dict):
        raise ExtenderArgsError(
            f"request body must be a JSON object (ExtenderArgs), "
            f"not {type(data).__name__}"
        )
    if not data:
        raise ExtenderArgsError(
            "request body is empty: expected an ExtenderArgs object with Pod, "
            "Nodes and NodeNames"
        )
    pod = _field(data, "Pod")
    if pod is None:
        raise ExtenderArgsError("missing Pod")
    if not isinstance(pod, dict):
        raise ExtenderArgsError(f"Pod must be an object, not {type(pod).__name__}")

    nodes = _field(data, "Nodes")
    if nodes is not None:
        if not isinstance(nodes, dict):
            raise ExtenderArgsError(
                f"Nodes must be a NodeList object or null, not {type(nodes).__name__}"
            )
        items = nodes.get("items")
        if items is not None and not isinstance(items, list):
            raise ExtenderArgsError("Nodes.items must be a list")

    node_names = _field(data, "NodeNames")
    if node_names is not None:
        if not isinstance(node_names, list):
            raise ExtenderArgsError(
                f"NodeNames must be a list of strings or null, "
                f"not {type(node_names).__name__}"
            )
        # str.join checks every item in C, and one search of the result finds a NUL
        # character; only a failure walks the list in Python.
        try:
            joined = "".join(node_names)
        except TypeError:
            for position, name in enumerate(node_names):
                if not isinstance(name, str):
                    raise ExtenderArgsError(
                        f"NodeNames[{position}] must be a string"
                    ) from None
        if has_nul(joined):
            raise ExtenderArgsError(
                nul_message(f"NodeNames[{first_nul_index(node_names)}]")
            )

    return ExtenderArgs(pod=pod, nodes=nodes, node_names=node_names)


def extender_filter_result(args: ExtenderArgs) -> dict[str, Any]:
    """The ExtenderFilterResult that lets every candidate node pass.

    Echoes the candidates exactly as received, in the field the scheduler reads
    (NodeNames in cache mode, Nodes otherwise). An empty or null list would reject
    every node, so nothing is ever dropped or added.
    """
    return {
        "Nodes": args.nodes,
        "NodeNames": args.node_names,
        "FailedNodes": {},
        "FailedAndUnresolvableNodes": {},
        "Error": "",
    }


def host_priority_list(
    nodes: list[str], scores: list[int]
) -> list[dict[str, str | int]]:
    """The HostPriorityList reply: `[{"Host": name, "Score": n}, ...]`."""
    return [
        {"Host": node, "Score": score}
        for node, score in zip(nodes, scores, strict=True)
    ]


def unique_names(names: list[str]) -> list[str]:
    """`names` without repeats, first occurrence kept, in order.

    kube-scheduler never repeats a node, so a set of the names usually has as many
    entries as the list and the list is returned as it is; that check costs about
    half of building the de-duplicated list.
    """
    if len(set(names)) == len(names):
        return names
    return list(dict.fromkeys(names))


# What follows each host name in the reply, by score: the rest of that entry and the
# start of the next one. Scores 0..10 are what kube-scheduler accepts from an
# extender (MaxExtenderPriority); any other value takes the general path.
_NEXT = {score: f'","Score":{score}}},{{"Host":"' for score in range(11)}
_LAST = {score: f'","Score":{score}}}]' for score in range(11)}


class HostPriorityList:
    """The prioritize reply, `[{"Host": name, "Score": n}, ...]`, rendered lazily.

    For thousands of nodes, building a dict per node only to serialize it cost more
    than scoring them. `to_json` writes the same bytes as `orjson.dumps` of those
    dicts, straight from the two lists, when every name needs no escaping in JSON
    and every score is one of 0..10 (always, in practice); otherwise it builds the
    dicts. Iterating yields the dicts, for anything that wants the rows.
    """

    __slots__ = ("nodes", "scores")

    def __init__(self, nodes: list[str], scores: list[int]):
        if len(nodes) != len(scores):
            raise ValueError(
                f"{len(scores)} scores for {len(nodes)} nodes: a strategy must "
                "return one score per node"
            )
        self.nodes = nodes
        self.scores = scores

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[dict[str, str | int]]:
        return iter(host_priority_list(self.nodes, self.scores))

    def to_json(self) -> bytes:
        """The reply as compact JSON bytes (what orjson writes for the dicts)."""
        fast = self._join()
        if fast is not None:
            return fast
        return orjson.dumps(host_priority_list(self.nodes, self.scores))

    def _join(self) -> bytes | None:
        nodes, scores = self.nodes, self.scores
        if not nodes:
            return b"[]"
        try:
            # orjson escapes with a backslash only; none means every name is
            # written as it is (UTF-8). It also rejects what is not valid text.
            if b"\\" in orjson.dumps(nodes):
                return None
        except orjson.JSONEncodeError:
            return None
        try:
            # itemgetter looks every score up in C; a score outside 0..10 (or not
            # a number) is missing from the table and takes the general path.
            if len(scores) == 1:
                tails = (_NEXT[scores[0]],)
            else:
                tails = itemgetter(*scores)(_NEXT)
            last = _LAST[scores[-1]]
        except (KeyError, TypeError):
            return None
        pieces: list[str] = [""] * (2 * len(nodes))
        pieces[0::2] = nodes
        pieces[1::2] = tails
        pieces[-1] = last
        return ('[{"Host":"' + "".join(pieces)).encode()

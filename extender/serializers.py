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

from dataclasses import dataclass

from rest_framework.exceptions import ValidationError


class ExtenderArgsError(ValidationError):
    """The request body is not a valid ExtenderArgs object; the message says why."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


def _field(data: dict, name: str):
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

    pod: dict
    nodes: dict | None
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
        return names

    def pod_label(self, label: str) -> str | None:
        """The value of the pod's label `label`, or None when the pod lacks it."""
        metadata = self.pod.get("metadata")
        if metadata is None:
            return None
        if not isinstance(metadata, dict):
            raise ExtenderArgsError("Pod.metadata must be an object")
        labels = metadata.get("labels")
        if labels is None:
            return None
        if not isinstance(labels, dict):
            raise ExtenderArgsError("Pod.metadata.labels must be an object")
        value = labels.get(label)
        if value is not None and not isinstance(value, str):
            raise ExtenderArgsError(f"Pod label {label!r} must be a string")
        return value

    def pod_ref(self) -> str:
        """`namespace/name` of the pod, for logs."""
        metadata = self.pod.get("metadata")
        if not isinstance(metadata, dict):
            return "?/?"
        return f"{metadata.get('namespace', '?')}/{metadata.get('name', '?')}"


def parse_extender_args(data) -> ExtenderArgs:
    """Check a decoded request body and return it as ExtenderArgs.

    Raises ExtenderArgsError (a 400) naming the first problem found: a body that is
    not an object, a missing or non-object Pod, Nodes that is not a NodeList,
    NodeNames that is not a list of strings.
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
        # str.join checks every item in C; only a failure walks the list in Python.
        try:
            "".join(node_names)
        except TypeError:
            for position, name in enumerate(node_names):
                if not isinstance(name, str):
                    raise ExtenderArgsError(
                        f"NodeNames[{position}] must be a string"
                    ) from None

    return ExtenderArgs(pod=pod, nodes=nodes, node_names=node_names)


def extender_filter_result(args: ExtenderArgs) -> dict:
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


def host_priority_list(nodes: list[str], scores: list[int]) -> list[dict]:
    """The HostPriorityList reply: `[{"Host": name, "Score": n}, ...]`."""
    return [
        {"Host": node, "Score": score}
        for node, score in zip(nodes, scores, strict=True)
    ]

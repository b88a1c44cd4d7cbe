"""Kubernetes objects the fake API server holds: Pods, Nodes and Leases.

``RESOURCES`` names the served resources; ``make_pod``, ``make_node`` and
``make_lease`` build objects shaped like the ones a real cluster returns, and
``pod_status`` the status the kubelet writes as a pod pulls, runs and ends.
"""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime
from typing import Any

DEFAULT_NAMESPACE = "ks-pipelines"
PIPELINE_LABEL = "ks-pipeline"
SCHEDULER_NAME = "ks-scheduler"
CREATION_TIMESTAMP = "2026-01-01T00:00:00Z"

# resource -> (kind, apiVersion, group for error messages, namespaced)
RESOURCES = {
    "pods": ("Pod", "v1", "", True),
    "nodes": ("Node", "v1", "", False),
    "leases": ("Lease", "coordination.k8s.io/v1", "coordination.k8s.io", True),
    "events": ("Event", "events.k8s.io/v1", "events.k8s.io", True),
}


def qualified_name(resource: str) -> str:
    """Return the name error messages use: ``leases.coordination.k8s.io``, ``pods``."""
    group = RESOURCES.get(resource, ("", "", "", False))[2]
    return f"{resource}.{group}" if group else resource


def make_pod(
    name: str,
    uid: str | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    node: str | None = None,
    label: str | None = "pipeline1",
    scheduler: str = SCHEDULER_NAME,
    phase: str = "Pending",
    rv: str | int = "1",
) -> dict[str, Any]:
    """Return a Pod dict shaped like one a Job creates; ``label=None`` omits it."""
    labels = {"job-name": name, "ks-step": "step"}
    if label is not None:
        labels[PIPELINE_LABEL] = label
    spec: dict[str, Any] = {
        "containers": [
            {
                "name": "step",
                "image": "registry.example.com/ks/pipeline-step:1.4.2",
                "resources": {"requests": {"cpu": "500m", "memory": "512Mi"}},
                "terminationMessagePath": "/dev/termination-log",
                "terminationMessagePolicy": "File",
                "imagePullPolicy": "IfNotPresent",
            }
        ],
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": 30,
        "dnsPolicy": "ClusterFirst",
        "serviceAccountName": "default",
        "schedulerName": scheduler,
        "tolerations": [
            {
                "key": "node.kubernetes.io/not-ready",
                "operator": "Exists",
                "effect": "NoExecute",
                "tolerationSeconds": 300,
            }
        ],
        "priority": 0,
        "enableServiceLinks": True,
        "preemptionPolicy": "PreemptLowerPriority",
    }
    status: dict[str, Any] = {"phase": phase, "qosClass": "Burstable"}
    if node is not None:
        spec["nodeName"] = node
        status["conditions"] = [
            {
                "type": "PodScheduled",
                "status": "True",
                "lastTransitionTime": CREATION_TIMESTAMP,
            }
        ]
    return {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "uid": uid or str(uuid.uuid4()),
            "resourceVersion": str(rv),
            "creationTimestamp": CREATION_TIMESTAMP,
            "labels": labels,
        },
        "spec": spec,
        "status": status,
    }


def pod_status(
    *,
    scheduled: datetime | str | None,
    started: datetime | str | None = None,
    finished: datetime | str | None = None,
    phase: str | None = None,
    exit_code: int = 0,
    restarted: tuple[datetime | str, datetime | str] | None = None,
    init: tuple[datetime | str, datetime | str] | None = None,
) -> dict[str, Any]:
    """Return a Pod ``status`` as the kubelet writes it for one ``step`` container.

    ``scheduled`` is the PodScheduled transition (None leaves the condition out);
    the container waits (pulling) until ``started``, runs, and terminates at
    ``finished`` with ``exit_code``. ``restarted`` = (startedAt, finishedAt) of an
    earlier attempt kept in ``lastState``; ``init`` = the times of a workspace
    restore init container. The phase follows from the above unless given.
    """
    if phase is None:
        phase = "Pending" if started is None else "Running"
        if finished is not None:
            phase = "Succeeded" if exit_code == 0 else "Failed"
    conditions = []
    if scheduled is not None:
        conditions.append(_condition("PodScheduled", "True", scheduled))
    ready = started is not None and finished is None
    since = _time(started or scheduled or CREATION_TIMESTAMP)
    conditions += [
        _condition("Initialized", "True", since),
        _condition("ContainersReady", "True" if ready else "False", since),
        _condition("Ready", "True" if ready else "False", since),
    ]
    image = "registry.example.com/ks/pipeline-step:1.4.2"
    container: dict[str, Any] = {
        "name": "step",
        "image": image,
        "imageID": f"{image}@sha256:{'ab' * 32}",
        "ready": ready,
        "restartCount": 0,
        "started": ready,
        "lastState": {},
        "state": {"waiting": {"reason": "ContainerCreating"}},
    }
    if started is not None:
        container["containerID"] = f"containerd://{uuid.uuid4().hex}"
        container["state"] = {"running": {"startedAt": _time(started)}}
    if finished is not None:
        container["state"] = {
            "terminated": {
                "exitCode": exit_code,
                "reason": "Completed" if exit_code == 0 else "Error",
                "startedAt": _time(started) if started is not None else None,
                "finishedAt": _time(finished),
                "containerID": container.get("containerID", ""),
            }
        }
    if restarted is not None:
        container["restartCount"] = 1
        container["lastState"] = {
            "terminated": {
                "exitCode": 1,
                "reason": "Error",
                "startedAt": _time(restarted[0]),
                "finishedAt": _time(restarted[1]),
            }
        }
    status: dict[str, Any] = {
        "phase": phase,
        "qosClass": "Burstable",
        "conditions": conditions,
        "hostIP": "10.0.0.10",
        "podIP": "10.244.1.17",
        "containerStatuses": [container],
    }
    if scheduled is not None:
        status["startTime"] = _time(scheduled)
    if init is not None:
        status["initContainerStatuses"] = [
            {
                "name": "restore-workspace",
                "image": image,
                "ready": True,
                "restartCount": 0,
                "lastState": {},
                "state": {
                    "terminated": {
                        "exitCode": 0,
                        "reason": "Completed",
                        "startedAt": _time(init[0]),
                        "finishedAt": _time(init[1]),
                    }
                },
            }
        ]
    return status


def _condition(type_: str, status: str, at: datetime | str) -> dict[str, Any]:
    return {"type": type_, "status": status, "lastTransitionTime": _time(at)}


def _time(value: datetime | str) -> str:
    """RFC 3339 in UTC with whole seconds, as the API server writes Time fields."""
    if isinstance(value, str):
        return value
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def make_node(name: str, uid: str | None = None, rv: str | int = "1") -> dict[str, Any]:
    """Return a Ready Node dict; a replaced node keeps its name, not its UID."""
    return {
        "kind": "Node",
        "apiVersion": "v1",
        "metadata": {
            "name": name,
            "uid": uid or str(uuid.uuid4()),
            "resourceVersion": str(rv),
            "creationTimestamp": CREATION_TIMESTAMP,
            "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux"},
        },
        "spec": {},
        "status": {
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "lastTransitionTime": CREATION_TIMESTAMP,
                }
            ],
            "nodeInfo": {
                "architecture": "amd64",
                "bootID": "boot",
                "containerRuntimeVersion": "containerd://1.7.0",
                "kernelVersion": "6.1.0",
                "kubeProxyVersion": "v1.31.0",
                "kubeletVersion": "v1.31.0",
                "machineID": "machine",
                "operatingSystem": "linux",
                "osImage": "Debian GNU/Linux 12",
                "systemUUID": "system",
            },
        },
    }


def make_lease(
    name: str,
    holder: str | None = None,
    namespace: str = DEFAULT_NAMESPACE,
    duration: int = 15,
) -> dict[str, Any]:
    """Return a Lease body suitable for POST (no resourceVersion)."""
    now = time.strftime("%Y-%m-%dT%H:%M:%S.000000Z", time.gmtime())
    spec: dict[str, Any] = {"leaseDurationSeconds": duration, "leaseTransitions": 0}
    if holder is not None:
        spec.update(holderIdentity=holder, acquireTime=now, renewTime=now)
    return {
        "kind": "Lease",
        "apiVersion": "coordination.k8s.io/v1",
        "metadata": {"name": name, "namespace": namespace},
        "spec": spec,
    }

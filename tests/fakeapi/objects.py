"""Kubernetes objects the fake API server holds: Pods, Nodes and Leases.

``RESOURCES`` names the served resources; ``make_pod``, ``make_node`` and
``make_lease`` build objects shaped like the ones a real cluster returns.
"""

from __future__ import annotations

import time
import uuid
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

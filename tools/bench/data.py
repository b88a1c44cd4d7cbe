"""Benchmark data: realistic Node objects, request bodies and a history table.

Nodes follow the shape of the recorded kube-scheduler fixtures (filter-nodes.json)
with what real clusters add: 50 images (kubelet's nodeStatusMaxImages default),
more conditions and labels, so one compact node is about 14 KB.

History follows how pipeline labels are built (`ci-language-tool-project`): the
general segments (the CI system, the language) have rows on nearly every node, the
tool on about half, and each project on a handful, 100 000 rows in all, each in both
kinds of key (segments and label path, see `keynode_rows`). A prioritize call for
5000 nodes with a label like `jenkins-java-maven-project0042` touches about 12 000
of them.
"""

from __future__ import annotations

import hashlib
import random

import orjson

PIPELINE_LABEL = "jenkins-java-maven-project0042"
CI_SYSTEMS = ["jenkins", "gitlab", "tekton"]
LANGUAGES = ["java", "go", "python", "node", "rust", "cpp"]
TOOLS = ["maven", "gradle", "bazel", "make", "npm", "pip", "cargo", "cmake"]
KEYNODE_ROWS = 100_000
NODE_COUNT = 5000


def node_name(index: int) -> str:
    return f"ip-10-{index // 250}-{index % 250}-{17 + index % 7}.eu-west-1.internal"


def node_names(count: int) -> list[str]:
    return [node_name(i) for i in range(count)]


def _digest(*parts: object) -> str:
    return hashlib.sha256("/".join(map(str, parts)).encode()).hexdigest()


def _uid(*parts: object) -> str:
    h = _digest(*parts)
    return f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _images(index: int) -> list[dict]:
    images = []
    for i in range(50):
        repo = f"registry.example.com/platform/team-{i % 9}/service-{(index + i) % 137}"
        tag = f"v{i % 4}.{(index * 7 + i) % 31}.{i % 11}"
        images.append(
            {
                "names": [
                    f"{repo}@sha256:{_digest(repo, tag)}",
                    f"{repo}:{tag}",
                ],
                "sizeBytes": 10_000_000 + ((index * 131 + i * 7919) % 900_000_000),
            }
        )
    return images


def _condition(kind: str, status: str, reason: str, message: str) -> dict:
    return {
        "type": kind,
        "status": status,
        "lastHeartbeatTime": "2025-06-03T09:40:58Z",
        "lastTransitionTime": "2025-05-12T08:14:41Z",
        "reason": reason,
        "message": message,
    }


def make_node(index: int) -> dict:
    """One realistic Node object (about 14 KB compact JSON)."""
    name = node_name(index)
    zone = "eu-west-1" + "abc"[index % 3]
    address = f"10.{index // 250}.{index % 250}.{17 + index % 7}"
    resources = {
        "cpu": "8",
        "ephemeral-storage": "101430960Ki",
        "hugepages-1Gi": "0",
        "hugepages-2Mi": "0",
        "memory": "32475784Ki",
        "pods": "110",
    }
    return {
        "metadata": {
            "name": name,
            "uid": _uid("node", index),
            "resourceVersion": str(4_700_000 + index),
            "creationTimestamp": "2025-05-12T08:14:41Z",
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/instance-type": "m6i.2xlarge",
                "beta.kubernetes.io/os": "linux",
                "failure-domain.beta.kubernetes.io/region": "eu-west-1",
                "failure-domain.beta.kubernetes.io/zone": zone,
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "node.kubernetes.io/instance-type": "m6i.2xlarge",
                "topology.kubernetes.io/region": "eu-west-1",
                "topology.kubernetes.io/zone": zone,
                "topology.ebs.csi.aws.com/zone": zone,
                "ks.example.com/pipeline-pool": "pipelines",
                "node-group": f"pipelines-{index % 4}",
            },
            "annotations": {
                "alpha.kubernetes.io/provided-node-ip": address,
                "csi.volume.kubernetes.io/nodeid": orjson.dumps(
                    {"ebs.csi.aws.com": f"i-{_digest('i', index)[:17]}"}
                ).decode(),
                "kubeadm.alpha.kubernetes.io/cri-socket": (
                    "unix:///var/run/containerd/containerd.sock"
                ),
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
            },
        },
        "spec": {
            "podCIDR": f"10.244.{index % 250}.0/24",
            "podCIDRs": [f"10.244.{index % 250}.0/24"],
            "providerID": f"aws:///{zone}/i-{_digest('i', index)[:17]}",
        },
        "status": {
            "capacity": resources,
            "allocatable": {**resources, "memory": "32373384Ki"},
            "conditions": [
                _condition(
                    "NetworkUnavailable",
                    "False",
                    "CalicoIsUp",
                    "Calico is running on this node",
                ),
                _condition(
                    "MemoryPressure",
                    "False",
                    "KubeletHasSufficientMemory",
                    "kubelet has sufficient memory available",
                ),
                _condition(
                    "DiskPressure",
                    "False",
                    "KubeletHasNoDiskPressure",
                    "kubelet has no disk pressure",
                ),
                _condition(
                    "PIDPressure",
                    "False",
                    "KubeletHasSufficientPID",
                    "kubelet has sufficient PID available",
                ),
                _condition(
                    "Ready", "True", "KubeletReady", "kubelet is posting ready status"
                ),
            ],
            "addresses": [
                {"type": "InternalIP", "address": address},
                {"type": "InternalDNS", "address": name},
                {"type": "Hostname", "address": name},
            ],
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": _digest("machine", index)[:32],
                "systemUUID": _uid("system", index),
                "bootID": _uid("boot", index),
                "kernelVersion": "6.8.0-1019-aws",
                "osImage": "Ubuntu 24.04.1 LTS",
                "containerRuntimeVersion": "containerd://1.7.22",
                "kubeletVersion": "v1.30.6",
                "kubeProxyVersion": "v1.30.6",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
            "images": _images(index),
        },
    }


def make_pod(label: str = PIPELINE_LABEL) -> dict:
    """A pipeline pod like the recorded fixtures (about 2 KB)."""
    job = "project0042-build"
    return {
        "metadata": {
            "name": f"{job}-x7k2p",
            "generateName": f"{job}-",
            "namespace": "ks-pipelines",
            "uid": _uid("pod", label),
            "resourceVersion": "4718293",
            "creationTimestamp": "2025-06-03T09:41:27Z",
            "labels": {
                "batch.kubernetes.io/job-name": job,
                "job-name": job,
                "ks-pipeline": label,
                "ks-step": "build",
            },
            "ownerReferences": [
                {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "name": job,
                    "uid": _uid("job", label),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "build",
                    "image": "registry.example.com/ks/pipeline-step:1.4.2",
                    "command": ["python", "-m", "steps.build"],
                    "env": [{"name": "KS_PIPELINE", "value": label}],
                    "resources": {
                        "limits": {"memory": "1Gi"},
                        "requests": {"cpu": "500m", "memory": "512Mi"},
                    },
                }
            ],
            "restartPolicy": "Never",
            "schedulerName": "ks-scheduler",
            "serviceAccountName": "default",
            "priority": 0,
        },
        "status": {"phase": "Pending", "qosClass": "Burstable"},
    }


def request_body(count: int, *, full_nodes: bool) -> bytes:
    """A compact ExtenderArgs body for `count` candidate nodes."""
    pod = make_pod()
    if full_nodes:
        body = {
            "Pod": pod,
            "Nodes": {"metadata": {}, "items": [make_node(i) for i in range(count)]},
            "NodeNames": None,
        }
    else:
        body = {"Pod": pod, "Nodes": None, "NodeNames": node_names(count)}
    return orjson.dumps(body)


def keynode_rows(
    total: int = KEYNODE_ROWS, nodes: int = NODE_COUNT, seed: int = 7
) -> list[tuple[str, str, int]]:
    """`total` distinct (key, node, count) rows shaped like real pipeline history.

    Each history comes in both kinds of key a placement counts under: segments
    (`jenkins`, `java`, `maven`, `project0042`: what `seed` reads) and the label
    path of PIPELINE_LABEL's pipelines (`jenkins-*`, `jenkins-java-*`,
    `jenkins-java-maven-*` and `jenkins-java-maven-project0042$`: what `warm`
    reads), on the same nodes with the same counts.
    """
    rng = random.Random(seed)
    names = node_names(nodes)
    rows: dict[tuple[str, str], int] = {}
    ci, language, tool = PIPELINE_LABEL.split("-")[:3]
    path = {ci: f"{ci}-*", language: f"{ci}-{language}-*"}
    path[tool] = f"{ci}-{language}-{tool}-*"

    def add(key: str, node: str, count: int) -> None:
        if len(rows) < total:
            rows.setdefault((key, node), count)

    def add_with_path(key: str, node: str, count: int) -> None:
        add(key, node, count)
        if key in path:
            add(path[key], node, count)

    # General segments: nearly every node has run each CI system and language.
    shares = [(key, 0.97) for key in CI_SYSTEMS] + [(key, 0.9) for key in LANGUAGES]
    for key, share in shares:
        for node in names:
            if rng.random() < share:
                add_with_path(key, node, rng.randint(1, 150))
    # Tools: about half the nodes each.
    for key in TOOLS:
        for node in names:
            if rng.random() < 0.5:
                add_with_path(key, node, rng.randint(1, 80))
    # Projects: a few nodes each, until the table holds `total` rows.
    project = 0
    while len(rows) < total:
        key = f"project{project:04d}"
        for node in rng.sample(names, rng.randint(3, 20)):
            count = rng.randint(1, 60)
            add(key, node, count)
            add(f"{ci}-{language}-{tool}-{key}$", node, count)
        project += 1
    return [(key, node, count) for (key, node), count in rows.items()]

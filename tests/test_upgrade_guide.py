"""The install guide's namespace override for an upgrade from the Go ks-scheduler
builds, and puts each object where it works."""

import re
import subprocess

import yaml

from tests.helpers import REPO
from tests.test_deploy import find, kustomize
from tests.test_readme import shell_blocks

OLD_NAMESPACE = "ksphere-system"
# What must stay in kube-system: the binding to the API server's authentication
# reader Role, and the Role and binding of the scheduler's Lease (kept in kube-system
# by deploy/base/kube-scheduler-config.yaml).
PINNED = {
    ("RoleBinding", "ks-scheduler-extension-apiserver-authentication-reader"),
    ("Role", "ks-scheduler-leader-election"),
    ("RoleBinding", "ks-scheduler-leader-election"),
}


def readme_kustomization(directory: str) -> str:
    """The guide's YAML block that starts with `# <directory>/kustomization.yaml`."""
    readme = (REPO / "docs" / "install.md").read_text()
    blocks = re.findall(r"^ *```yaml\n(.*?)^ *```", readme, flags=re.M | re.S)
    for block in blocks:
        text = "\n".join(line[2:] for line in block.splitlines())
        if text.startswith(f"# {directory}/kustomization.yaml"):
            return text + "\n"
    raise AssertionError(f"no {directory}/kustomization.yaml block in docs/install.md")


def build_override(tmp_path):
    # Laid out as the guide says: the two directories beside the kustomization
    # `make overlay` writes in Install step 3.
    made = subprocess.run(
        [REPO / "deploy" / "render.sh", "--into", tmp_path / "my-ks-scheduler"]
        + ["--image", "registry.example.com/ks-scheduler:1.0.0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert made.returncode == 0, made.stderr
    for directory in ("ksphere", "ksphere-install"):
        (tmp_path / directory).mkdir()
        (tmp_path / directory / "kustomization.yaml").write_text(
            readme_kustomization(directory)
        )
    return kustomize(tmp_path / "ksphere-install")


def test_readme_namespace_override_moves_the_install_to_the_old_namespace(tmp_path):
    docs = build_override(tmp_path)
    placed = {
        (doc["kind"], doc["metadata"]["name"]): doc["metadata"].get("namespace")
        for doc in docs
    }
    for (kind, name), namespace in placed.items():
        if kind.startswith("Cluster"):
            assert namespace is None
        elif (kind, name) in PINNED:
            assert namespace == "kube-system", (kind, name)
        else:
            assert namespace == OLD_NAMESPACE, (kind, name)
    assert PINNED <= set(placed)
    # Every binding names the ServiceAccount where it now lives.
    for doc in docs:
        for subject in doc.get("subjects", []):
            assert subject["namespace"] == OLD_NAMESPACE, doc["metadata"]["name"]


def test_readme_namespace_override_keeps_the_old_volume_and_the_lease_rbac(tmp_path):
    docs = build_override(tmp_path)
    (deployment,) = find(docs, "Deployment", "ks-scheduler")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == "scheduler-data"
    config_maps = [
        doc
        for doc in find(docs, "ConfigMap")
        if doc["metadata"]["name"].startswith("ks-scheduler-config")
    ]
    config = yaml.safe_load(config_maps[0]["data"]["config.yaml"])
    lease_namespace = config["leaderElection"]["resourceNamespace"]
    (role,) = find(docs, "Role", "ks-scheduler-leader-election")
    assert role["metadata"]["namespace"] == lease_namespace


def upgrade_section() -> str:
    text = (REPO / "docs" / "install.md").read_text()
    start = text.index("## Upgrading from the Go ks-scheduler")
    return text[start : text.index("\n## ", start + 1)]


def test_the_upgrade_path_works_in_the_namespace_its_build_uses(tmp_path):
    """The Secret the upgrade path creates, and every command on ks-scheduler's own
    objects, are in the namespace where the override puts the Deployment: a pod reads
    Secrets of its own namespace only."""
    docs = build_override(tmp_path)
    (deployment,) = find(docs, "Deployment", "ks-scheduler")
    home = deployment["metadata"]["namespace"]
    assert home == OLD_NAMESPACE
    spec = deployment["spec"]["template"]["spec"]
    needed = {
        item["valueFrom"]["secretKeyRef"]["name"]
        for container in spec.get("initContainers", []) + spec["containers"]
        for item in container.get("env", [])
        if "secretKeyRef" in item.get("valueFrom", {})
        and not item["valueFrom"]["secretKeyRef"].get("optional")
    }
    assert needed
    created, on_ours = set(), []
    for block in shell_blocks(upgrade_section()):
        for line in block:
            words = line.split("#")[0].split()
            if not words or words[0] != "kubectl" or "-n" not in words:
                continue
            namespace = words[words.index("-n") + 1]
            match = re.search(r"create secret generic (\S+)", line)
            if match:
                created.add((namespace, match.group(1)))
            if match or re.search(r"\b(deploy|svc|pod)/ks-scheduler\b", line):
                on_ours.append((namespace, line))
    assert {(home, name) for name in needed} <= created
    assert on_ours
    for namespace, line in on_ours:
        assert namespace == home, line

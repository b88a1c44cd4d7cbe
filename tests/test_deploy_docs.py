"""What the docs say about the manifests is what the manifests do: the NetworkPolicy's
open ports, and the common labels on every object of every build."""

import re

import pytest

from tests.helpers import REPO
from tests.test_deploy import BUILDS, DEPLOY, find, kubectl_or_skip, kustomize

COMMON_LABELS = {
    "app.kubernetes.io/name": "ks-scheduler",
    "app.kubernetes.io/part-of": "ks-scheduler",
}
# Every build the guide installs from, the webhook overlay too.
ALL_BUILDS = {**BUILDS, "webhook": DEPLOY / "overlays" / "webhook"}


def policy_ports(path) -> set[tuple[str, int, str]]:
    """(direction, port, protocol) of the NetworkPolicy in the build at `path`."""
    (policy,) = find(kustomize(path), "NetworkPolicy")
    return {
        (direction, port["port"], port.get("protocol", "TCP"))
        for direction in ("ingress", "egress")
        for rule in policy["spec"].get(direction, [])
        for port in rule.get("ports", [])
    }


def operate_table() -> list[dict[str, str]]:
    """The rows of docs/operate.md's NetworkPolicy table."""
    text = (REPO / "docs" / "operate.md").read_text()
    section = text.split("### NetworkPolicy\n", 1)[1].split("\n#", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in rows[0].strip("|").split("|")]
    return [
        dict(zip(header, (c.strip() for c in row.strip("|").split("|")), strict=True))
        for row in rows[2:]
    ]


def readme_ports() -> set[tuple[str, int, str]]:
    """The ports deploy/README.md's NetworkPolicy bullet names, as `8080/TCP`."""
    text = (DEPLOY / "README.md").read_text()
    bullet = text.split("- **NetworkPolicy.**", 1)[1].split("\n- ", 1)[0]
    ingress, egress = bullet.split("Egress:", 1)
    return {
        (direction, int(port), protocol)
        for direction, part in (("ingress", ingress), ("egress", egress))
        for port, protocol in re.findall(r"\b(\d+)/(TCP|UDP)\b", part)
    }


@pytest.mark.parametrize("name", sorted(ALL_BUILDS))
def test_the_network_policy_opens_the_ports_the_operate_guide_lists(name):
    kubectl_or_skip()
    overlay = "postgres" if name == "pg" else name
    documented = {
        (row["direction"], int(row["port"]), row["protocol"])
        for row in operate_table()
        if row["installs"] in ("every", overlay)
    }
    assert policy_ports(ALL_BUILDS[name]) == documented
    assert all(row["why"] for row in operate_table())


def test_deploy_readme_names_every_open_port_and_no_other():
    kubectl_or_skip()
    opened = policy_ports(BUILDS["sqlite"]) | policy_ports(BUILDS["pg"])
    assert readme_ports() == opened


def test_the_table_parsers_see_a_missing_port():
    """The checks above would notice a port the docs leave out."""
    assert ("ingress", 9100, "TCP") in readme_ports()
    rows = {(row["direction"], int(row["port"])) for row in operate_table()}
    assert ("ingress", 9100) in rows and ("egress", 6443) in rows


@pytest.mark.parametrize("name", sorted(ALL_BUILDS))
def test_every_object_carries_the_common_labels(name):
    kubectl_or_skip()
    for doc in kustomize(ALL_BUILDS[name]):
        labels = doc["metadata"].get("labels", {})
        assert COMMON_LABELS.items() <= labels.items(), (
            doc["kind"],
            doc["metadata"]["name"],
        )

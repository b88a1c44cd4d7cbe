"""The placement filter by key (admin and API) agrees with the counts: it matches the
placements that count under the key, case-sensitively on both databases."""

import pytest

from history.models import KeyNode, Placement
from tests.helpers import place

pytestmark = pytest.mark.django_db

LABELS = {
    "u1": "team-build",
    "u2": "team-build",
    "u3": "team-build-app",
    "u4": "Team-Build-app",
    "u5": "TEAM-BUILD",
    "u6": "team-buildx",
    "u7": "ci-team-build",
    "u8": "x-rebuild",
}


@pytest.fixture
def ledger():
    for uid, label in LABELS.items():
        place(uid, label, "node-1")


def in_admin(client, key):
    response = client.get("/admin/history/placement/", {"key": key})
    assert response.status_code == 200
    return sorted(p.pod_uid for p in response.context["cl"].result_list)


def in_api(client, key):
    response = client.get("/api/placements/", {"key": key})
    assert response.status_code == 200
    return sorted(row["pod_uid"] for row in response.json()["results"])


EXPECTED = {
    # A prefix: the label itself and the labels under it, in its own case.
    "team-build-*": ["u1", "u2", "u3"],
    "Team-Build-*": ["u4"],
    "team-*": ["u1", "u2", "u3", "u6"],
    # A pipeline: that very label.
    "team-build$": ["u1", "u2"],
    "TEAM-BUILD$": ["u5"],
    "team-buildx$": ["u6"],
    # A segment: as a whole segment, in its case.
    "build": ["u1", "u2", "u3", "u7"],
    "Build": ["u4"],
    "team": ["u1", "u2", "u3", "u6", "u7"],
}


@pytest.mark.parametrize("key", EXPECTED)
def test_admin_placement_filter_matches_keys_case_sensitively(
    admin_client, ledger, key
):
    assert in_admin(admin_client, key) == EXPECTED[key]


@pytest.mark.parametrize("key", EXPECTED)
def test_api_placement_filter_matches_keys_case_sensitively(admin_client, ledger, key):
    assert in_api(admin_client, key) == EXPECTED[key]


def test_the_placements_of_every_key_add_up_to_its_count(admin_client, ledger):
    rows = KeyNode.objects.filter(node="node-1")
    assert rows.count() > len(EXPECTED)
    for key, count in rows.values_list("key", "count"):
        assert len(in_api(admin_client, key)) == count, key
        assert len(in_admin(admin_client, key)) == count, key


def test_glob_characters_in_a_filter_value_match_only_themselves(admin_client):
    place("s1", "a-b", "node-1")
    Placement.objects.filter(pod_uid="s1").update(label="a*-b")
    assert in_api(admin_client, "a*-*") == ["s1"]
    assert in_api(admin_client, "a?-*") == []
    assert in_api(admin_client, "[a]*-*") == []

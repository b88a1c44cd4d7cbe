"""Migration 0013 builds the label-path history from the ledger: the rows and the
warmth it gives are those the ledger would have written, and the audit balances."""

import random

import pytest
from django.core.management import call_command

from history import audit, corrections
from history.labels import key_kind
from history.ledger import record_placement
from history.models import KeyNode, Placement

pytestmark = pytest.mark.django_db(transaction=True)

LABELS = [
    "jenkins-java-maven-api",
    "jenkins-java-maven-web",
    "gitlab-go-build-api",
    "jenkins-java",
    "api",
    "jenkins-java-maven-api-nightly",
]


def path_rows():
    return {
        (row.key, row.node): (row.count, row.decayed_weight)
        for row in KeyNode.objects.all()
        if key_kind(row.key) != "segment"
    }


@pytest.fixture
def migrate_back_and_forth():
    """Run the test at 0013, after it went back to 0012 and forth again."""

    def run():
        call_command("migrate", "history", "0012_node_name_rule", verbosity=0)
        assert path_rows() == {}
        # The old rule's warmth, to be judged again.
        Placement.objects.update(warmth="exact")
        call_command("migrate", "history", verbosity=0)

    yield run
    call_command("migrate", verbosity=0)


def test_the_migration_writes_what_the_ledger_writes(migrate_back_and_forth):
    rng = random.Random(7)
    for i in range(120):
        record_placement(
            pod_uid=f"u{i}",
            namespace="ci",
            name=f"p{i}",
            label=rng.choice(LABELS),
            node=f"n{rng.randrange(5)}",
        )
    corrections.create_key_node(key="java", node="n9", count=4, actor="admin")
    written = path_rows()
    judged = dict(Placement.objects.values_list("pod_uid", "warmth"))
    assert set(judged.values()) == {"exact", "partial", "cold"}

    migrate_back_and_forth()

    rebuilt = path_rows()
    assert rebuilt.keys() == written.keys()
    for pair, (count, weight) in written.items():
        assert rebuilt[pair][0] == count, pair
        assert rebuilt[pair][1] == pytest.approx(weight, rel=1e-6), pair
    assert dict(Placement.objects.values_list("pod_uid", "warmth")) == judged
    assert KeyNode.objects.get(key="java", node="n9").count == 4
    assert audit.audit_counts()[1] == []


def test_labels_that_are_not_label_values_are_skipped_and_logged_once(
    migrate_back_and_forth, caplog
):
    # Over 251 characters, a path key would not fit the 253 of KeyNode.key: on
    # PostgreSQL the migration failed with StringDataRightTruncation.
    long_label = "-".join(["seg"] * 63) + "x"
    invalid = [long_label, "jenkins-java$", "jenkins-*", "jénkins-java"]
    for i, label in enumerate([*invalid, *invalid, "jenkins-java"]):
        record_placement(
            pod_uid=f"u{i}", namespace="ci", name=f"p{i}", label=label, node="n1"
        )
    assert len(long_label) > 251

    with caplog.at_level("WARNING", logger="history.replay"):
        migrate_back_and_forth()

    assert sorted(key for key, _ in path_rows()) == [
        "jenkins-*",
        "jenkins-java$",
        "jenkins-java-*",
    ]
    assert KeyNode.objects.get(key="jenkins-java$").count == 1
    named = [
        r.getMessage() for r in caplog.records if "skipped the ledger" in r.getMessage()
    ]
    assert len(named) == len(invalid)
    assert any(
        "skipped 8 ledger rows of 4 labels" in r.getMessage() for r in caplog.records
    )
    assert audit.audit_counts()[1] == []

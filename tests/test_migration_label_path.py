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

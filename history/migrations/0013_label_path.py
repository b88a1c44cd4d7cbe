"""Warmth by label path: KeyNode rows for each step of every recorded label's path,
built from the ledger, and every ledger row's warmth judged again by the new rule.

Placements now also count under their label path (`history.labels.placement_keys`:
`jenkins-*`, ..., `jenkins-java-maven-app1-*` and `jenkins-java-maven-app1$`). This
migration replays the ledger (`history.replay.rebuild_path_rows`), node by node in
the order pods were bound, and, per (key, node), adds up the count and the recency
weight exactly as the ledger's upsert does (`recency.accumulate_decayed`), so
`audit_counts` proves the new rows from the ledger like the old ones. While
replaying it judges each placement's warmth from the path history before it (this
very pipeline ran there: exact; a shared label prefix did: partial; else cold), with
the recency threshold and the node replacement rule `ledger.classify_warmth`
applies; a replacement counts from the moment it was recorded. Segment rows,
adjustments and imported history are left as they are. Memory is bounded: one page
of the ledger and one node's path rows. Ledger rows whose label is not a valid
Kubernetes label value are skipped, logged once per label and counted.
"""

from django.conf import settings
from django.db import migrations, models

import history.models
from history.queries import keys_of_kind
from history.replay import rebuild_path_rows

KEY_RULE = (
    "One segment of a pipeline label (letters, digits, '_' and '.', at most 63 "
    "characters, no '-'), a path prefix ending in '-*' (jenkins-java-*: a pipeline "
    "under jenkins-java ran here) or a pipeline ending in '$' "
    "(jenkins-java-maven-myapp$: this very pipeline ran here). The label "
    "jenkins-java-maven-myapp counts under its segments jenkins, java, maven and "
    "myapp, its prefixes jenkins-* to jenkins-java-maven-myapp-*, and "
    "jenkins-java-maven-myapp$."
)


def build(apps, schema_editor):
    rebuild_path_rows(
        Placement=apps.get_model("history", "Placement"),
        KeyNode=apps.get_model("history", "KeyNode"),
        NodeRecord=apps.get_model("history", "NodeRecord"),
        half_life=float(settings.KSSCHED_HALF_LIFE_DAYS) * 86400.0,
        judge_warmth=True,
        what="Migration 0013",
    )


def remove(apps, schema_editor):
    KeyNode = apps.get_model("history", "KeyNode")
    KeyNode.objects.exclude(keys_of_kind("segment")).delete()


class Migration(migrations.Migration):
    dependencies = [
        ("history", "0012_node_name_rule"),
    ]

    operations = [
        migrations.AlterField(
            model_name="keynode",
            name="key",
            field=models.CharField(
                help_text=KEY_RULE,
                max_length=253,
                validators=[history.models.validate_key],
            ),
        ),
        migrations.AlterField(
            model_name="placement",
            name="warmth",
            field=models.CharField(
                blank=True,
                choices=[
                    ("exact", "exact (this pipeline ran on the node)"),
                    (
                        "partial",
                        "partial (a pipeline under a shared label prefix ran there)",
                    ),
                    ("cold", "cold"),
                ],
                max_length=8,
            ),
        ),
        migrations.RunPython(build, remove),
    ]

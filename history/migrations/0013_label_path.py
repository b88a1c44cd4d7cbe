"""Warmth by label path: KeyNode rows for each step of every recorded label's path,
built from the ledger, and every ledger row's warmth judged again by the new rule.

Placements now also count under their label path (`history.labels.placement_keys`:
`jenkins-*`, ..., `jenkins-java-maven-app1-*` and `jenkins-java-maven-app1$`). This
migration replays the ledger in the order pods were bound and, per (key, node),
adds up the count and the recency weight exactly as the ledger's upsert does
(`recency.accumulate_decayed`), so `audit_counts` proves the new rows from the
ledger like the old ones. While replaying it judges each placement's warmth from
the path history before it (this very pipeline ran there: exact; a shared label
prefix did: partial; else cold), with the recency threshold and the node
replacement rule `ledger.classify_warmth` applies; a replacement counts from the
moment it was recorded. Segment rows, adjustments and imported history are left
as they are. Memory grows with the distinct (path key, node) pairs of the ledger.
"""

from django.conf import settings
from django.db import migrations, models

import history.models
from history.labels import key_kind, path_keys, placement_keys
from history.queries import keys_of_kind
from history.recency import WARM_MIN_WEIGHT, accumulate_decayed, decayed_weight

KEY_RULE = (
    "One segment of a pipeline label (letters, digits, '_' and '.', at most 63 "
    "characters, no '-'), a path prefix ending in '-*' (jenkins-java-*: a pipeline "
    "under jenkins-java ran here) or a pipeline ending in '$' "
    "(jenkins-java-maven-myapp$: this very pipeline ran here). The label "
    "jenkins-java-maven-myapp counts under its segments jenkins, java, maven and "
    "myapp, its prefixes jenkins-* to jenkins-java-maven-myapp-*, and "
    "jenkins-java-maven-myapp$."
)
BATCH = 2000


def build(apps, schema_editor):
    KeyNode = apps.get_model("history", "KeyNode")
    Placement = apps.get_model("history", "Placement")
    NodeRecord = apps.get_model("history", "NodeRecord")
    half_life = float(settings.KSSCHED_HALF_LIFE_DAYS) * 86400.0
    since = {
        name: at.timestamp()
        for name, at in NodeRecord.objects.filter(
            replacements__gt=0, history_since__isnull=False
        ).values_list("name", "history_since")
    }
    # (key, node) -> [count, weight, weighed at, first bound, last bound]
    rows = {}
    warmth = {}
    ledger = Placement.objects.order_by("bound_at", "pk").values_list(
        "pk", "label", "node", "bound_at", "warmth"
    )
    for pk, label, node, bound_at, before in ledger.iterator(chunk_size=BATCH):
        at = bound_at.timestamp()
        keys = path_keys(label)
        warm = set()
        replaced = since.get(node)
        for key in keys:
            row = rows.get((key, node))
            if row is None or (
                replaced is not None and row[4].timestamp() < replaced <= at
            ):
                continue
            weight = decayed_weight(
                weight=row[1], at=row[2], now=at, half_life=half_life
            )
            if min(weight, row[0]) >= WARM_MIN_WEIGHT:
                warm.add(key)
        judged = "cold"
        if keys and keys[-1] in warm:
            judged = "exact"
        elif warm:
            judged = "partial"
        if judged != before:
            warmth.setdefault(judged, []).append(pk)
        for key in placement_keys(label):
            if key_kind(key) == "segment":
                continue
            row = rows.get((key, node))
            if row is None:
                rows[key, node] = [1, 1.0, at, bound_at, bound_at]
                continue
            row[1], row[2] = accumulate_decayed(
                weight=row[1], at=row[2], add=1.0, add_at=at, half_life=half_life
            )
            row[0] += 1
            row[4] = max(row[4], bound_at)
    for judged, pks in warmth.items():
        for start in range(0, len(pks), BATCH):
            Placement.objects.filter(pk__in=pks[start : start + BATCH]).update(
                warmth=judged
            )
    KeyNode.objects.exclude(keys_of_kind("segment")).delete()
    made = [
        KeyNode(
            key=key,
            node=node,
            count=count,
            decayed_weight=weight,
            decayed_at=at,
            last_placed_at=last,
            created=first,
            updated=last,
        )
        for (key, node), (count, weight, at, first, last) in rows.items()
    ]
    # `created` and `updated` become now (the fields set themselves on save): a
    # node gone long ago keeps its new rows until `prune_nodes` finds it gone again.
    for start in range(0, len(made), BATCH):
        KeyNode.objects.bulk_create(made[start : start + BATCH])


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

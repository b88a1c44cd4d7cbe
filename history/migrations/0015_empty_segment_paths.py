"""Distinct labels, distinct path keys: a label with an empty segment (`team--build`)
counted under the path keys of the label without it (`team-build-*`,
`team-build$`), so a node where only one of them ran looked warm for the other.

`history.labels.path_keys` now keeps empty segments (`team-*`, `team--*`,
`team--build$`). This migration finds the labels of the ledger that have one, and
rebuilds from the ledger (`history.replay.rebuild_path_rows`, bounded in memory) the
rows of every key whose counts change: the keys such a label counted under before and
does not now, and those it counts under now and did not before. Each rebuilt count
keeps its (key, node)'s adjustments, so `audit_counts` balances. Nothing happens
when no ledger label has an empty segment. The warmth recorded for past placements
stays as it was judged. Going back leaves the rows as they are.
"""

from django.conf import settings
from django.db import migrations

from history.labels import is_valid_label_value, key_kind, placement_keys
from history.replay import PAGE, rebuild_path_rows


def old_path_keys(label):
    """The path keys (prefixes and pipeline) the label counted under before: its
    segments with empty ones dropped."""
    segments = [segment for segment in label.split("-") if segment]
    return {
        *("-".join(segments[:n]) + "-*" for n in range(1, len(segments) + 1)),
        "-".join(segments) + "$",
    }


def changed_keys(Placement):
    """The path keys whose counts differ between the two rules, over the ledger's
    labels with an empty segment (read a page of distinct labels at a time)."""
    changed = set()
    labels = (
        Placement.objects.filter(label__contains="--")
        .order_by("label")
        .values_list("label", flat=True)
        .distinct()
    )
    last = None
    while True:
        page = list((labels if last is None else labels.filter(label__gt=last))[:PAGE])
        for label in page:
            if not is_valid_label_value(label):
                continue
            new = {key for key in placement_keys(label) if key_kind(key) != "segment"}
            changed |= new ^ old_path_keys(label)
        if len(page) < PAGE:
            return changed
        last = page[-1]


def rebuild(apps, schema_editor):
    Placement = apps.get_model("history", "Placement")
    changed = changed_keys(Placement)
    if not changed:
        return
    rebuild_path_rows(
        Placement=Placement,
        KeyNode=apps.get_model("history", "KeyNode"),
        NodeRecord=apps.get_model("history", "NodeRecord"),
        CountAdjustment=apps.get_model("history", "CountAdjustment"),
        half_life=float(settings.KSSCHED_HALF_LIFE_DAYS) * 86400.0,
        only_keys=changed,
        what="Migration 0015",
    )


class Migration(migrations.Migration):
    dependencies = [
        ("history", "0014_policy_key_segment"),
    ]

    operations = [
        migrations.RunPython(rebuild, migrations.RunPython.noop),
    ]

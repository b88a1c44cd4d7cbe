"""What ks-scheduler remembers about pipeline pods.

KeyNode holds the counts the extender scores with. Placement is the ledger that makes
counting exactly-once: a count only moves when a new pod UID enters the ledger, in the
same transaction. CountAdjustment records every change that did not come from a
placement (admin edits, resets, pruning), so `audit_counts` can tell drift from intent.
"""

from django.core.exceptions import ValidationError
from django.core.validators import MaxValueValidator
from django.db import models

from history.labels import KEY_RULE, is_valid_key, is_valid_segment
from history.nodenames import NODE_NAME_RULE, is_valid_node_name

# The largest count a person may write (admin forms, list edits). A billion pods of
# one key on one node is beyond any real cluster, and it leaves the watcher's later
# increments (+1 per pod) about 9 * 10**18 below the 64-bit integer limit of both
# databases: PostgreSQL's bigint raises "out of range" past 2**63 - 1, and SQLite
# silently turns the value into an inexact float. Counts above 999 999 already
# score like 999 999 (see extender.scoring.rules), so nothing is lost.
MAX_COUNT = 10**9


def validate_key(value: str) -> None:
    """Refuse a KeyNode key that no placement counts under (`labels.KEY_RULE`).

    Such a row could never match a pod (`history.labels.is_valid_key`).
    """
    if is_valid_key(value):
        return
    raise ValidationError(
        "A key is one segment of a label (letters, digits, '_' and '.', at most 63 "
        "characters, no '-'), a label prefix ending in '-*' such as jenkins-java-*, "
        "or a pipeline label ending in '$' such as jenkins-java-maven-app$; "
        "%(value)s is none of these.",
        code="invalid_key",
        params={"value": repr(value)},
    )


POLICY_KEY_RULE = (
    "A segment of a pipeline label (jenkins, java, myapp): policies apply to the "
    "labels that contain it. Label-path keys (jenkins-java-*, ...$) hold history, "
    "not policies."
)


def validate_policy_key(value: str) -> None:
    """Refuse a policy key that is not a segment: the strategies look policies up by
    the label's segments, so a policy on a label-path key would never apply."""
    if not is_valid_segment(value):
        raise ValidationError(
            "%(value)s is not a label segment. " + POLICY_KEY_RULE,
            code="invalid_policy_key",
            params={"value": repr(value)},
        )


def validate_node_name(value: str) -> None:
    """Refuse a node name the Kubernetes API server would not accept.

    The webhook copies stored node names into pods' node-affinity terms, and a pod
    with an invalid name there is rejected (`history.nodenames`).
    """
    if is_valid_node_name(value):
        return
    raise ValidationError(
        "%(value)s is not a Kubernetes node name: lower-case letters, digits, '-' "
        "and '.', each dot-separated part starting and ending with a letter or "
        "digit, at most 253 characters.",
        code="invalid_node_name",
        params={"value": repr(value)},
    )


class KeyNode(models.Model):
    """How often pods whose pipeline label counts under `key` were placed on `node`.

    One row per (key, node). A placement counts under each segment of its label and
    each step of its label path (`history.labels.placement_keys`). Written by the
    watcher through `history.ledger`; platform engineers may edit `count` in the
    admin (recorded as a CountAdjustment).
    """

    key = models.CharField(
        max_length=253, validators=[validate_key], help_text=KEY_RULE
    )
    node = models.CharField(
        max_length=253, validators=[validate_node_name], help_text=NODE_NAME_RULE
    )
    count = models.PositiveBigIntegerField(
        default=0,
        validators=[
            MaxValueValidator(
                MAX_COUNT,
                message=(
                    "Ensure this value is less than or equal to %(limit_value)s: "
                    "larger counts score no higher and could overflow the database "
                    "when later placements are added."
                ),
            )
        ],
    )
    last_placed_at = models.DateTimeField(null=True, blank=True)
    # Recency state kept on write: the sum over placements of 0.5 ** (age / half-life),
    # valued at `decayed_at` (Unix seconds). See `history.recency.decayed_weight`.
    decayed_weight = models.FloatField(default=0.0)
    decayed_at = models.FloatField(default=0.0)
    created = models.DateTimeField(auto_now_add=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "key on node"
        verbose_name_plural = "keys on nodes"
        ordering = ["key", "node"]
        constraints = [
            # The unique index on (key, node) is also the index that serves "all rows of
            # these keys": key is its leading column.
            models.UniqueConstraint(
                fields=["key", "node"], name="keynode_key_node_uniq"
            ),
            models.CheckConstraint(
                condition=models.Q(count__gte=0), name="keynode_count_gte_0"
            ),
        ]
        indexes = [
            models.Index(fields=["node"], name="keynode_node_idx"),
            # Each node's pipeline keys, newest placement first, without reading
            # the table: the recent pipelines of `history.reader.depths`.
            models.Index(
                fields=["node", "-last_placed_at", "-key"],
                condition=models.Q(key__endswith="$"),
                name="keynode_recent_idx",
            ),
        ]

    def __str__(self) -> str:
        return self.describe(key=self.key, node=self.node, count=self.count)

    @staticmethod
    def describe(*, key: str, node: str, count: int) -> str:
        """How a row is named (the admin history too), without building one."""
        return f"{key} on {node}: {count}"


class Placement(models.Model):
    """One pipeline pod placed on a node: the ledger that makes counting exactly-once.

    Written by the watcher in the same transaction as the KeyNode increments; a row
    is inserted once per pod UID, and the label value is frozen at that moment.
    `finished_at` is set when the pod succeeds, fails or is deleted, so the active
    pods per node are known. `startup_seconds`, `run_seconds` and `outcome` come from
    the pod's own status (`history.timings`) and are written once, at the first
    observation that carries them (`ledger.record_outcome`); rows recorded before
    they existed, and pods with unusable times, have none.
    """

    class Outcome(models.TextChoices):
        SUCCEEDED = "Succeeded", "succeeded"
        FAILED = "Failed", "failed"

    class Warmth(models.TextChoices):
        EXACT = "exact", "exact (this pipeline ran on the node)"
        PARTIAL = (
            "partial",
            "partial (a pipeline under a shared label prefix ran there)",
        )
        COLD = "cold", "cold"

    pod_uid = models.CharField(max_length=64, unique=True)
    namespace = models.CharField(max_length=253)
    name = models.CharField(max_length=253)
    label = models.CharField(max_length=253, help_text="The pipeline label value.")
    node = models.CharField(max_length=253)
    bound_at = models.DateTimeField(db_index=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    resource_version = models.CharField(max_length=64, blank=True)
    warmth = models.CharField(max_length=8, choices=Warmth.choices, blank=True)
    startup_seconds = models.FloatField(
        null=True,
        blank=True,
        help_text="PodScheduled to first container start (pulls, restores).",
    )
    run_seconds = models.FloatField(
        null=True,
        blank=True,
        help_text="First container start to last container finish.",
    )
    outcome = models.CharField(
        max_length=9,
        choices=Outcome.choices,
        blank=True,
        help_text="Final phase; empty while running or if deleted first.",
    )

    class Meta:
        ordering = ["-bound_at"]
        indexes = [
            models.Index(
                fields=["label", "finished_at"], name="placement_label_active"
            ),
            models.Index(fields=["node", "finished_at"], name="placement_node_active"),
            # The pods that ended since a time: what the books of warmth's worth
            # read (`history.worth_feed`), without a scan of the whole ledger.
            models.Index(fields=["finished_at"], name="placement_finished"),
            # The running pods per node, for the `warm` scoring: only active rows.
            models.Index(
                fields=["node"],
                condition=models.Q(finished_at__isnull=True),
                name="placement_running_node",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name} on {self.node}"


class CountAdjustment(models.Model):
    """A change to a KeyNode count that did not come from a placement.

    Written by the admin (edits, bulk actions) and by `prune_placements`. `audit_counts`
    expects count == ledger rows + sum of adjustments for every (key, node). A node
    replaced under the same name changes no count (readers ignore what came before
    `NodeRecord.history_since`), so it writes no adjustment.
    """

    class Reason(models.TextChoices):
        ADMIN_EDIT = "admin_edit", "edited in the admin"
        RESET = "reset", "reset to zero"
        HALVED = "halved", "halved"
        DELETED = "deleted", "row deleted"
        PRUNED = "pruned", "ledger rows pruned"
        IMPORTED = "imported", "imported from the Go ks-scheduler"
        NODE_GONE = "node_gone", "node gone (rows removed)"

    key = models.CharField(max_length=253)
    node = models.CharField(max_length=253)
    delta = models.BigIntegerField()
    reason = models.CharField(max_length=16, choices=Reason.choices)
    actor = models.CharField(max_length=150, blank=True)
    created = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created"]
        indexes = [
            models.Index(fields=["key", "node"], name="adjustment_key_node"),
            # `audit_counts` reads one node at a time.
            models.Index(fields=["node"], name="adjustment_node"),
        ]

    def __str__(self) -> str:
        return f"{self.key} on {self.node}: {self.delta:+d} ({self.reason})"


class HistoryImport(models.Model):
    """One import of the Go ks-scheduler's history (its `key_node` table).

    Written by `import_history` and by the automatic import after `migrate`, in the
    same transaction as the counts (CountAdjustment reason `imported`). `sha256`
    identifies what was imported (the summed pairs), so importing the same history
    again changes nothing.
    """

    class Mode(models.TextChoices):
        ADD = "add", "added to the existing counts"
        REPLACE = "replace", "set the imported pairs to the old counts"

    source = models.CharField(
        max_length=1024, help_text="The file, or the table in this database."
    )
    sha256 = models.CharField(
        max_length=64, db_index=True, help_text="Hash of the imported pairs."
    )
    mode = models.CharField(max_length=8, choices=Mode.choices)
    rows = models.PositiveBigIntegerField(help_text="Rows read from the old table.")
    pairs = models.PositiveBigIntegerField(help_text="(key, node) pairs imported.")
    changed = models.PositiveBigIntegerField(help_text="Pairs whose count changed.")
    total = models.PositiveBigIntegerField(help_text="Sum of the imported counts.")
    skipped = models.PositiveBigIntegerField(help_text="Rows left out as unusable.")
    skipped_reasons = models.JSONField(default=dict, blank=True)
    actor = models.CharField(max_length=150, blank=True)
    imported_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        verbose_name = "history import"
        ordering = ["-imported_at"]

    def __str__(self) -> str:
        return f"import #{self.pk} of {self.source} ({self.mode})"


class WatchState(models.Model):
    """Progress and health of one watch stream (`pods` or `nodes`).

    Written by the watcher in the same transaction as the counts, so a restart resumes
    from `resource_version` without losing or repeating anything. An event that can
    never be written is skipped and noted in `skipped_events`/`last_skipped`. Read
    by the admin overview, the metrics, `/readyz` and `watcher_health`.
    """

    name = models.CharField(max_length=32, primary_key=True)
    resource_version = models.CharField(max_length=64, blank=True)
    last_event_at = models.DateTimeField(null=True, blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    relists = models.PositiveBigIntegerField(default=0)
    events = models.PositiveBigIntegerField(default=0)
    holder = models.CharField(max_length=253, blank=True)
    skipped_events = models.PositiveBigIntegerField(
        default=0, help_text="Events dropped because they could not be written."
    )
    last_skipped = models.CharField(max_length=500, blank=True)
    last_skipped_at = models.DateTimeField(null=True, blank=True)
    updated = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name} at {self.resource_version or '-'}"


class NodeRecord(models.Model):
    """The identity of a node name: its current UID and since when history counts.

    Written by the watcher from Node objects. A new UID under the same name means the
    node was replaced: `history_since` moves forward and older history no longer scores.
    """

    name = models.CharField(max_length=253, unique=True)
    uid = models.CharField(max_length=64)
    first_seen_at = models.DateTimeField(auto_now_add=True)
    history_since = models.DateTimeField(null=True, blank=True)
    replacements = models.PositiveIntegerField(default=0)
    updated = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"{self.name} ({self.uid})"


class KeyPolicy(models.Model):
    """How the scoring treats pods whose pipeline label contains `key`.

    Edited by platform engineers in the admin. The most specific segment of a label
    that has a policy decides: `enabled=False` opts the key out (every node gets the
    same neutral score), `weight` scales the history bonus (1 = as computed), and
    `worth` says whether the weight learned from the pipeline's outcomes
    (`history.worth`) applies on top of it (auto), the weight alone does (fixed), or
    no warm pull at all (off: weight 0, pins and bans still apply).
    """

    class Worth(models.TextChoices):
        AUTO = "auto", "auto (learned from outcomes, times the weight)"
        FIXED = "fixed", "fixed (the weight alone)"
        OFF = "off", "off (no warm pull)"

    key = models.CharField(
        max_length=253,
        unique=True,
        validators=[validate_policy_key],
        help_text=POLICY_KEY_RULE,
    )
    enabled = models.BooleanField(
        default=True, help_text="Off: no node preference for this key."
    )
    weight = models.FloatField(
        default=1.0, help_text="Scales the history bonus; 0 to 10, 1 = unchanged."
    )
    worth = models.CharField(
        max_length=5,
        choices=Worth.choices,
        default=Worth.AUTO,
        help_text="Warmth's worth: learned (auto), the weight alone, or off.",
    )
    note = models.CharField(max_length=253, blank=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "key policy"
        verbose_name_plural = "key policies"
        ordering = ["key"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(weight__gte=0) & models.Q(weight__lte=10),
                name="keypolicy_weight_range",
            )
        ]

    def __str__(self) -> str:
        state = "on" if self.enabled else "opted out"
        return f"{self.key}: {state}, weight {self.weight:g}, worth {self.worth}"


class NodePolicy(models.Model):
    """Pin (always prefer, score 10) or ban (never prefer, score 0) `node` for `key`.

    Edited by platform engineers in the admin. When several segments of a label have a
    rule for the same node, the most specific segment's rule wins.
    """

    class Action(models.TextChoices):
        PIN = "pin", "pin (always prefer)"
        BAN = "ban", "ban (never prefer)"

    key = models.CharField(
        max_length=253, validators=[validate_policy_key], help_text=POLICY_KEY_RULE
    )
    node = models.CharField(
        max_length=253, validators=[validate_node_name], help_text=NODE_NAME_RULE
    )
    action = models.CharField(max_length=8, choices=Action.choices)
    note = models.CharField(max_length=253, blank=True)
    updated = models.DateTimeField(auto_now=True)

    class Meta:
        verbose_name = "node policy"
        verbose_name_plural = "node policies"
        ordering = ["key", "node"]
        constraints = [
            models.UniqueConstraint(
                fields=["key", "node"], name="nodepolicy_key_node_uniq"
            )
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.node} for {self.key}"


class LearnedDepth(models.Model):
    """The workspace depth last read from the ledger's outcomes, for
    KSSCHED_WORKSPACE_DEPTH=auto: the depth from which exact placements start like
    cold (or partial) ones (`history.workspaces.workspace_report`'s `gone_from`),
    or None with the report's reason. One row, written by the watcher that holds
    the lease (`history.watcher.housekeeping`); read by every extender process
    (`history.depth_feed`)."""

    depth = models.PositiveSmallIntegerField(null=True, blank=True)
    reason = models.CharField(max_length=500, blank=True)
    measured_at = models.DateTimeField()

    class Meta:
        verbose_name = "learned workspace depth"

    def __str__(self) -> str:
        found = "none" if self.depth is None else str(self.depth)
        return f"workspace depth {found} (measured {self.measured_at:%Y-%m-%d %H:%M})"

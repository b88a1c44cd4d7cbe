"""Admin for pipeline history: KeyNode counts are editable, the ledger is read-only.

Every count change goes through `history.corrections`, so it is recorded as a
CountAdjustment and `audit_counts` does not report it as drift, and every change is
written to the object's admin history as "old → new". Members of the view-only group
browse and export CSV; they see no edit controls and no actions that write.
"""

from __future__ import annotations

import csv
from collections.abc import Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlencode

from django import forms
from django.contrib import admin
from django.db.models import Model, QuerySet
from django.forms.formsets import BaseFormSet
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils import timezone
from django.utils.html import conditional_escape, format_html
from django.utils.safestring import SafeString, mark_safe

from history import corrections
from history.admin_base import (
    HistoryModelAdmin,
)
from history.admin_corrections import KeyNodeCorrections
from history.admin_filters import (
    ActiveFilter,
    CountFilter,
    KeyFilter,
    KindFilter,
    NodeFilter,
)
from history.labels import key_kind, key_label
from history.models import (
    CountAdjustment,
    HistoryImport,
    KeyNode,
    KeyPolicy,
    NodePolicy,
    Placement,
)
from history.recency import weight_now

if TYPE_CHECKING:
    from django.contrib.admin.options import _FieldsetSpec


# The pipeline page lives in the extender app (it needs the scoring strategy) and is
# routed in kssched/urls.py under this name.
PIPELINE_URL_NAME = "admin-pipeline"
WEIGHT_NOW_HELP = (
    "Weight now is what the warm scoring uses for a row: every placement counts 1 "
    "and halves every KSSCHED_HALF_LIFE_DAYS days, and it never exceeds the count. "
    "Raising a count adds the difference as placements made at the moment of the "
    "edit; lowering it caps the weight at the new count. Below 0.1 the row is "
    "forgotten. The seed scoring uses the count."
)


def pipeline_url(value: str) -> str:
    return f"{reverse(PIPELINE_URL_NAME)}?{urlencode({'q': value})}"


def placements_url(**params: str) -> str:
    return f"{reverse('admin:history_placement_changelist')}?{urlencode(params)}"


def csv_cell(value: object) -> str:
    """A CSV cell that spreadsheets do not evaluate as a formula."""
    text = "" if value is None else str(value)
    return f"'{text}" if text[:1] in ("=", "+", "-", "@") else text


def breakable_node(name: str) -> str:
    """A node name that may wrap after its dots as well as at its hyphens
    (`ip-10-1-2-3.eu-central-1.compute.internal`), never inside a word."""
    return mark_safe(
        ".<wbr>".join(conditional_escape(part) for part in name.split("."))
    )


class NodeColumn:
    """The node column of a change list (`node_name`), wrapping where a node name may.

    A model field would take precedence over a method named `node`, hence the name.
    """

    @admin.display(description="node", ordering="node")
    def node_name(self, obj: KeyNode | Placement) -> str:
        return breakable_node(obj.node)


@admin.register(KeyNode)
class KeyNodeAdmin(KeyNodeCorrections, NodeColumn, HistoryModelAdmin[KeyNode]):
    list_display = (
        "key",
        "node_name",
        "count",
        "kind",
        "weight",
        "last_placement",
        "updated",
        "links",
    )
    list_editable = ("count",)
    list_filter = (
        KindFilter,
        KeyFilter,
        NodeFilter,
        CountFilter,
        "last_placed_at",
        "updated",
    )
    search_fields = ("key", "node")
    date_hierarchy = "updated"
    ordering = ("key", "node")
    list_per_page = 100
    actions = ("export_csv", "reset_counts", "halve_counts")
    # Explicit, so that state the watcher maintains (decay) never enters the form.
    fieldsets = (
        (None, {"fields": ("key", "node", "count")}),
        ("Scoring", {"fields": ("weight",), "description": WEIGHT_NOW_HELP}),
        (None, {"fields": ("last_placed_at", "created", "updated")}),
    )

    def get_fieldsets(
        self, request: HttpRequest, obj: KeyNode | None = None
    ) -> _FieldsetSpec:
        # A row being added has no weight yet: it gets its count, valued now.
        if obj is None:
            return [self.fieldsets[0], self.fieldsets[2]]
        return self.fieldsets

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        extra_context = {"weight_now_help": WEIGHT_NOW_HELP, **(extra_context or {})}
        return super().changelist_view(request, extra_context)

    @admin.display(description="kind")
    def kind(self, obj: KeyNode) -> str:
        return key_kind(obj.key)

    @admin.display(description="weight now")
    def weight(self, obj: KeyNode) -> str:
        value = weight_now(
            count=obj.count,
            weight=obj.decayed_weight,
            at=obj.decayed_at,
            now=timezone.now().timestamp(),
        )
        return f"{value:.2f}"

    @admin.display(description="last placement", ordering="last_placed_at")
    def last_placement(self, obj: KeyNode) -> datetime | None:
        return obj.last_placed_at

    @admin.display(description="see")
    def links(self, obj: KeyNode) -> SafeString:
        return format_html(
            '<a href="{}">placements</a> · <a href="{}">pipeline</a>',
            placements_url(key=obj.key, node=obj.node),
            pipeline_url(key_label(obj.key)),
        )

    def get_readonly_fields(
        self, request: HttpRequest, obj: KeyNode | None = None
    ) -> tuple[str, ...]:
        # Key and node identify the row in the ledger; renaming would break audits.
        # The watcher owns last_placed_at.
        if obj:
            return ("key", "node", "weight", "last_placed_at", "created", "updated")
        return ("last_placed_at", "created", "updated")

    def save_model(
        self,
        request: HttpRequest,
        obj: KeyNode,
        form: forms.ModelForm[KeyNode],
        change: bool,
    ) -> None:
        actor = request.user.get_username()
        if not change:
            created = corrections.create_key_node(
                key=obj.key, node=obj.node, count=obj.count, actor=actor
            )
            obj.pk = created.pk
            return
        if "count" in form.changed_data:
            new = obj.count
            delta = corrections.set_key_node_count(key_node=obj, count=new, actor=actor)
            # Kept for construct_change_message, which runs right after (an attribute
            # of this instance only, not a model field).
            obj._count_change = (new - delta, new)  # type: ignore[attr-defined]

    # The stub is narrower than Django: the form Django passes is the ModelForm (the
    # stub says forms.Form), and log_change also takes a plain text message (the
    # stub allows only the structured list).
    def construct_change_message(  # type: ignore[override]
        self,
        request: HttpRequest,
        form: forms.ModelForm[KeyNode],
        formsets: Iterable[BaseFormSet[Any]],
        add: bool = False,
    ) -> str | list[dict[str, dict[str, list[str]]]]:
        if add:
            return f"Added with count {form.instance.count}."
        change = getattr(form.instance, "_count_change", None)
        if change:
            old, new = change
            return f"Changed count from {old} to {new}."
        return super().construct_change_message(
            request,
            form,  # type: ignore[arg-type]  # a ModelForm, as Django passes it
            formsets,
            add,
        )

    @admin.action(description="Export selected rows as CSV", permissions=["view"])
    def export_csv(
        self, request: HttpRequest, queryset: QuerySet[KeyNode]
    ) -> HttpResponse:
        stamp = timezone.now().strftime("%Y%m%dT%H%M%SZ")
        response = HttpResponse(content_type="text/csv; charset=utf-8")
        response["Content-Disposition"] = f'attachment; filename="keynodes-{stamp}.csv"'
        writer = csv.writer(response)
        writer.writerow(["key", "node", "count", "last_placed_at", "updated"])
        for row in queryset.order_by("key", "node"):
            writer.writerow(
                [
                    csv_cell(row.key),
                    csv_cell(row.node),
                    row.count,
                    row.last_placed_at.isoformat() if row.last_placed_at else "",
                    row.updated.isoformat(),
                ]
            )
        return response


_M = TypeVar("_M", bound=Model)


class ReadOnlyAdmin(HistoryModelAdmin[_M]):
    """Facts recorded by the watcher or by edits: browsable, never editable."""

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(
        self, request: HttpRequest, obj: _M | None = None
    ) -> bool:
        return False

    def has_delete_permission(
        self, request: HttpRequest, obj: _M | None = None
    ) -> bool:
        return False


@admin.register(Placement)
class PlacementAdmin(NodeColumn, ReadOnlyAdmin[Placement]):
    list_display = (
        "pod_name",
        "namespace",
        "label_link",
        "node_name",
        "bound_at",
        "finished_at",
        "warmth_short",
    )
    list_filter = (KeyFilter, NodeFilter, ActiveFilter, "warmth", "bound_at")
    search_fields = ("pod_uid", "name", "namespace", "label", "node")
    date_hierarchy = "bound_at"
    list_per_page = 100

    @admin.display(description="name", ordering="name")
    def pod_name(self, obj: Placement) -> SafeString:
        # On one line (a name is read and copied whole); one longer than its
        # column ends in "…" and shows whole on hover.
        return format_html(
            '<span class="ks-pod-name" title="{}">{}</span>', obj.name, obj.name
        )

    @admin.display(description="warmth", ordering="warmth")
    def warmth_short(self, obj: Placement) -> str:
        return obj.warmth or "-"

    @admin.display(description="label", ordering="label")
    def label_link(self, obj: Placement) -> SafeString:
        return format_html(
            '<a href="{}" title="pipeline page">{}</a>',
            pipeline_url(obj.label),
            obj.label,
        )


@admin.register(CountAdjustment)
class CountAdjustmentAdmin(ReadOnlyAdmin[CountAdjustment]):
    list_display = ("key", "node", "delta", "reason", "actor", "created")
    list_filter = ("reason", "created")
    search_fields = ("key", "node", "actor")
    date_hierarchy = "created"


@admin.register(HistoryImport)
class HistoryImportAdmin(ReadOnlyAdmin[HistoryImport]):
    """Imports of the Go ks-scheduler's history (`import_history`, `migrate`)."""

    list_display = (
        "imported_at",
        "source",
        "mode",
        "rows",
        "pairs",
        "changed",
        "total",
        "skipped",
        "actor",
    )
    list_filter = ("mode",)
    search_fields = ("source", "sha256")


@admin.register(KeyPolicy)
class KeyPolicyAdmin(HistoryModelAdmin[KeyPolicy]):
    """Per-key scoring policy for the `warm` strategy: opt out or weight a key."""

    list_display = ("key", "enabled", "weight", "worth", "note", "updated")
    list_editable = ("enabled", "weight", "worth")
    list_filter = ("enabled", "worth")
    search_fields = ("key", "note")
    ordering = ("key",)


@admin.register(NodePolicy)
class NodePolicyAdmin(HistoryModelAdmin[NodePolicy]):
    """Pin or ban a node for a key in the `warm` strategy."""

    list_display = ("key", "node", "action", "note", "updated")
    list_filter = ("action",)
    search_fields = ("key", "node", "note")
    ordering = ("key", "node")

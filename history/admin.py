"""Admin for pipeline history: KeyNode counts are editable, the ledger is read-only.

Every count change goes through `history.services`, so it is recorded as a
CountAdjustment and `audit_counts` does not report it as drift.
"""

from django.contrib import admin

from history import services
from history.models import CountAdjustment, KeyNode, KeyPolicy, NodePolicy, Placement


@admin.register(KeyNode)
class KeyNodeAdmin(admin.ModelAdmin):
    list_display = ("key", "node", "count", "last_placed_at", "updated")
    list_filter = ("updated", "last_placed_at")
    search_fields = ("key", "node")
    date_hierarchy = "updated"
    ordering = ("key", "node")
    list_per_page = 100

    def get_readonly_fields(self, request, obj=None):
        # Key and node identify the row in the ledger; renaming would break audits.
        return ("key", "node", "created", "updated") if obj else ("created", "updated")

    def save_model(self, request, obj, form, change):
        actor = request.user.get_username()
        if not change:
            created = services.create_key_node(
                key=obj.key, node=obj.node, count=obj.count, actor=actor
            )
            obj.pk = created.pk
            return
        if "count" in form.changed_data:
            services.set_key_node_count(key_node=obj, count=obj.count, actor=actor)

    def delete_model(self, request, obj):
        services.delete_key_nodes(key_nodes=[obj], actor=request.user.get_username())

    def delete_queryset(self, request, queryset):
        services.delete_key_nodes(
            key_nodes=list(queryset), actor=request.user.get_username()
        )


class ReadOnlyAdmin(admin.ModelAdmin):
    """Facts recorded by the watcher or by edits: browsable, never editable."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Placement)
class PlacementAdmin(ReadOnlyAdmin):
    list_display = ("pod_uid", "namespace", "name", "label", "node", "bound_at")
    list_filter = ("finished_at", "warmth", "bound_at")
    search_fields = ("pod_uid", "name", "label", "node")
    date_hierarchy = "bound_at"


@admin.register(CountAdjustment)
class CountAdjustmentAdmin(ReadOnlyAdmin):
    list_display = ("key", "node", "delta", "reason", "actor", "created")
    list_filter = ("reason", "created")
    search_fields = ("key", "node", "actor")
    date_hierarchy = "created"

@admin.register(KeyPolicy)
class KeyPolicyAdmin(admin.ModelAdmin):
    """Per-key scoring policy for the `warm` strategy: opt out or weight a key."""

    list_display = ("key", "enabled", "weight", "note", "updated")
    list_editable = ("enabled", "weight")
    list_filter = ("enabled",)
    search_fields = ("key", "note")
    ordering = ("key",)


@admin.register(NodePolicy)
class NodePolicyAdmin(admin.ModelAdmin):
    """Pin or ban a node for a key in the `warm` strategy."""

    list_display = ("key", "node", "action", "note", "updated")
    list_filter = ("action",)
    search_fields = ("key", "node", "note")
    ordering = ("key", "node")

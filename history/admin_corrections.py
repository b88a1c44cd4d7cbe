"""How the KeyNode admin changes counts: single deletions, bulk actions and their
admin history, all through `history.corrections`.

"Select all" on a busy prefix key selects a row per node it ran on, thousands of
rows: the actions are set-based (`corrections`), their admin history is written a
batch at a time (`adminlog`), and the delete confirmation names the first
DELETE_LISTED rows and counts the rest.
"""

from collections.abc import Callable, Sequence
from typing import Protocol

from django.contrib import admin, messages
from django.contrib.admin.models import CHANGE, DELETION
from django.db.models import QuerySet
from django.http import HttpRequest

from history import corrections
from history.adminlog import key_node_repr, log_key_node_entries
from history.models import KeyNode

# Rows named on the confirmation page of "Delete selected"; the rest are counted.
DELETE_LISTED = 100

_BatchLogger = Callable[[list[corrections.CountChange]], None]


class _Correction(Protocol):
    """A bulk correction of `corrections` (`reset_key_nodes`, `halve_key_nodes`)."""

    def __call__(
        self,
        *,
        key_nodes: QuerySet[KeyNode],
        actor: str,
        on_batch: _BatchLogger | None = None,
    ) -> int: ...


class KeyNodeCorrections(admin.ModelAdmin[KeyNode]):
    """The KeyNode admin's deletions and its "reset" and "halve" bulk actions."""

    def delete_model(self, request: HttpRequest, obj: KeyNode) -> None:
        corrections.delete_key_nodes(key_nodes=[obj], actor=request.user.get_username())

    def get_deleted_objects(
        self, objs: Sequence[KeyNode] | QuerySet[KeyNode], request: HttpRequest
    ) -> tuple[list[str], dict[str, int], set[str], list[str]]:
        # A KeyNode row has no related rows: the confirmation of a large selection
        # names the first DELETE_LISTED rows and counts the rest (building a link
        # per row took seconds for "select all" on a busy key).
        total = objs.count() if isinstance(objs, QuerySet) else len(objs)
        listed, counts, perms, protected = super().get_deleted_objects(
            list(objs[:DELETE_LISTED]), request
        )
        if total > DELETE_LISTED:
            name = str(KeyNode._meta.verbose_name_plural)
            listed.append(f"… and {total - DELETE_LISTED} more {name}")
            counts = {name: total}
        return listed, counts, perms, protected

    # Django ignores the return value (the stub's list of LogEntry): the entries are
    # written without making LogEntry instances.
    def log_deletions(  # type: ignore[override]
        self, request: HttpRequest, queryset: QuerySet[KeyNode] | Sequence[KeyNode]
    ) -> None:
        # As Django's, without building a model instance per row.
        rows = (
            queryset.values_list("pk", "key", "node", "count")
            if isinstance(queryset, QuerySet)
            else [(row.pk, row.key, row.node, row.count) for row in queryset]
        )
        log_key_node_entries(
            # The admin serves logged-in staff: never AnonymousUser (pk None).
            user_id=request.user.pk,  # type: ignore[arg-type]
            action_flag=DELETION,
            entries=[
                (pk, key_node_repr(key=key, node=node, count=count), "")
                for pk, key, node, count in rows
            ],
        )

    def delete_queryset(
        self, request: HttpRequest, queryset: QuerySet[KeyNode]
    ) -> None:
        corrections.delete_key_nodes(
            key_nodes=queryset, actor=request.user.get_username()
        )

    @admin.action(description="Reset selected counts to zero", permissions=["change"])
    def reset_counts(self, request: HttpRequest, queryset: QuerySet[KeyNode]) -> None:
        self._correct(request, queryset, corrections.reset_key_nodes, "Reset")

    @admin.action(description="Halve selected counts", permissions=["change"])
    def halve_counts(self, request: HttpRequest, queryset: QuerySet[KeyNode]) -> None:
        self._correct(request, queryset, corrections.halve_key_nodes, "Halved")

    def _correct(
        self,
        request: HttpRequest,
        queryset: QuerySet[KeyNode],
        correction: _Correction,
        verb: str,
    ) -> None:
        """Apply a bulk `correction` to the selection, log it, say how many changed."""
        changed = correction(
            key_nodes=queryset,
            actor=request.user.get_username(),
            on_batch=self._bulk_logger(request, verb),
        )
        self.message_user(
            request,
            f"{verb} {changed} count(s); rows already at the target were skipped.",
            messages.SUCCESS,
        )

    def _bulk_logger(self, request: HttpRequest, verb: str) -> _BatchLogger:
        """Writes each changed row's "old → new" to its admin history, a batch of
        rows per statement (`adminlog`)."""

        def log(changes: list[corrections.CountChange]) -> None:
            log_key_node_entries(
                # The admin serves logged-in staff: never AnonymousUser (pk None).
                user_id=request.user.pk,  # type: ignore[arg-type]
                action_flag=CHANGE,
                entries=[
                    (
                        change.pk,
                        key_node_repr(
                            key=change.key, node=change.node, count=change.new
                        ),
                        f"{verb} count from {change.old} to {change.new} "
                        f"(bulk action).",
                    )
                    for change in changes
                ],
            )

        return log

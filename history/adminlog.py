"""The admin history of KeyNode rows, written in bulk.

A bulk action changes thousands of rows at once, and each row keeps its line in
its admin history ("Halved count from 40 to 20 (bulk action)."). Django writes such
lines with `bulk_create`, which prepares every row in Python (about half a second
for 10 000 rows, several times that on PostgreSQL); here they are one
`INSERT ... SELECT` per BULK_ROWS rows, as the counts themselves are.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django.contrib.admin.models import LogEntry
from django.contrib.contenttypes.models import ContentType
from django.db import connection
from django.utils import timezone

from history.corrections import BULK_ROWS
from history.models import KeyNode
from history.sqlrows import rows_table

_ENTRY = (("object_id", "text"), ("object_repr", "text"), ("change_message", "text"))
# LogEntry.object_repr's length.
REPR_LENGTH = 200


def key_node_repr(*, key: str, node: str, count: int) -> str:
    """What the admin history calls a KeyNode row (`KeyNode.describe`)."""
    return KeyNode.describe(key=key, node=node, count=count)[:REPR_LENGTH]


def log_key_node_entries(
    *,
    user_id: int,
    action_flag: int,
    entries: Sequence[tuple[int, str, str]],
    now: datetime | None = None,
) -> None:
    """One admin history line per (pk, object_repr, change_message) of KeyNode
    rows, by `user_id`, of `action_flag` (ADDITION, CHANGE or DELETION)."""
    # Makes sure the row exists; its id is read in the statement itself, since the
    # manager's cached id outlives a flush of the table (a test database's).
    ContentType.objects.get_for_model(KeyNode, for_concrete_model=False)
    content_types = ContentType._meta.db_table
    stamp = connection.ops.adapt_datetimefield_value(now or timezone.now())
    table = LogEntry._meta.db_table
    with connection.cursor() as cursor:
        for start in range(0, len(entries), BULK_ROWS):
            rows, params = rows_table(
                [
                    (str(pk), text[:REPR_LENGTH], message)
                    for pk, text, message in entries[start : start + BULK_ROWS]
                ],
                columns=_ENTRY,
            )
            cursor.execute(
                f"INSERT INTO {table} (action_time, user_id, content_type_id, "
                f"object_id, object_repr, action_flag, change_message) "
                f"SELECT %s, %s, (SELECT id FROM {content_types} WHERE app_label = %s "
                f"AND model = %s), r.object_id, r.object_repr, %s, r.change_message "
                f"FROM ({rows}) AS r",
                [
                    stamp,
                    user_id,
                    KeyNode._meta.app_label,
                    KeyNode._meta.model_name,
                    action_flag,
                    *params,
                ],
            )

"""The history store read straight from the database: one statement per call.

Used when the cache is off, inside transactions (where a cache could hold a write
that is then rolled back), and by callers that want the database's word. The
statement's shape (`history_sql`) is shared with the caches, which read the small
tables with it, and decoded in one place (`model.decode`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import orjson
import psycopg
from django.db import connection
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper

from history.labels import distinct_keys, split_pipeline_label
from history.models import KeyNode, KeyPolicy, NodePolicy, NodeRecord, Placement
from history.reader.depths import (
    Recent,
    decode_recent,
    depths_of,
    pipeline_key,
    ran_on,
    recent_sql,
)
from history.reader.model import (
    LabelHistory,
    Small,
    decode,
    empty_history,
)
from history.reader.pool import database_pool

# Typed NULLs: the columns of a UNION ALL must agree on PostgreSQL.
NULL_TEXT = "CAST(NULL AS TEXT)"
NULL_NUMBER = "CAST(NULL AS BIGINT)"
NULL_REAL = "CAST(NULL AS DOUBLE PRECISION)"


# Nodes whose recent pipelines one SQLite statement reads (a compound SELECT of one
# part per node: SQLite allows 500).
RECENT_NODES = 400

# SQLite's log of pods that started or stopped running (migration 0010's triggers).
POD_LOG = "history_podlog"


def history_sql(
    *,
    keys: int = 0,
    policy_keys: int = 0,
    rows_condition: str | None = None,
    running: bool = True,
) -> str:
    """One statement of (kind, first, second, third, number, real, real2) rows:
    running pods per (node, label), key and node policies, replaced nodes, and,
    when `rows_condition` is given, the KeyNode rows it selects. `keys` limits the
    rows to that many key parameters (given first, then the condition's), and
    `policy_keys` > 0 the policies to that many (given again for each policy
    table; 0: every policy). `running` False leaves the running pods out."""
    text, number, real = NULL_TEXT, NULL_NUMBER, NULL_REAL
    marks = ", ".join(["%s"] * keys)
    policy_marks = ", ".join(["%s"] * policy_keys)
    only = f" WHERE key IN ({policy_marks})" if policy_keys else ""
    parts = []
    if rows_condition is not None:
        parts.append(
            f"SELECT {Small.ROW:d}, node, key, {text}, count, decayed_weight, "
            f"decayed_at FROM {KeyNode._meta.db_table} "
            f"WHERE key IN ({marks}) AND count > 0 AND {rows_condition}"
        )
    if running and connection.vendor == "postgresql":
        # The snapshot the running pods were read under (see postgres_cache).
        parts.append(
            f"SELECT {Small.SNAPSHOT:d}, CAST(pg_current_snapshot() AS TEXT), "
            f"{text}, {text}, {number}, {real}, {real}"
        )
    elif running:
        # The last pod log id the running pods include (see sqlite_cache): one
        # statement reads one state of the file.
        parts.append(
            f"SELECT {Small.SNAPSHOT:d}, CAST(COALESCE(MAX(id), 0) AS TEXT), "
            f"{text}, {text}, {number}, {real}, {real} FROM {POD_LOG}"
        )
    if running:
        parts.append(
            f"SELECT {Small.RUNNING:d}, node, label, {text}, COUNT(*), {real}, "
            f"{real} FROM {Placement._meta.db_table} WHERE finished_at IS NULL "
            f"GROUP BY node, label"
        )
    parts += [
        f"SELECT {Small.KEY_POLICY:d}, key, {text}, worth, "
        f"CASE WHEN enabled THEN 1 ELSE 0 END, weight, {real} "
        f"FROM {KeyPolicy._meta.db_table}{only}",
        f"SELECT {Small.NODE_POLICY:d}, key, node, action, {number}, {real}, {real} "
        f"FROM {NodePolicy._meta.db_table}{only}",
        f"SELECT {Small.REPLACED:d}, name, CAST(history_since AS TEXT), {text}, "
        f"{number}, {real}, {real} FROM {NodeRecord._meta.db_table} "
        f"WHERE replacements > 0 AND history_since IS NOT NULL",
    ]
    return " UNION ALL ".join(parts)


class SqlReader:
    """Answers `read` with one statement, none per node: the label's rows on the
    nodes (served by the (key, node) index), the running pods (a partial index),
    the replaced nodes and the policies of the label's keys."""

    def read(
        self,
        *,
        keys: Sequence[str],
        label: str,
        nodes: Sequence[str] | None,
        depths: bool = False,
    ) -> LabelHistory:
        unique = list(distinct_keys(keys))
        if not unique or nodes is not None and not nodes:
            return empty_history(keys)
        params: list[object] = list(unique)
        if nodes is None:
            condition = "1 = 1"
        else:
            condition, param = nodes_condition("node", nodes)
            params.append(param)
        # Policies belong to the label's segments, whichever keys are read.
        policy_keys = distinct_keys([*unique, *split_pipeline_label(label)])
        found = decode(
            fetch_all(
                history_sql(
                    keys=len(unique),
                    policy_keys=len(policy_keys),
                    rows_condition=condition,
                ),
                [*params, *policy_keys, *policy_keys],
            ),
            as_timestamp,
        )
        active = found.active.get(label, {})
        key = pipeline_key(unique) if depths else None
        ran = ran_on(found.rows.get(key, {}), found.replaced) if key else []
        return LabelHistory(
            keys=tuple(keys),
            by_key=found.rows,
            replaced=found.replaced,
            active=active,
            busy=found.busy,
            policies=found.policies,
            depths=depths_of(key, ran, read_recent(ran)) if key else {},
        )

    def pool(self, *, now: float, days: float) -> tuple[str, ...]:
        """The pipeline pool (`pool.database_pool`)."""
        return database_pool.at(now=now, days=days)

    def node_history(self, *, keys: Sequence[str], node: str) -> LabelHistory:
        """The label's rows on one node and the node's replacement, nothing else
        (no running pods, no policies): what warmth classification needs, at a
        cost that does not grow with the pods running elsewhere."""
        unique = list(distinct_keys(keys))
        if not unique:
            return empty_history(keys)
        marks = ", ".join(["%s"] * len(unique))
        text, number, real = NULL_TEXT, NULL_NUMBER, NULL_REAL
        found = decode(
            fetch_all(
                f"SELECT {Small.ROW:d}, node, key, {text}, count, decayed_weight, "
                f"decayed_at FROM {KeyNode._meta.db_table} "
                f"WHERE node = %s AND key IN ({marks}) AND count > 0 "
                f"UNION ALL SELECT {Small.REPLACED:d}, name, "
                f"CAST(history_since AS TEXT), {text}, {number}, {real}, {real} "
                f"FROM {NodeRecord._meta.db_table} WHERE name = %s "
                f"AND replacements > 0 AND history_since IS NOT NULL",
                [node, *unique, node],
            ),
            as_timestamp,
        )
        return LabelHistory(
            keys=tuple(keys),
            by_key=found.rows,
            replaced=found.replaced,
            active={},
            busy={},
        )


def fetch_all(sql: str, params: Sequence[Any]) -> list[tuple[Any, ...]]:
    """Run one statement and return its rows. On PostgreSQL the parameters are
    bound on the server (a node list is one array parameter, not kilobytes of SQL
    text, and a statement run often is prepared once per connection)."""
    if connection.vendor != "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            found: list[tuple[Any, ...]] = cursor.fetchall()
            return found
    connection.ensure_connection()
    # Django's own wrappers: errors become Django's, and the query is logged where
    # Django logs queries.
    wrapper = CursorDebugWrapper if connection.queries_logged else CursorWrapper
    with wrapper(psycopg.Cursor(connection.connection), connection) as cursor:
        cursor.execute(sql, params)
        rows: list[tuple[Any, ...]] = cursor.fetchall()
        return rows


def read_recent(nodes: Sequence[str]) -> dict[str, Recent]:
    """node -> its recent pipelines (`depths`), for `nodes`: one statement (on
    SQLite, one per RECENT_NODES nodes)."""
    found: list[tuple[Any, ...]] = []
    vendor = connection.vendor
    if vendor == "postgresql":
        if nodes:
            found = fetch_all(recent_sql(vendor, len(nodes)), [list(nodes)])
    else:
        for start in range(0, len(nodes), RECENT_NODES):
            chunk = nodes[start : start + RECENT_NODES]
            found += fetch_all(recent_sql(vendor, len(chunk)), chunk)
    return decode_recent(found, as_timestamp)


def read_placed(pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], float]:
    """(key, node) -> when that row was last placed, for the `pairs` that have a
    row with a placement time, in one statement."""
    if not pairs:
        return {}
    where = " OR ".join(["(key = %s AND node = %s)"] * len(pairs))
    found = fetch_all(
        f"SELECT key, node, last_placed_at FROM {KeyNode._meta.db_table} "
        f"WHERE ({where}) AND last_placed_at IS NOT NULL",
        [part for pair in pairs for part in pair],
    )
    return {(key, node): as_timestamp(at) for key, node, at in found}


def nodes_condition(column: str, nodes: Sequence[str]) -> tuple[str, str | list[str]]:
    """A `column IN nodes` condition with one parameter, whatever the node count."""
    if connection.vendor == "postgresql":
        return f"{column} = ANY(%s)", list(nodes)
    return f"{column} IN (SELECT value FROM json_each(%s))", orjson.dumps(
        list(nodes)
    ).decode()


def as_timestamp(value: datetime | str) -> float:
    """Unix seconds of a datetime column read with a plain cursor: a datetime, or
    text (SQLite's storage; PostgreSQL's `CAST(... AS TEXT)` with its offset)."""
    if isinstance(value, str):
        value = datetime.fromisoformat(value)
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
    return value.timestamp()

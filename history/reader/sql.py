"""The history store read straight from the database: one statement per call.

Used on PostgreSQL, inside transactions (where a cache could hold a write that is
then rolled back), and by `explain`-style callers that want the database's word.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

import orjson
import psycopg
from django.db import connection
from django.db.backends.utils import CursorDebugWrapper, CursorWrapper

from history.models import KeyNode, KeyPolicy, NodePolicy, NodeRecord, Placement
from history.reader.model import LabelHistory, Policies, empty_history
from history.recency import Row

# Typed NULLs: the columns of a UNION ALL must agree on PostgreSQL.
NULL_TEXT = "CAST(NULL AS TEXT)"
NULL_NUMBER = "CAST(NULL AS BIGINT)"
NULL_REAL = "CAST(NULL AS DOUBLE PRECISION)"


class SqlReader:
    """Answers `read` with one statement, none per node: the label's rows on the
    nodes (served by the (key, node) index), the replaced nodes among those with
    rows, the active pods (a partial index) and the policies of the label's keys.
    """

    def read(
        self, *, keys: Sequence[str], label: str, nodes: Sequence[str] | None
    ) -> LabelHistory:
        unique = list(dict.fromkeys(keys))
        if not unique or nodes is not None and not nodes:
            return empty_history(keys)
        node_params: list[str | list[str]] = []
        if nodes is None:
            condition = "1 = 1"
        else:
            condition, param = nodes_condition("node", nodes)
            node_params.append(param)
        marks = ", ".join(["%s"] * len(unique))
        text, number, real = NULL_TEXT, NULL_NUMBER, NULL_REAL
        sql = (
            f"WITH r AS (SELECT node, key, count, decayed_weight, decayed_at "
            f"FROM {KeyNode._meta.db_table} "
            f"WHERE key IN ({marks}) AND count > 0 AND {condition}) "
            f"SELECT 0, node, key, {text}, count, decayed_weight, decayed_at FROM r "
            f"UNION ALL SELECT 1, name, {text}, CAST(history_since AS TEXT), "
            f"{number}, {real}, {real} FROM {NodeRecord._meta.db_table} "
            f"WHERE replacements > 0 AND history_since IS NOT NULL "
            f"AND name IN (SELECT node FROM r) "
            f"UNION ALL SELECT 2, node, {text}, {text}, "
            f"SUM(CASE WHEN label = %s THEN 1 ELSE 0 END), COUNT(*), {real} "
            f"FROM {Placement._meta.db_table} WHERE finished_at IS NULL "
            f"GROUP BY node "
            f"UNION ALL SELECT 3, key, {text}, {text}, "
            f"CASE WHEN enabled THEN 1 ELSE 0 END, weight, {real} "
            f"FROM {KeyPolicy._meta.db_table} WHERE key IN ({marks}) "
            f"UNION ALL SELECT 4, key, node, action, {number}, {real}, {real} "
            f"FROM {NodePolicy._meta.db_table} WHERE key IN ({marks})"
        )
        found = fetch_all(sql, [*unique, *node_params, label, *unique, *unique])
        rows: dict[str, list[Row]] = {}
        replaced: dict[str, float] = {}
        active: dict[str, int] = {}
        busy: dict[str, int] = {}
        key_policies: dict[str, tuple[bool, float]] = {}
        node_policies: dict[str, dict[str, str]] = {}
        for kind, first, second, third, number_, real_, at in found:
            if kind == 0:
                row = (second, number_, real_, at)
                if first in rows:
                    rows[first].append(row)
                else:
                    rows[first] = [row]
            elif kind == 1:
                replaced[first] = as_timestamp(third)
            elif kind == 2:
                busy[first] = int(real_)
                if number_:
                    active[first] = number_
            elif kind == 3:
                key_policies[first] = (bool(number_), float(real_))
            else:
                node_policies.setdefault(first, {})[second] = third
        return LabelHistory(
            keys=tuple(keys),
            rows=rows,
            replaced=replaced,
            active=active,
            busy=busy,
            policies=Policies(keys=key_policies, nodes=node_policies),
        )


def fetch_all(sql: str, params: list) -> list[tuple]:
    """Run one statement and return its rows. On PostgreSQL the parameters are
    bound on the server (a node list is one array parameter, not kilobytes of SQL
    text, and a statement run often is prepared once per connection)."""
    if connection.vendor != "postgresql":
        with connection.cursor() as cursor:
            cursor.execute(sql, params)
            return cursor.fetchall()
    connection.ensure_connection()
    # Django's own wrappers: errors become Django's, and the query is logged where
    # Django logs queries.
    wrapper = CursorDebugWrapper if connection.queries_logged else CursorWrapper
    with wrapper(psycopg.Cursor(connection.connection), connection) as cursor:
        cursor.execute(sql, params)
        return cursor.fetchall()


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

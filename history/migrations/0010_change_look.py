"""PostgreSQL only: the cache's look as a function, so its plan is cached server-side.

`kssched_history_look(previous)` returns the current snapshot, the log's horizon
and the log rows the `previous` snapshot did not see, in one query under one
snapshot (see `history.reader.postgres_cache`). PL/pgSQL keeps the query's plan for
the life of the server session, so a call costs no planning of the query itself:
the caller prepares only the trivial `SELECT * FROM kssched_history_look($1)`, and
can send even that unprepared (behind a transaction-pooling proxy, where prepared
statements do not survive) for a few tens of microseconds more.
"""

from django.db import migrations

# Each use of the parameter goes through a scalar subquery and the limit is a
# literal, so the planner has nothing to fold into a custom plan and keeps the
# generic one after five calls; ORDER BY xid keeps the index scan even when the
# log's statistics are missing or stale (a sequential scan of a log of 100 000
# rows costs milliseconds). The limit is MAX_SYNC_PAIRS + 1: more rows than
# MAX_SYNC_PAIRS mean "start over".
FORWARD = """
CREATE FUNCTION kssched_history_look(previous text)
RETURNS TABLE (snapshot text, horizon text, kind smallint, key text, node text)
LANGUAGE plpgsql STABLE AS $$
BEGIN
    RETURN QUERY
    SELECT CAST(s AS text),
           CAST((SELECT h.horizon FROM history_change_horizon AS h WHERE h.id = 1)
                AS text),
           c.kind, c.key, c.node
    FROM pg_current_snapshot() AS s
    LEFT JOIN LATERAL (
        SELECT l.kind, l.key, l.node FROM history_change AS l
        WHERE l.xid >= (SELECT pg_snapshot_xmin(CAST(previous AS pg_snapshot)))
          AND NOT pg_visible_in_snapshot(
              l.xid, (SELECT CAST(previous AS pg_snapshot)))
        ORDER BY l.xid
        LIMIT 5001
    ) AS c ON TRUE;
END $$;
"""

BACKWARD = "DROP FUNCTION IF EXISTS kssched_history_look(text);"


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD)


class Migration(migrations.Migration):
    dependencies = [("history", "0009_history_import")]

    operations = [migrations.RunPython(forward, backward)]

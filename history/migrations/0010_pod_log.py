"""Running pipeline pods, followed change by change.

The per-worker caches keep the running pods per (label, node). Re-reading them all
after every commit made each placement cost in proportion to every pod running.
Now every start, finish, move or deletion of a running Placement row is logged by
a trigger, whatever writes it, and the caches apply the log:

- PostgreSQL: rows of the change log of migration 0005 (kind 3 a pod starts
  running, kind 4 it stops; `key` holds the label), replacing that table's
  statement-level "other" trigger.
- SQLite: its own log table, followed by id (SQLite commits one writer at a time,
  so ids become visible in order).
"""

from django.db import migrations

POD_LOG = "history_podlog"

SQLITE_FORWARD = [
    f"CREATE TABLE {POD_LOG} (id INTEGER PRIMARY KEY AUTOINCREMENT, "
    f"label TEXT NOT NULL, node TEXT NOT NULL, delta INTEGER NOT NULL)",
    f"CREATE TRIGGER kssched_pod_started AFTER INSERT ON history_placement "
    f"WHEN NEW.finished_at IS NULL BEGIN INSERT INTO {POD_LOG} (label, node, delta) "
    f"VALUES (NEW.label, NEW.node, 1); END",
    f"CREATE TRIGGER kssched_pod_changed AFTER UPDATE OF finished_at, label, node "
    f"ON history_placement BEGIN "
    f"INSERT INTO {POD_LOG} (label, node, delta) SELECT OLD.label, OLD.node, -1 "
    f"WHERE OLD.finished_at IS NULL; "
    f"INSERT INTO {POD_LOG} (label, node, delta) SELECT NEW.label, NEW.node, 1 "
    f"WHERE NEW.finished_at IS NULL; END",
    f"CREATE TRIGGER kssched_pod_deleted AFTER DELETE ON history_placement "
    f"WHEN OLD.finished_at IS NULL BEGIN INSERT INTO {POD_LOG} (label, node, delta) "
    f"VALUES (OLD.label, OLD.node, -1); END",
]
SQLITE_BACKWARD = [
    "DROP TRIGGER IF EXISTS kssched_pod_started",
    "DROP TRIGGER IF EXISTS kssched_pod_changed",
    "DROP TRIGGER IF EXISTS kssched_pod_deleted",
    f"DROP TABLE IF EXISTS {POD_LOG}",
]

POSTGRES_FORWARD = """
CREATE FUNCTION kssched_log_pod() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' AND OLD.finished_at IS NULL THEN
        INSERT INTO history_change (kind, key, node) VALUES (4, OLD.label, OLD.node);
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.finished_at IS NULL THEN
        INSERT INTO history_change (kind, key, node) VALUES (3, NEW.label, NEW.node);
    END IF;
    RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS kssched_history_placement_changed ON history_placement;
CREATE TRIGGER kssched_pod_logged AFTER INSERT OR DELETE
    OR UPDATE OF finished_at, label, node
    ON history_placement FOR EACH ROW EXECUTE FUNCTION kssched_log_pod();
"""
POSTGRES_BACKWARD = """
DROP TRIGGER IF EXISTS kssched_pod_logged ON history_placement;
DROP FUNCTION IF EXISTS kssched_log_pod();
CREATE TRIGGER kssched_history_placement_changed AFTER INSERT OR UPDATE OR DELETE
    ON history_placement FOR EACH STATEMENT EXECUTE FUNCTION kssched_log_other();
"""


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_FORWARD)
    elif schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE_FORWARD:
            schema_editor.execute(statement)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(POSTGRES_BACKWARD)
    elif schema_editor.connection.vendor == "sqlite":
        for statement in SQLITE_BACKWARD:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("history", "0009_history_import")]

    operations = [migrations.RunPython(forward, backward)]

"""PostgreSQL only: a change log written by triggers, for the per-worker cache.

Every change to the tables scoring reads is logged in the writing transaction with
that transaction's id (xid8): a KeyNode row change logs its (key, node); a change to
the ledger, the policies or the node records logs one "other" row per statement; a
TRUNCATE logs "start over". Readers find what they have not seen by comparing ids
with the snapshot of their previous look (see `history.reader.postgres_cache`).
SQLite needs none of this: its cache follows the ledger.
"""

from django.db import migrations

CHANGE_TABLE = "history_change"
HORIZON_TABLE = "history_change_horizon"

FORWARD = f"""
CREATE TABLE {CHANGE_TABLE} (
    id bigserial PRIMARY KEY,
    xid xid8 NOT NULL DEFAULT pg_current_xact_id(),
    kind smallint NOT NULL,
    key text NULL,
    node text NULL,
    created timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE INDEX history_change_xid ON {CHANGE_TABLE} (xid);
CREATE TABLE {HORIZON_TABLE} (
    id smallint PRIMARY KEY CHECK (id = 1),
    horizon xid8 NOT NULL,
    pending xid8 NOT NULL,
    pending_at timestamptz NOT NULL
);
INSERT INTO {HORIZON_TABLE} VALUES (
    1, pg_snapshot_xmin(pg_current_snapshot()),
    pg_snapshot_xmin(pg_current_snapshot()), clock_timestamp()
);

CREATE FUNCTION kssched_log_keynode() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' THEN
        INSERT INTO {CHANGE_TABLE} (kind, key, node) VALUES (0, OLD.key, OLD.node);
    END IF;
    IF TG_OP = 'INSERT'
       OR (TG_OP = 'UPDATE' AND (NEW.key <> OLD.key OR NEW.node <> OLD.node)) THEN
        INSERT INTO {CHANGE_TABLE} (kind, key, node) VALUES (0, NEW.key, NEW.node);
    END IF;
    RETURN NULL;
END $$;

CREATE FUNCTION kssched_log_other() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {CHANGE_TABLE} (kind) VALUES (1);
    RETURN NULL;
END $$;

CREATE FUNCTION kssched_log_truncate() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO {CHANGE_TABLE} (kind) VALUES (2);
    RETURN NULL;
END $$;

CREATE TRIGGER kssched_keynode_changed AFTER INSERT OR UPDATE OR DELETE
    ON history_keynode FOR EACH ROW EXECUTE FUNCTION kssched_log_keynode();
"""

OTHER_TABLES = [
    "history_keynode",
    "history_placement",
    "history_keypolicy",
    "history_nodepolicy",
    "history_noderecord",
]

for _table in OTHER_TABLES[1:]:
    FORWARD += (
        f"CREATE TRIGGER kssched_{_table}_changed AFTER INSERT OR UPDATE OR DELETE "
        f"ON {_table} FOR EACH STATEMENT EXECUTE FUNCTION kssched_log_other();\n"
    )
for _table in OTHER_TABLES:
    FORWARD += (
        f"CREATE TRIGGER kssched_{_table}_truncated AFTER TRUNCATE "
        f"ON {_table} FOR EACH STATEMENT EXECUTE FUNCTION kssched_log_truncate();\n"
    )

BACKWARD = "".join(
    f"DROP TRIGGER IF EXISTS kssched_{table}_changed ON {table};\n"
    f"DROP TRIGGER IF EXISTS kssched_{table}_truncated ON {table};\n"
    for table in OTHER_TABLES
) + (
    f"DROP TRIGGER IF EXISTS kssched_keynode_changed ON history_keynode;\n"
    f"DROP FUNCTION IF EXISTS kssched_log_keynode();\n"
    f"DROP FUNCTION IF EXISTS kssched_log_other();\n"
    f"DROP FUNCTION IF EXISTS kssched_log_truncate();\n"
    f"DROP TABLE IF EXISTS {CHANGE_TABLE};\n"
    f"DROP TABLE IF EXISTS {HORIZON_TABLE};\n"
)


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(FORWARD)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(BACKWARD)


class Migration(migrations.Migration):
    dependencies = [("history", "0004_keynode_count_max")]

    operations = [migrations.RunPython(forward, backward)]

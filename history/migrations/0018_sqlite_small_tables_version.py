"""SQLite: a version of the small tables the history cache re-reads.

The process cache re-reads the policies and the node records (`_read_extra`) when
they may have changed. On PostgreSQL the change log says so (kind 1, migration
0005); on SQLite nothing did, so every commit, a placement as much as a policy
edit, re-read them. Now every insert, update or delete of a KeyPolicy, NodePolicy
or NodeRecord row, whatever writes it, bumps one counter in the same transaction,
and the cache re-reads them only when the counter moved.
"""

from django.db import migrations

VERSION_TABLE = "history_smalltables"
SMALL_TABLES = ["history_keypolicy", "history_nodepolicy", "history_noderecord"]
OPERATIONS = ["INSERT", "UPDATE", "DELETE"]

FORWARD = [
    f"CREATE TABLE {VERSION_TABLE} (id INTEGER PRIMARY KEY CHECK (id = 1), "
    f"version INTEGER NOT NULL)",
    f"INSERT INTO {VERSION_TABLE} (id, version) VALUES (1, 0)",
] + [
    f"CREATE TRIGGER kssched_{table}_{operation.lower()} AFTER {operation} "
    f"ON {table} BEGIN UPDATE {VERSION_TABLE} SET version = version + 1; END"
    for table in SMALL_TABLES
    for operation in OPERATIONS
]
BACKWARD = [
    f"DROP TRIGGER IF EXISTS kssched_{table}_{operation.lower()}"
    for table in SMALL_TABLES
    for operation in OPERATIONS
] + [f"DROP TABLE IF EXISTS {VERSION_TABLE}"]


def forward(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for statement in FORWARD:
            schema_editor.execute(statement)


def backward(apps, schema_editor):
    if schema_editor.connection.vendor == "sqlite":
        for statement in BACKWARD:
            schema_editor.execute(statement)


class Migration(migrations.Migration):
    dependencies = [("history", "0017_keypolicy_worth")]

    operations = [migrations.RunPython(forward, backward)]

"""Many rows as one SQL table, whatever their number.

A set-based write (`INSERT ... SELECT`, `UPDATE ... FROM`) reads its rows from a
table made of the statement's parameters: one array per column on PostgreSQL
(`unnest`), one JSON list on SQLite (`json_each`). The statement's text and its
number of parameters stay the same however many rows travel.
"""

from __future__ import annotations

from collections.abc import Sequence

import orjson
from django.db import connection


def rows_table(
    rows: Sequence[tuple[object, ...]], *, columns: Sequence[tuple[str, str]]
) -> tuple[str, list[list[object]] | list[str]]:
    """SQL for `rows` as a table r(<column names>), and its parameters.

    `columns` gives each column's name and PostgreSQL type (`text`, `bigint`);
    every row has one value per column.
    """
    names = ", ".join(name for name, _ in columns)
    if connection.vendor == "postgresql":
        arrays = zip(*rows, strict=True) if rows else [() for _ in columns]
        casts = ", ".join(f"%s::{kind}[]" for _, kind in columns)
        return (
            f"SELECT * FROM unnest({casts}) AS r({names})",
            [list(array) for array in arrays],
        )
    picks = ", ".join(
        f"json_extract(value, '$[{index}]') AS {name}"
        for index, (name, _) in enumerate(columns)
    )
    return f"SELECT {picks} FROM json_each(%s)", [orjson.dumps(list(rows)).decode()]

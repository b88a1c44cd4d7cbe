"""Checks on text from outside before it reaches a query.

PostgreSQL text cannot hold a NUL character: a query that carries one fails with a
DataError (a 500), while SQLite simply finds nothing. No Kubernetes name or label
value can contain one, so every boundary where outside text becomes a query (the
extender's request body, the admin's filters and search, the pipeline page, the
history API's path and query) refuses it with a 400 before any query runs, the same
on both databases.
"""

from collections.abc import Iterable, Mapping
from datetime import UTC, date, datetime
from typing import Any

from django.http import QueryDict
from django.utils.dateparse import parse_date, parse_datetime

NUL = "\x00"


def has_nul(text: str) -> bool:
    """True when `text` contains a NUL character."""
    return NUL in text


def first_nul_index(texts: Iterable[str]) -> int | None:
    """The position of the first of `texts` that contains a NUL character, or None."""
    for position, text in enumerate(texts):
        if NUL in text:
            return position
    return None


def nul_parameter(params: Mapping[str, Any]) -> str | None:
    """The name of the first parameter whose name or value holds a NUL, or None.

    `params` is a QueryDict (every value of a repeated parameter is checked) or a
    plain mapping of names to strings (URL keyword arguments).
    """
    items = params.lists() if hasattr(params, "lists") else params.items()
    for name, values in items:
        if isinstance(values, str):
            values = [values]
        if NUL in name or any(isinstance(v, str) and NUL in v for v in values):
            return name.replace(NUL, "\\x00")
    return None


def nul_message(what: str) -> str:
    """The error text for a refused value: what held it, and why it is refused."""
    return (
        f"{what} contains a NUL character (\\x00), which no Kubernetes name or "
        "label value can hold; nothing was looked up"
    )


# Instants a query may name. Python's datetime ends at 0001-01-01 and 9999-12-31:
# an instant within a day of either end cannot be moved to UTC (an offset crosses
# the end) or have a day added (the admin's date drill-down), and fails with an
# OverflowError (a 500) instead of finding nothing. No pod ran then.
EARLIEST = datetime(1, 1, 2, tzinfo=UTC)
LATEST = datetime(9999, 12, 30, tzinfo=UTC)
RANGE_TEXT = "between 0001-01-02 and 9999-12-30 (UTC)"


def is_instant_in_range(moment: datetime | date) -> bool:
    """True when `moment` (a datetime, naive meaning UTC, or a date) lies within
    EARLIEST..LATEST, so that queries and date arithmetic on it cannot overflow."""
    if not isinstance(moment, datetime):
        moment = datetime(moment.year, moment.month, moment.day)
    if moment.tzinfo is None or moment.utcoffset() is None:
        moment = moment.replace(tzinfo=UTC)
    return EARLIEST <= moment <= LATEST


def out_of_range_parameter(params: QueryDict) -> str | None:
    """The name of the first parameter that names a date outside EARLIEST..LATEST
    (an ISO date or date-time, or a `__year` of 1 or 9999), or None.

    `params` is a QueryDict (every value of a repeated parameter is checked).
    """
    for name, values in params.lists():
        for value in values:
            if name.endswith("__year"):
                if value.strip().isdigit() and not 1 < int(value) < 9999:
                    return name
                continue
            try:
                moment = parse_datetime(value) or parse_date(value)
            except ValueError:
                continue
            if moment is not None and not is_instant_in_range(moment):
                return name
    return None

"""Checks on text from outside before it reaches a query.

PostgreSQL text cannot hold a NUL character: a query that carries one fails with a
DataError (a 500), while SQLite simply finds nothing. No Kubernetes name or label
value can contain one, so every boundary where outside text becomes a query (the
extender's request body, the admin's filters and search, the pipeline page, the
history API's path and query) refuses it with a 400 before any query runs, the same
on both databases.
"""

from collections.abc import Iterable, Mapping

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


def nul_parameter(params: Mapping) -> str | None:
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

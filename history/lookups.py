"""Case-sensitive text lookups that behave the same on both databases.

Label values and keys are case-sensitive: `Team-Build-app` counts under other keys
than `team-build-app`, and scoring reads them as written. Django's `startswith`,
`endswith` and `contains` are LIKE, which SQLite compares without case for ASCII
letters, so a filter built on them matched more on SQLite than on PostgreSQL.
These lookups (`label__cs_startswith="team-build-"`) are LIKE on PostgreSQL, where
it is case-sensitive, and GLOB on SQLite, which is case-sensitive too (and, for a
prefix, served by an index on the column). Registered on CharField when the app is
ready (`history.apps`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from django.db.models import CharField, lookups

if TYPE_CHECKING:
    from django.db.backends.base.base import BaseDatabaseWrapper
    from django.db.models.sql.compiler import SQLCompiler

_GLOB_SPECIAL = frozenset("*?[")


def _glob_literal(text: str) -> str:
    """`text` as a GLOB pattern that matches exactly it."""
    return "".join(f"[{char}]" if char in _GLOB_SPECIAL else char for char in text)


class _Glob:
    """On SQLite, `lhs GLOB pattern`, the pattern made from the value by `glob`;
    elsewhere the `plain` lookup (LIKE)."""

    glob = "{}"
    plain: type[lookups.PatternLookup]

    def as_sql(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper
    ) -> tuple[str, tuple[str | int, ...]]:
        plain = self.plain(self.lhs, self.rhs)  # type: ignore[attr-defined]
        return plain.as_sql(compiler, connection)

    def as_sqlite(
        self, compiler: SQLCompiler, connection: BaseDatabaseWrapper
    ) -> tuple[str, list[str | int]]:
        lhs, lhs_params = self.process_lhs(compiler, connection)  # type: ignore[attr-defined]
        value = self.rhs  # type: ignore[attr-defined]
        if not isinstance(value, str):
            raise TypeError(f"a case-sensitive text lookup needs a str, not {value!r}")
        return f"{lhs} GLOB %s", [*lhs_params, self.glob.format(_glob_literal(value))]


class CaseSensitiveStartsWith(_Glob, lookups.StartsWith):
    plain = lookups.StartsWith
    lookup_name = "cs_startswith"
    glob = "{}*"


class CaseSensitiveEndsWith(_Glob, lookups.EndsWith):
    plain = lookups.EndsWith
    lookup_name = "cs_endswith"
    glob = "*{}"


class CaseSensitiveContains(_Glob, lookups.Contains):
    plain = lookups.Contains
    lookup_name = "cs_contains"
    glob = "*{}*"


def register() -> None:
    for lookup in (
        CaseSensitiveStartsWith,
        CaseSensitiveEndsWith,
        CaseSensitiveContains,
    ):
        CharField.register_lookup(lookup)

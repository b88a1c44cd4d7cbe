"""Recency: a placement's weight halves once per half-life.

KeyNode rows keep `decayed_weight` valued at `decayed_at`; the ledger's upsert
carries both forward in SQL (`halvings_sql`) and the simulator's in-memory history
does the same in Python (`accumulate_decayed`), so both hold the same numbers.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured

# 0.5 ** 1000 is still a normal float; PostgreSQL raises on float underflow, so the
# number of halvings is bounded in SQL and in Python alike. Beyond this many
# half-lives a weight stops falling.
MAX_HALVINGS = 1000.0

# A row whose weight has fallen below this no longer makes a node warm: `warm`'s
# default `min_weight` and the ledger's warmth (`ledger.classify_warmth`).
WARM_MIN_WEIGHT = 0.1

# A history row: (key, count, decayed_weight, decayed_at in Unix seconds).
Row = tuple[str, int, float, float]
# A row weighed at one instant: (key, count, weight).
WeighedRow = tuple[str, int, float]


def half_life_seconds() -> float:
    """KSSCHED_HALF_LIFE_DAYS in seconds; a placement's weight halves this often."""
    days = float(settings.KSSCHED_HALF_LIFE_DAYS)
    if days <= 0:
        raise ImproperlyConfigured("KSSCHED_HALF_LIFE_DAYS must be greater than 0")
    return days * 86400.0


def halvings_sql(later: str, earlier: str) -> str:
    """SQL for 0.5 ** ((later - earlier) / half-life), 1 when `later` is not later."""
    half_life = repr(half_life_seconds())
    gap = f"({later} - {earlier})"
    return (
        f"POWER(0.5, CASE WHEN {gap} <= 0 THEN 0.0 "
        f"WHEN {gap} / {half_life} > {MAX_HALVINGS} THEN {MAX_HALVINGS} "
        f"ELSE {gap} / {half_life} END)"
    )


def carried_weight_sql(*, count: str, weight: str, at: str, later: str) -> str:
    """SQL for a row's stored weight carried forward to `later`.

    A row without recency state (`at` 0: made by hand before edits kept one) weighs
    its count, as `weigh` values it, so its weight is taken as its count at `later`.
    """
    return (
        f"CASE WHEN {at} = 0 THEN {count} ELSE {weight} * {halvings_sql(later, at)} END"
    )


def decayed_weight(*, weight: float, at: float, now: float, half_life: float) -> float:
    """A recency weight valued at `at` (Unix seconds), carried forward to `now`.

    It halves every `half_life` seconds; a `now` before `at` leaves it unchanged.
    """
    if now <= at:
        return weight
    # typeshed types float ** float as Any (a negative base gives a complex).
    return weight * 0.5 ** min((now - at) / half_life, MAX_HALVINGS)  # type: ignore[no-any-return]


def accumulate_decayed(
    *, weight: float, at: float, add: float, add_at: float, half_life: float
) -> tuple[float, float]:
    """Add `add` placements made at `add_at` to a weight valued at `at`.

    Returns (weight, at) valued at the later instant: exactly what the upsert in
    `increment_key_nodes` stores, so the simulator's state matches the database's.
    """
    later = max(at, add_at)
    total = decayed_weight(
        weight=weight, at=at, now=later, half_life=half_life
    ) + decayed_weight(weight=add, at=add_at, now=later, half_life=half_life)
    return total, later


def weigh(rows: Iterable[Row], now: float, half_life: float) -> list[WeighedRow]:
    """(key, count, weight at `now`) for history rows; a row made by hand has no
    recency state (`decayed_at` 0) and weighs its count."""
    return [
        (
            key,
            count,
            decayed_weight(weight=weight, at=at, now=now, half_life=half_life)
            if at
            else float(count),
        )
        for key, count, weight, at in rows
    ]


def weight_now(*, count: int, weight: float, at: float, now: float) -> float:
    """The weight the `warm` scoring gives a row at `now`: its recency weight
    carried to `now` (its count when it has no recency state), never above its
    count (the scoring caps it the same way, `rules.best_segment`)."""
    if not at:
        return float(count)
    carried = decayed_weight(
        weight=weight, at=at, now=now, half_life=half_life_seconds()
    )
    return min(carried, float(count))

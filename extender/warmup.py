"""A worker's history cache warmed before it serves.

A fresh worker process holds no history: its first call for a label whose general
label-path prefix (`ci-java-maven-*`, thousands of rows) it has not read fetches
those rows and derives its scores from them in Python, row by row, 25-100 ms once
per prefix, position and time window (docs/design.md, "The process cache on
watcher-shaped history"). Those first calls were the p99.

So before a worker serves (gunicorn's `post_worker_init`), it scores the labels of
the most recent placements once, for up to KSSCHED_WARM_START_SECONDS: first one
label for each label-path prefix they use, general prefixes first, then the rest.
A label's own rows are small; its prefixes are what the other labels share. Nothing
is written, and a failure only logs: the worker then starts cold, as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence

from django.conf import settings
from django.db import DatabaseError, connections

from extender.scoring.strategies import get_strategy
from history.labels import path_keys
from history.models import Placement

logger = logging.getLogger(__name__)

# Placements looked at, newest first, and the most distinct labels taken from them.
RECENT_PLACEMENTS = 20_000
MOST_LABELS = 2_000
# The candidate scored: the cache reads and derives every row of a label's keys,
# whatever the candidates.
PROBE_NODES = ["ks-scheduler-warm-start"]


def recent_labels(limit: int = RECENT_PLACEMENTS) -> list[str]:
    """The distinct labels of the last `limit` placements, newest first."""
    found = (
        Placement.objects.order_by("-id")
        .values_list("label", flat=True)[:limit]
        .iterator()
    )
    return list(dict.fromkeys(label for label in found if label))[:MOST_LABELS]


def warming_order(labels: Sequence[str]) -> list[str]:
    """`labels` with, first, one label for each label-path prefix (a key ending
    in `-*`) they use, most general prefixes first; then the rest in their order."""
    first: dict[str, str] = {}
    for label in labels:
        for depth, key in enumerate(path_keys(label)):
            if key.endswith("*"):
                first.setdefault(f"{depth:04d}{key}", label)
    leading = list(dict.fromkeys(first[name] for name in sorted(first)))
    chosen = set(leading)
    return leading + [label for label in labels if label not in chosen]


def warm(
    labels: Iterable[str],
    *,
    seconds: float,
    notify: Callable[[], None] = lambda: None,
) -> int:
    """Score each of `labels` once until `seconds` have passed; how many were.
    `notify` is called after each (the worker's heartbeat)."""
    deadline = time.monotonic() + seconds
    strategy = get_strategy()
    done = 0
    for label in labels:
        if time.monotonic() >= deadline:
            break
        strategy.score(label=label, nodes=PROBE_NODES)
        done += 1
        notify()
    return done


def warm_start(*, seconds: float, notify: Callable[[], None] = lambda: None) -> int:
    """Warm this process's history cache from the recent placements for at most
    `seconds` (0: not at all); how many labels were scored."""
    if seconds <= 0 or not settings.KSSCHED_HISTORY_CACHE:
        return 0
    started = time.monotonic()
    try:
        labels = warming_order(recent_labels())
        done = warm(labels, seconds=seconds, notify=notify)
    except DatabaseError as exc:
        logger.warning("Warm start skipped, the worker starts cold: %s", exc)
        return 0
    except Exception:  # noqa: BLE001 - a worker that cannot warm still serves
        logger.exception("Warm start failed, the worker starts cold")
        return 0
    finally:
        # Requests open their own connections (one per greenlet).
        connections.close_all()
    logger.info(
        "Warm start: %d of %d recent labels scored in %.1f s",
        done,
        len(labels),
        time.monotonic() - started,
    )
    return done

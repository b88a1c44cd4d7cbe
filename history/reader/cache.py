"""The process cache of history: one per worker process, shared by its threads and
greenlets, bounded in bytes.

It holds the rows of the keys asked about (each key once, whatever the labels that
use it), the small tables (policies, node replacements) and the running pods, and
what the strategies derive from the rows (`memo.KeyMemo`).

**The one rule.** Before every read the store's change feed (`sync`: the ledger on
SQLite, the change log on PostgreSQL) says what changed since the cache's
watermark: the (key, node) pairs to re-read, that the small tables must be re-read,
the pods that started or stopped, or that it cannot say (the log was pruned past
the watermark, another database, too many changes), and then everything starts
over. Re-reading is idempotent, so a change seen twice does no harm; each store
explains why none is missed.

**Sharing.** `lock` guards the cache; it is held to sync, to publish and to hand out
a read, never while a label's first rows are fetched or while scoring runs. What
a read was handed is never changed while it holds it: while any read is alive
(`KeyMemo.lent`), a re-read replaces a key's mapping (and the running pods'
mappings) with a changed copy, so a reader keeps a consistent view and never sees a
half-updated one; when none is (kube-scheduler's serial calls: the previous call's
read is gone before the next one syncs), it changes them in place, at the cost of
what changed rather than of what the key holds (a general prefix such as
`jenkins-*` holds a row on most nodes). Nothing is kept per thread, greenlet or
connection object: a new connection per request reads a warm cache.

**Bound.** Rows and derived values are counted in estimated bytes; past
KSSCHED_HISTORY_CACHE_MB the least recently used keys are dropped (never those of
the read being answered).
"""

from __future__ import annotations

import sys
import threading
from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace

from django.conf import settings
from django.db import connection

from history.labels import PIPELINE_MARK, distinct_keys
from history.models import KeyNode
from history.reader.depths import Recent, depths_of, pipeline_key, ran_on
from history.reader.memo import KeyMemo
from history.reader.model import LabelHistory, Policies, decode
from history.reader.pool import database_pool
from history.reader.sql import (
    SqlReader,
    as_timestamp,
    history_sql,
    read_placed,
    read_recent,
)

# A sync that names more pairs than this starts over instead (bulk edits, pauses).
MAX_SYNC_PAIRS = 5000
# (key, node) pairs re-read by one statement (two parameters each).
REREAD_PAIRS = 400
# Estimated bytes a cached row takes: a dict slot, a 3-tuple, an int and two
# floats (node names are interned, so each name is held once).
ROW_BYTES = 200
# Estimated bytes of a key without rows (its dict, LRU slot, epoch and log).
KEY_BYTES = 400
# Estimated bytes of a node's recent pipelines: a dict slot, a `Recent`, a tuple of
# DEEPEST + 1 references (the keys are interned, so each is held once) and one of
# as many floats.
RECENT_BYTES = 800

Rows = dict[str, tuple[int, float, float]]


def budget_bytes() -> int:
    """KSSCHED_HISTORY_CACHE_MB in bytes."""
    return int(settings.KSSCHED_HISTORY_CACHE_MB * 1024 * 1024)


class CachedReader:
    """The history of the keys asked about, kept up to date by `sync`.

    Inside a transaction it answers through `SqlReader` instead: an uncommitted
    write could be rolled back after being cached.
    """

    def __init__(self) -> None:
        self.sql = SqlReader()
        self.lock = threading.Lock()
        self.memo = KeyMemo()
        # Bumped by every start over: a fetch begun before one is not kept.
        self.generation = 0
        self.clear()

    def clear(self) -> None:
        """Forget everything; the next read loads what it needs (under `lock`, or
        before the cache is shared)."""
        self.generation += 1
        # key -> {node: (count, decayed_weight, decayed_at)} for count > 0, in
        # least-recently-used order; a mapping is replaced, never changed.
        self.rows: OrderedDict[str, Rows] = OrderedDict()
        self.row_bytes = 0
        # Keys being fetched outside the lock -> nodes that changed meanwhile.
        self.fetching: dict[str, set[str]] = {}
        self.memo.clear()
        # Policies and node records, re-read when `sync` says they changed; the
        # running pods, kept up to date pod by pod once read.
        self.extra_stale = True
        self.running_stale = True
        self.active: dict[str, dict[str, int]] = {}
        self.busy: dict[str, int] = {}
        self.policies = Policies()
        self.replaced: Mapping[str, float] = {}
        # node -> its recent pipelines (`depths`), for nodes asked about, kept up
        # to date as their pipeline keys change. Nodes being read outside the
        # lock -> whether one changed meanwhile.
        self.recent: dict[str, Recent] = {}
        self.recent_loading: dict[str, bool] = {}

    @property
    def bytes(self) -> int:
        """Estimated bytes held: rows, keys, derived values and recent pipelines."""
        return self.row_bytes + self.memo.bytes + len(self.recent) * RECENT_BYTES

    # --- what a store implements ------------------------------------------------------

    def sync(self) -> None:
        """Bring the cache up to date (under `lock`): call `changed`,
        `extra_changed`, `pods_changed`, `running_changed` or `clear`."""
        raise NotImplementedError

    def look_ahead(self) -> None:
        """Start the next `sync` now, if this store can (see `reading_ahead`)."""

    def settle(self) -> None:
        """Finish what `look_ahead` started if no `sync` did."""

    def after_request(self) -> None:
        """Housekeeping that can wait until a request's reply is sent."""

    def running_read(self, snapshot: str | None) -> None:
        """Every running pod was just read (under `snapshot` on PostgreSQL)."""

    # --- reading ----------------------------------------------------------------------

    def read(
        self,
        *,
        keys: Sequence[str],
        label: str,
        nodes: Sequence[str] | None,
        depths: bool = False,
    ) -> LabelHistory:
        """The label's history on every node that has some (see `LabelHistory`)."""
        if connection.in_atomic_block:
            return self.sql.read(keys=keys, label=label, nodes=nodes, depths=depths)
        unique = distinct_keys(keys)
        history = self._read_rows(keys, label, unique)
        key = pipeline_key(unique) if depths else None
        if key is None:
            return history
        found = self._depths(key, ran_on(history.by_key.get(key, {}), history.replaced))
        return replace(history, depths=found)

    def _read_rows(
        self, keys: Sequence[str], label: str, unique: Sequence[str]
    ) -> LabelHistory:
        """`read` without depths."""
        with self.lock:
            self.sync()
            if self.extra_stale:
                self._read_extra()
            missing = [key for key in unique if key not in self.rows]
            mine = [key for key in missing if key not in self.fetching]
            for key in mine:
                self.fetching[key] = set()
            generation = self.generation
            if not missing:
                return self._hand_out(keys, label, unique, {})
        try:
            fetched = self._fetch(missing)
        except BaseException:
            with self.lock:
                if self.generation == generation:
                    for key in mine:
                        self.fetching.pop(key, None)
            raise
        with self.lock:
            if self.generation == generation:
                for key in mine:
                    self._publish(key, fetched[key], self.fetching.pop(key, set()))
            return self._hand_out(keys, label, unique, fetched)

    def pool(self, *, now: float, days: float) -> tuple[str, ...]:
        """The pipeline pool (`pool.database_pool`)."""
        return database_pool.at(now=now, days=days)

    def _depths(self, key: str, ran: Sequence[str]) -> dict[str, int]:
        """node -> the depth of pipeline `key` there, for the nodes it `ran` on:
        each node's recent pipelines as cached, read (outside `lock`) for nodes
        not cached yet, and kept unless a placement on the node came meanwhile."""
        with self.lock:
            generation = self.generation
            recent = {node: self.recent[node] for node in ran if node in self.recent}
            absent = [node for node in ran if node not in recent]
            mine = [node for node in absent if node not in self.recent_loading]
            for node in mine:
                self.recent_loading[node] = False
        if absent:
            try:
                fetched = read_recent(absent)
            finally:
                with self.lock:
                    for node in mine:
                        if self.recent_loading.pop(node, True):
                            continue  # changed while read, or started over
                        if self.generation == generation:
                            self.recent[node] = fetched.get(node, Recent((), ()))
            empty = Recent((), ())
            recent.update((node, fetched.get(node, empty)) for node in absent)
        return depths_of(key, ran, recent)

    def _hand_out(
        self,
        keys: Sequence[str],
        label: str,
        unique: Sequence[str],
        fetched: Mapping[str, Rows],
    ) -> LabelHistory:
        """The read's value (under `lock`): the cached mappings as they are now,
        and rows fetched for this read where the cache has none."""
        rows = self.rows
        for key in unique:
            if key in rows:
                rows.move_to_end(key)
        self._bound(keep=unique)
        return LabelHistory(
            keys=tuple(keys),
            by_key={key: rows.get(key) or fetched.get(key) or {} for key in unique},
            replaced=self.replaced,
            active=self.active.get(label, {}),
            busy=self.busy,
            policies=self.policies,
            memo=self.memo.view([key for key in unique if key in rows]),
        )

    # --- what `sync` reports (under `lock`) -------------------------------------------

    def is_cached(self, key: str) -> bool:
        """Whether a change of `key` matters: held, being fetched, or a pipeline
        key while recent pipelines are cached."""
        return (
            key in self.rows
            or key in self.fetching
            or (
                key.endswith(PIPELINE_MARK) and bool(self.recent or self.recent_loading)
            )
        )

    def changed(self, pairs: Mapping[str, set[str]]) -> None:
        """Re-read the rows of these (key, nodes) pairs; keys not cached are skipped
        and keys being fetched re-read them once published. A pipeline key's
        change drops its nodes' recent pipelines."""
        held: dict[str, set[str]] = {}
        placed: list[tuple[str, str]] = []
        for key, nodes in pairs.items():
            if not nodes:
                continue
            if key.endswith(PIPELINE_MARK):
                for node in nodes:
                    if node in self.recent:
                        placed.append((key, node))
                    elif node in self.recent_loading:
                        self.recent_loading[node] = True
            if key in self.rows:
                held[key] = nodes
            elif key in self.fetching:
                self.fetching[key].update(nodes)
        self._reread(held)
        self._follow_recent(placed)

    def _follow_recent(self, pairs: Sequence[tuple[str, str]]) -> None:
        """Move these pipeline keys in their nodes' recent pipelines, from their
        rows' placement times (REREAD_PAIRS pairs a statement); a node whose list
        cannot say without being read again is dropped, read again when needed."""
        for start in range(0, len(pairs), REREAD_PAIRS):
            chunk = pairs[start : start + REREAD_PAIRS]
            found = read_placed(chunk)
            for key, node in chunk:
                recent = self.recent.get(node)
                if recent is None:
                    continue
                moved = recent.placed(key, found.get((key, node)))
                if moved is None:
                    del self.recent[node]
                else:
                    self.recent[node] = moved

    def extra_changed(self) -> None:
        """The policies or the node records changed."""
        self.extra_stale = True

    def running_changed(self) -> None:
        """The running pods must be read again, all of them."""
        self.running_stale = self.extra_stale = True

    def pods_changed(self, deltas: Iterable[tuple[str, str, int]]) -> None:
        """Pods of (label, node) started (+1) or stopped (-1) running: applied in
        place when no read holds the running pods' mappings, else to new mappings
        that replace them."""
        if self.running_stale:
            return
        lent = self.memo.lent()
        busy = dict(self.busy) if lent else self.busy
        active = dict(self.active) if lent else self.active
        copied: set[str] = set()
        for label, node, delta in deltas:
            if lent and label not in copied:
                active[label] = dict(active.get(label, {}))
                copied.add(label)
            for counts in (active.setdefault(label, {}), busy):
                value = counts.get(node, 0) + delta
                if value > 0:
                    counts[node] = value
                else:
                    counts.pop(node, None)
            if not active[label]:
                del active[label]
        self.active, self.busy = active, busy

    # --- keys (under `lock`, but `_fetch`) --------------------------------------------

    def _bound(self, keep: Sequence[str]) -> None:
        """Drop least recently used keys while over the byte budget (never the keys
        of the read being answered)."""
        budget = budget_bytes()
        rows = self.rows
        while self.bytes > budget and len(rows) > len(keep):
            key = next(iter(rows))
            if key in keep:
                rows.move_to_end(key)
                continue
            dropped = rows.pop(key)
            self.row_bytes -= KEY_BYTES + len(dropped) * ROW_BYTES
            self.memo.forget(key)

    def _fetch(self, keys: list[str]) -> dict[str, Rows]:
        """Every row with count > 0 of `keys`, in one query (outside `lock`)."""
        intern = sys.intern
        loaded: dict[str, Rows] = {key: {} for key in keys}
        marks = ", ".join(["%s"] * len(keys))
        with connection.cursor() as cursor:
            cursor.execute(
                f"SELECT key, node, count, decayed_weight, decayed_at "
                f"FROM {KeyNode._meta.db_table} WHERE key IN ({marks}) AND count > 0",
                keys,
            )
            for key, node, count, weight, at in cursor.fetchall():
                loaded[key][intern(node)] = (count, weight, at)
        return loaded

    def _publish(self, key: str, rows: Rows, changed: set[str]) -> None:
        """Keep a fetched key, then re-read what changed while it was fetched."""
        self.rows[key] = rows
        self.row_bytes += KEY_BYTES + len(rows) * ROW_BYTES
        self.memo.start(key)
        if changed:
            self._reread({key: changed})

    def _reread(self, pairs: Mapping[str, Iterable[str]]) -> None:
        """Re-read the rows of these (key, nodes) pairs of cached keys, in one
        statement for up to REREAD_PAIRS pairs. A key's mapping is changed in place when
        no read holds it (`KeyMemo.lent`), else replaced by a changed copy."""
        wanted = [(key, sorted(nodes)) for key, nodes in pairs.items() if nodes]
        if not wanted:
            # No cursor at all: the first of a request runs Django's health check,
            # a round trip of its own on PostgreSQL.
            return
        found: dict[tuple[str, str], tuple[int, float, float]] = {}
        with connection.cursor() as cursor:
            for chunk in _chunks(wanted, REREAD_PAIRS):
                where = " OR ".join(
                    f"(key = %s AND node IN ({', '.join(['%s'] * len(nodes))}))"
                    for _, nodes in chunk
                )
                cursor.execute(
                    f"SELECT key, node, count, decayed_weight, decayed_at "
                    f"FROM {KeyNode._meta.db_table} WHERE {where}",
                    [part for key, nodes in chunk for part in (key, *nodes)],
                )
                for key, node, count, weight, at in cursor:
                    found[key, node] = (count, weight, at)
        lent = self.memo.lent()
        intern = sys.intern
        for key, nodes in wanted:
            cached = dict(self.rows[key]) if lent else self.rows[key]
            before = len(cached)
            for node in nodes:
                row = found.get((key, node))
                if row is not None and row[0] > 0:
                    cached[intern(node)] = row
                else:
                    cached.pop(node, None)
            self.rows[key] = cached
            self.row_bytes += (len(cached) - before) * ROW_BYTES
            self.memo.changed(key, nodes)

    def _read_extra(self) -> None:
        """Policies and node replacements (small tables), and the running pods when
        they must be read again, in one statement."""
        running = self.running_stale
        with connection.cursor() as cursor:
            cursor.execute(history_sql(running=running))
            found = decode(cursor.fetchall(), as_timestamp)
        if running:
            self.active, self.busy = found.active, found.busy
            self.running_stale = False
            self.running_read(found.snapshot)
        self.policies = found.policies
        if found.replaced != self.replaced:
            # What was derived from the rows no longer holds.
            self.replaced = found.replaced
            self.memo.restart_all()
        self.extra_stale = False


def _chunks(
    wanted: list[tuple[str, list[str]]], most: int
) -> Iterable[list[tuple[str, list[str]]]]:
    """(key, nodes) pairs in groups of about `most` nodes (a key's nodes are never
    split; a key with more is a group of its own)."""
    group: list[tuple[str, list[str]]] = []
    size = 0
    for key, nodes in wanted:
        if group and size + len(nodes) > most:
            yield group
            group, size = [], 0
        group.append((key, nodes))
        size += len(nodes)
    if group:
        yield group

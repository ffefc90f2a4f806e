"""Column copies of partitions for scans: a full scan of a partition that filters, counts, groups or takes
a top n leaves behind its keys and the columns it decoded as Arrow arrays, and the next such scan of the
partition is decided over them in C (query/columns.py) instead of reading and decoding every row.

A copy holds the keys in key order and some columns as of the moment its build began; from that moment
the store tells it every key an apply put or deleted (`Store.track_changes`). A scan from the copy leaves
out those keys' rows and reads their current rows from the store instead, through the row evaluator: the
answer is the store's, as a scan of the rows would give it. When too many keys changed for that to pay
(a quarter of the copy), the copy is dropped and the next scan builds another. A build takes the
columns of the partition's copy too, so queries on different columns share one copy.

A scan from a copy is decided as of its first step: the changed keys are taken then, and the rows it
reads from the store come from a store snapshot made then (the copy's arrays never change), as a scan of
the rows reads its iterator's moment. The copy's part is decided off the event loop, in the server's scan
compute thread (`OffLoop`): pyarrow's calls release the GIL, so lookups are answered meanwhile. The builds
and the applies run on the event loop, so no apply falls between a build's start and the making of its
scan's iterator.

A server keeps copies up to `query.scan.cache.bytes` in all, the least recently used dropped first; 0
keeps none. A copy of a store that was closed (a snapshot installed, the replica dropped) is never used.
"""

from __future__ import annotations

import heapq
import time
from collections import OrderedDict
from collections.abc import Callable, Generator, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any

import pyarrow as pa
import pyarrow.compute as pc

from hotstate.query.columns import (
    aggregate_inputs,
    column_aggregates,
    column_array,
    column_mask,
    column_top,
    joined_column,
    top_inputs,
)
from hotstate.query.expressions import Col, EvalError
from hotstate.query.scan import AGGREGATE, MAX_GROUPS, TOP, ScanRun, sort_key_of
from hotstate.replica.store import ChangedKeys, Store

if TYPE_CHECKING:
    from hotstate.server.scan_pace import ScanPace

__all__ = ["ColumnCache", "ColumnCacheBuild", "ColumnCaches", "OffLoop", "scan_from_cache"]

# How many changed keys a copy of `rows` rows takes before it is rebuilt rather than patched.
MIN_CHANGE_LIMIT = 10_000
# Rows of a copy's arrays: Arrow's per-array cost made the copy's operations twice as slow with small ones.
COPY_CHUNK_ROWS = 16_384


def _change_limit(rows: int) -> int:
    return max(MIN_CHANGE_LIMIT, rows // 4)


class ColumnCache:
    """The keys and the columns `names` of one store, in key order, as of when the build began; `changed`:
    the keys applied since."""

    def __init__(
        self,
        store: Store,
        names: frozenset[str],
        keys: pa.ChunkedArray,
        columns: dict[str, pa.ChunkedArray],
        changed: ChangedKeys,
    ) -> None:
        self.store = store
        self.names = names
        self.keys = keys
        self.columns = columns
        self.changed = changed
        self.rows = len(keys)
        self.nbytes = keys.nbytes + sum(column.nbytes for column in columns.values())

    @property
    def current(self) -> bool:
        """Whether scans may use it: its store open, and few enough keys changed since its build."""
        return not self.changed.overflowed and not self.store.closed

    def close(self) -> None:
        self.store.untrack(self.changed)


class ColumnCacheBuild:
    """A copy of `names` collected from a full scan's chunks as the scan decodes them (`add`, which
    ScanRun calls), begun before the scan's iterator was made."""

    def __init__(self, store: Store, names: frozenset[str], readers: dict[str, Callable[[Any], object]]):
        self.store = store
        self.names = names
        self._readers = [(name, readers[name]) for name in sorted(names)]
        self.changed = store.track_changes(_change_limit(store.count_estimate()))
        self._keys = _Chunks()
        self._columns = {name: _Chunks() for name in names}
        self.failed = False  # a column has no Arrow form that means the same (query/columns.py)

    def add(self, keys: Sequence[bytes], rows: Sequence[Any] | None) -> None:
        """A chunk of the scan: its keys and their rows decoded (None: a row lacks a column; a copy of no
        columns, for COUNT(*), is fed keys alone)."""
        if self.failed:
            return
        if rows is None or (self._readers and len(rows) != len(keys)):
            self.failed = True
            return
        arrays = []
        for name, read in self._readers:
            array = column_array(list(map(read, rows)))
            if array is None:
                self.failed = True
                return
            arrays.append((name, array))
        for name, array in arrays:
            self._columns[name].add(array)
        self._keys.add(pa.array(keys, pa.binary()))

    def finish(self) -> ColumnCache | None:
        """The copy, once the scan read every row of the store; None when a column has no Arrow form."""
        columns = {}
        for name, chunks in self._columns.items():
            column = None if self.failed else joined_column(chunks.done())
            if column is None:
                self.abandon()
                return None
            columns[name] = column
        keys = pa.chunked_array(self._keys.done(), pa.binary())
        return ColumnCache(self.store, self.names, keys, columns, self.changed)

    def abandon(self) -> None:
        self.store.untrack(self.changed)


class _Chunks:
    """A column's arrays as a scan hands them over (a few hundred rows each), joined into arrays of about
    COPY_CHUNK_ROWS rows."""

    def __init__(self) -> None:
        self._joined: list[pa.Array] = []
        self._pending: list[pa.Array] = []
        self._rows = 0

    def add(self, array: pa.Array) -> None:
        self._pending.append(array)
        self._rows += len(array)
        if self._rows >= COPY_CHUNK_ROWS:
            self._join()

    def _join(self) -> None:
        if self._pending:
            types = {array.type for array in self._pending if array.type != pa.null()}
            if len(types) == 1:  # else joined_column refuses the column
                (kind,) = types
                self._pending = [pa.concat_arrays([array.cast(kind) for array in self._pending])]
            self._joined.extend(self._pending)
            self._pending, self._rows = [], 0

    def done(self) -> list[pa.Array]:
        self._join()
        return self._joined


class ColumnCaches:
    """A server's copies by partition (table id, partition), at most `max_bytes` in all."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self._caches: OrderedDict[tuple[int, int], ColumnCache] = OrderedDict()
        self._building: dict[tuple[int, int], ColumnCacheBuild] = {}
        # Partitions whose columns had no Arrow form, by store and names: not built again for them.
        self._refused: dict[tuple[int, int], tuple[Store, frozenset[str]]] = {}

    @property
    def nbytes(self) -> int:
        return sum(cache.nbytes for cache in self._caches.values())

    def __len__(self) -> int:
        return len(self._caches)

    def usable(self, pid: tuple[int, int], store: Store, names: frozenset[str]) -> ColumnCache | None:
        """The partition's copy if it holds `names` of this store and may be used."""
        cache = self._caches.get(pid)
        if cache is None:
            return None
        if cache.store is not store or not cache.current:
            self._drop(pid)
            return None
        if not names <= cache.names:
            return None
        self._caches.move_to_end(pid)
        return cache

    def to_build(self, pid: tuple[int, int], store: Store, names: frozenset[str]) -> frozenset[str] | None:
        """The columns a build of the partition's copy for a scan of `names` should copy, or None when none
        should begin (no room for copies, one being built, these columns refused before). The copy takes
        the columns of the partition's copy as well, so queries that read different columns share one
        copy rather than rebuild it in turn; a build of those that failed (a column with no Arrow form)
        leaves them out."""
        if self.max_bytes <= 0 or pid in self._building:
            return None
        current = self._caches.get(pid)
        wanted = names | (current.names if current is not None and current.store is store else frozenset())
        refused = self._refused.get(pid)
        if refused is not None and refused[0] is store and refused[1] <= wanted:
            wanted = names
            if refused[1] <= wanted:
                return None
        return wanted

    def build(
        self,
        pid: tuple[int, int],
        store: Store,
        names: frozenset[str],
        readers: dict[str, Callable[[Any], object]],
    ) -> ColumnCacheBuild:
        """A build of the partition's copy of `names` (`to_build`'s) to feed from a full scan about to
        begin."""
        self._forget_closed()
        build = self._building[pid] = ColumnCacheBuild(store, names, readers)
        return build

    def built(self, pid: tuple[int, int], build: ColumnCacheBuild) -> None:
        """The scan feeding `build` read every row: keep its copy (within the bytes)."""
        self._building.pop(pid, None)
        cache = build.finish()
        if cache is None:
            self._refused[pid] = (build.store, build.names)
            return
        if cache.nbytes > self.max_bytes:
            cache.close()
            return
        self._drop(pid)
        self._caches[pid] = cache
        while self.nbytes > self.max_bytes:
            self._drop(next(iter(self._caches)))

    def abandoned(self, pid: tuple[int, int], build: ColumnCacheBuild) -> None:
        """The scan feeding `build` ended before the end of the store (a LIMIT, an error, cancelled)."""
        if self._building.get(pid) is build:
            del self._building[pid]
        build.abandon()

    def _drop(self, pid: tuple[int, int]) -> None:
        cache = self._caches.pop(pid, None)
        if cache is not None:
            cache.close()

    def _forget_closed(self) -> None:
        for pid in [pid for pid, cache in self._caches.items() if cache.store.closed]:
            self._drop(pid)
        for pid in [pid for pid, (store, _) in self._refused.items() if store.closed]:
            del self._refused[pid]


# Work a scan from a copy hands to its server's compute thread; what it returns is sent back to the scan
# (a query's error too, as a value: the scan raises it where its handlers are).
OffLoop = Callable[[], object]


@dataclass(frozen=True, slots=True)
class _Found:
    """What the copy says of its rows no apply changed since its build (`unchanged` of them)."""

    unchanged: int
    matches: int = 0  # a count of the rows the WHERE keeps
    keys: list[bytes] = field(default_factory=list)  # rows: the first kept keys; top n: its keys, in order
    values: list[list[object]] = field(default_factory=list)  # top n: each key's ORDER BY values
    groups: dict[tuple[object, ...], list[Any]] | None = None


def _decide(cache: ColumnCache, run: ScanRun, changed: list[bytes]) -> _Found | EvalError | None:
    """The scan's answer over the copy's unchanged rows, in C (pyarrow releases the GIL in each call, so
    the event loop runs on beside it), or the query's error; None when the WHERE or the aggregates have no
    column form over these columns."""
    program = run.program
    columns = cache.columns
    mask = None
    if program.where is not None:
        mask = column_mask(program.where, columns)
        if mask is None:
            return None
    unchanged = cache.rows
    if changed:
        stale = pc.is_in(cache.keys, value_set=pa.array(changed, pa.binary()))
        unchanged -= pc.sum(stale).as_py() or 0
        kept = pc.invert(stale)
        mask = kept if mask is None else pc.and_(mask, kept)
    if program.mode == AGGREGATE and not run.counts_matches:
        group = [node.name for node in program.group if isinstance(node, Col)]
        aggregates = [(a.func, a.arg.name if isinstance(a.arg, Col) else None) for a in program.aggregates]
        inputs = aggregate_inputs(group, aggregates, columns)
        if inputs is None:
            return None
        try:
            groups = column_aggregates(len(program.group), aggregates, inputs, mask, cache.rows, MAX_GROUPS)
        except ValueError as error:
            return EvalError(str(error))
        return _Found(unchanged, groups=groups)
    order = run.order_columns if program.mode == TOP else None
    if order is not None:
        sort_inputs = top_inputs(order, columns)
        if sort_inputs is None:
            return None
        # A top n per array and the best of them: one sort of a whole copy cost 7x (sorting every row).
        best: list[tuple[tuple[object, ...], bytes, list[object]]] = []
        for start in range(0, cache.rows, COPY_CHUNK_ROWS):
            sliced = {name: column.slice(start, COPY_CHUNK_ROWS) for name, column in sort_inputs.items()}
            part = None if mask is None else mask.slice(start, COPY_CHUNK_ROWS)
            keys, values = column_top(
                order, sliced, cache.keys.slice(start, COPY_CHUNK_ROWS), part, program.keep
            )
            best.extend(
                (sort_key_of(one, program.order), key, one) for key, one in zip(keys, values, strict=True)
            )
            best = heapq.nsmallest(program.keep, best)
        return _Found(unchanged, keys=[key for _, key, _ in best], values=[one for _, _, one in best])
    if run.counts_matches:
        return _Found(unchanged, matches=cache.rows if mask is None else pc.sum(mask).as_py() or 0)
    assert mask is not None
    return _Found(unchanged, keys=pc.filter(cache.keys, mask).slice(0, program.keep).to_pylist())


def scan_from_cache(
    cache: ColumnCache, run: ScanRun, pace: ScanPace
) -> Generator[OffLoop | None, object, bool]:
    """Feed `run` the partition's answer from `cache`: its WHERE over the copy's columns (a count of its
    keys, its groups' aggregates, its top n) for the rows no apply changed since, decided off the event loop
    (the one OffLoop this yields: its result is sent back), and the changed keys' rows read from the store
    through the row evaluator, `pace.most` at a time, fed in `pace`'s slices with a step (a None) after
    each. All as of the first
    step: the changed keys are taken then, and every row read from the store comes from a view of that
    moment (the copy's arrays never change). Returns False when the WHERE or the aggregates have no column
    form over these columns (the caller scans the rows)."""
    store = cache.store
    view = store.snapshot()
    try:
        changed = sorted(cache.changed.keys)
        found = yield partial(_decide, cache, run, changed)
        if found is None:
            return False
        if isinstance(found, EvalError):
            raise found
        assert isinstance(found, _Found)
        chunk_rows = pace.most
        for at in range(0, len(changed), chunk_rows):
            keys = changed[at : at + chunk_rows]
            current = [
                (key, row) for key, row in zip(keys, view.get_many(keys), strict=True) if row is not None
            ]
            for piece in pace.slices(current):
                began = time.monotonic()
                if run.keys_only:
                    run.feed_keys([key for key, _ in piece])
                else:
                    run.feed(piece)
                pace.took(len(piece), time.monotonic() - began)
                yield None
        if found.unchanged:
            run.saw_every_column()
        if found.groups is not None:
            run.add_groups(found.groups, found.unchanged)
        elif run.counts_matches:
            run.add_match_count(found.matches, found.unchanged)
        else:
            # The kept keys' rows, a chunk a step (an ORDER BY without LIMIT keeps up to the row cap).
            rows: list[bytes | None] = []
            for at in range(0, len(found.keys), chunk_rows):
                if at:
                    yield None
                rows.extend(view.get_many(found.keys[at : at + chunk_rows]))
            if run.program.mode == TOP:
                run.add_top(
                    [
                        (values, key, row)
                        for values, key, row in zip(found.values, found.keys, rows, strict=True)
                        if row is not None
                    ],
                    found.unchanged,
                )
            else:
                run.add_matches(
                    [(key, row) for key, row in zip(found.keys, rows, strict=True) if row is not None],
                    found.unchanged,
                )
        return True
    finally:
        view.close()

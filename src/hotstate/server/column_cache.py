"""Column copies of partitions for scans: a full scan of a partition that filters, counts, groups or takes
a top n leaves behind its keys and the columns it decoded as Arrow arrays, and the next such scan of the
partition is decided over them in C (query/columns.py) instead of reading and decoding every row.

A copy holds the keys in key order and some columns as of the moment its build began; from that moment
the store tells it every key an apply put or deleted (`Store.track_changes`). A scan from the copy leaves
out those keys' rows and reads their current rows from the store instead, through the row evaluator: the
answer is the store's, as a scan of the rows would give it. When too many keys changed for that to pay
(a quarter of the copy), the copy is dropped and the next scan builds another. A build takes the
columns of the partition's copy too, so queries on different columns share one copy.

A scan from a copy runs in steps of COPY_STEP_ROWS of its rows, as of its first step: the changed keys
are taken then, and the rows it reads from the store come from a store snapshot made then (the copy's
arrays never change), as a scan of the rows reads its iterator's moment. The builds and the applies run
on the event loop, so no apply falls between a build's start and the making of its scan's iterator.

A server keeps copies up to `query.scan.cache.bytes` in all, the least recently used dropped first; 0
keeps none. A copy of a store that was closed (a snapshot installed, the replica dropped) is never used.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Callable, Generator, Sequence
from typing import Any

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

__all__ = ["ColumnCache", "ColumnCacheBuild", "ColumnCaches", "scan_from_cache"]

# How many changed keys a copy of `rows` rows takes before it is rebuilt rather than patched.
MIN_CHANGE_LIMIT = 10_000
# Rows of a copy one step of a scan decides over (about a millisecond); between steps the event loop runs.
COPY_STEP_ROWS = 16_384


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
    COPY_STEP_ROWS rows: Arrow's per-array cost made the copy's operations twice as slow with small ones."""

    def __init__(self) -> None:
        self._joined: list[pa.Array] = []
        self._pending: list[pa.Array] = []
        self._rows = 0

    def add(self, array: pa.Array) -> None:
        self._pending.append(array)
        self._rows += len(array)
        if self._rows >= COPY_STEP_ROWS:
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


def scan_from_cache(cache: ColumnCache, run: ScanRun, chunk_rows: int) -> Generator[None, None, bool]:
    """Feed `run` the partition's answer from `cache`, yielding between steps of at most COPY_STEP_ROWS rows
    of the copy (or `chunk_rows` rows read from the store): its WHERE over the copy's columns (a count of
    its keys, its groups' aggregates) for the rows no apply changed since, and the changed keys' rows read
    from the store. All as of the first step: the changed keys are taken then, and every row read from the
    store comes from a view of that moment (the copy's arrays never change). Returns False at once when
    the WHERE or the aggregates have no column form over these columns (the caller scans the rows)."""
    program = run.program
    where = program.where
    mask = None if where is None else column_mask(where, cache.columns)
    if where is not None and mask is None:
        return False
    aggregating = program.mode == AGGREGATE and not run.counts_matches
    aggregates = [(a.func, a.arg.name if isinstance(a.arg, Col) else None) for a in program.aggregates]
    inputs = None
    if aggregating:
        group = [node.name for node in program.group if isinstance(node, Col)]
        inputs = aggregate_inputs(group, aggregates, cache.columns)
        if inputs is None:
            return False
    order = run.order_columns if program.mode == TOP else None
    sort_inputs = None
    if order is not None:
        sort_inputs = top_inputs(order, cache.columns)
        if sort_inputs is None:
            return False
    step_rows = COPY_STEP_ROWS
    store = cache.store
    view = store.snapshot()
    try:
        changed = sorted(cache.changed.keys)
        unchanged = cache.rows
        if changed:
            stale = pc.is_in(cache.keys, value_set=pa.array(changed, pa.binary()))
            unchanged -= pc.sum(stale).as_py() or 0
            kept = pc.invert(stale)
            mask = kept if mask is None else pc.and_(mask, kept)
        # The changed keys' rows, through the rows' evaluation.
        for at in range(0, len(changed), chunk_rows):
            keys = changed[at : at + chunk_rows]
            current = [
                (key, row) for key, row in zip(keys, view.get_many(keys), strict=True) if row is not None
            ]
            if run.keys_only:
                run.feed_keys([key for key, _ in current])
            else:
                run.feed(current)
            yield None
        if unchanged:
            run.saw_every_column()
        matches = 0
        matched: list[bytes] = []
        keep = program.keep
        best: list[
            tuple[tuple[object, ...], bytes, list[object]]
        ] = []  # the top n so far: sort key, key, values
        for start in range(0, cache.rows, step_rows):
            part = None if mask is None else mask.slice(start, step_rows)
            if order is not None and sort_inputs is not None:
                sliced = {name: column.slice(start, step_rows) for name, column in sort_inputs.items()}
                keys, values = column_top(order, sliced, cache.keys.slice(start, step_rows), part, keep)
                best.extend(
                    (sort_key_of(one, program.order), key, one) for key, one in zip(keys, values, strict=True)
                )
                best = heapq.nsmallest(keep, best)
            elif inputs is not None:
                sliced = {name: column.slice(start, step_rows) for name, column in inputs.items()}
                rows = min(step_rows, cache.rows - start)
                try:
                    groups = column_aggregates(len(program.group), aggregates, sliced, part, rows, MAX_GROUPS)
                except ValueError as error:
                    raise EvalError(str(error)) from None
                run.add_groups(groups, 0)
            elif run.counts_matches:
                matches += min(step_rows, cache.rows - start) if part is None else pc.sum(part).as_py() or 0
            else:
                assert part is not None
                found = pc.filter(cache.keys.slice(start, step_rows), part).slice(0, keep - len(matched))
                matched.extend(found.to_pylist())
                if len(matched) >= keep:
                    break
            yield None
        if order is not None:
            found_rows = view.get_many([key for _, key, _ in best])
            run.add_top(
                [
                    (values, key, row)
                    for (_, key, values), row in zip(best, found_rows, strict=True)
                    if row is not None
                ],
                unchanged,
            )
        elif inputs is not None:
            run.add_groups({}, unchanged)
        elif run.counts_matches:
            run.add_match_count(matches, unchanged)
        else:
            items: list[tuple[bytes, bytes]] = []
            for at in range(0, len(matched), chunk_rows):
                keys = matched[at : at + chunk_rows]
                items.extend(
                    (key, row) for key, row in zip(keys, view.get_many(keys), strict=True) if row is not None
                )
                if at + chunk_rows < len(matched):
                    yield None
            run.add_matches(items, unchanged)
        return True
    finally:
        view.close()

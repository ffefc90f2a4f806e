"""One RocksDB (through rocksdict) per partition replica: the materialized rows and how far they go.

The applied log position and the epoch of the last applied record live in their own column family and
are written in the same WriteBatch as the data, so after any crash the store's rows are exactly the
rows of the log prefix its position names, and a restarted replica resumes from there. A column family
rather than a reserved key prefix keeps data keys exactly the encoded keys: no byte added to each key, no
slicing on every read, and no scan that has to step around the meta entry.

A far-behind follower gets a snapshot instead of the log: `snapshot()` pins a consistent view with its
position, `StoreSnapshot.chunk` serves it in bounded pieces keyed by the last key sent (so the transfer is
stateless across RPCs), and the follower builds the new store beside its old one with `begin_install`,
then swaps it in. The directories tell the state of an install, so a crash anywhere leaves an openable
store, either the complete old one or the complete new one:

    <path>.install   being written; not committed, deleted on open
    <path>.ready     committed (data and meta synced); open swaps it in
    <path>.old       the previous store during a swap; deleted once <path> holds the new one
    <path>.trash     a store being destroyed
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import struct
import threading
import weakref
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, cast

from rocksdict import (
    BlockBasedOptions,
    Cache,
    ColumnFamily,
    Options,
    Rdict,
    RdictIter,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from hotstate.log.files import fsync_dir, fsync_file

__all__ = [
    "ChangedKeys",
    "Store",
    "StoreCorruptError",
    "StoreError",
    "StoreInstall",
    "StorePaths",
    "StoreSnapshot",
    "store_paths",
]

META_COLUMN_FAMILY = "hotstate.meta"
# A TTL-by-write-time table's write-time index: key -> when the replica applied its last put (8 bytes,
# replica.retention.pack_written), in the same WriteBatch as the row. Key-ordered like the data, so the
# TTL sweep reads a page of it beside a page of rows; puts never read first (the new time overwrites the
# old), so a write pays one 8-byte put. Snapshots do not carry it: keys without an entry are stamped by
# the sweep when it first meets them (server.replicas), which can only make rows live longer.
WRITTEN_COLUMN_FAMILY = "hotstate.written"
_APPLIED_KEY = b"applied"
_APPLIED = struct.Struct(">QQ")  # position, epoch
_MAX_U64 = 2**64 - 1

# Sized for many small partition stores on a small machine: memtables flush at 8 MiB, one block cache is
# shared by every store of the process (so memory does not grow with the partition count), and the
# info LOG files stay small.
WRITE_BUFFER_BYTES = 8 << 20
BLOCK_CACHE_BYTES = 64 << 20
# The meta column family takes a tiny write with every batch and would never fill its memtable, which
# would keep every WAL file alive; past this total RocksDB flushes it so old WAL files can go.
MAX_TOTAL_WAL_BYTES = 4 * WRITE_BUFFER_BYTES
MAX_OPEN_FILES = 256
DELETION_WINDOW = 1000
DELETION_TRIGGER = 500

_block_cache: Cache | None = None
_open_paths: set[Path] = set()
_open_paths_lock = threading.Lock()


class StoreError(Exception):
    """A store that cannot be opened, read or written (RocksDB's error, with the path)."""

    def __init__(self, path: Path, message: str) -> None:
        super().__init__(f"store {path}: {message}")
        self.path = path


class StoreCorruptError(StoreError):
    """The store's files are damaged or missing (RocksDB's Corruption status, a file its MANIFEST names
    that is gone, a block whose checksum fails): its contents cannot be trusted. Unlike a plain StoreError
    (no space, a read-only disk) this says nothing about the disk being unusable now, only that this copy
    is lost: the replica can be rebuilt from another one."""


# RocksDB's status texts for damaged files rather than a failing disk: a Corruption status, or a file the
# MANIFEST (or CURRENT) names that is not there.
_DAMAGE_MARKERS = ("Corruption:", "No such file or directory", "checksum mismatch")


def _status_error(path: Path, what: str, iterator: RdictIter) -> StoreError | None:
    try:
        iterator.status()
    except Exception as error:
        return _store_error(path, what, error)
    return None


def _store_error(path: Path, what: str, error: Exception) -> StoreError:
    text = str(error)
    if any(marker in text for marker in _DAMAGE_MARKERS):
        return StoreCorruptError(path, f"{what}: {text}")
    return StoreError(path, f"{what}: {text}")


@dataclass(frozen=True, slots=True)
class StorePaths:
    live: Path
    install: Path
    ready: Path
    old: Path
    trash: Path


def store_paths(path: Path | str) -> StorePaths:
    live = Path(path)
    return StorePaths(
        live=live,
        install=live.with_name(live.name + ".install"),
        ready=live.with_name(live.name + ".ready"),
        old=live.with_name(live.name + ".old"),
        trash=live.with_name(live.name + ".trash"),
    )


def _options() -> Options:
    global _block_cache
    if _block_cache is None:
        _block_cache = Cache(BLOCK_CACHE_BYTES)
    table = BlockBasedOptions()
    table.set_block_cache(_block_cache)
    table.set_bloom_filter(10, False)  # point gets of absent keys skip the data blocks
    table.set_cache_index_and_filter_blocks(True)  # their memory counts against the shared cache
    # raw_mode: keys and values are our bytes, not rocksdict's pickled/tagged Python objects.
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    options.set_block_based_table_factory(table)
    options.set_write_buffer_size(WRITE_BUFFER_BYTES)
    options.set_max_write_buffer_number(2)
    options.set_max_total_wal_size(MAX_TOTAL_WAL_BYTES)
    options.set_max_background_jobs(2)
    options.set_max_open_files(MAX_OPEN_FILES)
    options.set_keep_log_file_num(2)
    options.set_max_log_file_size(1 << 20)
    # Tables that delete what they write (deletes, TTL, window retention): an SST file where some
    # DELETION_WINDOW consecutive entries hold DELETION_TRIGGER tombstones (or half its entries are
    # tombstones) is marked for compaction at once, so deleted rows' space and the tombstones themselves
    # go without waiting for the level to fill (RocksDB's CompactOnDeletionCollector).
    options.add_compact_on_deletion_collector_factory(DELETION_WINDOW, DELETION_TRIGGER, 0.5)
    return options


def _open_rdict(path: Path) -> Rdict:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        return Rdict(
            str(path),
            _options(),
            column_families={META_COLUMN_FAMILY: _options(), WRITTEN_COLUMN_FAMILY: _options()},
        )
    except Exception as error:  # rocksdict raises bare Exceptions carrying RocksDB's status text
        raise _store_error(path, "cannot open", error) from None


def _read_applied(path: Path, db: Rdict) -> tuple[int, int]:
    raw = db.get_column_family(META_COLUMN_FAMILY).get(_APPLIED_KEY)
    if raw is None:
        return 0, 0
    if not isinstance(raw, bytes) or len(raw) != _APPLIED.size:
        raise StoreCorruptError(path, f"corrupt applied-position entry {raw!r}")
    position, epoch = _APPLIED.unpack(raw)
    return position, epoch


def _check_position(position: int, epoch: int) -> None:
    if not 0 <= position <= _MAX_U64 or not 0 <= epoch <= _MAX_U64:
        raise ValueError(f"position and epoch must be in [0, 2**64), got position={position}, epoch={epoch}")


def _rmtree(path: Path) -> None:
    if path.exists():
        shutil.rmtree(path)


def _complete_swap(paths: StorePaths) -> None:
    """Move a committed install into place; every step can be cut off and redone (from `_recover`)."""
    if paths.old.exists() and paths.live.exists():
        _rmtree(paths.old)  # left over from an earlier swap that finished its renames
    if paths.live.exists():
        os.rename(paths.live, paths.old)
    os.rename(paths.ready, paths.live)
    fsync_dir(paths.live.parent)
    _rmtree(paths.old)


def _recover(paths: StorePaths) -> None:
    _rmtree(paths.trash)
    _rmtree(paths.install)
    if paths.ready.exists():
        _complete_swap(paths)
    elif paths.old.exists():
        if paths.live.exists():
            _rmtree(paths.old)
        else:
            # No swap step leaves this state; restoring the old store beats losing it.
            os.rename(paths.old, paths.live)
            fsync_dir(paths.live.parent)


def _register_open(path: Path) -> Path:
    key = path.resolve()
    with _open_paths_lock:
        if key in _open_paths:
            raise StoreError(path, "already open in this process")
        _open_paths.add(key)
    return key


def _unregister_open(key: Path) -> None:
    with _open_paths_lock:
        _open_paths.discard(key)


def _is_open(path: Path) -> bool:
    with _open_paths_lock:
        return path.resolve() in _open_paths


class _Cursor:
    """A live RocksDB iterator that `Store.close` can take away (an open iterator keeps the DB locked)."""

    __slots__ = ("__weakref__", "_items", "_path")

    def __init__(self, path: Path, items: Iterator[Any]) -> None:
        self._path = path
        self._items: Iterator[Any] | None = items

    def next_item(self) -> tuple[bytes, bytes] | None:
        # No caller may hold the iterator across a yield, or release() could not drop the last reference.
        if self._items is None:
            raise StoreError(self._path, "closed during a scan")
        # Typed by the annotation, not by cast(): cast's type argument is an expression built on every
        # call, and this runs once per row of every scan (that doubled a row's read: 786 ns instead of 381).
        item: tuple[bytes, bytes] | None = next(self._items, None)
        return item

    def next_chunk(self, size: int) -> list[Any]:
        """Up to `size` more entries, taken from the iterator in C (islice): a Python frame per entry cost
        a third of a whole scan of counted keys."""
        if self._items is None:
            raise StoreError(self._path, "closed during a scan")
        return list(itertools.islice(self._items, size))

    def release(self) -> None:
        self._items = None


class ChangedKeys:
    """The keys a store's `apply` put or deleted since `Store.track_changes` made this, up to `limit` of
    them: past it, `overflowed` alone (what follows the store knows then that too much changed to patch).
    A column copy of the store (server/column_cache.py) reads the rows of these keys from the store."""

    __slots__ = ("keys", "limit", "overflowed")

    def __init__(self, limit: int) -> None:
        self.keys: set[bytes] = set()
        self.limit = limit
        self.overflowed = False

    def add(self, records: Sequence[tuple[bytes, bytes | None]]) -> None:
        if self.overflowed:
            return
        keys = self.keys
        keys.update([key for key, _ in records])
        if len(keys) > self.limit:
            self.overflowed = True
            keys.clear()


class Store:
    """The RocksDB of one partition replica. Use `Store.open`; one thread may apply while others read."""

    def __init__(self, path: Path, db: Rdict, position: int, epoch: int, sync: bool, key: Path) -> None:
        self._path = path
        self._db: Rdict | None = db
        self._meta: ColumnFamily | None = db.get_column_family_handle(META_COLUMN_FAMILY)
        self._written: ColumnFamily | None = db.get_column_family_handle(WRITTEN_COLUMN_FAMILY)
        self._position = position
        self._epoch = epoch
        self._write_options = WriteOptions()
        self._write_options.sync = sync
        self._registered = key
        # Guards (position, epoch) against apply() so a snapshot reads the pair that matches its view.
        self._lock = threading.Lock()
        self._snapshots: weakref.WeakSet[StoreSnapshot] = weakref.WeakSet()
        self._cursors: weakref.WeakSet[_Cursor] = weakref.WeakSet()
        self._trackers: list[ChangedKeys] = []

    @classmethod
    def open(cls, path: Path | str, *, sync: bool = False) -> Store:
        """Open (creating if missing) the store at `path`, finishing or discarding an interrupted install.

        sync=True makes every apply() fsync the WAL before it returns.
        """
        path = Path(path)
        key = _register_open(path)
        try:
            _recover(store_paths(path))
            db = _open_rdict(path)
            try:
                position, epoch = _read_applied(path, db)
            except BaseException:
                db.close()
                raise
        except BaseException:
            _unregister_open(key)
            raise
        return cls(path, db, position, epoch, sync, key)

    @property
    def path(self) -> Path:
        return self._path

    @property
    def position(self) -> int:
        """The log position up to which records have been applied (0 for a new store)."""
        return self._position

    @property
    def epoch(self) -> int:
        """The epoch of the last applied record (0 for a new store)."""
        return self._epoch

    @property
    def closed(self) -> bool:
        """Whether `close` ran: a scan that spans turns of the event loop may find its store closed under it
        (a snapshot installed, the replica dropped), which is no failure of the store."""
        return self._db is None

    def _require_open(self) -> Rdict:
        if self._db is None:
            raise StoreError(self._path, "closed")
        return self._db

    def apply(
        self,
        records: Sequence[tuple[bytes, bytes | None]],
        position: int,
        epoch: int,
        written: bytes | None = None,
    ) -> None:
        """Put (or delete, for a None value) every record and move to (position, epoch), atomically.
        `written` (a TTL-by-write-time table's): the write-time index entry of every key put."""
        _check_position(position, epoch)
        batch = WriteBatch(raw_mode=True)
        if written is None:
            for key, value in records:
                if value is None:
                    batch.delete(key)
                else:
                    batch.put(key, value)
        else:
            for key, value in records:
                if value is None:
                    batch.delete(key)
                    batch.delete(key, self._written)
                else:
                    batch.put(key, value)
                    batch.put(key, written, self._written)
        batch.put(_APPLIED_KEY, _APPLIED.pack(position, epoch), self._meta)
        with self._lock:
            db = self._require_open()
            if position < self._position:
                raise ValueError(f"position {position} is behind the store's position {self._position}")
            try:
                db.write(batch, self._write_options)
            except Exception as error:
                raise _store_error(self._path, "write failed", error) from None
            self._position = position
            self._epoch = epoch
            for tracker in self._trackers:
                tracker.add(records)

    def track_changes(self, limit: int) -> ChangedKeys:
        """From now on, the keys every `apply` puts or deletes (see ChangedKeys), until `untrack`. A scan
        iterator made after this call sees the store as of a moment after it: a key it read that changed
        since is among the keys."""
        tracker = ChangedKeys(limit)
        with self._lock:
            self._trackers.append(tracker)
        return tracker

    @property
    def trackers(self) -> int:
        """How many `track_changes` lists every apply fills now."""
        return len(self._trackers)

    def untrack(self, tracker: ChangedKeys) -> None:
        with self._lock:
            if tracker in self._trackers:
                self._trackers.remove(tracker)

    def get(self, key: bytes) -> bytes | None:
        db = self._require_open()
        try:
            value = db.get(key)
        except Exception as error:  # a block failing its checksum, an IO error
            raise _store_error(self._path, "read failed", error) from None
        return cast(bytes | None, value)

    def written_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The write-time index entries of `keys` (None: no entry)."""
        if not keys:
            return []
        db = self._require_open()
        try:
            values = db.get_column_family(WRITTEN_COLUMN_FAMILY).get(list(keys))
        except Exception as error:
            raise _store_error(self._path, "read failed", error) from None
        return cast(list[bytes | None], values)

    def stamp_written(self, keys: Sequence[bytes], written: bytes) -> None:
        """Give `keys` (rows without an entry) a write-time index entry: local to this replica, outside
        the log and the position (the index only delays expiry, it never decides a row's contents)."""
        if not keys:
            return
        batch = WriteBatch(raw_mode=True)
        for key in keys:
            batch.put(key, written, self._written)
        with self._lock:
            db = self._require_open()
            try:
                db.write(batch, self._write_options)
            except Exception as error:
                raise _store_error(self._path, "write failed", error) from None

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        if not keys:
            return []
        db = self._require_open()
        try:
            values = db.get(list(keys))
        except Exception as error:
            raise _store_error(self._path, "read failed", error) from None
        return cast(list[bytes | None], values)

    def scan(
        self, start: bytes | None = None, end: bytes | None = None, *, limit: int | None = None
    ) -> Iterator[tuple[bytes, bytes]]:
        """Items with start <= key < end (None: unbounded) in ascending key order, at most `limit`.

        The view is the store as of this call, whatever apply() does while the caller iterates.
        """
        if limit is not None and limit < 0:
            raise ValueError(f"limit must be >= 0, got {limit}")
        db = self._require_open()
        if limit == 0 or (start is not None and end is not None and start >= end):
            return iter(())
        read_options = ReadOptions()
        if end is not None:
            read_options.set_iterate_upper_bound(end)
        items = cast(Iterator[tuple[bytes, bytes]], db.items(from_key=start, read_opt=read_options))
        cursor = _Cursor(self._path, items)
        self._cursors.add(cursor)
        return self._scan(cursor, limit, start, end)

    def scan_chunks(
        self,
        start: bytes | None,
        end: bytes | None,
        size: int | Callable[[], int],
        *,
        keys_only: bool = False,
        fill_cache: bool = True,
    ) -> Iterator[list[Any]]:
        """`scan(start, end)` in lists of up to `size` (key, value) items (the last may be shorter, none is
        empty), or of keys alone with `keys_only` (no value copied out of RocksDB: what a COUNT(*) needs).
        `size` may be a function, asked before each list (a scan sizes its reads from their cost).
        A scan run in steps takes a list at a time, gathered in C rather than a Python frame per entry.
        The same view and the same end-of-range check as `scan`.

        `fill_cache=False` for a read of a whole table or a sweep through it (a pull query's scan, expiry):
        it reads each block once, so its blocks would only push the blocks that point lookups and key
        ranges keep hot out of the shared cache, and inserting each cost about a fifth of an iteration's
        time. A key range read keeps filling it: the same user's windows are asked for again."""
        if isinstance(size, int):
            if size <= 0:
                raise ValueError(f"size must be > 0, got {size}")
            size_of = itertools.repeat(size).__next__
        else:
            size_of = size
        db = self._require_open()
        if start is not None and end is not None and start >= end:
            return iter(())
        read_options = ReadOptions()
        if not fill_cache:
            read_options.fill_cache(False)  # type: ignore[call-arg]  # the stub (0.3.29) omits the argument
        if end is not None:
            read_options.set_iterate_upper_bound(end)
        entries = (db.keys if keys_only else db.items)(from_key=start, read_opt=read_options)
        cursor = _Cursor(self._path, entries)
        self._cursors.add(cursor)
        return self._chunks(cursor, size_of, start, end, keys_only)

    def scan_page(self, start: bytes | None, size: int) -> list[tuple[bytes, bytes]]:
        """The first `size` items from `start` to the end of the store: `scan_chunks`' first chunk (gathered
        in C, not filling the block cache), its iterator released at once. A page shorter than `size` is
        the end of the store, told from a damaged block as `scan`'s end is."""
        chunks = self.scan_chunks(start, None, size, fill_cache=False)
        try:
            page: list[tuple[bytes, bytes]] = next(chunks, [])
            if 0 < len(page) < size:
                next(chunks, None)  # the end check runs past the last chunk
            return page
        finally:
            if isinstance(chunks, Generator):
                chunks.close()

    def _chunks(
        self,
        cursor: _Cursor,
        size_of: Callable[[], int],
        start: bytes | None,
        end: bytes | None,
        keys_only: bool,
    ) -> Iterator[list[Any]]:
        try:
            last: bytes | None = None
            while True:
                size = max(1, size_of())
                chunk = cursor.next_chunk(size)
                if chunk:
                    last = chunk[-1] if keys_only else chunk[-1][0]
                    yield chunk
                if len(chunk) < size:
                    self._check_scan_end(start if last is None else last, last is not None, end)
                    return
        finally:
            cursor.release()

    def _scan(
        self, cursor: _Cursor, limit: int | None, start: bytes | None, end: bytes | None
    ) -> Iterator[tuple[bytes, bytes]]:
        remaining = -1 if limit is None else limit
        last: bytes | None = None
        try:
            while remaining != 0:
                item = cursor.next_item()
                if item is None:
                    self._check_scan_end(start if last is None else last, last is not None, end)
                    return
                last = item[0]
                yield item
                remaining -= 1
        finally:
            cursor.release()

    def _check_scan_end(self, key: bytes | None, past: bool, end: bytes | None) -> None:
        """rocksdict's item iteration ends quietly at a block it cannot read (a checksum mismatch): step
        past where it ended with a RocksDB iterator, whose status tells damage from the end of the range
        (StoreCorruptError rather than an answer missing rows). One seek per scan that reached its end."""
        db = self._db
        if db is None:
            raise StoreError(self._path, "closed during a scan")
        options = ReadOptions()
        if end is not None:
            options.set_iterate_upper_bound(end)
        iterator = db.iter(options)
        if key is None:
            iterator.seek_to_first()
        else:
            iterator.seek(key)
            if past and iterator.valid() and iterator.key() == key:
                iterator.next()
        failure = _status_error(self._path, "scan failed", iterator)
        # The iterator holds the DB open (and its LOCK): it must not live on in the traceback's frame.
        del iterator
        if failure is not None:
            raise failure

    def snapshot(self) -> StoreSnapshot:
        """A consistent view of the data with the (position, epoch) it reflects; close it when done."""
        with self._lock:
            db = self._require_open()
            # rocksdict's Snapshot.iter()/items() ignore the snapshot and see later writes (0.3.29; only
            # Snapshot[key] honours it), so the view is a RocksDB iterator instead: an iterator reads as
            # of the sequence number at its creation for its whole life, whatever it seeks to. Like a
            # snapshot it keeps old versions alive; it also pins the memtables of that moment.
            snapshot = StoreSnapshot(self._path, db.iter(), self._position, self._epoch)
            self._snapshots.add(snapshot)
        return snapshot

    def count_estimate(self) -> int:
        """RocksDB's estimate of the number of keys (exact for a store that has not overwritten keys)."""
        value = self._require_open().property_int_value("rocksdb.estimate-num-keys")
        return value or 0

    def verify(self) -> int:
        """Read every entry of both column families with block checksums on; the number of data entries.

        RocksDB checks at open only that the files its MANIFEST names exist; a damaged block is found when
        read, and a plain iteration over it just ends early. This reads it all (without filling the block
        cache) and raises StoreCorruptError on the first damage, naming RocksDB's status.
        """
        db = self._require_open()
        count = 0
        for column in (db, db.get_column_family(META_COLUMN_FAMILY)):
            options = ReadOptions()
            options.set_verify_checksums(True)
            options.fill_cache(False)  # type: ignore[call-arg]  # the stub lacks the flag
            iterator = column.iter(options)
            iterator.seek_to_first()
            while iterator.valid():
                if column is db:
                    count += 1
                iterator.next()
            failure = _status_error(self._path, "verification failed", iterator)
            del iterator  # see _check_scan_end
            if failure is not None:
                del column  # a column family handle holds the DB open too
                raise failure
        return count

    def close(self) -> None:
        with self._lock:
            db = self._db
            if db is None:
                return
            # Every iterator and handle holds a reference to the DB, which stays open (and locked) until
            # the last one is gone; a snapshot or scan left open must not keep the store locked.
            for snapshot in list(self._snapshots):
                snapshot.close()
            for cursor in list(self._cursors):
                cursor.release()
            self._meta = None
            self._written = None
            self._db = None
            # Memtables to SST files: the next open replays no WAL, and verify() checks every row's block.
            with contextlib.suppress(Exception):
                db.flush()
            try:
                db.close()
            finally:
                _unregister_open(self._registered)

    def __enter__(self) -> Store:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    @staticmethod
    def destroy(path: Path | str) -> None:
        """Delete a replica's store and any install leftovers; the store must be closed."""
        paths = store_paths(path)
        if _is_open(paths.live):
            raise StoreError(paths.live, "cannot destroy an open store")
        # Renamed first so that a crash halfway through deleting never leaves a damaged store at `path`.
        if paths.live.exists():
            _rmtree(paths.trash)
            os.rename(paths.live, paths.trash)
            fsync_dir(paths.live.parent)
        for leftover in (paths.install, paths.ready, paths.old, paths.trash):
            _rmtree(leftover)

    @staticmethod
    def begin_install(path: Path | str) -> StoreInstall:
        """Start building a replacement for the store at `path` (which may stay open meanwhile).

        Opening the store discards an uncommitted install, so it must not be reopened while one is built.
        """
        paths = store_paths(path)
        _rmtree(paths.install)
        _rmtree(paths.ready)  # a committed install nobody swapped in is older than this one
        return StoreInstall(paths, _open_rdict(paths.install))

    @classmethod
    def swap_installed(cls, path: Path | str, *, sync: bool = False) -> Store:
        """Replace the (closed) store at `path` with the committed install and open it."""
        paths = store_paths(path)
        if _is_open(paths.live):
            raise StoreError(paths.live, "close the store before swapping in the installed one")
        if not paths.ready.exists():
            raise StoreError(paths.live, "no committed install to swap in")
        _complete_swap(paths)
        return cls.open(path, sync=sync)


class StoreSnapshot:
    """A consistent view of a store, read in chunks; `position`/`epoch` are those of the view."""

    def __init__(self, path: Path, iterator: RdictIter, position: int, epoch: int) -> None:
        self._path = path
        self._iterator: RdictIter | None = iterator
        self._lock = threading.Lock()
        self.position = position
        self.epoch = epoch

    def chunk(self, after: bytes | None, max_bytes: int) -> tuple[list[tuple[bytes, bytes]], bytes | None]:
        """Items with key > after (from the first key for None) until max_bytes of keys and values.

        Returns the items (at least one while any remain) and the key to pass as `after` next time, or
        None when this chunk reached the end.
        """
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes}")
        with self._lock:
            iterator = self._iterator
            if iterator is None:
                raise StoreError(self._path, "snapshot closed")
            if after is None:
                iterator.seek_to_first()
            else:
                iterator.seek(after)
                if iterator.valid() and iterator.key() == after:
                    iterator.next()
            items: list[tuple[bytes, bytes]] = []
            size = 0
            while size < max_bytes and iterator.valid():
                key: bytes = iterator.key()
                value: bytes = iterator.value()
                items.append((key, value))
                size += len(key) + len(value)
                iterator.next()
            try:
                iterator.status()
            except Exception as error:
                raise StoreError(self._path, f"snapshot read failed: {error}") from None
            return items, (items[-1][0] if iterator.valid() else None)

    def get_many(self, keys: Sequence[bytes]) -> list[bytes | None]:
        """The view's rows of `keys` (None: no row), a seek each."""
        with self._lock:
            iterator = self._iterator
            if iterator is None:
                raise StoreError(self._path, "snapshot closed")
            rows: list[bytes | None] = []
            for key in keys:
                iterator.seek(key)
                rows.append(iterator.value() if iterator.valid() and iterator.key() == key else None)
            failure = _status_error(self._path, "snapshot read failed", iterator)
            if failure is not None:
                raise failure
            return rows

    def close(self) -> None:
        with self._lock:
            self._iterator = None

    def __enter__(self) -> StoreSnapshot:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class StoreInstall:
    """A store being built from a snapshot beside the live one; see the module docstring."""

    def __init__(self, paths: StorePaths, db: Rdict) -> None:
        self._paths = paths
        self._db: Rdict | None = db
        self._committed = False

    @property
    def committed(self) -> bool:
        return self._committed

    def _require_writable(self) -> Rdict:
        if self._db is None:
            raise StoreError(self._paths.install, "install already committed or aborted")
        return self._db

    def add(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        db = self._require_writable()
        batch = WriteBatch(raw_mode=True)
        for key, value in items:
            batch.put(key, value)
        try:
            db.write(batch)
        except Exception as error:
            raise StoreError(self._paths.install, f"write failed: {error}") from None

    def commit(self, position: int, epoch: int) -> None:
        """Make the install durable with its (position, epoch) and mark it complete (`.ready`)."""
        _check_position(position, epoch)
        db = self._require_writable()
        batch = WriteBatch(raw_mode=True)
        batch.put(
            _APPLIED_KEY, _APPLIED.pack(position, epoch), db.get_column_family_handle(META_COLUMN_FAMILY)
        )
        synced = WriteOptions()
        synced.sync = True
        try:
            # A synced WAL write makes every earlier unsynced write durable too; the flush only spares
            # the first open a WAL replay.
            db.write(batch, synced)
            db.flush()
        except Exception as error:
            raise StoreError(self._paths.install, f"commit failed: {error}") from None
        finally:
            self._db = None
            db.close()
        # Belt and braces before the rename publishes it: every file and the directory itself on disk.
        for entry in self._paths.install.iterdir():
            if entry.is_file():
                fsync_file(entry)
        fsync_dir(self._paths.install)
        os.rename(self._paths.install, self._paths.ready)
        fsync_dir(self._paths.live.parent)
        self._committed = True

    def abort(self) -> None:
        """Drop the install (committed or not, as long as it was not swapped in)."""
        db, self._db = self._db, None
        if db is not None:
            db.close()
        _rmtree(self._paths.install)
        if self._committed:
            _rmtree(self._paths.ready)
            self._committed = False

    def __enter__(self) -> StoreInstall:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is not None or not self._committed:
            self.abort()

"""The segmented append-only log: record batches in segment files, a leader-epoch file, crash recovery.

Directory layout:

    00000000000000000000.log     batches (see batch.py), the segment's name is its base offset
    00000000000000000000.index   sparse offset index of that segment (see index.py)
    leader-epoch-checkpoint      epoch -> start offset (see epochs.py)
    log-start-offset             first readable offset (it may fall inside a segment)
    clean-shutdown               present only between close() and the next open()
    .lock                        flock'ed while a Log has the directory open

Semantics a caller relies on:

- `read(from_offset, max_bytes)` returns whole batches, except that the first one is *trimmed* to start
  at `from_offset` (unlike Kafka, a follower can hand the result straight to `append_batch`). max_bytes
  counts encoded batch sizes; the first batch is returned even when larger, so a reader always advances.
- Recovery on open (recovery.py) validates the last segment batch by batch (CRC32C, offsets, framing)
  and cuts a torn or corrupt tail off the file with a warning: it is never served. After an unclean
  stop of an fsync="never" log every segment is validated and the log ends at the first bad batch.
  Damage followed by a valid batch is not a torn write but corruption inside the log: open() raises
  CorruptLogError naming the file and byte. Corruption in an older segment found later by read()
  raises CorruptLogError too.
- Writes are ordered so that a crash leaves files that recovery makes consistent: records before the
  epoch entries that describe them (recovery re-derives a missing entry from the last segment), the
  start-offset file before deleting segments, and a cut inside a batch as one atomic rename.
- Not thread-safe: one owner (the asyncio task of a Raft shell or a replica) calls it. Calls block on
  disk IO; with fsync="always" every append and truncation waits for fsync.
"""

from __future__ import annotations

import bisect
import fcntl
import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Literal, get_args

from hotstate.log.batch import (
    HEADER_SIZE,
    InvalidBatchError,
    RecordBatch,
    check_batch_fields,
    check_crc,
    decode_batch,
    encode_batch,
)
from hotstate.log.divergence import DivergingEpoch
from hotstate.log.epochs import EPOCH_FILE, NO_EPOCH, EpochIndex, write_checkpoint
from hotstate.log.errors import CorruptLogError, LogError, OffsetOutOfRangeError
from hotstate.log.files import (
    CLEAN_SHUTDOWN_FILE,
    START_OFFSET_FILE,
    StartOffsetState,
    fsync_dir,
    fsync_file,
    write_start_offset,
)
from hotstate.log.index import MAX_RELATIVE_OFFSET
from hotstate.log.recovery import recover
from hotstate.log.segment import MAX_SEGMENT_BYTES, Segment

FsyncPolicy = Literal["always", "never"]
LOCK_FILE = ".lock"
_READ_CHUNK_MIN = 64 * 1024
_READ_CHUNK_MAX = 8 * 1024 * 1024


class Log:
    """See the module docstring. Create with `Log.open`; offsets are 0-based, end_offset is exclusive."""

    def __init__(
        self, directory: Path, fsync: FsyncPolicy, segment_bytes: int, index_interval_bytes: int, lock_fd: int
    ) -> None:
        self._dir = directory
        self._fsync = fsync
        self._always = fsync == "always"
        self._segment_bytes = segment_bytes
        self._index_interval = index_interval_bytes
        self._lock_fd = lock_fd
        self._segments: list[Segment] = []
        self._bases: list[int] = []  # base offsets of _segments, for bisect
        self._start = 0
        self._end = 0
        self._epochs = EpochIndex()
        # Metadata files or directory entries written without fsync (fsync="never") since the last flush.
        self._metadata_unsynced = False
        self._closed = False

    @classmethod
    def open(
        cls,
        directory: str | Path,
        *,
        fsync: FsyncPolicy = "never",
        segment_bytes: int = 64 * 1024 * 1024,
        index_interval_bytes: int = 4096,
        flushed_by_caller: bool = False,
    ) -> Log:
        """Open the log in `directory` (created if missing) and recover it; see the module docstring.

        flushed_by_caller: the caller flushes after its writes and before telling anyone of them, so only
        the last segment's tail can be torn (recovery.py).
        """
        if fsync not in get_args(FsyncPolicy):
            raise ValueError(f"fsync must be one of {get_args(FsyncPolicy)}, got {fsync!r}")
        if not HEADER_SIZE < segment_bytes <= MAX_SEGMENT_BYTES:
            raise ValueError(f"segment_bytes must be in ({HEADER_SIZE}, {MAX_SEGMENT_BYTES}]")
        if index_interval_bytes < 0:
            raise ValueError("index_interval_bytes must be >= 0")
        path = Path(directory)
        created = not path.exists()
        path.mkdir(parents=True, exist_ok=True)
        if created and fsync == "always":
            fsync_dir(path.parent)
        lock_fd = os.open(path / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(lock_fd)
            raise LogError(f"log directory {path} is open elsewhere") from None
        log = cls(path, fsync, segment_bytes, index_interval_bytes, lock_fd)
        try:
            recovered = recover(
                path,
                always=fsync == "always",
                index_interval_bytes=index_interval_bytes,
                flushed_by_caller=flushed_by_caller,
            )
        except BaseException:
            os.close(lock_fd)
            raise
        log._segments = recovered.segments
        log._bases = [segment.base_offset for segment in recovered.segments]
        log._start = recovered.start_offset
        log._end = recovered.end_offset
        log._epochs = recovered.epochs
        return log

    # -- properties ---------------------------------------------------------------------------------

    @property
    def directory(self) -> Path:
        return self._dir

    @property
    def fsync_policy(self) -> FsyncPolicy:
        return self._fsync

    @property
    def start_offset(self) -> int:
        """First offset still readable."""
        return self._start

    @property
    def end_offset(self) -> int:
        """Next offset to be written."""
        return self._end

    @property
    def latest_epoch(self) -> int:
        """Epoch of the latest record, -1 when the log holds none (e.g. empty after a snapshot)."""
        return self._epochs.latest_epoch

    @property
    def size_bytes(self) -> int:
        """Bytes of segment files, records below start_offset in the first segment included."""
        return sum(segment.size for segment in self._segments)

    @property
    def closed(self) -> bool:
        return self._closed

    def epoch_entries(self) -> list[tuple[int, int]]:
        """(epoch, start offset) for every epoch with a record in [start_offset, end_offset), ascending."""
        return self._epochs.entries()

    def end_offset_for_epoch(self, epoch: int) -> DivergingEpoch | None:
        """The largest known epoch <= `epoch` and where it ends (next epoch's start or end_offset); None if
        none is known. See EpochIndex.end_offset_for_epoch for the edges.

        The checkpoint file does not keep the epoch below the start, so above offset 0 an epoch below every
        record's answers None (the fetcher needs a snapshot), as after a reopen.
        """
        self._check_open()
        return self._epochs.end_offset_for_epoch(epoch, self._end)

    # -- writes -------------------------------------------------------------------------------------

    def append(self, leader_epoch: int, records: Sequence[bytes]) -> RecordBatch:
        """Leader side: append `records` as one batch at end_offset; returns it with its offsets."""
        self._check_open()
        self._check_epoch(leader_epoch)
        batch = RecordBatch(self._end, leader_epoch, check_batch_fields(self._end, leader_epoch, records))
        self._append(batch)
        return batch

    def append_batch(self, batch: RecordBatch) -> None:
        """Follower side: append a batch read from the leader; it must start at end_offset."""
        self._check_open()
        if batch.base_offset != self._end:
            raise LogError(f"batch at offset {batch.base_offset} but the log ends at {self._end}")
        self._check_epoch(batch.leader_epoch)
        records = check_batch_fields(batch.base_offset, batch.leader_epoch, batch.records)
        self._append(RecordBatch(batch.base_offset, batch.leader_epoch, records))

    def truncate_to(self, offset: int) -> None:
        """Drop every record at `offset` or above; a batch holding `offset` keeps its records below it."""
        self._check_open()
        if offset < self._start:
            raise OffsetOutOfRangeError(offset, self._start, self._end)
        if offset >= self._end:
            return
        keep = max(bisect.bisect_left(self._bases, offset) - 1, 0)
        segment_end = self._bases[keep + 1] if keep + 1 < len(self._bases) else self._end
        # Newest first: a crash midway leaves a shorter log, never one with a hole.
        removed = self._delete_segments_after(keep)
        segment = self._segments[keep]
        if offset < segment_end:
            position, header = segment.find(offset)
            if header.base_offset == offset:
                segment.truncate(position)
                if self._always:
                    segment.sync_data()
            else:
                batch = self._read_batch_at(segment, position, header.size)
                prefix = RecordBatch(
                    batch.base_offset, batch.leader_epoch, batch.records[: offset - batch.base_offset]
                )
                segment.replace_tail(position, encode_batch(prefix), fsync=self._always)
        self._sync_dir_if(removed)
        self._end = offset
        if self._epochs.truncate_to(offset):
            self._write_epochs()

    def advance_start_offset(self, offset: int) -> None:
        """Make `offset` the first readable offset and delete the segments wholly below it.

        Only moves forward (an offset <= start_offset is a no-op); beyond end_offset use reset().
        The epoch of the record at the new start now starts there (Kafka's truncateFromStart).
        """
        self._check_open()
        if offset <= self._start:
            return
        if offset > self._end:
            raise OffsetOutOfRangeError(offset, self._start, self._end)
        # The start goes to disk first: segments deleted before a crash are then below a durable start.
        write_start_offset(self._dir, StartOffsetState(offset, False), fsync=self._always)
        self._note_metadata_write()
        self._start = offset
        if self._epochs.advance_start(offset, self._end, NO_EPOCH):
            self._write_epochs()
        changed = False
        if offset == self._end and self._segments[-1].size > 0:
            self._roll(offset)  # so that every segment holding records can go
            changed = True
        while len(self._segments) > 1 and self._bases[1] <= offset:
            self._bases.pop(0)
            self._segments.pop(0).delete()
            changed = True
        self._sync_dir_if(changed)

    def reset(self, start_offset: int) -> None:
        """Drop all records and epochs; the log is empty at `start_offset` (after installing a snapshot)."""
        self._check_open()
        if start_offset < 0:
            raise LogError(f"negative start offset {start_offset}")
        # Marked pending first: open() finishes an interrupted reset instead of mixing old and new.
        write_start_offset(self._dir, StartOffsetState(start_offset, True), fsync=self._always)
        self._delete_segments_after(-1)
        self._epochs.reset(start_offset, NO_EPOCH)
        self._write_epochs()
        self._segments = [Segment.create(self._dir, start_offset)]
        self._bases = [start_offset]
        self._sync_dir_if(True)
        write_start_offset(self._dir, StartOffsetState(start_offset, False), fsync=self._always)
        self._note_metadata_write()
        self._start = self._end = start_offset

    def flush(self) -> None:
        """fsync every record, index and metadata file written since the last flush."""
        self._check_open()
        for segment in self._segments:
            segment.flush()
        if self._metadata_unsynced:
            fsync_file(self._dir / EPOCH_FILE)
            fsync_file(self._dir / START_OFFSET_FILE)
            fsync_dir(self._dir)
            self._metadata_unsynced = False

    def close(self) -> None:
        """Flush and mark the shutdown clean (the next open then validates only the last segment)."""
        if self._closed:
            return
        self.flush()
        (self._dir / CLEAN_SHUTDOWN_FILE).touch()
        fsync_dir(self._dir)
        self._release()

    def __enter__(self) -> Log:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"Log({str(self._dir)!r}, fsync={self._fsync!r}, start={self._start}, end={self._end}, "
            f"segments={len(self._segments)}, latest_epoch={self.latest_epoch})"
        )

    # -- reads --------------------------------------------------------------------------------------

    def read(self, from_offset: int, max_bytes: int) -> list[RecordBatch]:
        """Batches from `from_offset` on, the first trimmed to start there; see the module docstring.

        [] when from_offset == end_offset; OffsetOutOfRangeError outside [start_offset, end_offset].
        """
        self._check_open()
        if not self._start <= from_offset <= self._end:
            raise OffsetOutOfRangeError(from_offset, self._start, self._end)
        out: list[RecordBatch] = []
        if from_offset == self._end:
            return out
        used = 0
        chunk = min(max(max_bytes, _READ_CHUNK_MIN), _READ_CHUNK_MAX)
        i = bisect.bisect_right(self._bases, from_offset) - 1
        position = self._segments[i].index.lookup(from_offset)
        expected = from_offset
        for segment in self._segments[i:]:
            if out and segment.base_offset != expected:
                raise CorruptLogError(
                    segment.path, 0, f"segment starts at {segment.base_offset}, not {expected}"
                )
            reader = segment.reader(position, chunk)
            position = 0
            while True:
                at = reader.position
                try:
                    item = reader.next()
                    if item is None:
                        break
                    header, buffer, offset_in_buffer = item
                    if header.next_offset <= from_offset:
                        continue
                    if out and used + header.size > max_bytes:
                        return out
                    check_crc(header, buffer, offset_in_buffer)
                    batch = decode_batch(header, buffer, offset_in_buffer)
                except InvalidBatchError as exc:
                    raise CorruptLogError(segment.path, at, str(exc)) from exc
                if not batch.base_offset <= expected < batch.next_offset:
                    raise CorruptLogError(
                        segment.path, at, f"batch at offset {batch.base_offset}, not {expected}"
                    )
                if batch.base_offset < expected:
                    batch = RecordBatch(
                        expected, batch.leader_epoch, batch.records[expected - batch.base_offset :]
                    )
                out.append(batch)
                used += header.size
                expected = batch.next_offset
                if expected >= self._end:
                    return out
        raise CorruptLogError(
            self._segments[-1].path, self._segments[-1].size, f"log ends before {self._end}"
        )

    # -- internals ----------------------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise LogError(f"log {self._dir} is closed")

    def _check_epoch(self, epoch: int) -> None:
        if epoch < self._epochs.latest_epoch:
            raise LogError(
                f"leader epoch {epoch} is below the log's latest epoch {self._epochs.latest_epoch}"
            )

    def _append(self, batch: RecordBatch) -> None:
        data = encode_batch(batch)
        active = self._segments[-1]
        if active.size > 0 and (
            active.size + len(data) > self._segment_bytes
            or batch.last_offset - active.base_offset > MAX_RELATIVE_OFFSET
        ):
            active = self._roll(batch.base_offset)
        active.append(data, batch.base_offset, self._index_interval)
        if self._always:
            active.sync_data()
        self._end = batch.next_offset
        # After the records: a crash in between leaves an entry to re-derive, never one without records.
        if self._epochs.append(batch.leader_epoch, batch.base_offset):
            self._write_epochs()

    def _roll(self, base_offset: int) -> Segment:
        if self._always:
            self._segments[-1].flush()
        segment = Segment.create(self._dir, base_offset)
        self._segments.append(segment)
        self._bases.append(base_offset)
        self._sync_dir_if(True)
        return segment

    def _delete_segments_after(self, keep: int) -> bool:
        removed = False
        while len(self._segments) > keep + 1:
            self._bases.pop()
            self._segments.pop().delete()
            removed = True
        return removed

    def _sync_dir_if(self, changed: bool) -> None:
        if changed and self._always:
            fsync_dir(self._dir)
        elif changed:
            self._metadata_unsynced = True

    def _note_metadata_write(self) -> None:
        if not self._always:
            self._metadata_unsynced = True

    def _write_epochs(self) -> None:
        write_checkpoint(self._dir, self._epochs.entries(), fsync=self._always)
        self._note_metadata_write()

    def _read_batch_at(self, segment: Segment, position: int, size: int) -> RecordBatch:
        reader = segment.reader(position, size)
        try:
            item = reader.next()
            if item is None:
                raise InvalidBatchError("no batch")
            check_crc(*item)
            return decode_batch(*item)
        except InvalidBatchError as exc:
            raise CorruptLogError(segment.path, position, str(exc)) from exc

    def _release(self) -> None:
        for segment in self._segments:
            segment.close()
        self._segments = []
        self._bases = []
        os.close(self._lock_fd)  # also drops the flock
        self._closed = True

    def abandon(self) -> None:
        """Close without flushing or marking a clean shutdown: what a crash of the process leaves (a failed
        disk; tests), so the next open validates every segment."""
        if not self._closed:
            self._release()

    _abandon = abandon

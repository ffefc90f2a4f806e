"""One segment: a file of consecutive batches named by its base offset, with its sparse offset index."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from hotstate.log.batch import (
    HEADER_SIZE,
    BatchHeader,
    InvalidBatchError,
    check_crc,
    parse_header,
)
from hotstate.log.errors import CorruptLogError
from hotstate.log.files import fsync_dir
from hotstate.log.index import OffsetIndex

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
SWAP_SUFFIX = ".swap"
_NAME_DIGITS = 20
# Bounds a segment so that u32 index positions always fit (a segment holds at most one batch beyond it).
MAX_SEGMENT_BYTES = 1 << 31
SCAN_CHUNK_BYTES = 1 << 20


def segment_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:0{_NAME_DIGITS}d}{suffix}"


def parse_segment_name(name: str, suffix: str) -> int | None:
    stem = name[: -len(suffix)] if name.endswith(suffix) else ""
    return int(stem) if len(stem) == _NAME_DIGITS and stem.isdigit() else None


def _write_all(fd: int, data: bytes | memoryview, position: int) -> None:
    view = memoryview(data)
    while view:
        written = os.pwrite(fd, view, position)
        view = view[written:]
        position += written


def _fdatasync(fd: int) -> None:
    # fdatasync still flushes the file size, which is all the metadata an append changes.
    if hasattr(os, "fdatasync"):
        os.fdatasync(fd)
    else:  # pragma: no cover - macOS
        os.fsync(fd)


class BatchReader:
    """Walks the batches of a segment file from a position, reading it in chunks with pread."""

    def __init__(self, fd: int, position: int, end: int, chunk_bytes: int) -> None:
        self._fd = fd
        self._end = end
        self._chunk = chunk_bytes
        self._buffer = b""
        self._buffer_position = position
        self.position = position  # of the next batch

    def next(self) -> tuple[BatchHeader, bytes, int] | None:
        """(header, buffer, index of the batch in buffer), None at the end; CRC left to the caller."""
        if self.position >= self._end:
            return None
        buffer, at = self._ensure(HEADER_SIZE)
        header = parse_header(buffer, at)
        if self.position + header.size > self._end:
            raise InvalidBatchError(f"batch of {header.size} bytes runs past the end of the segment")
        buffer, at = self._ensure(header.size)
        self.position += header.size
        return header, buffer, at

    def _ensure(self, size: int) -> tuple[bytes, int]:
        at = self.position - self._buffer_position
        if at + size > len(self._buffer):
            want = min(max(size, self._chunk), self._end - self.position)
            self._buffer = os.pread(self._fd, want, self.position)
            self._buffer_position = self.position
            at = 0
        return self._buffer, at


@dataclass
class ScanResult:
    """What a recovery scan found in a segment."""

    next_offset: int
    valid_bytes: int
    # (epoch, base offset) of each batch whose epoch differs from the batch before it. Epochs may fall
    # below the log start (an emptied log takes any epoch), so this is not always ascending.
    epoch_changes: list[tuple[int, int]] = field(default_factory=list)
    # Why the scan stopped before the end of the file (a damaged tail), None if the file was clean.
    damage: str | None = None


class Segment:
    def __init__(self, directory: Path, base_offset: int, fd: int, size: int, index: OffsetIndex) -> None:
        self.directory = directory
        self.base_offset = base_offset
        self.path = directory / segment_name(base_offset, LOG_SUFFIX)
        self.size = size
        self.index = index
        self._fd = fd
        self._bytes_since_index = size - index.last_position if len(index) else size
        self._dirty = False
        # False when the index file was missing or inconsistent: the caller must scan() to rebuild it.
        self.index_loaded = True

    @classmethod
    def create(cls, directory: Path, base_offset: int) -> Segment:
        path = directory / segment_name(base_offset, LOG_SUFFIX)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        index = OffsetIndex(directory / segment_name(base_offset, INDEX_SUFFIX), base_offset)
        index.replace([])
        return cls(directory, base_offset, fd, 0, index)

    @classmethod
    def open(cls, directory: Path, base_offset: int) -> Segment:
        """Open an existing segment; its index is loaded if consistent, else left empty for a rebuild."""
        path = directory / segment_name(base_offset, LOG_SUFFIX)
        fd = os.open(path, os.O_RDWR)
        size = os.fstat(fd).st_size
        index_path = directory / segment_name(base_offset, INDEX_SUFFIX)
        index = OffsetIndex.load(index_path, base_offset, size)
        segment = cls(directory, base_offset, fd, size, index or OffsetIndex(index_path, base_offset))
        segment.index_loaded = index is not None
        return segment

    def reader(self, position: int, chunk_bytes: int = SCAN_CHUNK_BYTES) -> BatchReader:
        return BatchReader(self._fd, position, self.size, chunk_bytes)

    def append(self, data: bytes, base_offset: int, index_interval_bytes: int) -> None:
        # Index the first batch after every `index_interval_bytes`: lookups scan at most that far.
        if self._bytes_since_index >= index_interval_bytes and self.size > 0:
            self.index.append(base_offset, self.size)
            self._bytes_since_index = 0
        try:
            _write_all(self._fd, data, self.size)
        except OSError:
            # A half-written batch past `size` would be cut on recovery anyway; cutting it now keeps the
            # file equal to what the log serves even if the process lives on (e.g. after ENOSPC).
            os.ftruncate(self._fd, self.size)
            raise
        self.size += len(data)
        self._bytes_since_index += len(data)
        self._dirty = True

    def find(self, offset: int) -> tuple[int, BatchHeader]:
        """Position and header of the batch holding `offset`, which the caller knows is in this segment."""
        for position, header in self._headers(self.index.lookup(offset), chunk_bytes=64 * 1024):
            if header.next_offset > offset:
                return position, header
        raise CorruptLogError(self.path, self.size, f"segment ends before offset {offset}")

    def truncate(self, position: int) -> None:
        self.index.truncate_from_position(position)
        os.ftruncate(self._fd, position)
        self.size = position
        self._bytes_since_index = position - self.index.last_position if len(self.index) else position
        self._dirty = True

    def replace_tail(self, position: int, data: bytes, *, fsync: bool) -> None:
        """Make the file `file[:position] + data` in one atomic rename, so a crash keeps old or new.

        Used to cut a batch in two: cutting first and appending after would, for a moment, lose the
        records below the cut that the log promised to keep.
        """
        swap = self.path.with_name(self.path.name + SWAP_SUFFIX)
        fd = os.open(swap, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            copied = 0
            while copied < position:
                chunk = os.pread(self._fd, min(SCAN_CHUNK_BYTES, position - copied), copied)
                if not chunk:
                    raise CorruptLogError(self.path, copied, "segment shorter than expected")
                _write_all(fd, chunk, copied)
                copied += len(chunk)
            _write_all(fd, data, position)
            if fsync:
                os.fsync(fd)
        except BaseException:
            os.close(fd)
            swap.unlink(missing_ok=True)
            raise
        os.replace(swap, self.path)
        if fsync:
            fsync_dir(self.directory)
        os.close(self._fd)
        self._fd = fd
        self.index.truncate_from_position(position + 1)
        self.size = position + len(data)
        self._bytes_since_index = self.size - self.index.last_position if len(self.index) else self.size
        self._dirty = not fsync

    def scan(self, index_interval_bytes: int) -> ScanResult:
        """Validate every batch (CRC, offsets) from the start; rebuild the index from what is valid.

        Stops at the first invalid batch. If a valid batch follows the damage, this is not a torn tail
        but corruption inside the log: raise CorruptLogError rather than silently drop good records.
        """
        reader = self.reader(0)
        result = ScanResult(next_offset=self.base_offset, valid_bytes=0)
        entries: list[tuple[int, int]] = []
        since_index = 0
        last_epoch = -1
        while True:
            position = reader.position
            try:
                item = reader.next()
                if item is None:
                    break
                header, buffer, at = item
                check_crc(header, buffer, at)
            except InvalidBatchError as exc:
                if self._valid_batch_follows(position):
                    raise CorruptLogError(self.path, position, f"{exc}, with valid batches after it") from exc
                result.damage = f"{exc} at byte {position}"
                break
            if header.base_offset != result.next_offset:
                raise CorruptLogError(
                    self.path,
                    position,
                    f"batch at offset {header.base_offset}, expected {result.next_offset}",
                )
            if since_index >= index_interval_bytes and position > 0:
                entries.append((header.base_offset, position))
                since_index = 0
            since_index += header.size
            if header.leader_epoch != last_epoch:
                result.epoch_changes.append((header.leader_epoch, header.base_offset))
                last_epoch = header.leader_epoch
            result.next_offset = header.next_offset
            result.valid_bytes = reader.position
        self.index.replace(entries)
        self._bytes_since_index = since_index
        self.index_loaded = True
        return result

    def _valid_batch_follows(self, position: int) -> bool:
        """Whether the damaged batch at `position` declares a length that ends where a valid batch starts."""
        try:
            header = parse_header(os.pread(self._fd, HEADER_SIZE, position))
            following = position + header.size
            reader = self.reader(following)
            item = reader.next()
            if item is None:
                return False
            check_crc(item[0], item[1], item[2])
        except InvalidBatchError:
            return False
        return True

    def scan_epochs(self) -> list[tuple[int, int]]:
        """(epoch, base offset) where the epoch changes, from headers alone: rebuilds a lost epoch file."""
        changes: list[tuple[int, int]] = []
        for _, header in self._headers(0):
            if not changes or header.leader_epoch != changes[-1][0]:
                changes.append((header.leader_epoch, header.base_offset))
        return changes

    def _headers(self, start: int, **reader_options: int) -> Iterator[tuple[int, BatchHeader]]:
        """(position, header) of each batch from `start` to the end; CorruptLogError at a bad one."""
        reader = self.reader(start, **reader_options)
        while True:
            position = reader.position
            try:
                item = reader.next()
            except InvalidBatchError as exc:
                raise CorruptLogError(self.path, position, str(exc)) from exc
            if item is None:
                return
            yield position, item[0]

    def sync_data(self) -> None:
        """fsync the records only: the index is derived and rebuilt when found stale."""
        if self._dirty:
            _fdatasync(self._fd)
            self._dirty = False

    def flush(self) -> None:
        """fsync the records and the index written since the last flush."""
        self.sync_data()
        self.index.flush()

    def close(self) -> None:
        os.close(self._fd)
        self.index.close()

    def delete(self) -> None:
        self.close()
        self.path.unlink(missing_ok=True)
        self.index.path.unlink(missing_ok=True)

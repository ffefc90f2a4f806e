"""Sparse offset index of one segment: (offset relative to the segment base, file position) pairs.

An entry is added for a batch once `index_interval_bytes` have been written since the previous entry, so
a lookup lands at most about that many bytes before the batch it wants. The index is derived data: it is
never fsynced per append, the last segment's index is rebuilt on every open, and any other index that
fails its consistency check on load is rebuilt from its segment. A stale index (missing its latest
entries) is still correct, only sparser.
"""

from __future__ import annotations

import bisect
import os
import sys
from array import array
from pathlib import Path

ENTRY_SIZE = 8  # u32 relative offset, u32 position, big-endian
MAX_RELATIVE_OFFSET = 0xFFFFFFFF


def _big_endian(values: array[int]) -> bytes:
    if sys.byteorder == "little":
        values = array("I", values)
        values.byteswap()
    return values.tobytes()


class OffsetIndex:
    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        # Two parallel arrays keep the index compact (8 bytes an entry) and bisectable.
        self._relative: array[int] = array("I")
        self._positions: array[int] = array("I")
        self._fd: int | None = None
        self._dirty = False

    def __len__(self) -> int:
        return len(self._positions)

    @classmethod
    def load(cls, path: Path, base_offset: int, segment_size: int) -> OffsetIndex | None:
        """Read an index file; None when it is missing or inconsistent with its segment."""
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            return None
        if len(data) % ENTRY_SIZE:
            return None
        pairs = array("I")
        pairs.frombytes(data)
        if sys.byteorder == "little":
            pairs.byteswap()
        index = cls(path, base_offset)
        index._relative = pairs[0::2]
        index._positions = pairs[1::2]
        if not index._consistent(segment_size):
            return None
        return index

    def _consistent(self, segment_size: int) -> bool:
        rel, pos = self._relative, self._positions
        if pos and pos[-1] >= segment_size:
            return False
        return all(rel[i] < rel[i + 1] and pos[i] < pos[i + 1] for i in range(len(pos) - 1))

    def append(self, offset: int, position: int) -> None:
        relative = offset - self.base_offset
        self._relative.append(relative)
        self._positions.append(position)
        entry = array("I", (relative, position))
        os.pwrite(self._open(), _big_endian(entry), (len(self._positions) - 1) * ENTRY_SIZE)
        self._dirty = True

    def lookup(self, offset: int) -> int:
        """File position of the last indexed batch starting at or before `offset` (0 if none)."""
        i = bisect.bisect_right(self._relative, offset - self.base_offset) - 1
        return self._positions[i] if i >= 0 else 0

    @property
    def last_position(self) -> int:
        return self._positions[-1] if self._positions else 0

    def truncate_from_position(self, position: int) -> None:
        """Drop the entries of batches at `position` or later (they are being cut off the segment)."""
        keep = bisect.bisect_left(self._positions, position)
        if keep == len(self._positions):
            return
        del self._relative[keep:]
        del self._positions[keep:]
        os.ftruncate(self._open(), keep * ENTRY_SIZE)
        self._dirty = True

    def replace(self, entries: list[tuple[int, int]]) -> None:
        """Rewrite the whole index from (offset, position) pairs, as a recovery scan found them."""
        self._relative = array("I", (offset - self.base_offset for offset, _ in entries))
        self._positions = array("I", (position for _, position in entries))
        pairs = array("I")
        for relative, position in zip(self._relative, self._positions, strict=True):
            pairs.append(relative)
            pairs.append(position)
        fd = self._open()
        os.ftruncate(fd, 0)
        os.pwrite(fd, _big_endian(pairs), 0)
        self._dirty = True

    def flush(self) -> None:
        """fsync what was written since the last flush, then let go of the file until the next write."""
        if self._fd is not None:
            if self._dirty:
                os.fsync(self._fd)
                self._dirty = False
            self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _open(self) -> int:
        if self._fd is None:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        return self._fd

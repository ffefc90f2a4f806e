"""The committed changes of this server's partition logs as push-query feeds replay them: decoded once, in
blocks of BLOCK_OFFSETS offsets, and shared by every feed (here or on another server) reading them.

A feed resuming from a token replays the changes after its positions from the log (server/feeds.py). When a
server dies, its subscribers resume on the others at once, from about the same positions: read and decoded
per feed, the same stretch of log was decoded once per subscriber (a range feed kept a few of its changes,
a remote read sent them all), hundreds of times over. Offsets of committed records mean the same on every
replica, and a committed record never changes, so a decoded block stays true for as long as its table
lives: the cache is bounded by the changes it holds, the least recently used block first out. A block is
read only below the store's position (what the replica applied, so committed), and grows when a later read
reaches past its end. The Change objects are shared, as a live batch's are by the feeds it is offered to
(each change's encodings and filter verdicts are computed once for all).

Reads are synchronous and bounded: one block (BLOCK_OFFSETS records, about 1 ms to read and decode) per
step of a replay, at most SERVE_MAX_BYTES of changes for another server's read.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hotstate.log.errors import LogError
from hotstate.protocol.rows import decode_records
from hotstate.query.feed import Change

if TYPE_CHECKING:
    from hotstate.server.replicas import LocalReplica

BLOCK_OFFSETS = 1024
# About 30 MB of changes of ~150 bytes: the stretch every subscriber of a dead server resumes over.
CACHE_CHANGES = 200_000
READ_BYTES = 1024 * 1024  # the log read per call while a block is filled
SERVE_MAX_BYTES = 1024 * 1024  # of changes in one answer to another server's feed

__all__ = ["BLOCK_OFFSETS", "CACHE_CHANGES", "SERVE_MAX_BYTES", "ChangeLog"]


@dataclass(slots=True)
class _Block:
    first: int  # the offset of changes[0]
    changes: list[Change]

    @property
    def end(self) -> int:
        return self.first + len(self.changes)


class ChangeLog:
    """Decoded blocks of committed changes, by (table id, partition, offset // BLOCK_OFFSETS)."""

    def __init__(self, max_changes: int = CACHE_CHANGES) -> None:
        self.max_changes = max_changes
        self._blocks: OrderedDict[tuple[int, int, int], _Block] = OrderedDict()
        self._held = 0
        self.reads = 0  # blocks read (or grown) from a log: what the sharing saves is reads per replay

    def __len__(self) -> int:
        return self._held

    def changes(self, replica: LocalReplica, start: int, end: int) -> Iterator[Change]:
        """The committed changes of `replica`'s partition in [start, end) (`end` at most the store's
        position), each block read as the iterator reaches it. Raises OffsetOutOfRangeError (when
        advanced) once the log no longer holds the next one, LogError when the log is closed."""
        offset = start
        while offset < end:
            chunk = self.chunk(replica, offset, end)
            yield from chunk
            offset += len(chunk)

    def chunk(self, replica: LocalReplica, offset: int, end: int) -> list[Change]:
        """The changes from `offset` on, below `end`, to the end of `offset`'s block at most (at least one
        when offset < end). Raises OffsetOutOfRangeError, LogError."""
        if offset >= end:
            return []
        key = (replica.table.table_id, replica.partition, offset // BLOCK_OFFSETS)
        limit = min((key[2] + 1) * BLOCK_OFFSETS, end)
        block = self._blocks.get(key)
        if block is None or offset < block.first:
            if block is not None:
                self._drop(key)
            # From the block's start: the feeds resuming in it share one read whatever their positions.
            first = max(key[2] * BLOCK_OFFSETS, replica.log.start_offset)
            block = self._blocks[key] = _Block(first if first <= offset else offset, [])
        else:
            self._blocks.move_to_end(key)
        if offset >= block.end:  # fill or grow it: a read ending below its block reaches further now
            grown = _read(replica, block.end, limit)
            self.reads += 1
            if block.end + len(grown) <= offset:
                raise LogError(
                    f"the log of {replica.table.name}/{replica.partition} ends at {block.end + len(grown)}, "
                    f"below the store's position {end}"
                )
            block.changes.extend(grown)
            self._held += len(grown)
            self._evict()
        return block.changes[offset - block.first : limit - block.first]

    def _drop(self, key: tuple[int, int, int]) -> None:
        block = self._blocks.pop(key)
        self._held -= len(block.changes)

    def _evict(self) -> None:
        while self._held > self.max_changes and len(self._blocks) > 1:
            self._drop(next(iter(self._blocks)))


def _read(replica: LocalReplica, start: int, limit: int) -> list[Change]:
    """The committed records of `replica`'s log in [start, limit) as changes. Raises OffsetOutOfRangeError
    (the log no longer holds `start`), LogError (closed)."""
    partition = replica.partition
    out: list[Change] = []
    offset = start
    while offset < limit:
        batches = replica.log.read(offset, READ_BYTES)
        before = offset
        for batch in batches:
            if batch.base_offset >= limit:
                return out
            epoch = batch.leader_epoch
            for index, (key, row) in enumerate(decode_records(batch.records)):
                at = batch.base_offset + index
                if at >= limit:
                    return out
                if at >= offset:
                    out.append(Change(partition, at, epoch, key, row))
                    offset = at + 1
        if offset == before:  # nothing more in the log
            return out
    return out

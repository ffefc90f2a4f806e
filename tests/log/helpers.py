"""Shared helpers for the log tests."""

from __future__ import annotations

from pathlib import Path

from hotstate.log import Log, RecordBatch

BIG = 1 << 30


def records(tag: int, count: int = 3) -> list[bytes]:
    return [f"r{tag}-{i}".encode() for i in range(count)]


def flat(log: Log, from_offset: int | None = None) -> list[tuple[int, int, bytes]]:
    """Every (offset, epoch, record) from `from_offset` (default start_offset) to the end."""
    start = log.start_offset if from_offset is None else from_offset
    out: list[tuple[int, int, bytes]] = []
    for batch in log.read(start, BIG):
        out.extend((batch.base_offset + i, batch.leader_epoch, r) for i, r in enumerate(batch.records))
    return out


def flat_batches(batches: list[RecordBatch]) -> list[tuple[int, int, bytes]]:
    return [(b.base_offset + i, b.leader_epoch, r) for b in batches for i, r in enumerate(b.records)]


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def fill(log: Log, count: int, *, epoch_every: int = 0, per_batch: int = 3) -> list[RecordBatch]:
    """Append `count` batches; the epoch rises every `epoch_every` batches (never if 0)."""
    out = []
    for i in range(count):
        epoch = i // epoch_every if epoch_every else 0
        out.append(log.append(epoch, records(i, per_batch)))
    return out

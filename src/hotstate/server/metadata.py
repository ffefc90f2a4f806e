"""Every server's metadata image: committed metadata entries replayed in order, and snapshots of it.

Other code reads `MetadataPublisher.image` (immutable) and never the log. The publisher also decides
when to snapshot (by records applied and by time).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

from hotstate.controller.codec import decode_batch
from hotstate.controller.image import ImageBuilder, MetadataImage
from hotstate.controller.snapshot import decode_snapshot, encode_snapshot
from hotstate.raft.records import Entry, EntryKind, Snapshot

log = logging.getLogger(__name__)


class MetadataPublisher:
    def __init__(
        self,
        *,
        snapshot: Snapshot | None,
        snapshot_max_records: int,
        snapshot_interval_ms: int,
        clock: Callable[[], int],
    ) -> None:
        self.image = MetadataImage.empty() if snapshot is None else decode_snapshot(snapshot.data)
        self._snapshot_max_records = snapshot_max_records
        self._snapshot_interval_ms = snapshot_interval_ms
        self._clock = clock
        self._records_since_snapshot = 0
        self._last_snapshot_at = clock()
        self._listeners: list[Callable[[MetadataImage, Sequence[Entry]], None]] = []

    def add_listener(self, listener: Callable[[MetadataImage, Sequence[Entry]], None]) -> None:
        """Called after every change of the image, with the entries that made it."""
        self._listeners.append(listener)

    def on_committed(self, entries: Sequence[Entry], snapshot: Snapshot | None) -> None:
        if snapshot is not None:
            self.image = decode_snapshot(snapshot.data)
            self._records_since_snapshot = 0
            log.info("metadata image loaded from a snapshot at offset %d", self.image.offset)
        builder = ImageBuilder(self.image)
        for entry in entries:
            if entry.kind is EntryKind.DATA:
                batch = decode_batch(entry.data)
                builder.apply_all(batch.records, entry.offset)
                self._records_since_snapshot += len(batch.records)
        if entries:
            self.image = builder.build(entries[-1].offset + 1)
        for listener in self._listeners:
            listener(self.image, entries)

    def snapshot_due(self) -> bool:
        if self._records_since_snapshot == 0:
            return False
        return (
            self._records_since_snapshot >= self._snapshot_max_records
            or self._clock() - self._last_snapshot_at >= self._snapshot_interval_ms
        )

    def snapshot_bytes(self) -> tuple[int, bytes]:
        """(end offset, data) of a snapshot of the current image; resets the snapshot counters."""
        self._records_since_snapshot = 0
        self._last_snapshot_at = self._clock()
        return self.image.offset, encode_snapshot(self.image)

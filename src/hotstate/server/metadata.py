"""Every server's metadata image: committed metadata entries replayed in order, and snapshots of it.

Other code reads `MetadataPublisher.image` (immutable) and never the log. The publisher also decides
when to snapshot (by records applied and by time), says whether the image has caught up since the
process started (`not_ready`), and parks metadata watches until a table changes (`wait_for_change`).

**Caught up.** A restarted server replays its local metadata log only up to the high watermark a leader
tells it, so for a while its image may lack tables, partitions and moves that were committed long ago.
Its image has caught up once it holds this process's own registration (the `RegisterServer` record with
this incarnation id): that record was committed after the process started, so every record committed
before the start sits below it in the log and is in the image too. Until then the server answers
"not ready" (HTTP 503, RPC `NOT_READY`) rather than "no such table" from a stale image. Once caught up it
stays so for the life of the process (a later fall behind is judged like any stale replica, by lag).
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Callable, Sequence

from hotstate.controller.codec import decode_batch, iter_batch_records
from hotstate.controller.image import ImageBuilder, MetadataImage, PartitionInfo, iter_block_partitions
from hotstate.controller.records import PartitionBlock
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
        incarnation: tuple[int, str] | None = None,
    ) -> None:
        """`incarnation`: this process's (node id, incarnation id); the image is caught up once it holds
        that registration. None: caught up from the start (no registration to wait for)."""
        self.image = MetadataImage.empty() if snapshot is None else decode_snapshot(snapshot.data)
        self._incarnation = incarnation
        self.caught_up = incarnation is None
        self._snapshot_max_records = snapshot_max_records
        self._snapshot_interval_ms = snapshot_interval_ms
        self._clock = clock
        self._records_since_snapshot = 0
        self._last_snapshot_at = clock()
        self._listeners: list[Callable[[MetadataImage, Sequence[Entry]], None]] = []
        # Per table name, the image offset from which its latest change is visible. Changes before this
        # process loaded its image count as made at the load offset: a watch may be answered early, never
        # late.
        self._loaded_at = self.image.offset
        self._table_changed_at: dict[str, int] = dict.fromkeys(self.image.tables, self._loaded_at)
        self._watches: dict[str, list[tuple[int, asyncio.Future[None]]]] = {}
        self._prepared: (
            tuple[MetadataImage, Sequence[Entry], Snapshot | None, tuple[MetadataImage, int]] | None
        ) = None
        self._check_caught_up()

    def add_listener(self, listener: Callable[[MetadataImage, Sequence[Entry]], None]) -> None:
        """Called after every change of the image, with the entries that made it."""
        self._listeners.append(listener)

    async def prepare(self, entries: Sequence[Entry], snapshot: Snapshot | None) -> None:
        """Decode and apply big commits (a snapshot, a 100,000-partition table) on a worker thread, ahead
        of `on_committed`, which then only swaps the image in: the event loop is not held for seconds.
        Safe because the driver calls prepare then on_committed for one commit at a time, and the image is
        immutable."""
        size = sum(len(e.data) for e in entries) + (len(snapshot.data) if snapshot is not None else 0)
        if size < PREPARE_OFF_LOOP_BYTES:
            return
        base = self.image
        if snapshot is not None:
            built = await asyncio.to_thread(_apply, base, entries, snapshot)
        else:
            built = await _apply_in_steps(base, entries)
        self._prepared = (base, entries, snapshot, built)

    def on_committed(self, entries: Sequence[Entry], snapshot: Snapshot | None) -> None:
        prepared, self._prepared = self._prepared, None
        if (
            prepared is not None
            and prepared[0] is self.image
            and prepared[1] is entries
            and prepared[2] is snapshot
        ):
            image, records = prepared[3]
        else:
            image, records = _apply(self.image, entries, snapshot)
        if snapshot is not None:
            self._records_since_snapshot = 0
            log.info("metadata image loaded from a snapshot at offset %d", image.offset)
        self._records_since_snapshot += records
        before = self.image
        self.image = image
        self._note_changes(before, self.image, whole=snapshot is not None)
        self._check_caught_up()
        if prepared is not None:
            # A big commit (a 100,000-partition table, a snapshot) leaves hundreds of thousands of new
            # long-lived objects: each full collection would walk them all again, on the loop (measured:
            # 60 ms with one such table, 120 ms with three, growing with every one). Frozen, they are left
            # out of collections; an image dropped later is still freed by reference counting (images hold
            # no cycles). The price: garbage cycles that exist right now are kept for good, once per big
            # commit.
            gc.freeze()
        for listener in self._listeners:
            listener(self.image, entries)
        self._answer_watches()

    # ------------------------------------------------------------------ readiness
    def _check_caught_up(self) -> None:
        if self.caught_up or self._incarnation is None:
            return
        node_id, incarnation_id = self._incarnation
        server = self.image.servers.get(node_id)
        if server is not None and server.incarnation_id == incarnation_id:
            self.caught_up = True
            log.info(
                "metadata image caught up at offset %d (holds this server's registration)", self.image.offset
            )

    def not_ready(self) -> str | None:
        """None once the image has caught up (module docstring); else why this server cannot answer yet."""
        if self.caught_up:
            return None
        node_id = self._incarnation[0] if self._incarnation is not None else "?"
        return (
            f"server {node_id} is starting: metadata not caught up (its image is at offset "
            f"{self.image.offset} and does not hold this server's registration yet); ask another server "
            "or retry shortly"
        )

    # ------------------------------------------------------------------ metadata watches
    def table_changed_at(self, table: str) -> int:
        """The image offset from which the table's latest change (creation, partitions, deletion) shows."""
        # A name not seen since the image was loaded: whatever happened to it happened before the load.
        return self._table_changed_at.get(table, self._loaded_at)

    async def wait_for_change(self, table: str, known_offset: int, timeout_s: float) -> bool:
        """Wait until the image holds a change of `table` that an image at `known_offset` did not have,
        or `timeout_s` passed. True if it changed."""
        if self.table_changed_at(table) > known_offset:
            return True
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (known_offset, future)
        waiting = self._watches.setdefault(table, [])
        waiting.append(entry)
        try:
            done, _ = await asyncio.wait({future}, timeout=max(0.0, timeout_s))
        finally:
            if entry in waiting:
                waiting.remove(entry)
            if not waiting and self._watches.get(table) is waiting:
                del self._watches[table]
        return bool(done)

    @property
    def watches(self) -> int:
        """How many metadata watches are parked (for tests and metrics)."""
        return sum(len(w) for w in self._watches.values())

    def _note_changes(self, before: MetadataImage, after: MetadataImage, *, whole: bool) -> None:
        offset = after.offset
        if whole:
            # Loaded from a snapshot: what changed is unknown, so every table counts as changed now.
            self._loaded_at = offset
            self._table_changed_at = dict.fromkeys(after.tables, offset)
            return
        # Parts the builder did not touch keep their identity: most commits (heartbeats, fencing with no
        # partition on the server) cost two comparisons here.
        if after.tables is before.tables and after.partitions is before.partitions:
            return
        for name, info in after.tables.items():
            old = before.tables.get(name)
            if (
                old is None
                or old is not info
                or (after.partitions.get(info.table_id) is not before.partitions.get(info.table_id))
            ):
                self._table_changed_at[name] = offset
        for name in before.tables:
            if name not in after.tables:
                self._table_changed_at[name] = offset

    def _answer_watches(self) -> None:
        for table, waiting in self._watches.items():
            changed_at = self.table_changed_at(table)
            for known_offset, future in waiting:
                if changed_at > known_offset and not future.done():
                    future.set_result(None)

    def snapshot_due(self) -> bool:
        if self._records_since_snapshot == 0:
            return False
        return (
            self._records_since_snapshot >= self._snapshot_max_records
            or self._clock() - self._last_snapshot_at >= self._snapshot_interval_ms
        )

    def snapshot_bytes(self) -> tuple[int, bytes]:
        """(end offset, data) of a snapshot of the current image; resets the snapshot counters."""
        image = self.snapshot_started()
        return image.offset, encode_snapshot(image)

    def snapshot_started(self) -> MetadataImage:
        """The image to snapshot (immutable: encode it anywhere, `encode_snapshot`); resets the counters."""
        self._records_since_snapshot = 0
        self._last_snapshot_at = self._clock()
        return self.image


# A commit this big is decoded and applied on a worker thread (`MetadataPublisher.prepare`): about 10 ms of
# work on the loop at this size.
PREPARE_OFF_LOOP_BYTES = 64 * 1024


async def _apply_in_steps(image: MetadataImage, entries: Sequence[Entry]) -> tuple[MetadataImage, int]:
    """`_apply` of entries on the loop, building a PartitionBlock's partitions a few thousand at a time
    with a yield between steps: a thread building them would hold the GIL, and the loop wait for it."""
    builder = ImageBuilder(image)
    records = 0
    for entry in entries:
        if entry.kind is not EntryKind.DATA:
            continue
        # A record at a time, yielding between: a new table's PartitionBlocks are about 10 ms each.
        for record in iter_batch_records(entry.data):
            await asyncio.sleep(0)
            records += 1
            built: list[PartitionInfo] | None = None
            if isinstance(record, PartitionBlock):
                try:
                    items = iter_block_partitions(record)
                except ValueError:
                    items = None  # the builder logs and skips it
                if items is not None:
                    built = []
                    for part in items:
                        built.append(part)
                        if len(built) % BUILD_STEP_PARTITIONS == 0:
                            await asyncio.sleep(0)
            builder.apply(record, entry.offset, built)
    if entries:
        image = builder.build(entries[-1].offset + 1)
    return image, records


# Partitions of a PartitionBlock built per step on the loop (`_apply_in_steps`): a few ms each.
BUILD_STEP_PARTITIONS = 1_000


def _apply(
    image: MetadataImage, entries: Sequence[Entry], snapshot: Snapshot | None
) -> tuple[MetadataImage, int]:
    """The image after `snapshot` (if any) and `entries`, and how many records the entries held."""
    if snapshot is not None:
        image = decode_snapshot(snapshot.data)
    builder = ImageBuilder(image)
    records = 0
    for entry in entries:
        if entry.kind is EntryKind.DATA:
            batch = decode_batch(entry.data)
            builder.apply_all(batch.records, entry.offset)
            records += len(batch.records)
    if entries:
        image = builder.build(entries[-1].offset + 1)
    return image, records

"""The asyncio shell around the partition replicas of one server: disk, network and the metadata image.

Replicas follow the image: created when this server is named a replica, told their role and ISR on every
change, closed and deleted when the partition (or table) goes away. Each replica's core is driven the same
way: input (metadata, Produce, Fetch, tick) -> `ready()` -> log ops on the partition's `hotstate.log`,
messages out, Produce answers, ISR change to the controller, committed batches into the RocksDB store
(with the position in the same write), store snapshot transfer when asked -> `advance()`.

Bad disks (docs/replication.md, "Bad disks"): a replica whose files are damaged (a corrupt log batch with
valid data after it, a store file missing or failing its checksums, a store that lost records its log no
longer holds) is never served; once this server's image holds its own registration (which took it out of
every ISR with another member) it is discarded and opened empty, to restore from the active exactly as a
new replica does. A write that fails on the disk (no space, read-only, an IO error) takes the replica
offline and reports the failure (`on_disk_failure`): the server then shuts down, as Kafka does when its
only log directory fails.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
import shutil
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from hotstate.controller.image import MetadataImage, PartitionInfo, TableInfo
from hotstate.controller.requests import (
    AlterPartitionRequest,
    AlterPartitionResponse,
    ControllerError,
    ControllerRequest,
    ControllerResponse,
)
from hotstate.log.batch import HEADER_SIZE, RecordBatch
from hotstate.log.errors import CorruptLogError
from hotstate.log.log import FsyncPolicy, Log
from hotstate.protocol.replica_state import ReplicaState
from hotstate.protocol.rows import decode_records, encode_records
from hotstate.replica.batchlog import BatchLog
from hotstate.replica.core import (
    AdvanceStart,
    AppendBatches,
    IsrChange,
    LogOp,
    PartitionView,
    ProduceResult,
    ReplicaConfig,
    ReplicaCore,
    ReplicaRole,
    ResetLog,
    SnapshotNeeded,
    TruncateTo,
)
from hotstate.replica.ingest import records_for_rows
from hotstate.replica.messages import (
    FetchRequest,
    FetchResponse,
    FetchStoreSnapshotRequest,
    FetchStoreSnapshotResponse,
    LagInfo,
    ProducePartitionsRequest,
    ProducePartitionsResponse,
    ProduceRequest,
    ProduceResponse,
    ReadPartitionRequest,
    ReadPartitionResponse,
    ReplicaError,
    ReplicaMessage,
)
from hotstate.replica.retention import (
    ExpiryRule,
    RetentionSweep,
    expiry_rule,
    expiry_times,
    pack_written,
    unpack_written,
    window_end_us,
)
from hotstate.replica.shell import Effects, ReplicaShell
from hotstate.replica.store import Store, StoreCorruptError, StoreError, StoreSnapshot
from hotstate.replica.throttle import TokenBucket
from hotstate.routing.freshness import EndWitness, lag_report
from hotstate.routing.freshness import replica_state as state_of
from hotstate.routing.lags import LagTable
from hotstate.server.raft_driver import monotonic_ms

# Rows of one Produce checked (decoded, keyed, hashed, made records) in one turn of the event loop: ~3.7 us a
# row of CPU (a bulk load's rows, 2 cores), so about 1 ms a turn before other work is served. Measured in a
# 2M-row bulk load on 2 cores (bench/bulk_load.py), with the store applied in steps of the same size:
# forwarded lookups' p99 at the server 68 ms with 256, 114-119 ms with 1,024 (the loop's turns longer).
INGEST_STEP_ROWS = 256

log = logging.getLogger(__name__)

TICK_S = 0.01
# Expiry (windowed tables' retention, plain tables' TTL): each active sweeps one page of its keys this
# often, so expiry runs in small steps beside the queries (a page's scan and its tombstones' write), never
# a stall; a partition whose last page found expired rows, at the busy tick instead.
RETENTION_TICK_S = 0.5
RETENTION_BUSY_TICK_S = 0.02
RETENTION_PAGE = 1000
SNAPSHOT_CHUNK_BYTES = 1024 * 1024
# A partition log gives space back a whole segment at a time once its start (replica.log.retention.records
# below the store) has passed it: smaller segments than the log's 64 MiB default keep what a table that
# deletes what it writes holds on disk close to the retention (bench/compaction.py).
PARTITION_LOG_SEGMENT_BYTES = 16 * 1024 * 1024
SNAPSHOT_IDLE_S = 60.0
SNAPSHOT_REQUEST_TIMEOUT_S = 10.0
# With the move throttle on, the bucket's burst and the most one catch-up answer may carry: a tenth of a
# second at the rate, so the rate is kept over short spells too, but never so little that a fetch answer
# is mostly framing.
MIN_THROTTLED_FETCH_BYTES = 16 * 1024

PartitionId = tuple[int, int]  # (table id, partition)


class DamagedReplicaError(Exception):
    """A replica's files cannot be trusted: the message names the file and what is wrong with it."""


class _FilesFailed(Exception):
    """A write to a replica's log or store failed (`error`): the disk's fault or the files' damage."""

    def __init__(self, error: Exception) -> None:
        super().__init__(str(error))
        self.error = error


class FeedsPort(Protocol):
    """What the push-query hub (server/feeds.py) hears from the replicas."""

    def on_applied(
        self,
        pid: PartitionId,
        first_offset: int,
        epoch: int,
        records: Sequence[tuple[bytes, bytes | None]],
        next_offset: int,
    ) -> None: ...

    def replica_gone(self, pid: PartitionId, why: str) -> None: ...

    def on_image(self, image: MetadataImage) -> None: ...


@dataclass
class LocalReplica:
    table: TableInfo
    partition: int
    directory: Path
    log: Log
    store: Store
    core: ReplicaCore
    info: PartitionInfo
    witness: EndWitness  # what the core heard of the partition's end since it opened: its lag is known
    waiters: dict[int, asyncio.Future[ProduceResult]] = field(default_factory=dict)
    installing: bool = False
    # A catch-up fetch held back by the move throttle (the newest the core asked for), sent when it may go.
    throttled_fetch: FetchRequest | None = None
    feeds: FeedsPort | None = None  # the server's push-query hub (server/feeds.py)
    # A windowed table with a retention: the newest window end this replica applied since it opened (its
    # sweep, once active, measures the retention from it and from what its pages show).
    newest_end_us: int | None = None
    shell: ReplicaShell = field(init=False, repr=False)  # set by ReplicaManager._open

    @property
    def pid(self) -> PartitionId:
        return (self.table.table_id, self.partition)


class _ReplicaLog:
    """The shell's log port: the partition's segmented log (hotstate.log), written synchronously."""

    def __init__(self, replica: LocalReplica) -> None:
        self._replica = replica

    def write(self, ops: Sequence[LogOp]) -> bool:
        replica = self._replica
        plog = replica.log
        try:
            for op in ops:
                match op:
                    case AppendBatches(batches):
                        for batch in batches:
                            plog.append_batch(batch)
                    case TruncateTo(offset):
                        log.info(
                            "replica %s/%d: log diverged from the active's; truncated to %d (dropped %d "
                            "records that were never committed)",
                            replica.table.name,
                            replica.partition,
                            offset,
                            plog.end_offset - offset,
                        )
                        plog.truncate_to(offset)
                    case AdvanceStart(offset):
                        plog.advance_start_offset(min(offset, plog.end_offset))
                    case ResetLog(offset, _):
                        plog.reset(offset)
        except (OSError, StoreError, CorruptLogError) as error:
            raise _FilesFailed(error) from error
        # With fsync "always" the log syncs each write itself; "never" leaves it to the page cache, and
        # acknowledged writes are protected by replication to the ISR.
        return True


class _ReplicaStore:
    """The shell's store port: the replica's RocksDB store (the replica's current one: a snapshot install
    swaps it), the position written with the records."""

    def __init__(self, replica: LocalReplica) -> None:
        self._replica = replica

    @property
    def position(self) -> int:
        return self._replica.store.position

    def apply(self, batch: RecordBatch) -> None:
        replica = self._replica
        store = replica.store
        first = max(store.position, batch.base_offset)
        decoded = decode_records(batch.records[first - batch.base_offset :])
        table = replica.table
        # A TTL-by-write-time table's write-time index: when this replica applied the batch (within the
        # commit wait of the write on the active, which decides expiry).
        written = None
        if table.ttl is not None and table.ttl.column is None and table.window is None:
            written = pack_written(time.time_ns() // 1000)
        elif table.window is not None and table.window.retention_us is not None:
            newest = max((window_end_us(key) or 0 for key, row in decoded if row is not None), default=0)
            if newest and (replica.newest_end_us is None or newest > replica.newest_end_us):
                replica.newest_end_us = newest
        try:
            store.apply(decoded, batch.next_offset, batch.leader_epoch, written)
        except (OSError, StoreError) as error:
            raise _FilesFailed(error) from error
        # The partition's one tail: every push-query subscription here is fed from this call.
        feeds = replica.feeds
        if feeds is not None:
            feeds.on_applied(replica.pid, first, batch.leader_epoch, decoded, batch.next_offset)


@dataclass
class _ServedSnapshot:
    snapshot: StoreSnapshot
    leader_epoch: int
    used_at: float


class ReplicaManager:
    def __init__(
        self,
        node_id: int,
        data_dir: Path,
        config: ReplicaConfig,
        *,
        fsync: FsyncPolicy,
        produce_max_bytes: int,
        send: Callable[[int, ReplicaMessage], object],
        request: Callable[[int, object, float], Awaitable[object]],
        to_controller: Callable[[ControllerRequest], Awaitable[ControllerResponse]],
        ready: Callable[[], bool] = lambda: True,
        on_disk_failure: Callable[[str], None] = lambda reason: None,
        move_throttle_bytes_per_s: int = 0,
    ) -> None:
        """`move_throttle_bytes_per_s`: the most this server's replicas outside the ISR (warmups, new and
        restoring copies) fetch per second, log and store snapshots together; 0: no limit. In-sync
        replicas are never held back."""
        self.node_id = node_id
        self._move_bucket: TokenBucket | None = None
        if move_throttle_bytes_per_s > 0:
            burst = max(move_throttle_bytes_per_s // 10, MIN_THROTTLED_FETCH_BYTES)
            self._move_bucket = TokenBucket(move_throttle_bytes_per_s, burst, monotonic_ms())
        self.root = data_dir / "partitions"
        self.config = config
        self.fsync: FsyncPolicy = fsync
        self.produce_max_bytes = produce_max_bytes
        self._send = send
        self._request = request
        self._to_controller = to_controller
        # Whether this server's image holds its own registration (server.metadata's not_ready is None).
        self._ready = ready
        self._on_disk_failure = on_disk_failure
        self.replicas: dict[PartitionId, LocalReplica] = {}
        self.feeds: FeedsPort | None = None  # set by the server when it serves push queries
        # Replicas found damaged and not rebuilt yet: never served; the value says why (logged once).
        self.damaged: dict[PartitionId, str] = {}
        self._kept_damaged: set[PartitionId] = set()  # refused a rebuild (the last in-sync replica), logged
        # Set once a write failed on the disk: no replica is opened or written any more.
        self.disk_failure: str | None = None
        # The lag reports this server holds (server.liveness fills it): a replica's lag is known once one of
        # them, from another server, arrived after the replica opened.
        self.lags = LagTable()
        self.image = MetadataImage.empty()
        self._served: dict[int, _ServedSnapshot] = {}
        self._snapshot_ids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()
        self._ticker: asyncio.Task[None] | None = None
        self._sweeps: dict[PartitionId, RetentionSweep] = {}
        self.expired_rows = 0  # rows this server's actives deleted by expiry (retention and TTL)
        # Write work takes turns of the event loop, so that lookups and heartbeats are served between them
        # whatever the write load (measured: a bulk load's Produces and applies, each done in one go, held
        # the loop 0.5-0.9 s at a time on 2 loaded cores). Produces are checked and appended one at a time,
        # in the order they arrived (a partition's must be appended in its writer's order), INGEST_STEP_ROWS
        # rows a turn; the replicas' deferred applies run one replica's step a turn, in turn.
        self._ingest = asyncio.Lock()
        self._deferred: dict[PartitionId, LocalReplica] = {}
        self._deferred_scheduled = False
        self._closed = False

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self._ticker = asyncio.create_task(self._tick_loop(), name="replica-ticks")
        self._spawn(self._retention_loop(), "expiry")

    async def stop(self) -> None:
        self._closed = True
        if self._ticker is not None:
            self._ticker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._ticker
        for task in list(self._tasks):
            task.cancel()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        for served in self._served.values():
            served.snapshot.close()
        self._served.clear()
        for replica in list(self.replicas.values()):
            self._close(replica)
        self.replicas.clear()

    def _close(self, replica: LocalReplica) -> None:
        for waiter in replica.waiters.values():
            if not waiter.done():
                waiter.set_result(ProduceResult(0, ReplicaError.NOT_LEADER, -1, -1))
        replica.waiters.clear()
        with contextlib.suppress(Exception):
            replica.log.close()
        with contextlib.suppress(Exception):
            replica.store.close()

    # ------------------------------------------------------------------ metadata
    def on_image(self, image: MetadataImage) -> None:
        """Create, update and remove local replicas to match the image."""
        if self._closed or self.disk_failure is not None:
            return
        self.image = image
        if self.feeds is not None:  # a dropped table's feeds end as such before its replicas go
            self.feeds.on_image(image)
        now = monotonic_ms()
        wanted: set[PartitionId] = set()
        for table in image.tables.values():
            for part in image.partitions.get(table.table_id, ()):
                if self.node_id not in part.replicas:
                    continue
                pid = (table.table_id, part.partition)
                wanted.add(pid)
                replica = self.replicas.get(pid)
                if replica is None:
                    try:
                        replica = self._open_or_rebuild(table, part, now)
                    except (OSError, StoreError) as error:
                        self._disk_failed(f"cannot open replica {table.name}/{part.partition}: {error}")
                        return
                    except ValueError as error:
                        log.error("cannot open replica %s/%d: %s", table.name, part.partition, error)
                        continue
                    if replica is None:
                        continue
                    self.replicas[pid] = replica
                replica.info = part
                replica.table = table  # renamed when an overwrite swaps its staged generation in
                replica.core.set_metadata(_view(part), now)
                self._pump(replica)
        for pid in [pid for pid in self.replicas if pid not in wanted]:
            replica = self.replicas.pop(pid)
            log.info("replica %s/%d removed from this server: deleting its data", replica.table.name, pid[1])
            self._close(replica)
            if self.feeds is not None:
                self.feeds.replica_gone(pid, "was removed from this server")
            shutil.rmtree(replica.directory, ignore_errors=True)
        for pid in [pid for pid in self.damaged if pid not in wanted]:
            log.info("damaged replica %d/%d removed from this server: deleting its data", *pid)
            del self.damaged[pid]
            self._kept_damaged.discard(pid)
            shutil.rmtree(self._directory(pid), ignore_errors=True)

    def _directory(self, pid: PartitionId) -> Path:
        return self.root / f"{pid[0]}-{pid[1]}"

    def _open_or_rebuild(self, table: TableInfo, part: PartitionInfo, now: int) -> LocalReplica | None:
        """The replica, opened from its files; if they are damaged, rebuilt empty when that is safe (None
        until then: a damaged replica is never served)."""
        pid = (table.table_id, part.partition)
        name = f"{table.name}/{part.partition}"
        if pid not in self.damaged:
            try:
                return self._open(table, part, now)
            except DamagedReplicaError as damage:
                log.error("replica %s is damaged, not serving it: %s", name, damage)
                self.damaged[pid] = str(damage)
        # Registering fenced this server's previous incarnation, which took it out of every ISR that has
        # another member; only then does the image tell whether another replica holds every committed record.
        if not self._ready():
            return None
        others = [r for r in part.isr if r != self.node_id]
        if not others:
            if pid not in self._kept_damaged:
                self._kept_damaged.add(pid)
                log.error(
                    "replica %s: not rebuilding the damaged copy: this server is the partition's only "
                    "in-sync replica, so no other copy holds every acknowledged write; the partition stays "
                    "without it, and the files stay in %s for an operator",
                    name,
                    self._directory(pid),
                )
            return None
        log.warning(
            "replica %s: discarding the damaged copy and restoring it from the active like a new replica "
            "(in-sync replicas %s)",
            name,
            others,
        )
        directory = self._directory(pid)
        Store.destroy(directory / "store")
        shutil.rmtree(directory)
        del self.damaged[pid]
        self._kept_damaged.discard(pid)
        return self._open(table, part, now)

    def _open(self, table: TableInfo, part: PartitionInfo, now: int) -> LocalReplica:
        directory = self._directory((table.table_id, part.partition))
        directory.mkdir(parents=True, exist_ok=True)
        store, plog, batches = open_replica_files(directory, self.fsync, f"{table.name}/{part.partition}")
        start_epoch = 0
        if plog.start_offset > 0:
            start_epoch = store.epoch if store.position == plog.start_offset else _epoch_before(plog)
        core = ReplicaCore(
            self.node_id,
            table.table_id,
            part.partition,
            self.config,
            log=BatchLog(plog.start_offset, start_epoch, batches),
            store_position=store.position,
            store_epoch=store.epoch,
            now=now,
        )
        log.info(
            "replica %s/%d opened: store at %d, log [%d, %d)",
            table.name,
            part.partition,
            store.position,
            plog.start_offset,
            plog.end_offset,
        )
        replica = LocalReplica(table, part.partition, directory, plog, store, core, part, EndWitness(now))
        replica.feeds = self.feeds
        replica.shell = self._shell(replica)
        return replica

    # ------------------------------------------------------------------ the pump
    def _pump(self, replica: LocalReplica) -> None:
        if self.replicas.get(replica.pid) is not replica:
            return  # taken offline (a disk fault) while an input was on its way
        try:
            self._pump_ready(replica)
        except _FilesFailed as failed:
            error = failed.error
            if isinstance(error, CorruptLogError | StoreCorruptError):
                self._damaged_while_running(replica, error)
            else:
                self._take_offline(replica)
                self._disk_failed(f"writing replica {replica.table.name}/{replica.partition} failed: {error}")

    def _defer_pump(self, replica: LocalReplica) -> None:
        """Pump `replica` again in a later turn of the loop (its store apply goes on a step at a time): the
        replicas waiting take one turn each, oldest first."""
        self._deferred.setdefault(replica.pid, replica)
        if not self._deferred_scheduled:
            self._deferred_scheduled = True
            asyncio.get_running_loop().call_soon(self._pump_deferred)

    def _pump_deferred(self) -> None:
        self._deferred_scheduled = False
        if not self._deferred:
            return
        pid = next(iter(self._deferred))
        replica = self._deferred.pop(pid)
        if self._deferred:
            self._deferred_scheduled = True
            asyncio.get_running_loop().call_soon(self._pump_deferred)
        self._pump(replica)

    def _pump_ready(self, replica: LocalReplica) -> None:
        # The pump itself (and its deferred apply: writers and peers are answered before the store is
        # written) is replica/shell.py's, which the replication simulator runs too.
        replica.shell.pump()

    def _shell(self, replica: LocalReplica) -> ReplicaShell:
        def answer(result: ProduceResult) -> None:
            waiter = replica.waiters.pop(result.token, None)
            if waiter is not None and not waiter.done():
                waiter.set_result(result)

        def snapshot_needed(needed: SnapshotNeeded) -> None:
            if not replica.installing:
                replica.installing = True
                self._spawn(self._fetch_snapshot(replica, needed), f"snapshot-{replica.pid}")

        effects = Effects(
            send=lambda message: self._send_from(replica, message),
            answer=answer,
            isr_change=lambda change: self._spawn(self._alter_isr(replica, change), f"isr-{replica.pid}"),
            snapshot_needed=snapshot_needed,
            defer=lambda: self._defer_pump(replica),
        )
        return ReplicaShell(replica.core, _ReplicaLog(replica), _ReplicaStore(replica), effects)

    # ------------------------------------------------------------------ the move throttle
    def _catching_up(self, replica: LocalReplica) -> bool:
        return self._move_bucket is not None and self.node_id not in replica.core.isr

    def _send_from(self, replica: LocalReplica, message: ReplicaMessage) -> None:
        bucket = self._move_bucket
        if bucket is None or not isinstance(message, FetchRequest) or not self._catching_up(replica):
            self._send(message.dst, message)
            return
        message = dataclasses.replace(message, max_bytes=min(message.max_bytes, bucket.burst))
        wait = bucket.wait_ms(monotonic_ms())
        if wait == 0 and replica.throttled_fetch is None:
            self._send(message.dst, message)
            return
        # Only the newest fetch matters: one the core asked again for (its answer late) replaces it.
        held = replica.throttled_fetch
        replica.throttled_fetch = message
        if held is None:
            asyncio.get_running_loop().call_later(wait / 1000, self._release_fetch, replica)

    def _release_fetch(self, replica: LocalReplica) -> None:
        message = replica.throttled_fetch
        if message is None or self._move_bucket is None or self.replicas.get(replica.pid) is not replica:
            replica.throttled_fetch = None
            return
        wait = self._move_bucket.wait_ms(monotonic_ms())
        if wait > 0:  # others charged the bucket meanwhile
            asyncio.get_running_loop().call_later(wait / 1000, self._release_fetch, replica)
            return
        replica.throttled_fetch = None
        self._send(message.dst, message)

    def _charge(self, nbytes: int) -> None:
        if self._move_bucket is not None and nbytes:
            self._move_bucket.charge(nbytes, monotonic_ms())

    async def _move_allowance(self) -> None:
        """Wait until the move throttle lets the next catch-up request go."""
        while self._move_bucket is not None and (wait := self._move_bucket.wait_ms(monotonic_ms())) > 0:
            await asyncio.sleep(wait / 1000)

    def _take_offline(self, replica: LocalReplica) -> None:
        """Stop serving and writing `replica`; its files are left as a crash would leave them."""
        if self.replicas.get(replica.pid) is replica:
            del self.replicas[replica.pid]
        if self.feeds is not None:
            self.feeds.replica_gone(replica.pid, "went offline")
        for waiter in replica.waiters.values():
            if not waiter.done():
                waiter.set_result(ProduceResult(0, ReplicaError.NOT_LEADER, -1, -1))
        replica.waiters.clear()
        # No clean-shutdown mark: the next open validates every segment.
        replica.log.abandon()
        with contextlib.suppress(Exception):
            replica.store.close()

    def _damaged_while_running(self, replica: LocalReplica, damage: Exception) -> None:
        log.error(
            "replica %s/%d is damaged, not serving it: %s", replica.table.name, replica.partition, damage
        )
        self._take_offline(replica)
        self.damaged[replica.pid] = str(damage)
        if self._closed:
            return
        rebuilt = self._open_or_rebuild(replica.table, replica.info, monotonic_ms())
        if rebuilt is not None:
            self.replicas[rebuilt.pid] = rebuilt
            rebuilt.core.set_metadata(_view(replica.info), monotonic_ms())
            self._pump(rebuilt)

    def read_failed(self, replica: LocalReplica, error: StoreError) -> None:
        """A read found `replica`'s store failing. Handled on the loop's next turn, not inside the read:
        taking a replica offline and rebuilding it is the manager's work, never a query's."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # no loop (a synchronous caller): nothing else can be reading meanwhile
            self.store_failed(replica, error)
            return
        loop.call_soon(self.store_failed, replica, error)

    def store_failed(self, replica: LocalReplica, error: StoreError) -> None:
        """A read of `replica`'s store failed: damaged (rebuilt, as found at open) or the disk's fault."""
        if self.replicas.get(replica.pid) is not replica:
            return
        if isinstance(error, StoreCorruptError):
            self._damaged_while_running(replica, error)
        else:
            self._take_offline(replica)
            self._disk_failed(f"reading replica {replica.table.name}/{replica.partition} failed: {error}")

    def _disk_failed(self, reason: str) -> None:
        if self.disk_failure is not None:
            return
        self.disk_failure = reason
        log.critical(
            "disk failure under %s: %s; this server stops taking writes and shuts down (start it again once "
            "the disk is fixed; its replicas recover and catch up from the other servers)",
            self.root,
            reason,
        )
        self._on_disk_failure(reason)

    def _spawn(self, coro: Awaitable[None], name: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(TICK_S)
            now = monotonic_ms()
            for replica in list(self.replicas.values()):
                deadline = replica.core.next_deadline()
                if deadline is not None and deadline <= now:
                    replica.core.tick(now)
                    self._pump(replica)
            idle = time.monotonic() - SNAPSHOT_IDLE_S
            for snapshot_id in [i for i, s in self._served.items() if s.used_at < idle]:
                self._served.pop(snapshot_id).snapshot.close()

    # ------------------------------------------------------------------ expiry: window retention and TTL
    async def _retention_loop(self) -> None:
        due: dict[PartitionId, float] = {}  # when each partition's next page is
        while True:
            await asyncio.sleep(RETENTION_BUSY_TICK_S)
            now = time.monotonic()
            for pid, replica in list(self.replicas.items()):
                table = replica.table
                rule = expiry_rule(table.key_columns, table.window, table.ttl)
                if rule is None or replica.core.role is not ReplicaRole.LEADER:
                    self._sweeps.pop(pid, None)  # a new active sweeps from the start
                    due.pop(pid, None)
                    continue
                if due.get(pid, 0.0) > now:
                    continue
                deleted = 0
                try:
                    deleted = await self._expire_page(replica, rule)
                except Exception as error:  # the next tick tries again
                    log.warning("%s/%d: expiry step failed: %s", replica.table.name, replica.partition, error)
                # While its pages keep finding expired rows a partition's next step comes soon (a backlog
                # drains at many pages a second); each step is still one page, so queries run between them.
                due[pid] = time.monotonic() + (RETENTION_BUSY_TICK_S if deleted else RETENTION_TICK_S)
                await asyncio.sleep(0)  # one page, then the queries: pages of several partitions not in a row
            for pid in [pid for pid in due if pid not in self.replicas]:
                del due[pid]

    async def _expire_page(self, replica: LocalReplica, rule: ExpiryRule) -> int:
        """One step of a partition's expiry: a page of its keys (and rows or write times, as the rule
        needs) read, and the expired ones deleted with tombstones through the log. How many it deleted."""
        sweep = self._sweeps.get(replica.pid)
        if sweep is None or sweep.rule != rule:
            sweep = self._sweeps[replica.pid] = RetentionSweep(rule)
        if rule.from_newest:
            sweep.saw(replica.newest_end_us)
        now_us = time.time_ns() // 1000
        position = replica.store.position  # before the scan: whatever is applied during it is after this
        try:
            page = replica.store.scan_page(sweep.start(), RETENTION_PAGE)
            keys = [key for key, _ in page]
            written: list[int | None] = []
            if rule.source == "written":
                written = [unpack_written(entry) for entry in replica.store.written_many(keys)]
                missing = [key for key, at in zip(keys, written, strict=True) if at is None]
                if missing:  # rows that came by a snapshot, or from before the index: written now
                    replica.store.stamp_written(missing, pack_written(now_us))
                    written = [now_us if at is None else at for at in written]
        except StoreError as error:
            self.read_failed(replica, error)
            return 0
        rows = [row for _, row in page] if rule.reads_rows else None
        expired = sweep.page(keys, expiry_times(rule, keys, rows, written), RETENTION_PAGE, now_us)
        if expired:
            # Keys written (or deleted) after what the page read, in the log but not in the store yet, are
            # left for the next pass: their tombstone must not overtake a rewrite. With no await between
            # here and the tombstones' append, every write is either among these or after the tombstones.
            pending = {
                key
                for batch in replica.core.records_from(position)
                for key, _ in decode_records(batch.records[max(0, position - batch.base_offset) :])
            }
            expired = [key for key in expired if key not in pending]
        if not expired:
            return 0
        part = self.image.partitions.get(replica.table.table_id, ())[replica.partition]
        tombstones = encode_records(expired, [None] * len(expired))  # keys read from this replica's store
        started = self._start_produce(
            replica.table.name, replica.partition, part.leader_epoch, (), 30_000, records=tombstones
        )
        answer = (
            started if isinstance(started, ProduceResponse) else _produce_response(*(await _waited(started)))
        )
        if answer.error is not ReplicaError.NONE:
            log.info(
                "%s/%d: expired rows not deleted yet: %s",
                replica.table.name,
                replica.partition,
                answer.message,
            )
            sweep.cursor = None  # start over: the page's rows are found again
            return 0
        self.expired_rows += len(expired)
        log.debug("%s/%d: %d expired rows deleted", replica.table.name, replica.partition, len(expired))
        return len(expired)

    # ------------------------------------------------------------------ inputs from peers
    def deliver(self, message: ReplicaMessage) -> None:
        replica = self.replicas.get((message.table_id, message.partition))
        if replica is None:
            if isinstance(message, FetchRequest):
                self._send(
                    message.src,
                    FetchResponse(
                        self.node_id,
                        message.src,
                        message.table_id,
                        message.partition,
                        -1,
                        message.fetch_id,
                        ReplicaError.UNKNOWN_PARTITION,
                        0,
                        0,
                        0,
                    ),
                )
            return
        if isinstance(message, FetchResponse) and message.batches and self._catching_up(replica):
            self._charge(sum(_batch_bytes(batch) for batch in message.batches))
        replica.core.step(message, monotonic_ms())
        replica.witness.observe(message, replica.core)
        self._pump(replica)

    async def produce(self, request: ProduceRequest) -> ProduceResponse:
        async with self._ingest:
            started = await self._start_produce_stepped(
                request.table, request.partition, request.leader_epoch, request.rows, request.timeout_ms
            )
        if isinstance(started, ProduceResponse):
            return started
        waiter, replica = started
        return _produce_response(await waiter, replica)

    async def produce_partitions(self, request: ProducePartitionsRequest) -> ProducePartitionsResponse:
        """Every part as `produce` would answer it: all parts checked and appended (a part a turn of the
        loop, or more for a long one) before the first wait for a commit."""
        started = []
        async with self._ingest:
            for index, p in enumerate(request.parts):
                if index:
                    await asyncio.sleep(0)
                started.append(
                    await self._start_produce_stepped(
                        request.table, p.partition, p.leader_epoch, p.rows, request.timeout_ms
                    )
                )
        answers = []
        for part in started:
            if isinstance(part, ProduceResponse):
                answers.append(part)
            else:
                # Awaited in turn, not gathered: the answer leaves as soon as the last part commits, with no
                # extra event-loop turns (a deferred store write waits for it, see _pump_ready).
                waiter, replica = part
                answers.append(_produce_response(await waiter, replica))
        return ProducePartitionsResponse(tuple(answers))

    async def _start_produce_stepped(
        self, table_name: str, partition: int, leader_epoch: int, rows: tuple[bytes, ...], timeout_ms: int
    ) -> ProduceResponse | tuple[asyncio.Future[ProduceResult], LocalReplica]:
        """`_start_produce`, with the rows checked INGEST_STEP_ROWS a turn of the loop (the caller holds
        `_ingest`, so no other Produce is appended in between)."""
        if len(rows) <= INGEST_STEP_ROWS:
            return self._start_produce(table_name, partition, leader_epoch, rows, timeout_ms)
        refused = self._refusal(table_name, partition, leader_epoch, rows)
        if refused is not None:
            return refused
        table = self.image.tables[table_name]
        records: list[bytes] = []
        for first in range(0, len(rows), INGEST_STEP_ROWS):
            if first:
                await asyncio.sleep(0)
            step, problem = records_for_rows(
                rows[first : first + INGEST_STEP_ROWS],
                table.key_columns,
                table.partitions,
                partition,
                table.name,
                first_index=first,
            )
            if problem is not None:
                return ProduceResponse(ReplicaError.INVALID_ROW, problem)
            records.extend(step)
        now = self.image.tables.get(table_name)
        if now is None or (now.table_id, now.partitions, now.key_columns) != (
            table.table_id,
            table.partitions,
            table.key_columns,
        ):  # deleted, or made again, between the turns: the records are of the table that was
            return self._start_produce(table_name, partition, leader_epoch, rows, timeout_ms)
        # Checked again as it appends: the partition's active and epoch may have changed between the turns.
        return self._start_produce(table_name, partition, leader_epoch, rows, timeout_ms, records=records)

    def _refusal(
        self, table_name: str, partition: int, leader_epoch: int, rows: tuple[bytes, ...]
    ) -> ProduceResponse | None:
        """Why this server does not take a Produce of `rows` for the partition now, if it does not."""
        table = self.image.tables.get(table_name)
        if table is None:
            return ProduceResponse(ReplicaError.UNKNOWN_TABLE, f"no table {table_name!r}")
        if not 0 <= partition < table.partitions:
            return ProduceResponse(
                ReplicaError.INVALID_REQUEST,
                f"table {table.name!r} has partitions 0..{table.partitions - 1}, not {partition}",
            )
        size = sum(len(row) for row in rows)
        if size > self.produce_max_bytes:
            return ProduceResponse(
                ReplicaError.TOO_LARGE,
                f"{size} bytes of rows, above produce.max.bytes={self.produce_max_bytes}: "
                "send smaller batches",
            )
        replica = self.replicas.get((table.table_id, partition))
        part = self.image.partitions.get(table.table_id, ())[partition]
        if replica is None or replica.core.role is not ReplicaRole.LEADER:
            error = ReplicaError.NOT_LEADER
            if leader_epoch < part.leader_epoch:
                error = ReplicaError.FENCED_EPOCH
            why = "" if self.disk_failure is None else f" (its disk failed: {self.disk_failure})"
            return ProduceResponse(
                error,
                f"server {self.node_id} is not the active of {table.name}/{partition}{why}",
                active=part.active,
                leader_epoch=part.leader_epoch,
            )
        return None

    def _start_produce(
        self,
        table_name: str,
        partition: int,
        leader_epoch: int,
        rows: tuple[bytes, ...],
        timeout_ms: int,
        *,
        records: list[bytes] | None = None,
    ) -> ProduceResponse | tuple[asyncio.Future[ProduceResult], LocalReplica]:
        """Check and append one partition's rows: the answer at once (an error, or a result the core gave
        at once), or the commit (acks=all) to wait for, and the replica that answers. `records`: log
        records this server made from its own replica's keys (expiry's tombstones), appended as they are:
        checking each key again (decode, coerce, encode) cost ~25 us a key, on the event loop."""
        refused = self._refusal(table_name, partition, leader_epoch, rows)
        if refused is not None:
            return refused
        table = self.image.tables[table_name]
        replica = self.replicas[(table.table_id, partition)]
        if records is None:
            if not rows:
                return ProduceResponse(ReplicaError.INVALID_REQUEST, "no rows")
            records, problem = records_for_rows(
                rows, table.key_columns, table.partitions, partition, table.name
            )
            if problem is not None:
                return ProduceResponse(ReplicaError.INVALID_ROW, problem)
        timeout_ms = max(1, min(timeout_ms, 300_000))
        result = replica.core.produce(records, leader_epoch, monotonic_ms(), timeout_ms)
        if isinstance(result, ProduceResult):
            return _produce_response(result, replica)
        waiter: asyncio.Future[ProduceResult] = asyncio.get_running_loop().create_future()
        replica.waiters[result] = waiter
        self._pump(replica)
        return waiter, replica

    async def serve_snapshot(self, request: FetchStoreSnapshotRequest) -> FetchStoreSnapshotResponse:
        replica = self.replicas.get((request.table_id, request.partition))
        if replica is None or replica.core.role is not ReplicaRole.LEADER:
            return _snapshot_error(ReplicaError.NOT_LEADER, "not the active")
        if request.leader_epoch != replica.core.leader_epoch:
            return _snapshot_error(ReplicaError.FENCED_EPOCH, f"leader epoch is {replica.core.leader_epoch}")
        snapshot_id = request.snapshot_id
        served = self._served.get(snapshot_id)
        if snapshot_id == 0 or served is None:
            snapshot_id = next(self._snapshot_ids)
            served = _ServedSnapshot(replica.store.snapshot(), request.leader_epoch, time.monotonic())
            self._served[snapshot_id] = served
            log.info(
                "serving a store snapshot of %s/%d at %d to server %d",
                replica.table.name,
                replica.partition,
                served.snapshot.position,
                request.replica_id,
            )
        served.used_at = time.monotonic()
        max_bytes = max(1024, min(request.max_bytes, SNAPSHOT_CHUNK_BYTES))
        items, last = served.snapshot.chunk(request.after_key, max_bytes)
        done = last is None or not items
        if done:
            self._served.pop(snapshot_id, None)
            position, epoch = served.snapshot.position, served.snapshot.epoch
            served.snapshot.close()
        else:
            position, epoch = served.snapshot.position, served.snapshot.epoch
        return FetchStoreSnapshotResponse(
            ReplicaError.NONE, "", snapshot_id, position, epoch, tuple(items), None if done else last
        )

    # ------------------------------------------------------------------ effects
    async def _alter_isr(self, replica: LocalReplica, change: IsrChange) -> None:
        request = AlterPartitionRequest(
            self.node_id,
            replica.table.table_id,
            replica.partition,
            change.leader_epoch,
            change.partition_epoch,
            change.isr,
        )
        try:
            reply = await self._to_controller(request)
        except Exception as error:  # the core asks again after its retry interval
            log.debug("ISR change for %s not sent: %s", replica.pid, error)
            return
        if isinstance(reply, AlterPartitionResponse) and reply.error is ControllerError.INVALID_REQUEST:
            log.info("ISR change %s for %s refused: %s", change.isr, replica.pid, reply.message)
            if self.replicas.get(replica.pid) is replica:
                replica.core.isr_change_rejected(change, monotonic_ms())
                self._pump(replica)

    async def _fetch_snapshot(self, replica: LocalReplica, needed: SnapshotNeeded) -> None:
        name = f"{replica.table.name}/{replica.partition}"
        install = None
        try:
            install = Store.begin_install(replica.store.path)
            snapshot_id, after = 0, None
            chunk_bytes = SNAPSHOT_CHUNK_BYTES
            if self._move_bucket is not None:  # a replica rebuilding from a snapshot is never in sync
                chunk_bytes = min(chunk_bytes, self._move_bucket.burst)
            while True:
                await self._move_allowance()
                reply = await self._request(
                    needed.leader,
                    FetchStoreSnapshotRequest(
                        self.node_id,
                        replica.table.table_id,
                        replica.partition,
                        needed.leader_epoch,
                        snapshot_id,
                        after,
                        chunk_bytes,
                    ),
                    SNAPSHOT_REQUEST_TIMEOUT_S,
                )
                if not isinstance(reply, FetchStoreSnapshotResponse) or reply.error is not ReplicaError.NONE:
                    raise RuntimeError(getattr(reply, "message", "bad answer"))
                if snapshot_id and reply.snapshot_id != snapshot_id:
                    raise RuntimeError("the active restarted the snapshot")
                snapshot_id = reply.snapshot_id
                self._charge(sum(len(key) + len(value) for key, value in reply.items))
                install.add(list(reply.items))
                if reply.next_after is None:
                    break
                after = reply.next_after
            if self.replicas.get(replica.pid) is not replica or self._closed:
                install.abort()
                return
            install.commit(reply.position, reply.epoch)
            replica.store.close()
            replica.store = Store.swap_installed(replica.store.path)
            install = None
            if self.feeds is not None:  # the store jumped over changes its subscribers did not get
                self.feeds.replica_gone(replica.pid, "was rebuilt from a snapshot")
            log.info("replica %s rebuilt from the active's snapshot at %d", name, reply.position)
            replica.installing = False
            replica.core.snapshot_installed(reply.position, reply.epoch, monotonic_ms())
        except asyncio.CancelledError:
            if install is not None:
                install.abort()
            raise
        except Exception as error:
            if install is not None:
                with contextlib.suppress(Exception):
                    install.abort()
            replica.installing = False
            if isinstance(error, StoreError) and not isinstance(error, StoreCorruptError):
                self._take_offline(replica)
                self._disk_failed(f"installing a snapshot of {name} failed: {error}")
                return
            log.warning("snapshot transfer for %s failed: %s", name, error)
            replica.core.snapshot_failed(monotonic_ms())
        self._pump(replica)

    # ------------------------------------------------------------------ queries
    def read_partition(self, request: ReadPartitionRequest) -> ReadPartitionResponse:
        table = self.image.tables.get(request.table)
        if table is None:
            return ReadPartitionResponse(ReplicaError.UNKNOWN_TABLE, f"no table {request.table!r}")
        replica = self.replicas.get((table.table_id, request.partition))
        if replica is None:
            return ReadPartitionResponse(
                ReplicaError.UNKNOWN_PARTITION, f"no replica of {table.name}/{request.partition} here"
            )
        start = None if request.after_key is None else request.after_key + b"\x00"
        limit = max(1, min(request.limit, 100_000))
        try:
            items = tuple(replica.store.scan(start, None, limit=limit))
        except StoreError as error:
            self.read_failed(replica, error)
            return ReadPartitionResponse(ReplicaError.UNKNOWN_PARTITION, f"replica failed: {error}")
        return ReadPartitionResponse(ReplicaError.NONE, "", replica.store.position, items)

    def lag_info(self) -> list[LagInfo]:
        return [
            lag_report(
                r.core,
                r.witness,
                self.lags,
                self.node_id,
                table=r.table.name,
                state=replica_state(r),
                in_sync=self.node_id in r.info.isr,
            )
            for r in sorted(self.replicas.values(), key=lambda r: r.pid)
        ]

    def replica_ends(self) -> tuple[tuple[int, int, int], ...]:
        return tuple((pid[0], pid[1], r.core.log_end_offset) for pid, r in sorted(self.replicas.items()))


def open_replica_files(
    directory: Path, fsync: FsyncPolicy, name: str
) -> tuple[Store, Log, list[RecordBatch]]:
    """Open a replica's store and log and check them against each other; DamagedReplicaError if they
    cannot be trusted. OSError and StoreError (not StoreCorruptError) are the disk's, and pass through."""
    try:
        store = Store.open(directory / "store")
    except StoreCorruptError as error:
        raise DamagedReplicaError(str(error)) from error
    try:
        store.verify()
        plog = Log.open(directory / "log", fsync=fsync, segment_bytes=PARTITION_LOG_SEGMENT_BYTES)
    except (StoreCorruptError, CorruptLogError) as error:
        store.close()
        raise DamagedReplicaError(str(error)) from error
    except BaseException:
        store.close()
        raise
    try:
        if store.position < plog.start_offset:
            # The store went back (a lost WAL or a store rebuilt empty by RocksDB) past records the log no
            # longer holds: nothing here can bring it forward again.
            raise DamagedReplicaError(
                f"store {store.path} is at {store.position}, below the log start {plog.start_offset} "
                f"of {plog.directory}: the records between are lost"
            )
        if store.position > plog.end_offset:
            # A damaged tail was cut below what the store had applied (all committed): the log starts
            # again at the store's position, as after installing a snapshot, and refetches the rest.
            log.warning(
                "replica %s: log %s ends at %d, below the store's position %d (a damaged tail was cut): "
                "restarting the log at %d",
                name,
                plog.directory,
                plog.end_offset,
                store.position,
                store.position,
            )
            plog.reset(store.position)
        batches = plog.read(plog.start_offset, 1 << 62) if plog.end_offset > plog.start_offset else []
    except CorruptLogError as error:
        plog.abandon()
        store.close()
        raise DamagedReplicaError(str(error)) from error
    except BaseException:
        plog.abandon()
        store.close()
        raise
    return store, plog, batches


def _batch_bytes(batch: RecordBatch) -> int:
    return HEADER_SIZE + sum(len(record) for record in batch.records)


async def _waited(
    started: tuple[asyncio.Future[ProduceResult], LocalReplica],
) -> tuple[ProduceResult, LocalReplica]:
    waiter, replica = started
    return await waiter, replica


def replica_state(replica: LocalReplica) -> ReplicaState:
    return state_of(replica.core, replica.info.warmups)


def _view(part: PartitionInfo) -> PartitionView:
    return PartitionView(part.active, part.leader_epoch, part.isr, part.replicas, part.partition_epoch)


def _epoch_before(plog: Log) -> int:
    entries = plog.epoch_entries()
    before = [epoch for epoch, start in entries if start < plog.start_offset]
    return before[-1] if before else (entries[0][0] if entries else 0)


def _produce_response(result: ProduceResult, replica: LocalReplica) -> ProduceResponse:
    messages = {
        ReplicaError.NONE: "",
        ReplicaError.NOT_LEADER: "no longer the active",
        ReplicaError.FENCED_EPOCH: "the request's leader epoch is older than the partition's",
        ReplicaError.UNKNOWN_EPOCH: "the request's leader epoch is newer than this server knows yet",
        ReplicaError.NOT_ENOUGH_REPLICAS: "fewer in-sync replicas than min.insync.replicas; nothing written",
        ReplicaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND: "written, but the ISR shrank below min.insync",
        ReplicaError.TIMEOUT: "written, not committed in time: outcome unknown (an upsert retry is safe)",
    }
    return ProduceResponse(
        result.error,
        messages.get(result.error, result.error.name),
        result.base_offset,
        result.end_offset,
        replica.info.active,
        replica.info.leader_epoch,
    )


def _snapshot_error(error: ReplicaError, message: str) -> FetchStoreSnapshotResponse:
    return FetchStoreSnapshotResponse(error, message, 0, 0, 0, (), None)

"""Benchmark of the control plane at scale -> bench/results/control_plane.json.

1. `loop_stall`: in one process, the real `ControllerHost` over a real single-voter `RaftDriver` (metadata log
   on disk) and `MetadataPublisher`, 100 brokers registered through it; a table of P partitions is created
   while a task measures how late the event loop wakes up (sleeps of 1 ms): the longest stall, beside the
   time the same placement takes when run on the loop (the stall a synchronous create would cause). After
   the 100,000-partition table, one broker stops heartbeating: the longest stall until it is fenced and,
   broker.removal.delay.ms (2 s here) later, its copies are placed elsewhere.
2. `snapshot`: encode and load of a metadata snapshot of P partitions (1,000 per table, 3 servers) in this
   process: version 2 (a columnar PartitionBlock per table) beside version 1 (a PartitionAssignment record
   per partition, what snapshots held before), same image.
3. `rpc`: one real server process (controller only) and B simulated brokers, each a lightweight RPC client
   (`rpc.Connection`, the cluster secret handshake) sending the controller requests a broker sends:
   registrations per second (all at once), heartbeats per second held for a while (every 250 ms each, none
   fenced), then tables of P partitions in all, and one broker stopped: time until it is fenced with no
   active left, and until its copies are placed elsewhere (it holds no replica; broker.removal.delay.ms 2 s).

4. `failover`: three controller-only server processes (a 3-voter quorum) and B simulated brokers (as in 3,
   talking to a server that is not the leader), tables of P partitions in all; then kill -9 of the active
   controller: time until a surviving voter is leader with a higher commit (its first record, the leader
   change, committed), and until a delete-table request sent from then on is answered (the client trying
   the survivors in turn; a delete needs no broker, which the new controller has not heard from yet).

`--quick`: 10,000 partitions (and 100,000 for the in-process parts). Without it: 10k, 100k and 1M.
`--only PART[,PART]` runs only those parts (loop_stall, snapshot, rpc, failover) and merges them into the
existing results file.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import platform
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import msgpack

from hotstate.cli.local_cluster import LocalCluster
from hotstate.client.admin import AdminClient
from hotstate.controller.codec import RECORDS
from hotstate.controller.controller import ControllerConfig
from hotstate.controller.image import (
    ImageBuilder,
    MetadataImage,
    PartitionInfo,
    image_records,
    partition_block,
)
from hotstate.controller.records import (
    CreateTable,
    Endpoint,
    KeyColumn,
    KeyType,
    PartitionAssignment,
    PartitionBlock,
    RegisterServer,
    UnfenceServer,
)
from hotstate.controller.requests import (
    ControllerError,
    ControllerResponse,
    CreateTableRequest,
    RegisterServerRequest,
    RegisterServerResponse,
    ServerHeartbeatRequest,
    ServerHeartbeatResponse,
)
from hotstate.controller.snapshot import decode_snapshot, encode_snapshot
from hotstate.protocol.wire import MESSAGES, ForwardedControllerRequest
from hotstate.raft.config import RaftConfig
from hotstate.raft.node import RaftRole
from hotstate.raft.storage import RaftStorage
from hotstate.rpc import Connection
from hotstate.server.controller_host import ControllerHost
from hotstate.server.metadata import MetadataPublisher
from hotstate.server.raft_driver import RaftDriver, monotonic_ms

RESULTS = Path(__file__).parent / "results" / "control_plane.json"
KEY = (KeyColumn("k", KeyType.STRING),)
RACKS = ("az-a", "az-b", "az-c")
NOTE = "2 cores, shared with other work"
# The in-process controller: a broker fails after the table of this many partitions is created.
FAILURE_AT = 100_000
REMOVAL_DELAY_MS = 2000


# ------------------------------------------------------------------------------------------ loop stall
class StallMonitor:
    """The longest time the event loop took to come back from a 1 ms sleep, minus the sleep."""

    def __init__(self) -> None:
        self.worst_s = 0.0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self.worst_s = 0.0
        self._task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        while True:
            start = time.perf_counter()
            await asyncio.sleep(0.001)
            self.worst_s = max(self.worst_s, time.perf_counter() - start - 0.001)

    async def stop(self) -> float:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        return self.worst_s


async def _in_process_controller(directory: Path) -> tuple[RaftDriver, MetadataPublisher, ControllerHost]:
    holder: dict[str, Any] = {}

    async def prepare(entries: Any, snapshot: Any) -> None:
        await holder["metadata"].prepare(entries, snapshot)

    driver = RaftDriver(
        1,
        [1],
        RaftConfig(),
        RaftStorage(directory),
        send=lambda message: None,
        on_committed=lambda entries, snapshot: holder["metadata"].on_committed(entries, snapshot),
        prepare_commit=prepare,
        on_role_change=lambda node: holder["host"].on_role_change(node) if "host" in holder else None,
    )
    metadata = MetadataPublisher(
        snapshot=None, snapshot_max_records=1 << 40, snapshot_interval_ms=1 << 40, clock=monotonic_ms
    )
    holder["metadata"] = metadata

    async def no_forward(leader: int, request: Any) -> ControllerResponse:
        raise AssertionError("single voter: never forwards")

    host = ControllerHost(
        driver,
        metadata,
        # The stall grace the servers use (server/app.py): the on-loop placement measured below stalls the
        # loop for about 2 s on purpose; without the grace every broker's session expired in it, at times,
        # and the next tick fenced all 99 (a fence scan each: the 4.4-6.3 s "broker failure" stalls that
        # some runs recorded, and re-placements of minutes).
        ControllerConfig(
            reassign_interval_ms=0,
            broker_removal_delay_ms=REMOVAL_DELAY_MS,
            stall_grace_ms=ControllerConfig().session_timeout_ms // 4,
        ),
        forward=no_forward,
        clock=monotonic_ms,
    )
    holder["host"] = host
    driver.start()
    host.start()
    async with asyncio.timeout(10):
        while not (driver.node.role is RaftRole.LEADER and host.active):
            await asyncio.sleep(0.01)
    return driver, metadata, host


async def loop_stall(partitions: list[int], brokers: int = 100) -> list[dict[str, object]]:
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        driver, metadata, host = await _in_process_controller(Path(tmp) / "metadata")
        try:
            for n in range(2, brokers + 2):
                reply = await host.handle(
                    RegisterServerRequest(
                        n, f"i{n}", Endpoint("127.0.0.1", 1), None, RACKS[n % 3], (), ("broker",)
                    )
                )
                assert isinstance(reply, RegisterServerResponse) and reply.error is ControllerError.NONE
                beat = await host.handle(ServerHeartbeatRequest(n, f"i{n}", reply.registered_at + 1, False))
                assert isinstance(beat, ServerHeartbeatResponse)
            silent: set[int] = set()
            beating = asyncio.create_task(_heartbeats(host, brokers, silent))
            monitor = StallMonitor()
            for i, count in enumerate(partitions):
                # The machine's own noise: the same monitor over an idle second (heartbeats only).
                monitor.start()
                await asyncio.sleep(1.0)
                idle_s = await monitor.stop()
                request = CreateTableRequest(f"t{i}", count, 1, KEY, None, writer_rack="az-a")
                monitor.start()
                start = time.perf_counter()
                reply = await host.handle(request)
                create_s = time.perf_counter() - start
                stall_s = await monitor.stop()
                assert reply.error is ControllerError.NONE, reply
                assert len(metadata.image.partitions_of(f"t{i}")) == count
                # The same placement on the loop: what a synchronous create stalls it for.
                controller = host._controller
                assert controller is not None
                job = controller.placement_job(CreateTableRequest(f"again{i}", count, 1, KEY, None))
                assert job is not None
                start = time.perf_counter()
                job.run()
                on_loop_s = time.perf_counter() - start
                row: dict[str, object] = {
                    "partitions": count,
                    "brokers": brokers,
                    "create_s": round(create_s, 3),
                    "longest_loop_stall_ms": round(stall_s * 1000, 1),
                    "longest_idle_stall_ms": round(idle_s * 1000, 1),
                    "placement_on_the_loop_s": round(on_loop_s, 3),
                }
                if count == FAILURE_AT:
                    row["broker_fails"] = await _broker_fails(host, metadata, silent, monitor, 2 + i)
                out.append(row)
                print(row, flush=True)
            beating.cancel()
        finally:
            await host.stop()
            await driver.stop()
    return out


async def _heartbeats(host: ControllerHost, brokers: int, silent: set[int]) -> None:
    """Every broker's heartbeat every 250 ms (the default interval), as the real ones would send; the
    brokers in `silent` have failed."""
    while True:
        offset = host._driver.next_proposal_offset()
        for n in range(2, brokers + 2):
            if n not in silent:
                await host.handle(ServerHeartbeatRequest(n, f"i{n}", offset, False))
        await asyncio.sleep(0.25)


async def _broker_fails(
    host: ControllerHost, metadata: MetadataPublisher, silent: set[int], monitor: StallMonitor, node_id: int
) -> dict[str, object]:
    """Broker `node_id` stops heartbeating: the loop's longest stall until its session expired, it was fenced
    with its actives moved, and (after broker.removal.delay.ms) its copies were placed elsewhere."""
    # Only its partitions are looked at later: a scan of all of them would stall the loop being measured.
    held = [
        (table_id, p.partition)
        for table_id, parts in metadata.image.partitions.items()
        for p in parts
        if node_id in p.replicas
    ]
    monitor.start()
    start = time.perf_counter()
    silent.add(node_id)
    while not metadata.image.servers[node_id].fenced:
        await asyncio.sleep(0.01)
    fenced_s = time.perf_counter() - start

    def holds() -> bool:
        image = metadata.image
        return any(node_id in image.partitions[t][p].replicas for t, p in held)

    while holds():
        await asyncio.sleep(0.25)
    replaced_s = time.perf_counter() - start
    stall_s = await monitor.stop()
    return {
        "node": node_id,
        "fenced_s": round(fenced_s, 2),
        "copies_replaced_s": round(replaced_s, 2),
        "session_timeout_ms": ControllerConfig().session_timeout_ms,
        "broker_removal_delay_ms": REMOVAL_DELAY_MS,
        "longest_loop_stall_ms": round(stall_s * 1000, 1),
    }


# ------------------------------------------------------------------------------------------ snapshots
def snapshot_image(partitions: int) -> MetadataImage:
    builder = ImageBuilder(MetadataImage.empty())
    for n in (1, 2, 3):
        builder.apply(
            RegisterServer(n, f"i{n}", Endpoint("127.0.0.1", 9000 + n), None, RACKS[n - 1], (), ("broker",)),
            0,
        )
        builder.apply(UnfenceServer(n), 0)
    for t in range(max(1, partitions // 1000)):
        count = min(1000, partitions)
        builder.apply(CreateTable(f"t{t}", t + 1, count, 1, KEY, None), 1)
        parts = [
            PartitionInfo(
                t + 1, p, (1 + p % 3, 1 + (p + 1) % 3), 1 + p % 3, (), 0, (1 + p % 3, 1 + (p + 1) % 3), 0
            )
            for p in range(count)
        ]
        builder.apply(partition_block(t + 1, parts), 1)
    return builder.build(2)


def encode_v1(image: MetadataImage) -> bytes:
    """Version 1 as it was written: a PartitionAssignment record per partition, built from the image."""
    wire = []
    for record in image_records(image):
        if not isinstance(record, PartitionBlock):
            wire.append(RECORDS.to_wire(record))
            continue
        for p in image.partitions[record.table_id]:
            assignment = PartitionAssignment(
                p.table_id,
                p.partition,
                p.replicas,
                p.active,
                p.warmups,
                p.leader_epoch,
                p.isr,
                p.partition_epoch,
            )
            wire.append(RECORDS.to_wire(assignment))
    return msgpack.packb([1, image.offset, image.next_table_id, wire], use_bin_type=True)


def snapshot_bench(partitions: int) -> dict[str, object]:
    image = snapshot_image(partitions)
    start = time.perf_counter()
    old = encode_v1(image)
    old_encode_s = time.perf_counter() - start
    start = time.perf_counter()
    loaded_old = decode_snapshot(old)
    old_load_s = time.perf_counter() - start
    start = time.perf_counter()
    new = encode_snapshot(image)
    new_encode_s = time.perf_counter() - start
    start = time.perf_counter()
    loaded_new = decode_snapshot(new)
    new_load_s = time.perf_counter() - start
    assert loaded_new.partition_count() == loaded_old.partition_count() == partitions
    assert dict(loaded_new.partitions) == dict(loaded_old.partitions)
    result: dict[str, object] = {
        "partitions": partitions,
        "v1_bytes": len(old),
        "v2_bytes": len(new),
        "v1_encode_s": round(old_encode_s, 3),
        "v1_load_s": round(old_load_s, 3),
        "v2_encode_s": round(new_encode_s, 3),
        "v2_load_s": round(new_load_s, 3),
        "load_speedup": round(old_load_s / new_load_s, 2),
    }
    print(result, flush=True)
    return result


# ------------------------------------------------------------------------------------------ over RPC
class SimBroker:
    """A broker as the controller sees it: registration, then heartbeats, over a real RPC connection."""

    def __init__(
        self,
        node_id: int,
        address: tuple[str, int],
        cluster: LocalCluster,
        listen_port: int = 1,
        others: Sequence[tuple[str, int]] = (),
    ) -> None:
        self.node_id = node_id
        # Where the controller may probe it: port 1 refuses (a broker that is gone), a listening port
        # answers (one that is alive).
        self.listen_port = listen_port
        self.incarnation = f"sim{node_id}"
        # As a real broker does, it follows the active controller: `others` are tried in turn when the one
        # it talks to says it is not the controller or cannot be reached.
        self.connections = [
            Connection(
                *where,
                cluster_id=cluster.cluster_id,
                secret=cluster.secret,
                node_id=node_id,
                registry=MESSAGES,
            )
            for where in (address, *others)
        ]
        self.current = 0
        self.offset = 0
        self.beats = 0
        self.worst_beat_s = 0.0
        self.errors = 0
        self.stopped = False

    async def call(self, request: object, timeout: float = 10.0) -> object:
        for _ in range(len(self.connections)):
            connection = self.connections[self.current]
            try:
                reply = await connection.request(ForwardedControllerRequest(request), timeout)  # type: ignore[arg-type]
            except Exception:
                if len(self.connections) == 1:
                    raise
                self.current = (self.current + 1) % len(self.connections)
                continue
            if getattr(reply, "error", None) is ControllerError.NOT_CONTROLLER and len(self.connections) > 1:
                self.current = (self.current + 1) % len(self.connections)
                continue
            return reply
        raise ConnectionError("no server answered as the active controller")

    async def close(self) -> None:
        for connection in self.connections:
            await connection.close()

    async def register(self) -> None:
        reply = await self.call(
            RegisterServerRequest(
                self.node_id,
                self.incarnation,
                Endpoint("127.0.0.1", self.listen_port),
                None,
                RACKS[self.node_id % 3],
                (),
                ("broker",),
            )
        )
        assert isinstance(reply, RegisterServerResponse) and reply.error is ControllerError.NONE, reply
        self.offset = reply.registered_at + 1

    async def heartbeat_loop(self, interval_s: float = 0.25) -> None:
        while not self.stopped:
            start = time.perf_counter()
            try:
                reply = await self.call(
                    ServerHeartbeatRequest(self.node_id, self.incarnation, self.offset, False), timeout=2.0
                )
                if isinstance(reply, ServerHeartbeatResponse) and reply.error is ControllerError.NONE:
                    self.beats += 1
                else:
                    self.errors += 1
            except Exception:
                self.errors += 1
            took = time.perf_counter() - start
            self.worst_beat_s = max(self.worst_beat_s, took)
            await asyncio.sleep(max(0.0, interval_s - took))


async def _all_unfenced(admin: AdminClient, brokers: int) -> bool:
    described = await admin.describe()
    return sum(1 for s in described.servers if not s.fenced and "broker" in s.roles) == brokers


async def _until(check: Callable[[], Awaitable[bool]], timeout_s: float) -> float:
    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        if await check():
            return time.perf_counter() - start
        await asyncio.sleep(0.05)
    return float("nan")


async def rpc_bench(cluster: LocalCluster, partitions: int, brokers: int, hold_s: float) -> dict[str, object]:
    await cluster.wait_ready(60)
    address = cluster.addresses()[0]
    sims = [SimBroker(n, address, cluster) for n in range(2, brokers + 2)]
    admin: AdminClient = cluster.admin(request_timeout_s=120.0)
    try:
        start = time.perf_counter()
        await asyncio.gather(*(s.register() for s in sims))
        register_s = time.perf_counter() - start
        tasks = [asyncio.create_task(s.heartbeat_loop()) for s in sims]

        unfence_s = await _until(lambda: _all_unfenced(admin, brokers), 30)
        before = sum(s.beats for s in sims)
        await asyncio.sleep(hold_s)
        beats_per_s = (sum(s.beats for s in sims) - before) / hold_s
        worst_beat_ms = max(s.worst_beat_s for s in sims) * 1000
        start = time.perf_counter()
        await _create_tables(admin, partitions, "t", deadline_s=120.0)
        create_s = time.perf_counter() - start
        victim = sims[0]
        victim.stopped = True
        start = time.perf_counter()

        async def fenced() -> bool:
            described = await admin.describe()
            me = next(s for s in described.servers if s.node_id == victim.node_id)
            return me.fenced and me.actives == 0

        async def replaced() -> bool:
            described = await admin.describe()
            me = next((s for s in described.servers if s.node_id == victim.node_id), None)
            return me is None or me.actives + me.standbys == 0

        fence_s = await _until(fenced, 60)
        replace_s = await _until(replaced, 120)
        fenced_by_mistake = sum(1 for s in (await admin.describe()).servers if s.fenced) - 1
        for task in tasks:
            task.cancel()
        result: dict[str, object] = {
            "partitions": partitions,
            "simulated_brokers": brokers,
            "registrations_per_s": round(brokers / register_s, 1),
            "all_unfenced_s": round(unfence_s, 2),
            "heartbeats_per_s_held": round(beats_per_s, 1),
            "heartbeats_offered_per_s": brokers * 4,
            "worst_heartbeat_ms": round(worst_beat_ms, 1),
            "heartbeat_errors": sum(s.errors for s in sims[1:]),
            "create_tables_s": round(create_s, 2),
            "fence_dead_broker_s": round(fence_s, 2),
            "replace_its_copies_s_after_fence": round(replace_s, 2),
            "broker_removal_delay_ms": 2000,
            "other_brokers_fenced": fenced_by_mistake,
        }
        print(result, flush=True)
        return result
    finally:
        await admin.close()
        for s in sims:
            s.stopped = True
            await s.close()


def run_rpc(partitions: int, brokers: int, hold_s: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster.create(Path(tmp) / "cluster", 1)
        cluster.write_configs(
            process_roles=frozenset({"controller"}), broker_removal_delay_ms=2000, log_level="WARNING"
        )
        cluster.save()
        cluster.start_all()
        try:
            return asyncio.run(rpc_bench(cluster, partitions, brokers, hold_s))
        except Exception as error:  # recorded, as for failover
            print(f"rpc at {partitions} partitions failed: {error}", flush=True)
            return {"partitions": partitions, "simulated_brokers": brokers, "error": str(error)[:300]}
        finally:
            for server in cluster.servers:
                cluster.signal(server, signal.SIGKILL)


# ------------------------------------------------------------------------------------------ failover
async def _create_tables(admin: AdminClient, partitions: int, prefix: str, *, deadline_s: float) -> None:
    """Tables of at most 100,000 partitions (the per-table cap) named prefix0, prefix1, ... up to
    `partitions` in all."""
    created = 0
    index = 0
    while created < partitions:
        count = min(100_000, partitions - created)
        reply = await admin.create_table(
            f"{prefix}{index}", partitions=count, standby_replicas=1, key_columns=KEY, deadline_s=deadline_s
        )
        assert reply.error is ControllerError.NONE, reply
        created += count
        index += 1


async def _hold_open(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.read()
    writer.close()


async def failover_bench(cluster: LocalCluster, partitions: int, brokers: int) -> dict[str, object]:
    await cluster.wait_ready(60)
    admin: AdminClient = cluster.admin(request_timeout_s=120.0)
    sims: list[SimBroker] = []
    tasks: list[asyncio.Task[None]] = []
    listener: asyncio.Server | None = None
    try:
        voters = await admin.list_voters()
        leader = voters.leader_id
        assert leader is not None, voters
        # The brokers talk to the active controller (a follower refuses controller requests) and follow it
        # to the next one after the kill.
        active = next(s for s in cluster.servers if s.node_id == leader)
        # The brokers are alive: a new controller probes each one's address as it takes office, and one
        # that refuses is fenced at once.
        listener = await asyncio.start_server(_hold_open, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        others = [("127.0.0.1", s.rpc_port) for s in cluster.servers if s.node_id != leader]
        sims = [
            SimBroker(n, ("127.0.0.1", active.rpc_port), cluster, port, others)
            for n in range(10, brokers + 10)
        ]
        await asyncio.gather(*(s.register() for s in sims))
        tasks = [asyncio.create_task(s.heartbeat_loop()) for s in sims]

        await _until(lambda: _all_unfenced(admin, brokers), 30)
        start = time.perf_counter()
        await _create_tables(admin, partitions, "t", deadline_s=180.0)
        create_s = time.perf_counter() - start

        probe = await admin.create_table("probe", partitions=1, standby_replicas=1, key_columns=KEY)
        assert probe.error is ControllerError.NONE, probe
        # The followers apply the last creates (they are voters: the HW needed one of them already).
        await asyncio.sleep(2.0)
        before = await admin.list_voters()
        assert before.leader_id == leader, before
        victim = next(s for s in cluster.servers if s.node_id == leader)
        cluster.signal(victim, signal.SIGKILL)
        killed = time.perf_counter()
        new_leader: int | None = None
        elected_s = float("nan")
        while time.perf_counter() - killed < 60:
            try:
                now = await admin.list_voters(deadline_s=1.0)
            except Exception:
                now = None
            if (
                now is not None
                and now.leader_id not in (None, leader)
                and now.epoch > before.epoch
                and now.high_watermark > before.high_watermark
            ):
                new_leader = now.leader_id
                elected_s = time.perf_counter() - killed
                break
            await asyncio.sleep(0.01)
        # A delete needs no live broker (the new controller has heard from none yet): the first change the
        # new leader commits for a client.
        deleted = await admin.delete_table("probe", deadline_s=60.0)
        answered_s = time.perf_counter() - killed
        assert deleted.error is ControllerError.NONE, deleted
        result: dict[str, object] = {
            "partitions": partitions,
            "simulated_brokers": brokers,
            "create_tables_s": round(create_s, 2),
            "killed_leader": leader,
            "new_leader": new_leader,
            "new_leader_committed_s": round(elected_s, 3),
            "first_delete_answered_s": round(answered_s, 3),
        }
        print(result, flush=True)
        return result
    finally:
        for task in tasks:
            task.cancel()
        if listener is not None:
            listener.close()
        await admin.close()
        for s in sims:
            s.stopped = True
            await s.close()


def run_failover(partitions: int, brokers: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster.create(Path(tmp) / "cluster", 3)
        cluster.write_configs(process_roles=frozenset({"controller"}), log_level="WARNING")
        cluster.save()
        cluster.start_all()
        try:
            return asyncio.run(failover_bench(cluster, partitions, brokers))
        except Exception as error:  # recorded: a size the quorum does not hold is a result too
            print(f"failover at {partitions} partitions failed: {error}", flush=True)
            return {"partitions": partitions, "simulated_brokers": brokers, "error": str(error)[:300]}
        finally:
            for server in cluster.servers:
                with contextlib.suppress(Exception):
                    cluster.signal(server, signal.SIGKILL)


def main() -> int:
    quick = "--quick" in sys.argv
    sizes = [10_000] if quick else [10_000, 100_000, 1_000_000]
    parts = {"loop_stall", "snapshot", "rpc", "failover"}
    if "--only" in sys.argv:
        parts = set(sys.argv[sys.argv.index("--only") + 1].split(","))
    result: dict[str, object] = {
        "benchmark": "control_plane",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "load_average": list(os.getloadavg()),
        "python": platform.python_version(),
        "note": NOTE,
        "quick": quick,
    }
    in_process = [10_000, 100_000] if quick else sizes
    if parts != {"loop_stall", "snapshot", "rpc", "failover"} and RESULTS.exists():
        result = {**json.loads(RESULTS.read_text()), **result}
    RESULTS.parent.mkdir(exist_ok=True)

    def save() -> None:  # after every part: a part that fails or is cut short keeps the others
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")

    if "loop_stall" in parts:
        # One table of each size: a table holds at most 100,000 partitions.
        result["loop_stall"] = asyncio.run(loop_stall([n for n in in_process if n <= 100_000]))
        save()
    if "snapshot" in parts:
        result["snapshot"] = [snapshot_bench(n) for n in in_process]
        save()
    if "rpc" in parts:
        result["rpc"] = []
        for n in sizes:
            result["rpc"].append(run_rpc(n, 100, 5.0))
            save()
    if "failover" in parts:
        result["failover"] = []
        for n in sizes:
            result["failover"].append(run_failover(n, 100))
            save()
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

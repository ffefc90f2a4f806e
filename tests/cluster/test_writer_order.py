"""Between real server processes: many concurrent writes to the same keys on one pipelining TableWriter
while a fault makes Produces fail: the active of their partitions killed with SIGKILL, or a standby killed
and restarted under min.insync.replicas=2 (every write fails with NOT_ENOUGH_REPLICAS until it is back in
sync, then they succeed again: the retries race the way a plain retry loses). Every key must end with the
value of the last call that returned successfully for it, or of a later call (one that failed may still
have been written); never an older one: a Produce that failed and was retried must not land over a later
write that committed."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

from hotstate.client.writer import TableWriter, WriteError
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError
from hotstate.protocol.rows import decode_row
from hotstate.protocol.wire import MESSAGES
from hotstate.query.tokens import cluster_tag, decode, merge
from hotstate.replica.core import ReplicaConfig
from hotstate.replica.messages import (
    ReadPartitionRequest,
    ReadPartitionResponse,
    ReplicaError,
    TableMetadataResponse,
)
from hotstate.rpc import PeerPool

from .conftest import RunningCluster, StartCluster

KEY = (KeyColumn("user", KeyType.STRING),)
KEYS = [f"user-{i}" for i in range(24)]
WORKERS = 8


async def _read_all(
    running: RunningCluster, table: str, nodes: dict[int, int], positions: dict[int, int]
) -> dict[str, int]:
    """Every row of `table`, read from each partition's active (`nodes`: partition -> active) once its
    store holds every write acknowledged (`positions`: partition -> end offset)."""
    cluster = running.cluster
    pool = PeerPool(0, cluster.cluster_id, cluster.secret, MESSAGES, backoff_max=0.2)
    pool.update({s.node_id: ("127.0.0.1", s.rpc_port) for s in cluster.servers})
    values: dict[str, int] = {}
    try:
        for partition, node in nodes.items():
            end = time.monotonic() + 10.0
            while True:
                reply = await pool.request(node, ReadPartitionRequest(table, partition, None, 5000), 5.0)
                assert isinstance(reply, ReadPartitionResponse) and reply.error is ReplicaError.NONE, reply
                if reply.position >= positions.get(partition, 0):
                    break
                assert time.monotonic() < end, (partition, reply.position, positions)
                await asyncio.sleep(0.05)
            for _, row in reply.items:
                decoded = decode_row(row)
                values[str(decoded["user"])] = int(decoded["v"])  # type: ignore[call-overload]
    finally:
        await pool.close()
    return values


@dataclass
class Calls:
    attempted: dict[int, list[str]] = field(default_factory=dict)  # call number -> its keys
    succeeded: set[int] = field(default_factory=set)
    failed: list[WriteError] = field(default_factory=list)
    tokens: list[str] = field(default_factory=list)
    retries: int = 0


# Runs the fault; sets the event once no new call should be made (the calls under way then finish).
Fault = Callable[[TableMetadataResponse, asyncio.Event, TableWriter], Awaitable[str]]


async def _until_a_produce_failed(writer: TableWriter, before: int, within_s: float = 20.0) -> None:
    """Returns once the writer has seen a Produce fail since it had seen `before` fail: the fault reached
    a write (a kill with no write under way to the victim would test nothing)."""
    end = time.monotonic() + within_s
    while writer.stats.produce_failures == before:
        assert time.monotonic() < end, f"no Produce failed within {within_s} s of the fault"
        await asyncio.sleep(0.005)


async def _writes_during(running: RunningCluster, table: str, partitions: int, fault: Fault) -> None:
    """WORKERS tasks call `upsert` on one writer (max_in_flight 5) over and over, each call numbered as
    it is made and writing its number into a few random keys of KEYS, until `fault` says stop; then every
    key is read from its partition's active and must hold its last successful call's number or a later
    one. No call is made after the fault began, so the calls it failed are the last to write: their
    retries decide what the keys hold (later calls would write over a lost update and hide it)."""
    cluster = running.cluster
    async with cluster.admin(request_timeout_s=2.0) as admin:
        reply = await admin.create_table(table, partitions=partitions, standby_replicas=1, key_columns=KEY)
        assert reply.error is ControllerError.NONE, reply
    calls = Calls()
    numbers = itertools.count(1)
    stop = asyncio.Event()
    async with TableWriter(
        cluster.addresses(), table, cluster_id=cluster.cluster_id, secret=cluster.secret, max_in_flight=5
    ) as writer:
        await writer.upsert([{"user": key, "v": 0} for key in KEYS], deadline_s=30.0)
        meta = await writer.metadata()

        async def worker(seed: int) -> None:
            rng = random.Random(seed)
            while not stop.is_set():
                keys = rng.sample(KEYS, rng.randint(1, 6))
                number = next(numbers)  # taken as the call is made: the order of calls
                calls.attempted[number] = keys
                try:
                    result = await writer.upsert(
                        [{"user": key, "v": number} for key in keys], deadline_s=20.0
                    )
                except WriteError as error:
                    calls.failed.append(error)
                else:
                    calls.succeeded.add(number)
                    calls.tokens.append(result.consistency_token)
                    calls.retries += result.retries

        workers = [asyncio.create_task(worker(seed)) for seed in range(WORKERS)]
        await asyncio.sleep(1.0)
        before = dataclasses.replace(writer.stats)
        what = await fault(meta, stop, writer)
        stop.set()
        await asyncio.gather(*workers)
        after = dataclasses.replace(writer.stats)
        meta = await writer.metadata(refresh=True)
    print(
        f"\n{what}: {len(calls.attempted)} calls, {len(calls.succeeded)} succeeded, {len(calls.failed)} "
        f"failed, {calls.retries} retries; stats before {before}, after {after}"
    )
    assert not calls.failed, calls.failed[:3]
    assert calls.retries > 0  # the fault failed writes in flight
    actives = {p.partition: p.active for p in meta.partitions}
    assert None not in actives.values(), actives
    tag = cluster_tag(cluster.cluster_id)
    written = merge(*(decode(token, tag) for token in calls.tokens))
    positions = {partition: offset for (_, partition), offset in written.items()}
    final = await _read_all(running, table, actives, positions)  # type: ignore[arg-type]
    wrong = {}
    for key in KEYS:
        last = max((n for n in calls.succeeded if key in calls.attempted[n]), default=0)
        tried = {0} | {n for n, keys in calls.attempted.items() if key in keys}
        if final.get(key, -1) < last or final.get(key) not in tried:
            wrong[key] = (final.get(key), last)
    assert not wrong, f"keys holding an older value than their last successful write: {wrong}"


def test_pipelined_writes_to_the_same_keys_keep_their_order_through_a_kill_9_of_the_active(
    start_cluster: StartCluster,
) -> None:
    running = start_cluster(3)
    leader = running.leader()

    async def kill_an_active(meta: TableMetadataResponse, stop: asyncio.Event, writer: TableWriter) -> str:
        # Not the metadata leader if another server leads a partition: no election in the way.
        actives = Counter(p.active for p in meta.partitions)
        victim = (Counter({n: c for n, c in actives.items() if n != leader}) or actives).most_common(1)[0][0]
        assert victim is not None
        failed = writer.stats.produce_failures
        running.kill(victim)
        # Calls go on until one of them met the dead server (on a slow machine every write under way at
        # the kill may have been answered already): its retry is what the test is about.
        await _until_a_produce_failed(writer, failed)
        stop.set()
        return f"kill -9 of server {victim}, an active"

    running.run(_writes_during(running, "order", 2, kill_an_active))


def test_pipelined_writes_keep_their_order_while_too_few_replicas_fail_them_all(
    start_cluster: StartCluster,
) -> None:
    running = start_cluster(3, replica=ReplicaConfig(min_insync_replicas=2))

    async def kill_and_restart_the_standby(
        meta: TableMetadataResponse, stop: asyncio.Event, writer: TableWriter
    ) -> str:
        (part,) = meta.partitions
        standby = next(node for node in part.replicas if node != part.active)
        failed = writer.stats.produce_failures
        running.kill(standby)
        await asyncio.sleep(1.0)  # fenced, out of the ISR: every Produce fails NOT_ENOUGH_REPLICAS
        await _until_a_produce_failed(writer, failed)
        stop.set()
        running.restart(standby)  # back in sync, it lets the failed calls' retries through
        return f"kill -9 and restart of server {standby}, the standby (min.insync.replicas=2)"

    running.run(_writes_during(running, "insync", 1, kill_and_restart_the_standby))

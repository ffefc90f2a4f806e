"""Between real server processes: many concurrent writes to the same keys on one pipelining TableWriter
while the active of their partitions is killed with SIGKILL. Every key must end with the value of the last
call that returned successfully for it, or of a later call (one that failed may still have been written);
never an older one: a Produce that failed with the active and was retried must not land over a later
write that committed."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import random
import time
from collections import Counter

from hotstate.client.writer import TableWriter, WriteError
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError
from hotstate.protocol.wire import MESSAGES
from hotstate.query.tokens import cluster_tag, decode, merge
from hotstate.replica.messages import ReadPartitionRequest, ReadPartitionResponse, ReplicaError
from hotstate.replica.rows import decode_row
from hotstate.rpc import PeerPool

KEY = (KeyColumn("user", KeyType.STRING),)
KEYS = [f"user-{i}" for i in range(24)]
WORKERS = 8


async def _read_all(running, table: str, nodes: dict[int, int], positions: dict[int, int]) -> dict[str, int]:
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


def test_pipelined_writes_to_the_same_keys_keep_their_order_through_a_kill_9_of_the_active(
    start_cluster,
) -> None:
    running = start_cluster(3)
    leader = running.leader()
    cluster = running.cluster

    async def scenario() -> None:
        async with cluster.admin(request_timeout_s=2.0) as admin:
            reply = await admin.create_table("order", partitions=2, standby_replicas=1, key_columns=KEY)
            assert reply.error is ControllerError.NONE, reply
        attempted: dict[int, list[str]] = {}
        succeeded: set[int] = set()
        tokens: list[str] = []
        retries = 0
        failed: list[WriteError] = []
        numbers = itertools.count(1)
        stop = asyncio.Event()
        async with TableWriter(
            cluster.addresses(),
            "order",
            cluster_id=cluster.cluster_id,
            secret=cluster.secret,
            max_in_flight=5,
        ) as writer:
            await writer.upsert([{"user": key, "v": 0} for key in KEYS], deadline_s=30.0)
            meta = await writer.metadata()
            # Not the metadata leader: no election in the way. The busiest other server leads at least one
            # partition (three servers, two partitions, actives spread).
            victim = Counter(p.active for p in meta.partitions if p.active != leader).most_common(1)[0][0]

            async def worker(seed: int) -> None:
                rng = random.Random(seed)
                while not stop.is_set():
                    keys = rng.sample(KEYS, rng.randint(1, 6))
                    number = next(numbers)  # taken as the call is made: the order of calls
                    attempted[number] = keys
                    try:
                        result = await writer.upsert(
                            [{"user": key, "v": number} for key in keys], deadline_s=20.0
                        )
                    except WriteError as error:
                        failed.append(error)
                    else:
                        succeeded.add(number)
                        tokens.append(result.consistency_token)
                        nonlocal retries
                        retries += result.retries

            workers = [asyncio.create_task(worker(seed)) for seed in range(WORKERS)]
            await asyncio.sleep(1.0)
            before = dataclasses.replace(writer.stats)
            running.kill(victim)
            killed_at = time.monotonic()
            await asyncio.sleep(3.0)
            stop.set()
            await asyncio.gather(*workers)
            after = dataclasses.replace(writer.stats)
            meta = await writer.metadata(refresh=True)
        print(
            f"\nkill -9 of server {victim} at +{killed_at:.1f}: {len(attempted)} calls, {len(succeeded)} "
            f"succeeded, {len(failed)} failed; stats before {before}, after {after}"
        )
        assert not failed, failed[:3]
        assert retries > 0  # the kill hit writes in flight
        actives = {p.partition: p.active for p in meta.partitions}
        assert victim not in actives.values() and None not in actives.values(), actives
        tag = cluster_tag(cluster.cluster_id)
        written = merge(*(decode(token, tag) for token in tokens))
        positions = {partition: offset for (_, partition), offset in written.items()}
        final = await _read_all(running, "order", actives, positions)  # type: ignore[arg-type]
        wrong = {}
        for key in KEYS:
            last = max((n for n in succeeded if key in attempted[n]), default=0)
            tried = {0} | {n for n, keys in attempted.items() if key in keys}
            if final.get(key, -1) < last or final.get(key) not in tried:
                wrong[key] = (final.get(key), last)
        assert not wrong, f"keys holding an older value than their last successful write: {wrong}"

    running.run(scenario())

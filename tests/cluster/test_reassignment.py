"""Existing partitions follow the assignor between real server processes, under acks=all writes: a server
that joins gets its share of actives and standbys, the replicas of a server gone for good are re-created
on the others, and no acked write is lost or refused on the way."""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import Callable

from hotstate.client.writer import WriteError
from hotstate.replica.messages import PartitionMetadata, TableMetadataResponse

from .conftest import StartCluster
from .test_replication import Probe, _create, _writer


async def _wait_placement(
    probe: Probe,
    node: int,
    table: str,
    done: Callable[[tuple[PartitionMetadata, ...]], bool],
    what: str,
    timeout_s: float = 45.0,
) -> TableMetadataResponse:
    end = time.monotonic() + timeout_s
    while True:
        meta = await probe.metadata(node, table)
        if meta.partitions and done(meta.partitions):
            return meta
        if time.monotonic() > end:
            placement = [(p.partition, p.active, p.replicas, p.isr) for p in meta.partitions]
            raise AssertionError(f"{what}: not after {timeout_s:.0f} s; placement {placement}")
        await asyncio.sleep(0.1)


def test_a_joining_server_takes_its_share_and_a_server_gone_for_good_is_replaced(
    start_cluster: StartCluster,
) -> None:
    running = start_cluster(3, hold=(3,), broker_removal_delay_ms=4000)

    async def scenario() -> None:
        await _create(running, "clicks", partitions=6, standbys=1)
        probe = Probe(running)
        before = await probe.metadata(1, "clicks")
        assert {p.active for p in before.partitions} <= {1, 2}
        acked: dict[str, int] = {}
        failures: list[Exception] = []
        stop = asyncio.Event()

        async def write_loop() -> None:
            writer = _writer(running, "clicks")
            value = 0
            try:
                while not stop.is_set():
                    value += 1
                    rows = [{"user": f"k{i}", "clicks": value} for i in range(60)]
                    try:
                        await writer.upsert(rows, deadline_s=20.0)
                    except WriteError as error:
                        failures.append(error)
                        continue
                    for row in rows:
                        acked[str(row["user"])] = value
                    await asyncio.sleep(0.01)
            finally:
                await writer.close()

        writing = asyncio.create_task(write_loop())
        await asyncio.sleep(1.0)
        running.restart(3)
        joined_at = time.monotonic()

        def shared(parts: tuple[PartitionMetadata, ...]) -> bool:
            actives = Counter(p.active for p in parts)
            return actives == {1: 2, 2: 2, 3: 2} and all(
                set(p.isr) == set(p.replicas) and len(p.replicas) == 2 and p.active in p.replicas
                for p in parts
            )

        await _wait_placement(probe, 1, "clicks", shared, "server 3 gets a third of the actives")
        took_share = time.monotonic() - joined_at

        running.kill(3)
        killed_at = time.monotonic()

        def replaced(parts: tuple[PartitionMetadata, ...]) -> bool:
            return all(set(p.replicas) == {1, 2} and set(p.isr) == {1, 2} for p in parts)

        await _wait_placement(probe, 1, "clicks", replaced, "server 3's replicas re-created on 1 and 2")
        took_replace = time.monotonic() - killed_at
        await asyncio.sleep(0.5)
        stop.set()
        await writing
        assert not failures, failures[:3]
        print(
            f"\nserver 3 had its share {took_share:.1f} s after it started; its replicas were on the "
            f"others {took_replace:.1f} s after kill -9 (removal delay 4 s); {len(acked)} keys acked"
        )

        await probe.wait_converged([1, 2], "clicks")
        final = await probe.metadata(1, "clicks")
        seen: dict[str, int] = {}
        for part in final.partitions:
            stores = [await probe.rows(node, "clicks", part.partition) for node in part.replicas]
            assert all(store == stores[0] for store in stores), f"replicas of {part.partition} differ"
            for row in stores[0][1].values():
                seen[str(row["user"])] = int(row["clicks"])  # type: ignore[call-overload]
        for user, value in acked.items():
            assert seen.get(user, -1) >= value, (user, value, seen.get(user))
        await probe.close()

    running.run(scenario())

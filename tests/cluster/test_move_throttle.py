"""The move throttle with real processes: a server joining a cluster that holds data gets its share no
faster than `replica.move.throttle.bytes.per.sec` lets its new copies fetch, while writes (acks=all, so
waiting for every in-sync standby, which the throttle never holds back) go on at their usual speed."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import httpx

from hotstate.client.writer import WriteError
from hotstate.protocol.keys import encode_key, partition_for
from hotstate.replica.messages import PartitionMetadata

from .conftest import StartCluster
from .test_reassignment import _wait_placement
from .test_replication import Probe, _create, _writer

# 200 kB to move at 10 kB/s: about 20 s, where the same move unthrottled takes about 8 s (the controller's
# reassignment steps, run every 500 ms here), so a throttle not applied fails the bound below (16 s).
RATE = 10_000  # bytes/s
PARTITIONS = 6
ROWS = 300
VALUE = "x" * 1000


def test_a_joining_server_s_copies_fetch_no_faster_than_the_throttle(start_cluster: StartCluster) -> None:
    running = start_cluster(3, hold=(3,), move_throttle_bytes_per_sec=RATE, reassign_interval_ms=500)

    async def scenario() -> None:
        await _create(running, "clicks", partitions=PARTITIONS, standbys=1)
        writer = _writer(running, "clicks")
        rows = [{"user": f"k{i}", "clicks": 0, "blob": VALUE} for i in range(ROWS)]
        await writer.upsert(rows, deadline_s=30.0)
        per_partition: Counter[int] = Counter()
        for i in range(ROWS):
            per_partition[partition_for(encode_key((f"k{i}",)), PARTITIONS)] += len(VALUE)

        failures: list[Exception] = []
        latencies: list[float] = []
        stop = asyncio.Event()

        async def write_loop() -> None:
            value = 0
            while not stop.is_set():
                value += 1
                began = time.monotonic()
                try:
                    await writer.upsert([{"user": "hot", "clicks": value}], deadline_s=20.0)
                except WriteError as error:
                    failures.append(error)
                latencies.append(time.monotonic() - began)
                await asyncio.sleep(0.02)

        writing = asyncio.create_task(write_loop())
        running.restart(3)
        started = time.monotonic()

        def shared(parts: tuple[PartitionMetadata, ...]) -> bool:
            return Counter(p.active for p in parts) == {1: 2, 2: 2, 3: 2} and all(
                set(p.isr) == set(p.replicas) and len(p.replicas) == 2 for p in parts
            )

        probe = Probe(running)
        meta = await _wait_placement(probe, 1, "clicks", shared, "server 3 gets its share", timeout_s=90.0)
        took = time.monotonic() - started
        stop.set()
        await writing
        await writer.close()
        await probe.close()
        moved = sum(per_partition[p.partition] for p in meta.partitions if 3 in p.replicas)
        latencies.sort()
        median, p99 = latencies[len(latencies) // 2], latencies[int(len(latencies) * 0.99)]
        print(
            f"\nserver 3 took its share ({moved:,} bytes of values) in {took:.1f} s at {RATE:,} bytes/s; "
            f"{len(latencies)} writes meanwhile, median {median * 1000:.1f} ms, p99 {p99 * 1000:.1f} ms"
        )
        assert not failures, failures[:3]
        assert median < 0.1, (median, p99)
        # Held back like the new copies, an in-sync standby falls behind and out of the ISR (seen when the
        # throttle was applied to every follower): none did.
        server = running.server(1)
        async with httpx.AsyncClient(timeout=5.0) as http:
            events = (
                await http.get(f"http://127.0.0.1:{server.http_port}/v1/events", params={"limit": 500})
            ).json()["events"]
        shrunk = [e["message"] for e in events if e["kind"] == "isr_shrunk"]
        assert not shrunk, shrunk
        # The bucket starts with a burst of a tenth of a second; the rest waits for the rate.
        assert took >= 0.8 * (moved - RATE / 10) / RATE, (took, moved)

    running.run(scenario())

"""Benchmark of the metadata quorum between real processes -> bench/results/metadata.json.

1. Controller failover: kill -9 the leader of a local 3-server cluster, time until the next metadata write
   commits (a client retrying create_table); >= 20 runs, p50/p99.
2. Commit latency under a steady load: create/delete table requests at a fixed rate, p50/p99, beside the
   latency of a describe request (answered locally, no commit) as the baseline in the same run.
3. Snapshot of 1,000,000 partition records: time to encode and to load it, beside the time to replay the
   same records from raw batches (the baseline a snapshot saves us from).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

from hotstate.cli.local_cluster import LocalCluster
from hotstate.client.admin import ClusterUnavailableError, OutcomeUnknownError
from hotstate.controller.image import ImageBuilder, MetadataImage
from hotstate.controller.records import (
    CreateTable,
    Endpoint,
    KeyColumn,
    KeyType,
    PartitionAssignment,
    RegisterServer,
    UnfenceServer,
)
from hotstate.controller.requests import ControllerError
from hotstate.controller.snapshot import decode_snapshot, encode_snapshot

RESULTS = Path(__file__).parent / "results" / "metadata.json"
KEY = (KeyColumn("k", KeyType.STRING),)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]


def summary(values_ms: list[float]) -> dict[str, float]:
    return {
        "n": len(values_ms),
        "p50_ms": round(percentile(values_ms, 0.5), 1),
        "p99_ms": round(percentile(values_ms, 0.99), 1),
        "max_ms": round(max(values_ms), 1),
        "mean_ms": round(statistics.fmean(values_ms), 1),
    }


async def failover(cluster: LocalCluster, runs: int) -> dict[str, object]:
    samples = []
    async with cluster.admin(request_timeout_s=0.5) as admin:
        for run in range(runs):
            await cluster.wait_ready(30.0)
            leader = (await admin.describe()).leader_id
            assert leader is not None
            server = next(s for s in cluster.servers if s.node_id == leader)
            cluster.signal(server, signal.SIGKILL)
            killed = time.monotonic()
            while True:
                try:
                    reply = await admin.create_table(
                        f"f{run}", partitions=1, standby_replicas=0, key_columns=KEY
                    )
                except (OutcomeUnknownError, ClusterUnavailableError):
                    await asyncio.sleep(0.01)  # sent to the dead leader, or nobody reachable yet: again
                    continue
                # "exists" means an earlier attempt of ours committed: the write is in, either way.
                if reply.error in (ControllerError.NONE, ControllerError.TABLE_EXISTS):
                    break
            samples.append((time.monotonic() - killed) * 1000)
            while cluster.alive(server):
                await asyncio.sleep(0.01)
            cluster.start(server)
    return summary(samples)


async def commit_latency(cluster: LocalCluster, requests: int, rate_per_s: float) -> dict[str, object]:
    await cluster.wait_ready(30.0)
    commits: list[float] = []
    local: list[float] = []
    async with cluster.admin() as admin:
        started = time.monotonic()
        for i in range(requests):
            await asyncio.sleep(max(0.0, started + i / rate_per_s - time.monotonic()))
            t0 = time.monotonic()
            if i % 2 == 0:
                reply = await admin.create_table(f"l{i}", partitions=1, standby_replicas=0, key_columns=KEY)
            else:
                reply = await admin.delete_table(f"l{i - 1}")
            assert reply.error is ControllerError.NONE, reply
            commits.append((time.monotonic() - t0) * 1000)
            t0 = time.monotonic()
            await admin.describe()
            local.append((time.monotonic() - t0) * 1000)
    return {"rate_per_s": rate_per_s, "commit": summary(commits), "baseline_describe": summary(local)}


def snapshot_bench(partitions: int) -> dict[str, object]:
    tables = partitions // 1000
    batches = [
        [
            RegisterServer(n, f"i{n}", Endpoint("127.0.0.1", 9000 + n), None, f"az-{n}", (), ("broker",))
            for n in range(1, 4)
        ]
        + [UnfenceServer(n) for n in range(1, 4)]
    ]
    for t in range(tables):
        batch: list[object] = [CreateTable(f"t{t}", t + 1, 1000, 1, KEY, None)]
        for p in range(1000):
            # Active on one server, its standby on the next, both in sync.
            replicas = (1 + p % 3, 1 + (p + 1) % 3)
            batch.append(PartitionAssignment(t + 1, p, replicas, replicas[0], (), 0, replicas, 0))
        batches.append(batch)  # type: ignore[arg-type]
    t0 = time.perf_counter()
    builder = ImageBuilder(MetadataImage.empty())
    for offset, records in enumerate(batches):
        builder.apply_all(records, offset)  # type: ignore[arg-type]
    image = builder.build(len(batches))
    replay_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    data = encode_snapshot(image)
    write_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    loaded = decode_snapshot(data)
    load_s = time.perf_counter() - t0
    assert loaded.partition_count() == image.partition_count() == partitions
    return {
        "partition_records": partitions,
        "snapshot_bytes": len(data),
        "write_s": round(write_s, 2),
        "load_s": round(load_s, 2),
        "baseline_replay_from_records_s": round(replay_s, 2),
        "load_over_replay": round(load_s / replay_s, 2),
    }


def main() -> int:
    quick = "--quick" in sys.argv
    result: dict[str, object] = {
        "benchmark": "metadata",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "note": "3 local combined-mode servers on one 2-core machine, default timeouts",
    }
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster.create(Path(tmp) / "cluster", 3)
        cluster.write_configs()
        cluster.save()
        cluster.start_all()
        try:
            result["failover_kill9_leader_to_next_commit"] = asyncio.run(
                failover(cluster, 5 if quick else 20)
            )
            result["commit_latency"] = asyncio.run(commit_latency(cluster, 40 if quick else 400, 20.0))
        finally:
            for server in cluster.servers:
                cluster.signal(server, signal.SIGKILL)
    result["snapshot"] = snapshot_bench(100_000 if quick else 1_000_000)
    if not quick:
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

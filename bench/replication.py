"""Benchmark of partition replication between real processes -> bench/results/replication.json.

Committed upserts/s (acks=all) on a local 3-server cluster, table with 1 standby, in batches of 100 / 1,000
/ 10,000 rows sent by one writer, each beside the same batches written straight into a single local RocksDB
store in the same run (the ratio is the price of the network, the log and the replication). Follower lag
(records and ms) sampled under that load. Each size runs REPEATS times, interleaved with the others, each
time on a new table and beside a new baseline store: the reported run is the one with the median ratio,
with every run's ratio beside it (on 2 shared cores one run's ratio swings by a quarter).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

from hotstate.cli.local_cluster import LocalCluster
from hotstate.client.writer import TableWriter
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError
from hotstate.protocol.wire import MESSAGES
from hotstate.replica.keys import encode_key
from hotstate.replica.messages import LagInfoRequest, LagInfoResponse
from hotstate.replica.rows import encode_row
from hotstate.replica.store import Store
from hotstate.rpc import PeerPool

RESULTS = Path(__file__).parent / "results" / "replication.json"
KEY = (KeyColumn("user", KeyType.STRING),)
PARTITIONS = 4
ROWS_PER_SIZE = 60_000
REPEATS = 3


def row(i: int, round_: int) -> dict[str, object]:
    return {"user": f"user-{i:07d}", "clicks": round_, "url": f"/page/{i % 977}", "score": i * 0.5}


def baseline_rocksdb(directory: Path, batch: int) -> float:
    """Rows/s of the same batches encoded and applied to one local store (no network, no log)."""
    store = Store.open(directory)
    position = 0
    started = time.perf_counter()
    for start in range(0, ROWS_PER_SIZE, batch):
        records = []
        for i in range(start, min(start + batch, ROWS_PER_SIZE)):
            r = row(i, 1)
            records.append((encode_key((r["user"],)), encode_row(r)))  # type: ignore[arg-type]
        position += len(records)
        store.apply(records, position, 1)
    elapsed = time.perf_counter() - started
    store.close()
    return ROWS_PER_SIZE / elapsed


async def sample_lag(
    pool: PeerPool, nodes: list[int], stop: asyncio.Event, out: list[tuple[int, float]]
) -> None:
    """Follower lag in records, and in ms estimated from the write rate at the time of the sample."""
    while not stop.is_set():
        for node in nodes:
            try:
                reply = await pool.request(node, LagInfoRequest(), 1.0)
            except Exception:
                continue
            assert isinstance(reply, LagInfoResponse)
            for info in reply.replicas:
                if info.state == "standby":
                    out.append((info.offset_lag, time.monotonic()))
        await asyncio.sleep(0.05)


async def cluster_run(cluster: LocalCluster, batch: int, table: str) -> dict[str, object]:
    async with cluster.admin(request_timeout_s=2.0) as admin:
        reply = await admin.create_table(table, partitions=PARTITIONS, standby_replicas=1, key_columns=KEY)
        assert reply.error is ControllerError.NONE, reply
    writer = TableWriter(cluster.addresses(), table, cluster_id=cluster.cluster_id, secret=cluster.secret)
    await writer.upsert([row(0, 0)])
    pool = PeerPool(0, cluster.cluster_id, cluster.secret, MESSAGES)
    pool.update({s.node_id: ("127.0.0.1", s.rpc_port) for s in cluster.servers})
    stop = asyncio.Event()
    lags: list[tuple[int, float]] = []
    sampler = asyncio.create_task(sample_lag(pool, [s.node_id for s in cluster.servers], stop, lags))
    latencies = []
    started = time.perf_counter()
    for start in range(0, ROWS_PER_SIZE, batch):
        rows = [row(i, 1) for i in range(start, min(start + batch, ROWS_PER_SIZE))]
        t = time.perf_counter()
        await writer.upsert(rows)
        latencies.append((time.perf_counter() - t) * 1000)
    elapsed = time.perf_counter() - started
    stop.set()
    await sampler
    await writer.close()
    await pool.close()
    async with cluster.admin(request_timeout_s=2.0) as admin:  # a run's replicas must not load the next
        deleted = await admin.delete_table(table)
        assert deleted.error is ControllerError.NONE, deleted
    rate = ROWS_PER_SIZE / elapsed
    lag_records = [lag for lag, _ in lags] or [0]
    return {
        "rows_per_s": round(rate),
        "batch_latency_p50_ms": round(statistics.median(latencies), 1),
        "batch_latency_p99_ms": round(sorted(latencies)[int(0.99 * (len(latencies) - 1))], 1),
        "follower_lag_records_p50": statistics.median(lag_records),
        "follower_lag_records_max": max(lag_records),
        # At the measured write rate, a lag of N records is N / rate seconds behind.
        "follower_lag_ms_p50_est": round(statistics.median(lag_records) / rate * 1000, 2),
        "follower_lag_ms_max_est": round(max(lag_records) / rate * 1000, 2),
        "lag_samples": len(lags),
    }


async def main() -> None:
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cluster = LocalCluster.create(root / "cluster", 3)
        cluster.write_configs()
        cluster.save()
        cluster.start_all()
        try:
            await cluster.wait_ready(30)
            runs: dict[int, list[dict[str, object]]] = {100: [], 1_000: [], 10_000: []}
            for repeat in range(REPEATS):
                for batch, done in runs.items():
                    measured = await cluster_run(cluster, batch, f"bench_{batch}_{repeat}")
                    base = baseline_rocksdb(root / f"baseline-{batch}-{repeat}", batch)
                    measured["baseline_single_rocksdb_rows_per_s"] = round(base)
                    measured["ratio_vs_single_rocksdb"] = round(float(measured["rows_per_s"]) / base, 3)  # type: ignore[arg-type]
                    done.append(measured)
                    print(batch, measured, flush=True)
            for batch, done in runs.items():
                ratios = [float(run["ratio_vs_single_rocksdb"]) for run in done]  # type: ignore[arg-type]
                median = sorted(done, key=lambda run: float(run["ratio_vs_single_rocksdb"]))[len(done) // 2]  # type: ignore[arg-type]
                results[f"batch_{batch}"] = median | {"ratio_runs": ratios}
        finally:
            for server in cluster.servers:
                cluster.stop(server)
    report = {
        "benchmark": "committed upserts/s (acks=all) on a local 3-server cluster, 1 standby per partition",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "note": "2 cores shared by 3 servers, the writer and the baseline: numbers are for this machine only",
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "rows_per_batch_size": ROWS_PER_SIZE,
        "partitions": PARTITIONS,
        "row": "4 columns: user (key, str), clicks (int), url (str), score (float); about 60 bytes encoded",
        "baseline": "the same rows encoded and applied in the same batches to one local RocksDB store",
        "results": results,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")


if __name__ == "__main__":
    asyncio.run(main())

"""Benchmark of partition replication between real processes -> bench/results/replication.json.

Committed upserts/s (acks=all) on a local 3-server cluster, table with 1 standby, in batches of 100 / 1,000
/ 10,000 rows sent by one writer, each beside the same batches written straight into a single local RocksDB
store in the same run (the ratio is the price of the network, the log and the replication). Follower lag
(records and ms) sampled under that load. Each size runs REPEATS times, interleaved with the others, each
time on a new table and beside a new baseline store: the reported run is the one with the median ratio,
with every run's ratio beside it (on 2 shared cores one run's ratio swings by a quarter).

Each size is written twice: with one call in flight (each `upsert` awaited before the next: results
`batch_N`) and with IN_FLIGHT calls in flight on the same writer (`batch_N_in_flight_K`: K tasks take the
batches in order, and the writer pipelines their Produces, TableWriter's max_in_flight); both against the
same baseline (the sequential local store).

`--rows` and `--repeats` make a short check run (write it elsewhere with `--out`).
"""

from __future__ import annotations

import argparse
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
from hotstate.protocol.keys import encode_key
from hotstate.protocol.rows import encode_row
from hotstate.protocol.wire import MESSAGES
from hotstate.replica.messages import LagInfoRequest, LagInfoResponse
from hotstate.replica.store import Store
from hotstate.rpc import PeerPool

RESULTS = Path(__file__).parent / "results" / "replication.json"
KEY = (KeyColumn("user", KeyType.STRING),)
PARTITIONS = 4
ROWS_PER_SIZE = 400_000
REPEATS = 3
IN_FLIGHT = 8  # calls in flight on one writer, beside one at a time


def row(i: int, round_: int) -> dict[str, object]:
    return {"user": f"user-{i:07d}", "clicks": round_, "url": f"/page/{i % 977}", "score": i * 0.5}


def baseline_rocksdb(directory: Path, batch: int, total: int) -> float:
    """Rows/s of the same batches encoded and applied to one local store (no network, no log)."""
    store = Store.open(directory)
    position = 0
    started = time.perf_counter()
    for start in range(0, total, batch):
        records = []
        for i in range(start, min(start + batch, total)):
            r = row(i, 1)
            records.append((encode_key((r["user"],)), encode_row(r)))  # type: ignore[arg-type]
        position += len(records)
        store.apply(records, position, 1)
    elapsed = time.perf_counter() - started
    store.close()
    return total / elapsed


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


async def cluster_run(
    cluster: LocalCluster, batch: int, table: str, in_flight: int, total: int
) -> dict[str, object]:
    async with cluster.admin(request_timeout_s=2.0) as admin:
        reply = await admin.create_table(table, partitions=PARTITIONS, standby_replicas=1, key_columns=KEY)
        assert reply.error is ControllerError.NONE, reply
    writer = TableWriter(
        cluster.addresses(),
        table,
        cluster_id=cluster.cluster_id,
        secret=cluster.secret,
        max_in_flight=max(in_flight, 1),
    )
    await writer.upsert([row(0, 0)])
    pool = PeerPool(0, cluster.cluster_id, cluster.secret, MESSAGES)
    pool.update({s.node_id: ("127.0.0.1", s.rpc_port) for s in cluster.servers})
    stop = asyncio.Event()
    lags: list[tuple[int, float]] = []
    sampler = asyncio.create_task(sample_lag(pool, [s.node_id for s in cluster.servers], stop, lags))
    latencies: list[float] = []
    batches = iter(range(0, total, batch))

    async def caller() -> None:
        for start in batches:  # shared: each batch is taken by one caller, in order
            rows = [row(i, 1) for i in range(start, min(start + batch, total))]
            t = time.perf_counter()
            await writer.upsert(rows)
            latencies.append((time.perf_counter() - t) * 1000)

    started = time.perf_counter()
    await asyncio.gather(*(caller() for _ in range(in_flight)))
    elapsed = time.perf_counter() - started
    stop.set()
    await sampler
    await writer.close()
    await pool.close()
    async with cluster.admin(request_timeout_s=2.0) as admin:  # a run's replicas must not load the next
        deleted = await admin.delete_table(table)
        assert deleted.error is ControllerError.NONE, deleted
    rate = total / elapsed
    lag_records = [lag for lag, _ in lags] or [0]
    return {
        "calls_in_flight": in_flight,
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


async def main(total: int, repeats: int, out: Path) -> None:
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        cluster = LocalCluster.create(root / "cluster", 3)
        cluster.write_configs()
        cluster.save()
        cluster.start_all()
        try:
            await cluster.wait_ready(30)
            # Today's keys for one call in flight; `_in_flight_K` beside them.
            runs: dict[str, list[dict[str, object]]] = {}
            for repeat in range(repeats):
                for batch in (100, 1_000, 10_000):
                    base = baseline_rocksdb(root / f"baseline-{batch}-{repeat}", batch, total)
                    for in_flight in (1, IN_FLIGHT):
                        name = f"batch_{batch}" if in_flight == 1 else f"batch_{batch}_in_flight_{in_flight}"
                        table = f"bench_{batch}_{in_flight}_{repeat}"
                        measured = await cluster_run(cluster, batch, table, in_flight, total)
                        measured["baseline_single_rocksdb_rows_per_s"] = round(base)
                        measured["ratio_vs_single_rocksdb"] = round(float(measured["rows_per_s"]) / base, 3)  # type: ignore[arg-type]
                        runs.setdefault(name, []).append(measured)
                        print(name, measured, flush=True)
            for name, done in runs.items():
                ratios = [float(run["ratio_vs_single_rocksdb"]) for run in done]  # type: ignore[arg-type]
                median = sorted(done, key=lambda run: float(run["ratio_vs_single_rocksdb"]))[len(done) // 2]  # type: ignore[arg-type]
                results[name] = median | {"ratio_runs": ratios}
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
        "rows_per_batch_size": total,
        "calls_in_flight": [1, IN_FLIGHT],
        "partitions": PARTITIONS,
        "row": "4 columns: user (key, str), clicks (int), url (str), score (float); about 60 bytes encoded",
        "baseline": "the same rows encoded and applied in the same batches to one local RocksDB store",
        "results": results,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=ROWS_PER_SIZE, help="rows written per batch size and run")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="runs of each batch size")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the JSON goes")
    args = parser.parse_args()
    asyncio.run(main(args.rows, args.repeats, args.out))

"""Disk use of a table that deletes what it writes, on a local cluster -> bench/results/compaction.json.

A local 3-server cluster (default configs) holds table `churn` (6 partitions, 1 standby, key `id`
STRING, rows of about 200 bytes). It is loaded with `--live` rows (200,000), then written in steps: each
step upserts the next `live / 20` new keys and deletes the oldest as many, in one ordered `write`, so the
table always holds `live` rows, until 10x the table's size has been written and deleted. A thread samples
each server's bytes on disk (its whole data directory: partition logs, RocksDB stores, metadata) every
half second throughout, and for `--settle-s` seconds after the last step.

Reported per server and in total: bytes at the start (the table loaded), the peak, and the end (after
the settle), each also as a ratio to the live data's size on that server (live rows x row bytes x the
replicas of the table's partitions it holds / the partitions), the peak of each turnover (a tenth of
the churn), and where the bytes are (logs, stores, other) at the start and the end. Flat means the peaks
stop rising (the second half's at most 10% above the first half's) and the end is below them: deleted
rows' space is given back by RocksDB compaction and the partition logs' truncation, not kept.

    python bench/compaction.py            # full run, writes bench/results/compaction.json
    python bench/compaction.py --quick    # harness check: 10,000 live rows, writes to /tmp
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import json
import os
import platform
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

from hotstate.cli.local_cluster import LocalCluster
from hotstate.client.writer import Delete, TableWriter
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError
from hotstate.protocol.rows import encode_row
from hotstate.replica.core import ReplicaConfig

TABLE = "churn"
PARTITIONS = 6
STANDBYS = 1
KEY = (KeyColumn("id", KeyType.STRING),)
TURNOVER = 10  # the table's size, written and deleted this many times
STEPS_PER_TURN = 20
LOAD_BATCH = 20_000


def row(i: int) -> dict[str, object]:
    return {"id": f"id-{i:010d}", "clicks": i % 1000, "name": f"name-{i:010d}-" + "x" * 150}


def dir_bytes(path: Path) -> int:
    total = 0
    for directory, _, files in os.walk(path):
        for name in files:
            # A file compaction or truncation removed under the walk counts nothing.
            with contextlib.suppress(FileNotFoundError):
                total += os.stat(os.path.join(directory, name)).st_size
    return total


def breakdown(cluster: LocalCluster) -> dict[str, dict[str, int]]:
    """Each server's bytes in its partitions' logs, their RocksDB stores, and everything else."""
    out: dict[str, dict[str, int]] = {}
    for server in cluster.servers:
        root = server.directory(cluster.root)
        parts = [p.parent for p in root.rglob("partitions/*/log")]
        logs = sum(dir_bytes(p / "log") for p in parts)
        stores = sum(dir_bytes(p / "store") for p in parts)
        out[str(server.node_id)] = {"logs": logs, "stores": stores, "other": dir_bytes(root) - logs - stores}
    return out


class Sampler:
    """Each server's bytes on disk every `every_s`, in a thread, with the phase at the time."""

    def __init__(self, cluster: LocalCluster, every_s: float = 0.5) -> None:
        self.cluster, self.every_s = cluster, every_s
        self.phase = "load"
        self.samples: list[dict[str, Any]] = []
        self._started = time.monotonic()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def sample(self) -> dict[str, Any]:
        point: dict[str, Any] = {"t": round(time.monotonic() - self._started, 2), "phase": self.phase}
        for server in self.cluster.servers:
            point[str(server.node_id)] = dir_bytes(server.directory(self.cluster.root))
        self.samples.append(point)
        return point

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self.sample()


async def create(cluster: LocalCluster) -> None:
    async with cluster.admin(request_timeout_s=2.0) as admin:
        reply = await admin.create_table(
            TABLE, partitions=PARTITIONS, standby_replicas=STANDBYS, key_columns=KEY
        )
        assert reply.error is ControllerError.NONE, reply


async def load(cluster: LocalCluster, live: int) -> None:
    async with TableWriter(
        cluster.addresses(), TABLE, cluster_id=cluster.cluster_id, secret=cluster.secret
    ) as w:
        for first in range(0, live, LOAD_BATCH):
            await w.upsert([row(i) for i in range(first, min(live, first + LOAD_BATCH))])


async def churn(cluster: LocalCluster, live: int) -> dict[str, float]:
    """Write the next keys and delete the oldest, a step at a time, until TURNOVER x live are replaced."""
    step = max(1, live // STEPS_PER_TURN)
    started = time.monotonic()
    oldest, newest = 0, live
    async with TableWriter(
        cluster.addresses(), TABLE, cluster_id=cluster.cluster_id, secret=cluster.secret
    ) as w:
        while newest < live * (TURNOVER + 1):
            changes: list[Any] = [row(i) for i in range(newest, newest + step)]
            changes += [Delete(f"id-{i:010d}") for i in range(oldest, oldest + step)]
            await w.write(changes)
            oldest, newest = oldest + step, newest + step
    elapsed = time.monotonic() - started
    return {
        "churn_s": elapsed,
        "rows_written": newest - live,
        "rows_deleted": oldest,
        "steps": oldest // step,
    }


def replicas_per_server(cluster: LocalCluster) -> dict[str, int]:
    server = cluster.servers[0]
    tables = httpx.get(f"http://127.0.0.1:{server.http_port}/v1/tables", timeout=10).json()["tables"]
    placement = next(t for t in tables if t["name"] == TABLE)["placement"]
    held = {str(s.node_id): 0 for s in cluster.servers}
    for part in placement:
        for node in (part["active"], *part["standbys"]):
            if node is not None:
                held[str(node)] += 1
    return held


def count(cluster: LocalCluster) -> int | None:
    server = cluster.servers[0]
    reply = httpx.post(
        f"http://127.0.0.1:{server.http_port}/v1/query",
        json={"sql": f"SELECT COUNT(*) FROM {TABLE}", "max_lag": 0},
        timeout=120,
    )
    return int(reply.json()["rows"][0][0]) if reply.status_code == 200 else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--live", type=int, default=200_000, help="rows the table holds throughout")
    parser.add_argument("--settle-s", type=float, default=30.0)
    parser.add_argument(
        "--log-retention-records",
        type=int,
        default=None,
        help="the servers' replica.log.retention.records (default: theirs, 100,000)",
    )
    parser.add_argument("--quick", action="store_true", help="10,000 live rows, 5 s settle, results to /tmp")
    args = parser.parse_args()
    live, settle_s = (10_000, 5.0) if args.quick else (args.live, args.settle_s)
    out_dir = Path(tempfile.gettempdir()) if args.quick else Path(__file__).parent / "results"
    row_bytes = len(encode_row(row(0)))
    with tempfile.TemporaryDirectory(prefix="hotstate-compaction-") as scratch:
        cluster = LocalCluster.create(Path(scratch) / "cluster", 3)
        if args.log_retention_records is None:
            cluster.write_configs()
        else:
            cluster.write_configs(replica=ReplicaConfig(log_retention_records=args.log_retention_records))
        cluster.save()
        sampler: Sampler | None = None
        try:
            cluster.start_all()
            asyncio.run(cluster.wait_ready(30))
            asyncio.run(create(cluster))
            sampler = Sampler(cluster)
            sampler.start()
            started = time.monotonic()
            asyncio.run(load(cluster, live))
            setup = {"load_s": time.monotonic() - started}
            held = replicas_per_server(cluster)
            sampler.phase = "churn"
            start_point = sampler.sample()
            split_start = breakdown(cluster)
            setup.update(asyncio.run(churn(cluster, live)))
            sampler.phase = "settle"
            time.sleep(settle_s)
            end_point = sampler.sample()
            split_end = breakdown(cluster)
            rows_at_end = count(cluster)
        finally:
            if sampler is not None:
                sampler.stop()
            for server in cluster.servers:
                cluster.signal(server, signal.SIGKILL)
    assert sampler is not None
    churned = [s for s in sampler.samples if s["phase"] in ("churn", "settle")]
    per_server: dict[str, Any] = {}
    for node, replicas in held.items():
        live_bytes = live * row_bytes * replicas / PARTITIONS
        start, end = start_point[node], end_point[node]
        peak = max(s[node] for s in churned)
        per_server[node] = {
            "replicas": replicas,
            "live_bytes": live_bytes,
            "start_bytes": start,
            "peak_bytes": peak,
            "end_bytes": end,
            "start_ratio": start / live_bytes if live_bytes else None,
            "peak_ratio": peak / live_bytes if live_bytes else None,
            "end_ratio": end / live_bytes if live_bytes else None,
        }
    total_live = live * row_bytes * (1 + STANDBYS)
    churn_points = [s for s in sampler.samples if s["phase"] == "churn"]
    middle = churn_points[len(churn_points) // 2] if churn_points else start_point
    growth = {node: end_point[node] / middle[node] for node in held}
    # Bytes on disk saw-tooth (a log gives back a 16 MiB segment at a time, compaction rewrites files), so
    # one sample against another compares a trough with a tooth: the peaks of each tenth of the churn
    # (one turnover of the table each) show whether the tops keep rising.
    tenths = [
        churn_points[len(churn_points) * i // 10 : len(churn_points) * (i + 1) // 10] for i in range(10)
    ]
    peaks_per_turnover = {
        node: [max((p[node] for p in tenth), default=None) for tenth in tenths] for node in held
    }
    half = len(churn_points) // 2
    peak_growth = {
        node: max(p[node] for p in churn_points[half:]) / max(p[node] for p in churn_points[:half])
        for node in held
        if half
    }
    totals = {
        key: sum(p[key] for p in per_server.values()) for key in ("start_bytes", "peak_bytes", "end_bytes")
    }
    report = {
        "benchmark": f"compaction: a table that deletes what it writes, {TURNOVER}x its size replaced",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
        "python": platform.python_version(),
        "live_rows": live,
        "log_retention_records": args.log_retention_records,
        "row_bytes": row_bytes,
        "rows_at_end": rows_at_end,
        "setup": setup,
        "total": {
            **totals,
            "live_bytes": total_live,
            **{k.replace("_bytes", "_ratio"): v / total_live for k, v in totals.items()},
        },
        "per_server": per_server,
        "breakdown_start": split_start,
        "breakdown_end": split_end,
        # The end (after the settle) over the sample in the middle of the churn: the measure of earlier
        # runs, kept to compare; it sets a trough against what follows (see peak_growth).
        "growth_second_half": growth,
        "peaks_per_turnover": peaks_per_turnover,
        # Bounded rather than growing: the second half of the churn peaks no more than 10% above the first
        # half's peak, and the end is below it (the logs keep replica.log.retention.records per partition
        # and the stores their memtables and WAL whatever the live size, so a small table's ratio is high
        # but flat).
        "peak_growth_second_half": peak_growth,
        "flat": bool(peak_growth)
        and all(g <= 1.1 for g in peak_growth.values())
        and all(end_point[n] <= max(p[n] for p in churn_points[half:]) for n in held),
        "samples": sampler.samples,
    }
    path = out_dir / "compaction.json"
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(
        json.dumps(
            {k: report[k] for k in ("live_rows", "rows_at_end", "total", "peak_growth_second_half", "flat")},
            indent=2,
        )
    )
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()

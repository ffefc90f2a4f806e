"""A throttled move (issue 29 §2) -> bench/results/move_throttle.json.

What runs: a LocalCluster of 3 real combined-mode servers on loopback holding one table (`--partitions`,
1 standby) loaded with `--bytes` of row values (1 KiB each), every server with
`replica.move.throttle.bytes.per.sec` = `--rate`. Then a 4th server (a plain broker) starts, and the
controller moves its share of actives and standbys to it, each new copy catching up at the throttled rate.
Meanwhile `--queriers` threads send point lookups of random loaded keys to servers 1-3 over HTTP
(`POST /v1/query`), each waiting for its answer.

Reported: time to balance (from the 4th server's start until every server holds its share of actives,
every partition's replicas are in its ISR and no warmup is left), the bytes of values the new server
received (its partitions' share), the query latency p50/p99/max and count before the move (a window of
`--baseline` s) and during it, and failed queries. The issue's goal: query p99 < 10 ms during the move,
at a throttle that finishes a 1 GB cluster's move within 5 minutes.

`--quick` runs a tiny size (4 MB at 1 MB/s) to check that the bench works, and writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import random
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import NamedTuple

import httpx

from hotstate.cli.local_cluster import LocalCluster
from hotstate.client.writer import TableWriter
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError
from hotstate.protocol.keys import encode_key, partition_for
from hotstate.server.config import Voter, render_toml

RESULTS = Path(__file__).parent / "results" / "move_throttle.json"
TABLE = "moved"
KEY = (KeyColumn("user", KeyType.STRING),)
VALUE_BYTES = 1024
NEW = 4


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def latency_summary(values: list[float]) -> dict[str, object]:
    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000, 2)

    return {
        "queries": len(values),
        "p50_ms": ms(percentile(values, 0.5)),
        "p99_ms": ms(percentile(values, 0.99)),
        "max_ms": ms(max(values, default=None)),
    }


def make_cluster(root: Path, rate: int) -> LocalCluster:
    """Servers 1-3 combined (the voters), server NEW a broker: configured, not started."""
    cluster = LocalCluster.create(root, NEW)
    voters = tuple(Voter(s.node_id, s.host, s.rpc_port) for s in cluster.servers[:3])
    for server in cluster.servers:
        roles = {"broker"} if server.node_id == NEW else {"controller", "broker"}
        config = cluster.config_for(
            server, voters=voters, process_roles=frozenset(roles), move_throttle_bytes_per_sec=rate
        )
        directory = server.directory(root)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "server.toml").write_text(render_toml(config))
    cluster.save()
    return cluster


async def load(cluster: LocalCluster, partitions: int, rows: int) -> None:
    async with cluster.admin(request_timeout_s=2.0) as admin:
        reply = await admin.create_table(TABLE, partitions=partitions, standby_replicas=1, key_columns=KEY)
        assert reply.error is ControllerError.NONE, reply
    writer = TableWriter(cluster.addresses()[:3], TABLE, cluster_id=cluster.cluster_id, secret=cluster.secret)
    value = "v" * VALUE_BYTES
    try:
        for start in range(0, rows, 1000):
            chunk = [{"user": f"u{i}", "value": value} for i in range(start, min(rows, start + 1000))]
            await writer.upsert(chunk, deadline_s=60.0)
    finally:
        await writer.close()


class Placed(NamedTuple):
    partition: int
    active: int | None
    standbys: tuple[int, ...]
    warmups: tuple[int, ...]
    isr: tuple[int, ...]

    @property
    def holders(self) -> set[int | None]:
        return {self.active, *self.standbys}


def placement(base: str) -> list[Placed]:
    tables = httpx.get(f"{base}/v1/tables", timeout=5.0).json()["tables"]
    parts = next(t["placement"] for t in tables if t["name"] == TABLE)
    return [
        Placed(p["partition"], p["active"], tuple(p["standbys"]), tuple(p["warmups"]), tuple(p["isr"]))
        for p in parts
    ]


def balanced(parts: list[Placed], servers: int) -> bool:
    actives = Counter(p.active for p in parts)
    low, high = len(parts) // servers, -(-len(parts) // servers)
    return (
        len(actives) == servers
        and all(low <= n <= high for n in actives.values())
        and all(not p.warmups and set(p.isr) == p.holders for p in parts)
    )


class Queries:
    """Threads sending point lookups, each latency stamped with when it ended."""

    def __init__(self, bases: list[str], rows: int, threads: int) -> None:
        self.samples: list[tuple[float, float]] = []
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._run, args=(bases[i % len(bases)], rows, i)) for i in range(threads)
        ]

    def start(self) -> None:
        for thread in self._threads:
            thread.start()

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join()

    def _run(self, base: str, rows: int, seed: int) -> None:
        rng = random.Random(seed)
        with httpx.Client(timeout=10.0) as http:
            while not self._stop.is_set():
                sql = f"SELECT * FROM {TABLE} WHERE user = 'u{rng.randrange(rows)}'"
                began = time.monotonic()
                try:
                    reply = http.post(f"{base}/v1/query", json={"sql": sql})
                except httpx.HTTPError as error:
                    self.failures.append(f"{type(error).__name__}: {error}")
                    continue
                ended = time.monotonic()
                if reply.status_code != 200 or len(reply.json()["rows"]) != 1:
                    self.failures.append(f"{reply.status_code}: {reply.text[:200]}")
                    continue
                self.samples.append((ended, ended - began))

    def between(self, start: float, end: float) -> list[float]:
        return [latency for at, latency in self.samples if start <= at < end]


def run(total_bytes: int, rate: int, partitions: int, queriers: int, baseline_s: float) -> dict[str, object]:
    rows = max(partitions, total_bytes // VALUE_BYTES)
    with tempfile.TemporaryDirectory() as tmp:
        cluster = make_cluster(Path(tmp) / "cluster", rate)
        for server in cluster.servers[:3]:
            cluster.start(server)
        queries: Queries | None = None
        try:
            asyncio.run(cluster.wait_ready(30.0, expect=3))
            began_load = time.monotonic()
            asyncio.run(load(cluster, partitions, rows))
            load_s = time.monotonic() - began_load
            bases = [f"http://127.0.0.1:{s.http_port}" for s in cluster.servers[:3]]
            queries = Queries(bases, rows, queriers)
            queries.start()
            time.sleep(baseline_s)
            started = time.monotonic()
            cluster.start(cluster.servers[NEW - 1])
            parts = placement(bases[0])
            while not balanced(parts, NEW):
                if time.monotonic() - started > 3600:
                    raise TimeoutError(f"not balanced after an hour: {parts}")
                time.sleep(0.2)
                parts = placement(bases[0])
            took = time.monotonic() - started
            time.sleep(1.0)
            queries.stop()
            per_partition: Counter[int] = Counter()
            for i in range(rows):
                per_partition[partition_for(encode_key((f"u{i}",)), partitions)] += VALUE_BYTES
            moved = sum(per_partition[p.partition] for p in parts if NEW in p.holders)
            return {
                "rows": rows,
                "value_bytes": rows * VALUE_BYTES,
                "load_s": round(load_s, 1),
                "moved_value_bytes": moved,
                "throttle_bytes_per_sec": rate,
                "time_to_balance_s": round(took, 1),
                "moved_at_bytes_per_sec": round(moved / took) if took else None,
                "queries_before": latency_summary(queries.between(started - baseline_s, started)),
                "queries_during": latency_summary(queries.between(started, started + took)),
                "failed_queries": len(queries.failures),
                "failures": queries.failures[:10],
            }
        finally:
            if queries is not None:
                queries.stop()
            for server in cluster.servers:
                cluster.signal(server, signal.SIGKILL)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--bytes", type=int, default=1024**3, help="row values to load (default 1 GiB)")
    parser.add_argument("--rate", type=int, default=5 * 1024**2, help="throttle, bytes/s (default 5 MiB/s)")
    parser.add_argument("--partitions", type=int, default=12)
    parser.add_argument("--queriers", type=int, default=2, help="query threads (default 2)")
    parser.add_argument("--baseline", type=float, default=5.0, help="seconds of queries before the move")
    parser.add_argument("--quick", action="store_true", help="4 MB at 1 MB/s, nothing written")
    args = parser.parse_args(argv)
    if args.quick:
        args.bytes, args.rate, args.baseline = 4 * 1024**2, 1024**2, 2.0
    load_before = os.getloadavg()[0]
    results = run(args.bytes, args.rate, args.partitions, args.queriers, args.baseline)
    report = {
        "benchmark": "a 4th server joins a 3-server cluster holding data: throttled move, queries meanwhile",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "cluster": f"3 combined-mode servers + 1 broker; {args.partitions} partitions, 1 standby",
        "goal": "query p99 < 10 ms during the move, at a throttle that finishes 1 GB within 5 minutes",
        "results": results,
    }
    print(json.dumps(report, indent=2))
    if not args.quick:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

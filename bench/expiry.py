"""Expiry of 1M rows while point lookups run, on a local cluster -> bench/results/expiry.json.

A local 3-server cluster (default configs) holds two tables, each 6 partitions with 1 standby:
- `hot`: 10,000 plain rows, the point lookups' table (keys whose active is on server 1, asked through
  server 1's `/v1/query`, one client in a loop).
- `expiring`: a windowed table (key `user` and a TUMBLING 1-minute window, retention 1 hour) loaded with
  `--rows` rows (1,000,000), every one in the window 00:00-00:01, so nothing expires while it loads.

Then, in the same run:
1. idle: the lookups for `--idle-s` seconds with nothing expiring (lookup p50/p99/max).
2. expiry: one row per partition with a window ending a day later is written, so every loaded window is
   older than the retention; the actives delete them in pages (replica/retention.py, tombstones through
   the log). The lookups run until the servers' `hotstate_expired_rows` add up to every loaded row; then
   every replica is checked empty (standbys too, by `max_lag: 0` counts on each server).
   `expiry_rows_per_s` is the loaded rows over the time from the trigger to the last one deleted.
3. event-loop stalls: each server's `hotstate_event_loop_stall_seconds` histogram (how late a 10 ms timer
   fired) taken before and after each phase: the longest stall in the phase is reported as the bucket it
   fell in (upper bound), exact when it was the server's longest since start
   (`hotstate_event_loop_stall_max_seconds` grew during the phase).

    python bench/expiry.py                # full run, writes bench/results/expiry.json
    python bench/expiry.py --quick        # harness check: 20,000 rows, 2 s phases, writes to /tmp
"""

from __future__ import annotations

import argparse
import asyncio
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
from hotstate.client.writer import TableWriter
from hotstate.controller.records import KeyColumn, KeyType, TableWindow
from hotstate.controller.requests import ControllerError
from hotstate.protocol.keys import encode_key, partition_for
from hotstate.protocol.rows import encode_row

PARTITIONS = 6
STANDBYS = 1
HOT_ROWS = 10_000
WRITE_BATCH = 20_000
MINUTE = dt.timedelta(minutes=1)
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
WINDOW = TableWindow("window", "TUMBLING", 60_000_000, 60_000_000, retention_us=3_600_000_000)
WINDOW_KEY = (
    KeyColumn("user", KeyType.STRING),
    KeyColumn("WINDOWSTART", KeyType.WINDOW_START),
    KeyColumn("WINDOWEND", KeyType.WINDOW_END),
)
STALL = "hotstate_event_loop_stall_seconds"


def expiring_row(user: str, end: dt.datetime) -> dict[str, object]:
    return {"user": user, "WINDOWSTART": end - MINUTE, "WINDOWEND": end, "clicks": 7, "page": "p" * 80}


def hot_row(i: int) -> dict[str, object]:
    return {"id": f"h{i:06d}", "clicks": i, "name": f"name-{i:06d}-" + "x" * 60}


# --- the cluster ------------------------------------------------------------------------------------------


async def start(root: Path, rows: int) -> tuple[LocalCluster, dict[str, float]]:
    cluster = LocalCluster.create(root / "cluster", 3)
    cluster.write_configs()
    cluster.save()
    cluster.start_all()
    await cluster.wait_ready(30)
    async with cluster.admin(request_timeout_s=2.0) as admin:
        for name, key, window in (
            ("hot", (KeyColumn("id", KeyType.STRING),), None),
            ("expiring", WINDOW_KEY, WINDOW),
        ):
            reply = await admin.create_table(
                name, partitions=PARTITIONS, standby_replicas=STANDBYS, key_columns=key, window=window
            )
            assert reply.error is ControllerError.NONE, reply
    started = time.monotonic()
    auth = {"cluster_id": cluster.cluster_id, "secret": cluster.secret}
    async with TableWriter(cluster.addresses(), "hot", **auth) as w:
        await w.upsert([hot_row(i) for i in range(HOT_ROWS)])
    async with TableWriter(cluster.addresses(), "expiring", **auth) as w:
        for first in range(0, rows, WRITE_BATCH):
            end = min(rows, first + WRITE_BATCH)
            await w.upsert([expiring_row(f"u{i:09d}", T0 + MINUTE) for i in range(first, end)])
    return cluster, {"write_s": time.monotonic() - started}


async def trigger(cluster: LocalCluster) -> None:
    """One row per partition whose window ends a day after the loaded ones: all of those are expired."""
    users: dict[int, str] = {}
    i = 0
    while len(users) < PARTITIONS:
        user = f"a-trigger-{i}"
        users.setdefault(partition_for(encode_key((user,)), PARTITIONS), user)
        i += 1
    async with TableWriter(
        cluster.addresses(), "expiring", cluster_id=cluster.cluster_id, secret=cluster.secret
    ) as w:
        await w.upsert([expiring_row(user, T0 + dt.timedelta(days=1)) for user in users.values()])


def http(cluster: LocalCluster, node: int) -> str:
    server = next(s for s in cluster.servers if s.node_id == node)
    return f"http://127.0.0.1:{server.http_port}"


def count(base: str, table: str) -> int | None:
    reply = httpx.post(
        f"{base}/v1/query", json={"sql": f"SELECT COUNT(*) FROM {table}", "max_lag": 0}, timeout=120
    )
    return int(reply.json()["rows"][0][0]) if reply.status_code == 200 else None


def wait_count(base: str, table: str, rows: int, timeout_s: float = 600.0) -> float:
    started = time.monotonic()
    while time.monotonic() - started < timeout_s:
        if count(base, table) == rows:
            return time.monotonic() - started
        time.sleep(0.5)
    raise TimeoutError(f"{table}: the replicas did not reach {rows} rows")


def local_keys(base: str, node: int, amount: int = 200) -> list[str]:
    tables = httpx.get(f"{base}/v1/tables").json()["tables"]
    placement = next(t for t in tables if t["name"] == "hot")["placement"]
    mine = {p["partition"] for p in placement if p["active"] == node}
    keys = [f"h{i:06d}" for i in range(HOT_ROWS)]
    return [k for k in keys if partition_for(encode_key((k,)), PARTITIONS) in mine][:amount]


class Lookups:
    """Point lookups in a thread until stopped; latencies kept by phase."""

    def __init__(self, base: str, keys: list[str]) -> None:
        self.base, self.keys = base, keys
        self.phase = "idle"
        self.latencies: dict[str, list[float]] = {}
        self.errors = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        i = 0
        with httpx.Client(timeout=10.0) as client:
            while not self._stop.is_set():
                key = self.keys[i % len(self.keys)]
                i += 1
                phase = self.phase
                started = time.perf_counter()
                reply = client.post(
                    f"{self.base}/v1/query", json={"sql": f"SELECT * FROM hot WHERE id = '{key}'"}
                )
                elapsed = time.perf_counter() - started
                if reply.status_code != 200:
                    self.errors += 1
                self.latencies.setdefault(phase, []).append(elapsed)

    def summary(self, phase: str) -> dict[str, float]:
        values = sorted(self.latencies.get(phase, [0.0]))
        return {
            "n": len(values),
            "p50_ms": values[len(values) // 2] * 1000,
            "p99_ms": values[int(len(values) * 0.99)] * 1000,
            "max_ms": values[-1] * 1000,
        }


# --- metrics ---------------------------------------------------------------------------------------------


def metrics(base: str) -> dict[str, Any]:
    """The stall histogram's buckets (cumulative, by upper bound), its max, and expired rows."""
    text = httpx.get(f"{base}/metrics", timeout=10).text
    buckets: dict[float, float] = {}
    out: dict[str, Any] = {"buckets": buckets, "max": 0.0, "expired": 0.0}
    for line in text.splitlines():
        if line.startswith(f"{STALL}_bucket"):
            bound = line.split('le="', 1)[1].split('"', 1)[0]
            buckets[float("inf") if bound == "+Inf" else float(bound)] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("hotstate_event_loop_stall_max_seconds "):
            out["max"] = float(line.rsplit(" ", 1)[1])
        elif line.startswith("hotstate_expired_rows "):
            out["expired"] = float(line.rsplit(" ", 1)[1])
    return out


def longest_stall(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The longest stall between two readings: the highest bucket that gained a count (its upper bound),
    exact when the server's max grew meanwhile."""
    bounds = sorted(after["buckets"])
    gained = [
        b
        for i, b in enumerate(bounds)
        if (after["buckets"][b] - (after["buckets"][bounds[i - 1]] if i else 0))
        > (before["buckets"].get(b, 0) - (before["buckets"].get(bounds[i - 1], 0) if i else 0))
    ]
    top = max(gained, default=0.0)
    exact = after["max"] if after["max"] > before["max"] else None
    return {
        "stall_at_most_ms": None if top == float("inf") else top * 1000,
        "stall_exact_ms": None if exact is None else exact * 1000,
        "ticks": after["buckets"].get(float("inf"), 0) - before["buckets"].get(float("inf"), 0),
    }


def read_all(cluster: LocalCluster) -> dict[int, dict[str, Any]]:
    return {s.node_id: metrics(http(cluster, s.node_id)) for s in cluster.servers}


# --- main ------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="20,000 rows, 2 s idle, results to /tmp")
    args = parser.parse_args()
    rows, idle_s = (20_000, 2.0) if args.quick else (args.rows, args.idle_s)
    out_dir = Path(tempfile.gettempdir()) if args.quick else Path(__file__).parent / "results"
    with tempfile.TemporaryDirectory(prefix="hotstate-expiry-") as scratch:
        cluster: LocalCluster | None = None
        lookups: Lookups | None = None
        try:
            cluster, setup = asyncio.run(start(Path(scratch), rows))
            base = http(cluster, 1)
            setup["caught_up_s"] = wait_count(base, "expiring", rows)
            lookups = Lookups(base, local_keys(base, 1))
            lookups.start()
            time.sleep(0.5)  # connections and caches warm before the measured phase
            lookups.latencies.clear()
            idle_before = read_all(cluster)
            time.sleep(idle_s)
            idle_after = read_all(cluster)
            lookups.phase = "expiry"
            triggered = time.monotonic()
            asyncio.run(trigger(cluster))
            timeline: list[tuple[float, float]] = []
            expired = 0.0
            last = idle_after
            while expired < rows and time.monotonic() - triggered < 3600:
                time.sleep(0.25)
                last = read_all(cluster)
                expired = sum(m["expired"] - idle_after[n]["expired"] for n, m in last.items())
                timeline.append((round(time.monotonic() - triggered, 2), expired))
            expiry_s = time.monotonic() - triggered
            lookups.phase = "after"
            lookups.stop()
            remaining = {s.node_id: count(http(cluster, s.node_id), "expiring") for s in cluster.servers}
            status = httpx.get(f"{base}/clusterStatus", timeout=5.0).json()["clusterStatus"]
            alive = {v["serverId"]: v["hostAlive"] for v in status.values()}
        finally:
            if lookups is not None and lookups._thread.is_alive():
                lookups.stop()
            if cluster is not None:
                for server in cluster.servers:
                    cluster.signal(server, signal.SIGKILL)
    idle, during = lookups.summary("idle"), lookups.summary("expiry")
    stalls = {
        str(node): {
            "idle": longest_stall(idle_before[node], idle_after[node]),
            "expiry": longest_stall(idle_after[node], last[node]),
            "expired_rows": last[node]["expired"] - idle_after[node]["expired"],
        }
        for node in last
    }
    worst = max(
        (s["expiry"]["stall_exact_ms"] or s["expiry"]["stall_at_most_ms"] or 0.0) for s in stalls.values()
    )
    report = {
        "benchmark": "expiry: 1M windowed rows past their retention deleted while point lookups run",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
        "python": platform.python_version(),
        "rows": rows,
        "row_bytes": len(encode_row(expiring_row("u000000000", T0 + MINUTE))),
        "setup": setup,
        "expiry_s": expiry_s,
        "expiry_rows_per_s": rows / expiry_s,
        "rows_left_per_server": remaining,
        "lookups_idle": idle,
        "lookups_during_expiry": during,
        "lookup_errors": lookups.errors,
        "p99_ratio_during_vs_idle": during["p99_ms"] / idle["p99_ms"] if idle["p99_ms"] else None,
        "longest_stall_during_expiry_ms": worst,
        "stalls_per_server": stalls,
        "servers_alive_after": alive,
        "timeline": timeline,
    }
    path = out_dir / "expiry.json"
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    summary = {k: report[k] for k in ("rows", "expiry_s", "expiry_rows_per_s", "rows_left_per_server")}
    print(json.dumps({**summary, "idle": idle, "during": during, "longest_stall_ms": worst}, indent=2))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()

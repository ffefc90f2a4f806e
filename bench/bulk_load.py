"""Benchmark of a bulk load through the Spark batch writer -> bench/results/bulk_load.json.

ROWS rows of about 150 bytes (a string key, four value columns) are written to Parquet first, then:
  baseline   the same rows read from the Parquet files, encoded as the writers encode them (key and row
             codec) and applied in batches of BATCH to one local RocksDB store: no Spark, network, log or
             replication (the figure to compare against, measured in the same run)
  hotstate   `spark.read.parquet(dir).write.format("hotstate").mode("append")` (Spark local[2]) into a
             local 3-server cluster, PARTITIONS partitions with 1 standby each (acks=all); rows/s over the
             save() call
Beside the load: the time from save() returning until every replica of every partition is at its
active's position (in sync), the bytes on disk of each server's data directory after it, and the
latency of point lookups (`SELECT * ... WHERE id = '...'` over HTTP, one at a time, 8 ms apart, from a
Python client in a process and session of its own, as an application's would be) made
while the load ran: p50, p99 and max at this client; p99 and max of the server's own time (`took_ms`),
and its p99 for the lookups the server forwarded (the key's active on another server); each server's
longest event-loop stall (its /metrics since it started, the opening of the table's stores included).
The same lookups are asked at the same time from wrk (NativeLookups: a native client at server 1, one
at a time with a pause of 8 ms before each), so that the measuring side's own waits for a core are not
in the figure. Over the load the bench also reads each server's event-loop thread's CPU time and its
time runnable but waiting for a core (/proc/PID/schedstat), and the CPU every thread on the machine used,
summed by part (servers' loops, their RocksDB threads, Spark's JVM and Python workers, the clients): what
a lookup's wait is made of on 2 cores shared by everything.
The machine is shared: the bench waits (at most QUIET_WAIT_S) until
other processes use under 0.4 cores before each measured part, and records what they used.

Spark reads one Parquet file (FILE_ROWS rows) per task, so a task's rows stay bounded in memory (the
sink encodes a task's rows before sending and the writer holds them until they are acked). The writer's
deadline (`writeTimeoutMs`) is left at its default, 60 s: it bounds a time without progress (no Produce of
a partition acknowledged), not the whole of a task's write, so a task of half a million rows on 2 shared
cores needs no longer one (issue 26; until then this bench set it to 30 minutes).

`--rows` makes a short check run (write it elsewhere with `--out`; `--file-rows` smaller than `--rows`
gives it several tasks); the issue's figure is at 10,000,000 (about 15 minutes on 2 cores).
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
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from expiry import metrics
from freshness import cpu_sample, others_cores, wait_quiet
from hotstate.cli.local_cluster import LocalCluster
from hotstate.client.query import Client
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError
from hotstate.protocol.keys import encode_key
from hotstate.protocol.rows import encode_row
from hotstate.protocol.wire import MESSAGES
from hotstate.replica.messages import LagInfoRequest, LagInfoResponse
from hotstate.replica.store import Store
from hotstate.rpc import PeerPool
from pull_queries import wrk_result

RESULTS = Path(__file__).parent / "results" / "bulk_load.json"
ROWS = 10_000_000
FILE_ROWS = 500_000
BATCH = 10_000
PARTITIONS = 8
TABLE = "bulk"
KEY = (KeyColumn("id", KeyType.STRING),)
QUIET_WAIT_S = 60.0
SYNC_TIMEOUT_S = 600.0


def write_input(directory: Path, rows: int, file_rows: int = FILE_ROWS) -> int:
    """Parquet files of `rows` rows; the mean encoded row size in bytes."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True)
    filler = "x" * 60
    for number, start in enumerate(range(0, rows, file_rows)):
        ids = np.arange(start, min(start + file_rows, rows))
        table = pa.table(
            {
                "id": pa.array([f"user-{i:010d}" for i in ids]),
                "segment": pa.array([f"segment-{i % 97:02d}" for i in ids]),
                "score": pa.array(ids * 0.25),
                "visits": pa.array(ids % 1000),
                "note": pa.array([f"{filler}{i % 10_000:05d}" for i in ids]),
            }
        )
        pq.write_table(table, directory / f"part-{number:05d}.parquet")
    sample = pq.read_table(next(iter(sorted(directory.iterdir())))).slice(0, 1000).to_pylist()
    return round(statistics.mean(len(encode_key((r["id"],))) + len(encode_row(r)) for r in sample))


def baseline_rocksdb(source: Path, store_dir: Path) -> dict[str, Any]:
    """The same rows read, encoded and applied in batches to one local store."""
    import pyarrow.parquet as pq

    wait_quiet(QUIET_WAIT_S)
    before = cpu_sample()
    store = Store.open(store_dir)
    position = 0
    rows = 0
    started = time.perf_counter()
    for path in sorted(source.iterdir()):
        for batch in pq.ParquetFile(path).iter_batches(batch_size=BATCH):
            records = [(encode_key((r["id"],)), encode_row(r)) for r in batch.to_pylist()]
            position += len(records)
            store.apply(records, position, 1)
            rows += len(records)
    elapsed = time.perf_counter() - started
    store.close()
    return {
        "rows": rows,
        "seconds": round(elapsed, 2),
        "rows_per_s": round(rows / elapsed),
        "bytes_on_disk": _bytes_under(store_dir),
        "other_processes_cores": others_cores(before, cpu_sample()),
    }


def _bytes_under(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


# Each lookup client waits this long between one lookup's answer and the next lookup: both ask at about
# the same steady pace (~100 a second when answers are quick) rather than as fast as they can, which
# would make the measuring clients a large part of what loads the 2 cores.
LOOKUP_PAUSE_MS = 8


def ask_lookups(servers: list[str], rows: int) -> None:
    """The lookup client's process (`--lookups-for`): point lookups one at a time, LOOKUP_PAUSE_MS apart,
    until its stdin closes; then one JSON line of what it measured (each latency in ms) on stdout."""
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    latencies: list[float] = []
    took: list[float] = []
    forwarded_took: list[float] = []  # of the lookups the server that took them forwarded
    failures = 0
    chosen = random.Random(7)
    with Client(servers, timeout_s=5.0) as client:
        while not stop.is_set():
            key = f"user-{chosen.randrange(rows):010d}"
            started = time.perf_counter()
            try:
                answer = client.query(f"SELECT * FROM {TABLE} WHERE id = '{key}'")
            except Exception:
                failures += 1
                stop.wait(LOOKUP_PAUSE_MS / 1000)
                continue
            latencies.append((time.perf_counter() - started) * 1000)
            took.append(answer.took_ms)
            if answer.partitions and answer.partitions[0].served_by != answer.coordinator:
                forwarded_took.append(answer.took_ms)
            stop.wait(LOOKUP_PAUSE_MS / 1000)
    print(
        json.dumps(
            {"latencies": latencies, "took": took, "forwarded_took": forwarded_took, "failures": failures}
        )
    )


class Lookups:
    """`ask_lookups` in a process of its own, in a session of its own: not a thread of this process, which
    drives Spark, so that it does not wait for this process's lock or share its CPU (the kernel shares the
    cores between sessions first); an application's lookups come from its own process too."""

    def __init__(self, servers: list[str], rows: int) -> None:
        command = [sys.executable, __file__, "--lookups-for", ",".join(servers), "--rows", str(rows)]
        self.process = subprocess.Popen(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, start_new_session=True
        )

    def finish(self) -> dict[str, Any]:
        out, _ = self.process.communicate(input="", timeout=60)  # its stdin closed: it stops
        if self.process.returncode != 0:
            raise RuntimeError(f"the lookup client exited {self.process.returncode}")
        found: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return found


class NativeLookups:
    """The same lookups from wrk (one connection, LOOKUP_PAUSE_MS before each), in a session of its own: a
    native client, so that no Python process of the measuring side waits for one of the 2 cores between a
    lookup's send and its answer's read. Runs until `finish` (SIGINT: wrk stops, prints its summary)."""

    def __init__(self, base: str, rows: int, scratch: Path) -> None:
        chosen = random.Random(11)
        bodies = scratch / "lookup-bodies"
        bodies.write_text(
            "".join(
                json.dumps({"sql": f"SELECT * FROM {TABLE} WHERE id = 'user-{chosen.randrange(rows):010d}'"})
                + "\n"
                for _ in range(2000)
            )
        )
        lua = Path(__file__).parent / "lua" / "paced_bodies.lua"
        command = ["wrk", "-t1", "-c1", "-d3600s", "--timeout", "10s", "-s", str(lua), base]
        command += ["--", str(bodies), "/v1/query", '"user-', str(LOOKUP_PAUSE_MS)]
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
        )

    def finish(self) -> dict[str, Any]:
        self.process.send_signal(signal.SIGINT)
        out, err = self.process.communicate(timeout=30)
        raw = wrk_result(self.process.returncode, out, err)
        latency = raw["latency_us"]
        return {
            "count": raw["requests"],
            # wrk counts a non-2xx answer in errors.status too
            "failed": max(raw["non2xx"], raw["errors"]["status"])
            + sum(n for kind, n in raw["errors"].items() if kind != "status"),
            "rows_per_answer": round(raw["rows"] / max(1, raw["requests"] - raw["non2xx"]), 3),
            "p50_ms": latency["p50"] / 1000,
            "p99_ms": latency["p99"] / 1000,
            "max_ms": latency["max"] / 1000,
        }


async def positions(cluster: LocalCluster, pool: PeerPool) -> dict[int, list[int]]:
    """Per partition of the table: the store position of each replica the servers report."""
    found: dict[int, list[int]] = {}
    for server in cluster.servers:
        try:
            reply = await pool.request(server.node_id, LagInfoRequest(), 2.0)
        except Exception:
            continue
        assert isinstance(reply, LagInfoResponse)
        for info in reply.replicas:
            if info.table == TABLE:
                found.setdefault(info.partition, []).append(info.current_offset_position)
    return found


async def time_to_sync(cluster: LocalCluster, since: float) -> float:
    """Seconds from `since` until every partition has its 2 replicas at one position."""
    pool = PeerPool(0, cluster.cluster_id, cluster.secret, MESSAGES)
    pool.update({s.node_id: ("127.0.0.1", s.rpc_port) for s in cluster.servers})
    try:
        while time.perf_counter() - since < SYNC_TIMEOUT_S:
            found = await positions(cluster, pool)
            if len(found) == PARTITIONS and all(len(p) == 2 and len(set(p)) == 1 for p in found.values()):
                return time.perf_counter() - since
            await asyncio.sleep(0.05)
        raise TimeoutError(f"replicas not in sync within {SYNC_TIMEOUT_S} s")
    finally:
        await pool.close()


def loop_stalls(cluster: LocalCluster) -> dict[str, float]:
    """Each server's longest event-loop stall since it started (its /metrics), in ms."""
    return {
        str(server.node_id): round(metrics(base)["max"] * 1000, 1)
        for server, base in zip(cluster.servers, cluster.http_addresses(), strict=True)
    }


def loop_times(pids: list[int]) -> list[tuple[int, int]]:
    """(CPU ns, ns waited on a runqueue for a core) of each server's event-loop thread (its main thread)."""
    out = []
    for pid in pids:
        cpu, waited, _ = Path(f"/proc/{pid}/schedstat").read_text().split()
        out.append((int(cpu), int(waited)))
    return out


def cpu_by_part(bench_pid: int, server_pids: set[int]) -> dict[str, float]:
    """CPU seconds used so far by every thread on the machine, summed by what it is part of."""
    out: dict[str, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        pid = int(proc.name)
        try:
            command = (proc / "cmdline").read_bytes()
            for task in (proc / "task").iterdir():
                stat = (task / "stat").read_text()
                name = stat[stat.index("(") + 1 : stat.rindex(")")]
                fields = stat[stat.rindex(")") + 2 :].split()
                if pid in server_pids:
                    part = (
                        "server event loops"
                        if task.name == proc.name
                        else "server RocksDB threads"
                        if name.startswith("rocksdb")
                        else "server other threads"
                    )
                elif pid == bench_pid:
                    part = "this bench (Spark's driver)"
                elif b"--lookups-for" in command:
                    part = "Python lookup client"
                elif b"pyspark.daemon" in command:
                    part = "Spark Python workers (the writer)"
                elif b"java" in command:
                    part = "Spark JVM"
                elif command.startswith(b"wrk"):
                    part = "wrk (native lookup client)"
                else:
                    part = "other (kernel threads, tools)"
                out[part] = out.get(part, 0.0) + (int(fields[11]) + int(fields[12])) / tick
        except (OSError, ValueError):
            continue  # a process or thread that ended while being read
    return out


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2) if ordered else 0.0


def main(rows: int, out: Path, file_rows: int = FILE_ROWS) -> None:
    import hotstate.spark as hs
    from hotstate.spark.pipeline import build_session

    run_started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        source = root / "in"
        started_input = time.perf_counter()
        row_bytes = write_input(source, rows, file_rows)
        input_s = time.perf_counter() - started_input
        input_bytes = _bytes_under(source)
        baseline = baseline_rocksdb(source, root / "baseline")
        print("baseline", baseline, flush=True)
        cluster = LocalCluster.create(root / "cluster", 3)
        cluster.write_configs()
        cluster.save()
        cluster.start_all()
        os.environ["PYSPARK_PYTHON"] = sys.executable
        largest_file = max(p.stat().st_size for p in source.iterdir())
        spark, _ = build_session(
            "local[2]",
            2,
            app_name="hotstate-bulk-load",
            # One file per task: Spark would pack the files into one task per core.
            conf={"spark.sql.files.maxPartitionBytes": str(largest_file + 1)},
        )
        hs.register(spark)
        clients: list[subprocess.Popen[str]] = []  # the lookup clients, stopped whatever happens
        try:
            asyncio.run(cluster.wait_ready(30))

            async def create() -> None:
                # Made before the load so that lookups have a table from the start; the writer finds it
                # with the definition it asks for.
                async with cluster.admin(request_timeout_s=5.0) as admin:
                    made = await admin.create_table(
                        TABLE, partitions=PARTITIONS, standby_replicas=1, key_columns=KEY
                    )
                    assert made.error is ControllerError.NONE, made

            asyncio.run(create())
            frame = spark.read.parquet(str(source))
            frame.count()  # the files' footers read and the JVM warm before the clock starts
            tasks = frame.rdd.getNumPartitions()
            lookups = Lookups(cluster.http_addresses(), rows)
            clients.append(lookups.process)
            wait_quiet(QUIET_WAIT_S)
            before = cpu_sample()
            native = NativeLookups(cluster.http_addresses()[0], rows, root)
            clients.append(native.process)
            server_pids = [server.pid for server in cluster.servers if server.pid is not None]
            loops_before = loop_times(server_pids)
            cpu_before = cpu_by_part(os.getpid(), set(server_pids))
            started = time.perf_counter()
            (
                frame.write.format("hotstate")
                .mode("append")
                .option("table", TABLE)
                .option("key", "id")
                .option("partitions", PARTITIONS)
                .option("standbyReplicas", 1)
                .option("cluster", ",".join(f"{h}:{p}" for h, p in cluster.addresses()))
                .option("clusterId", cluster.cluster_id)
                .option("secret", cluster.secret)
                .save()
            )
            loaded = time.perf_counter()
            loops_after = loop_times(server_pids)
            cpu_after = cpu_by_part(os.getpid(), set(server_pids))
            asked = lookups.finish()
            native_lookups = native.finish()
            others = others_cores(before, cpu_sample())
            sync_s = asyncio.run(time_to_sync(cluster, loaded))
            with Client(cluster.http_addresses(), timeout_s=30.0) as client:
                counted = sum(
                    len(client.query(f"SELECT id FROM {TABLE} WHERE id = 'user-{i:010d}'").rows)
                    for i in random.Random(3).sample(range(rows), min(rows, 200))
                )
            load_s = loaded - started
            hotstate = {
                "rows": rows,
                "seconds": round(load_s, 2),
                "rows_per_s": round(rows / load_s),
                "spark_tasks": tasks,
                "replicas_in_sync_after_s": round(sync_s, 3),
                "bytes_on_disk_per_server": {
                    str(s.node_id): _bytes_under(s.directory(cluster.root)) for s in cluster.servers
                },
                "point_lookups_during_load": {
                    "count": len(asked["latencies"]),
                    "failed": asked["failures"],
                    "p50_ms": percentile(asked["latencies"], 0.5),
                    "p99_ms": percentile(asked["latencies"], 0.99),
                    "max_ms": percentile(asked["latencies"], 1.0),
                    # The server's own time (took_ms: from the query's start there to its answer), without
                    # the wait for its loop to read the request or for this client to get a CPU.
                    "server_took_p99_ms": percentile(asked["took"], 0.99),
                    "server_took_max_ms": percentile(asked["took"], 1.0),
                    "forwarded": len(asked["forwarded_took"]),
                    "forwarded_server_took_p99_ms": percentile(asked["forwarded_took"], 0.99),
                },
                # The same kind of lookups from wrk at one server, beside the Python client's (NativeLookups).
                "point_lookups_native_client_during_load": native_lookups,
                "loop_stall_max_ms_per_server": loop_stalls(cluster),
                # Each server's event loop over the load: its CPU and its time runnable but waiting for a
                # core (/proc/PID/schedstat): a lookup waits for the loop, and the loop waits for a core.
                "event_loop_cpu_and_core_wait_s_per_server": {
                    str(server.node_id): {
                        "cpu_s": round((after[0] - before[0]) / 1e9, 2),
                        "waited_for_a_core_s": round((after[1] - before[1]) / 1e9, 2),
                    }
                    for server, before, after in zip(cluster.servers, loops_before, loops_after, strict=True)
                },
                "cpu_s_during_load_by_part": dict(
                    sorted(
                        ((part, round(cpu_after[part] - cpu_before.get(part, 0.0), 1)) for part in cpu_after),
                        key=lambda item: -item[1],
                    )
                ),
                "sampled_keys_found": f"{counted} of {min(rows, 200)}",
                "other_processes_cores": others,
            }
            print("hotstate", hotstate, flush=True)
        finally:
            for client in clients:
                if client.poll() is None:
                    client.kill()
                    client.wait()
            spark.stop()
            for server in cluster.servers:
                cluster.stop(server)
    report = {
        "benchmark": "bulk load: Parquet -> Spark batch writer (append) -> 3 servers, 1 standby "
        "(see docstring)",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "note": "2 cores shared by Spark (local[2]), its Python workers, 3 servers and the lookups: "
        "numbers are for this machine only",
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "rows": rows,
        "row": "id (key, 15-char string), segment (string), score (double), visits (bigint), note "
        f"(65-char string): {row_bytes} bytes encoded (key + row)",
        "input_parquet_bytes": input_bytes,
        "input_written_s": round(input_s, 2),
        "seconds_total": round(time.perf_counter() - run_started, 1),
        "partitions": PARTITIONS,
        "baseline_single_rocksdb": baseline,
        "hotstate": hotstate,
        "ratio_vs_single_rocksdb": round(hotstate["rows_per_s"] / baseline["rows_per_s"], 3),
        "goals": {"ratio_vs_single_rocksdb": ">= 0.4", "point_lookup_p99_ms": "< 20"},
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=ROWS, help="rows loaded")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the JSON goes")
    parser.add_argument("--file-rows", type=int, default=FILE_ROWS, help="rows per Parquet file (a task)")
    parser.add_argument("--lookups-for", help=argparse.SUPPRESS)  # the lookup client's process (Lookups)
    args = parser.parse_args()
    if args.lookups_for:
        ask_lookups(args.lookups_for.split(","), args.rows)
    else:
        main(args.rows, args.out, args.file_rows)

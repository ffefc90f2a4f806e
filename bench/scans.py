"""Scans (filters on any column, COUNT(*), GROUP BY, top-n) on a local cluster -> bench/results/scans.json.

A local 3-server cluster (default configs) holds table `scans` (6 partitions, 1 standby, key `id` STRING,
2,000,000 rows of about 150 bytes: `clicks` 0-999, `category` one of 100, `amount` a float, `name` a
60-character string, `ts` a timestamp). Each query is asked through server 1's `/v1/query`, an unmeasured
warm-up run and then `--repeat` measured runs (the median is reported; `first_seconds` is the warm-up's
time: for the filter and the count with a WHERE, the scan that reads the rows and leaves each partition's
column copy behind at its replica, server/column_cache.py, which the measured runs then answer from):

1. filter:   SELECT id, clicks FROM scans WHERE clicks = 7               (a non-key filter, 0.1% match)
2. count:    SELECT COUNT(*) FROM scans                                   (no row decoded)
3. count_where: SELECT COUNT(*) FROM scans WHERE amount >= 0             (every row decoded and tested)
4. group:    SELECT category, SUM(clicks) FROM scans GROUP BY category   (100 groups)
5. top10:    SELECT id, amount FROM scans ORDER BY amount DESC LIMIT 10

`rows_scanned_per_s_per_server` is the table's rows over the answer's time over the servers that served
(each serves the partitions it is active for). Beside them, in the same run:
- `bare_loop`: one Python process over one local RocksDB (rocksdict) holding all the rows under the same
  encoded keys: iterate, decode with hotstate's row codec in chunks of 1,000, and answer the same question
  with plain Python (a comparison, a counter, a dict of sums, heapq.nlargest).
- `in_process`: hotstate's own scan steps (`LocalReads`, the replica's code: decode only the program's
  columns, evaluate, partial aggregates) over one hotstate `Store` holding every row, timed in this one
  process beside the same bare loop over that store: the ratio without three servers sharing the cores.
  The rows are read each time there (no column copies); `column_copy` under the filter and the count with
  a WHERE is the same question on a server's defaults: the first scan (rows read, the copy built) and the
  best of the later ones (answered from the copy).
- `duckdb`: the same questions over a Parquet export of the same rows (pyarrow writes it), one thread and
  all threads, a warm-up run then the median of `--repeat` (skipped when duckdb is not installed: the
  bench extra has it).
- `lookups_during_group`: point lookups on server 1 (keys whose active is there) while two clients (each a
  process of its own, so that no GIL of theirs delays the lookups' client) run the GROUP BY in a loop:
  p50/p99/max latency, against the same lookups on an idle cluster. A scan of rows yields to the event loop
  every `query.scan.step.rows` rows and a scan from a copy is decided in the server's low-priority compute
  thread, so lookups should keep their latency (goal p99 < 10 ms); the servers' liveness is checked after
  it (no server fenced or marked down). `lookups_during_one_group_client`: the same with one client, a
  GROUP BY always running. `lookups_native_client`: the same three measurements with the lookups asked by
  wrk (`-t1 -c1`, one at a time, the same keys) instead of this Python process: on 2 cores shared by three
  servers and the scanning clients, the Python client's own waits for a core are part of its latency.

Goals (issue 27): >= 1M rows scanned/s per server for the filter and COUNT(*), >= 0.8x the bare loop, and
the 2M-row GROUP BY answered in < 1.5 s end to end.

    python bench/scans.py                 # full run, writes bench/results/scans.json
    python bench/scans.py --quick         # harness check: 50,000 rows, 1 repeat, writes to /tmp
    python bench/scans.py --quick --rows 20000   # a smaller harness check
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import heapq
import json
import multiprocessing
import os
import platform
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx

from hotstate.cli.local_cluster import LocalCluster
from hotstate.client.writer import TableWriter
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError
from hotstate.protocol.keys import encode_key, partition_for
from hotstate.protocol.rows import decode_rows, encode_row
from pull_queries import Children, wrk_json

TABLE = "scans"
PARTITIONS = 6
STANDBYS = 1
KEY = (KeyColumn("id", KeyType.STRING),)
WRITE_BATCH = 20_000
QUERIES = {
    "filter": "SELECT id, clicks FROM scans WHERE clicks = 7",
    "count": "SELECT COUNT(*) FROM scans",
    "count_where": "SELECT COUNT(*) FROM scans WHERE amount >= 0",
    "group": "SELECT category, SUM(clicks) FROM scans GROUP BY category",
    "top10": "SELECT id, amount FROM scans ORDER BY amount DESC LIMIT 10",
}
EPOCH = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


# The questions a partition's column copy answers (server/column_cache.py); a bare COUNT(*) is answered
# from any copy.
COPY_QUESTIONS = ("filter", "count_where", "group", "top10")


def row(i: int) -> dict[str, object]:
    return {
        "id": f"id-{i:09d}",
        "clicks": i * 7919 % 1000,
        "category": f"c{i % 100:02d}",
        "amount": (i * 104729 % 1_000_000) / 100,
        "name": f"name-{i:09d}-" + "x" * 46,
        "ts": EPOCH + dt.timedelta(seconds=i),
    }


# --- the cluster ------------------------------------------------------------------------------------------


async def start(root: Path, rows: int) -> tuple[LocalCluster, dict[str, float]]:
    cluster = LocalCluster.create(root / "cluster", 3)
    cluster.write_configs()
    cluster.save()
    cluster.start_all()
    await cluster.wait_ready(30)
    async with cluster.admin(request_timeout_s=2.0) as admin:
        reply = await admin.create_table(
            TABLE, partitions=PARTITIONS, standby_replicas=STANDBYS, key_columns=KEY
        )
        assert reply.error is ControllerError.NONE, reply
    started = time.monotonic()
    async with TableWriter(
        cluster.addresses(), TABLE, cluster_id=cluster.cluster_id, secret=cluster.secret
    ) as w:
        for first in range(0, rows, WRITE_BATCH):
            await w.upsert([row(i) for i in range(first, min(rows, first + WRITE_BATCH))])
    return cluster, {"write_s": time.monotonic() - started}


def http(cluster: LocalCluster, node: int) -> str:
    server = next(s for s in cluster.servers if s.node_id == node)
    return f"http://127.0.0.1:{server.http_port}"


def wait_caught_up(base: str, rows: int, timeout_s: float = 300.0) -> None:
    """Until every replica of the table reports lag 0 (standbys included), so that each answer reads all."""
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        reply = httpx.post(
            f"{base}/v1/query", json={"sql": "SELECT COUNT(*) FROM scans", "max_lag": 0}, timeout=60
        )
        if reply.status_code == 200 and reply.json()["rows"] == [[rows]]:
            return
        time.sleep(0.5)
    raise TimeoutError("the table's replicas did not catch up")


def measure(base: str, sql: str, repeat: int) -> dict[str, Any]:
    times: list[float] = []
    answer: dict[str, Any] = {}
    first = 0.0
    with httpx.Client(timeout=120.0) as client:
        for attempt in range(repeat + 1):
            started = time.perf_counter()
            reply = client.post(f"{base}/v1/query", json={"sql": sql, "timeout_ms": 120_000})
            elapsed = time.perf_counter() - started
            if reply.status_code != 200:
                return {"error": f"{reply.status_code}: {reply.text[:300]}"}
            answer = reply.json()
            if attempt:  # the first is the warm-up (and builds the column copies of a filter)
                times.append(elapsed)
            else:
                first = elapsed
    servers = {p["served_by"] for p in answer["partitions"]}
    return {
        "seconds_median": statistics.median(times),
        "seconds": times,
        "first_seconds": first,
        "rows_returned": len(answer["rows"]),
        "served_by": sorted(servers),
        "first_rows": answer["rows"][:3],
    }


def lookups(base: str, keys: list[str], seconds: float) -> dict[str, float]:
    """Latency at this client, and `took_ms` as the server reports it (from the query's start at the
    server to its answer: without the wait for the server's loop to read the request, or for this client)."""
    latencies: list[float] = []
    took: list[float] = []
    end = time.monotonic() + seconds
    with httpx.Client(timeout=10.0) as client:
        i = 0
        while time.monotonic() < end:
            key = keys[i % len(keys)]
            i += 1
            started = time.perf_counter()
            reply = client.post(f"{base}/v1/query", json={"sql": f"SELECT * FROM scans WHERE id = '{key}'"})
            latencies.append(time.perf_counter() - started)
            assert reply.status_code == 200, reply.text[:300]
            took.append(reply.json()["took_ms"])
    latencies.sort()
    took.sort()
    return {
        "n": len(latencies),
        "p50_ms": latencies[len(latencies) // 2] * 1000,
        "p99_ms": latencies[int(len(latencies) * 0.99)] * 1000,
        "max_ms": latencies[-1] * 1000,
        "server_took_p99_ms": took[int(len(took) * 0.99)],
        "server_took_max_ms": took[-1],
    }


def _scan_loop(base: str, sql: str, stop: Any, answered: Any, failed: Any) -> None:
    """A client asking `sql` again and again until `stop` is set (in a process of its own)."""
    with httpx.Client(timeout=120.0) as client:
        while not stop.is_set():
            status = client.post(f"{base}/v1/query", json={"sql": sql, "timeout_ms": 120_000}).status_code
            with (answered if status == 200 else failed).get_lock():
                (answered if status == 200 else failed).value += 1


def lookups_native(base: str, keys: list[str], seconds: float) -> dict[str, float]:
    """The same lookups from wrk (`-t1 -c1`: one at a time, as `lookups` asks them), a native client: no
    Python process of the measuring side waits for one of the 2 cores between a lookup's send and its
    answer's read, so the latency is more the server's (and the kernel's)."""
    children = Children()
    with tempfile.TemporaryDirectory(prefix="hotstate-wrk-") as scratch:
        bodies = Path(scratch) / "bodies"
        bodies.write_text(
            "".join(json.dumps({"sql": f"SELECT * FROM scans WHERE id = '{key}'"}) + "\n" for key in keys)
        )
        try:
            duration_s = max(1, round(seconds))
            raw = wrk_json(
                children, base, "/v1/query", bodies, 1, duration_s, row_marker='"id-', timeout="10s"
            )
        finally:
            children.stop_all()
    assert raw["non2xx"] == 0 and raw["rows"] == raw["requests"], raw
    latency = raw["latency_us"]
    return {
        "n": raw["requests"],
        "p50_ms": latency["p50"] / 1000,
        "p99_ms": latency["p99"] / 1000,
        "max_ms": latency["max"] / 1000,
    }


def lookups_during(
    base: str,
    keys: list[str],
    sql: str,
    seconds: float,
    clients: int = 2,
    measure: Callable[[str, list[str], float], dict[str, float]] = lookups,
) -> dict[str, Any]:
    # The scanning clients are processes of their own: as threads of this one, each answer they parse would
    # hold the GIL the lookups' client waits for (up to the 5 ms switch interval), which is not the server.
    context = multiprocessing.get_context("fork")
    stop = context.Event()
    answered, failed = context.Value("i", 0), context.Value("i", 0)
    scanners = [
        context.Process(target=_scan_loop, args=(base, sql, stop, answered, failed)) for _ in range(clients)
    ]
    for scanner in scanners:
        scanner.start()
    try:
        time.sleep(0.5)
        measured = measure(base, keys, seconds)
    finally:
        stop.set()
        for scanner in scanners:
            scanner.join()
    return {**measured, "clients": clients, "scans_answered": {"200": answered.value, "other": failed.value}}


def local_keys(base: str, node: int, count: int = 200) -> list[str]:
    tables = httpx.get(f"{base}/v1/tables").json()["tables"]
    placement = next(t for t in tables if t["name"] == TABLE)["placement"]
    mine = {p["partition"] for p in placement if p["active"] == node}
    keys: list[str] = []
    i = 0
    while len(keys) < count:
        key = f"id-{i:09d}"
        if partition_for(encode_key((key,)), PARTITIONS) in mine:
            keys.append(key)
        i += 1
    return keys


# --- baselines -------------------------------------------------------------------------------------------


def bare_loop(root: Path, rows: int) -> dict[str, Any]:
    """The same questions answered by a plain loop over one local RocksDB holding every row."""
    from rocksdict import Rdict

    db = Rdict(str(root / "bare"))
    for first in range(0, rows, WRITE_BATCH):
        for i in range(first, min(rows, first + WRITE_BATCH)):
            value = row(i)
            db[encode_key((value["id"],))] = encode_row(value)
    db.flush()

    def chunks() -> Iterator[list[dict[str, object]]]:
        batch: list[bytes] = []
        for _, data in db.items():
            batch.append(data)
            if len(batch) == 1000:
                yield decode_rows(batch)
                batch = []
        if batch:
            yield decode_rows(batch)

    def filter_() -> object:
        return sum(1 for chunk in chunks() for r in chunk if r["clicks"] == 7)

    def count() -> object:
        return sum(1 for _ in db.keys())  # noqa: SIM118 - rocksdict: keys without reading values

    def count_where() -> object:
        return sum(1 for chunk in chunks() for r in chunk if r["amount"] >= 0)  # type: ignore[operator]

    def group() -> object:
        sums: dict[object, int] = {}
        for chunk in chunks():
            for r in chunk:
                sums[r["category"]] = sums.get(r["category"], 0) + r["clicks"]  # type: ignore[operator]
        return len(sums)

    def top10() -> object:
        return heapq.nlargest(10, (r["amount"] for chunk in chunks() for r in chunk))  # type: ignore[type-var]

    questions: dict[str, Callable[[], object]] = {
        "filter": filter_,
        "count": count,
        "count_where": count_where,
        "group": group,
        "top10": top10,
    }
    out: dict[str, Any] = {}
    for name, question in questions.items():
        started = time.perf_counter()
        question()
        elapsed = time.perf_counter() - started
        out[name] = {"seconds": elapsed, "rows_per_s": rows / elapsed}
    db.close()
    return out


def in_process(root: Path, rows: int, repeat: int) -> dict[str, Any]:
    """hotstate's replica scan steps over one Store, beside the bare loop over the same store, in this
    process: CPU seconds (process time, so other processes on the machine count less), best of `repeat`,
    and the longest step (thread CPU time) against query.scan.step.rows/ms."""
    from hotstate.query.scan import program_for, spec_of_conditions
    from hotstate.query.sql import parse
    from hotstate.replica.messages import PartitionQueryRequest, PartitionQueryResponse, ReplicaError
    from hotstate.replica.store import Store
    from hotstate.routing.lags import LagTable
    from hotstate.server.serving import LocalReads

    store = Store.open(root / "in-process")
    position = 0
    for first in range(0, rows, WRITE_BATCH):
        batch = [row(i) for i in range(first, min(rows, first + WRITE_BATCH))]
        position += 1
        store.apply(sorted((encode_key((r["id"],)), encode_row(r)) for r in batch), position, 1)

    def local_reads(cache_bytes: int) -> LocalReads:
        reads = LocalReads(
            1,
            image=dict,
            replicas=dict,
            lags=LagTable(),
            on_store_failure=lambda r, e: None,  # type: ignore[arg-type]
            scan_cache_bytes=cache_bytes,
        )
        replica = type("Replica", (), {"store": store, "pid": (1, 0)})()
        reads._checked = lambda request: (replica, "active", position, 0)  # type: ignore[method-assign]
        return reads

    # Reading the rows (no column copies), and a server's default: a filter's copy built by its first scan.
    reads, cached = local_reads(0), local_reads(256 * 1024 * 1024)
    cached.load_column_engine()  # a server loads it in a thread at its first scan that could use a copy

    def request(sql: str) -> PartitionQueryRequest:
        query = parse(sql)
        spec = query.scan or spec_of_conditions(query.conditions, query.columns)
        program = program_for(spec, query.limit, 10_000).encode()
        return PartitionQueryRequest(TABLE, 0, (), True, None, None, None, None, 0, program=program)

    def scan(sql: str, reads: LocalReads = reads) -> tuple[float, int, float]:
        """The longest step on the loop and the steps, and the CPU of the work a server does off its loop
        (a copy's part, in its scan compute thread: here in place)."""
        longest, steps, off_loop = 0.0, 0, 0.0
        scan_steps = reads._scan_steps(request(sql))
        result: object = None
        started = time.thread_time()
        while True:
            answer = scan_steps.send(result)
            result = None
            now = time.thread_time()
            longest, steps = max(longest, now - started), steps + 1
            if isinstance(answer, PartitionQueryResponse):
                assert answer.error is ReplicaError.NONE, answer.message
                return longest, steps, off_loop
            if answer is not None:
                result = answer()
                off_loop += time.thread_time() - now
            started = time.thread_time()

    def best(question: Callable[[], object]) -> float:
        times = []
        for _ in range(max(repeat, 2)):
            started = time.process_time()
            question()
            times.append(time.process_time() - started)
        return min(times)

    bare = _bare_questions(store.scan_chunks)
    out: dict[str, Any] = {}
    for name, sql in QUERIES.items():
        bare_s = best(bare[name])
        hot_s = best(lambda sql=sql: scan(sql))  # type: ignore[misc]
        longest, steps, _ = scan(sql)
        out[name] = {
            "bare_cpu_s": bare_s,
            "hotstate_cpu_s": hot_s,
            "hotstate_vs_bare": bare_s / hot_s,
            "hotstate_rows_per_cpu_s": rows / hot_s,
            "steps": steps,
            "longest_step_ms": longest * 1000,
        }
        if name in COPY_QUESTIONS:
            started = time.process_time()
            scan(sql, cached)  # reads the rows and builds the copy
            build_s = time.process_time() - started
            copy_s = best(lambda sql=sql: scan(sql, cached))  # type: ignore[misc]
            copy_longest, copy_steps, off_loop = scan(sql, cached)
            out[name]["column_copy"] = {
                "first_scan_cpu_s": build_s,
                "first_scan_vs_rows": hot_s / build_s,
                "cpu_s": copy_s,
                "vs_bare": bare_s / copy_s,
                "rows_per_cpu_s": rows / copy_s,
                "steps": copy_steps,
                "longest_step_ms": copy_longest * 1000,
                "off_loop_cpu_ms": off_loop * 1000,
            }
    store.close()
    return out


def _bare_questions(scan_chunks: Callable[..., Iterator[list[Any]]]) -> dict[str, Callable[[], object]]:
    """The bare loop's questions over a store's chunks (`Store.scan_chunks`): decode whole rows, plain
    Python."""

    def chunks() -> Iterator[list[dict[str, object]]]:
        for chunk in scan_chunks(None, None, 1000):
            yield decode_rows([data for _, data in chunk])

    def group() -> object:
        sums: dict[object, int] = {}
        for chunk in chunks():
            for r in chunk:
                sums[r["category"]] = sums.get(r["category"], 0) + r["clicks"]  # type: ignore[operator]
        return len(sums)

    return {
        "filter": lambda: sum(1 for chunk in chunks() for r in chunk if r["clicks"] == 7),
        "count": lambda: sum(map(len, scan_chunks(None, None, 1000, keys_only=True))),
        "count_where": lambda: sum(1 for chunk in chunks() for r in chunk if r["amount"] >= 0),  # type: ignore[operator]
        "group": group,
        "top10": lambda: heapq.nlargest(10, (r["amount"] for chunk in chunks() for r in chunk)),  # type: ignore[type-var]
    }


def duckdb_baseline(root: Path, rows: int, repeat: int) -> dict[str, Any]:
    try:
        import duckdb
    except ImportError:
        return {"skipped": "duckdb is not installed (pip install -e '.[bench]')"}
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = root / "scans.parquet"
    writer: pq.ParquetWriter | None = None
    for first in range(0, rows, 100_000):
        batch = pa.Table.from_pylist([row(i) for i in range(first, min(rows, first + 100_000))])
        if writer is None:
            writer = pq.ParquetWriter(path, batch.schema)
        writer.write_table(batch)
    assert writer is not None
    writer.close()
    out: dict[str, Any] = {"version": duckdb.__version__, "parquet_bytes": path.stat().st_size}
    for threads in (1, os.cpu_count() or 1):
        connection = duckdb.connect()
        connection.execute(f"SET threads TO {threads}")
        for name, sql in QUERIES.items():
            query = sql.replace("FROM scans", f"FROM read_parquet('{path}')")
            times = []
            for attempt in range(repeat + 1):
                started = time.perf_counter()
                answer = connection.execute(query).fetchall()
                if attempt:  # the first is the warm-up
                    times.append(time.perf_counter() - started)
            elapsed = statistics.median(times)
            out.setdefault(name, {})[f"threads_{threads}"] = {
                "seconds": elapsed,
                "rows_per_s": rows / elapsed,
                "rows_returned": len(answer),
            }
        connection.close()
    return out


# --- main ------------------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=2_000_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--quick", action="store_true", help="50,000 rows, 1 repeat, results to /tmp")
    args = parser.parse_args()
    if args.quick:
        rows = 50_000 if args.rows == parser.get_default("rows") else args.rows
        repeat = 1
    else:
        rows, repeat = args.rows, args.repeat
    out_dir = Path(tempfile.gettempdir()) if args.quick else Path(__file__).parent / "results"
    with tempfile.TemporaryDirectory(prefix="hotstate-scans-") as scratch:
        root = Path(scratch)
        cluster: LocalCluster | None = None
        try:
            cluster, setup = asyncio.run(start(root, rows))
            base = http(cluster, 1)
            wait_caught_up(base, rows)
            results: dict[str, Any] = {}
            for name, sql in QUERIES.items():
                measured = measure(base, sql, repeat)
                if "seconds_median" in measured:
                    per_server = rows / measured["seconds_median"] / max(1, len(measured["served_by"]))
                    measured["rows_scanned_per_s_per_server"] = per_server
                results[name] = {"sql": sql, **measured}
            keys = local_keys(base, 1)
            idle = lookups(base, keys, 3.0)
            during = lookups_during(base, keys, QUERIES["group"], 5.0)
            during_one = lookups_during(base, keys, QUERIES["group"], 5.0, clients=1)
            native = {
                "idle": lookups_native(base, keys, 3.0),
                "during_group": lookups_during(base, keys, QUERIES["group"], 5.0, measure=lookups_native),
                "during_one_group_client": lookups_during(
                    base, keys, QUERIES["group"], 5.0, clients=1, measure=lookups_native
                ),
            }
            status = httpx.get(f"{base}/clusterStatus", timeout=5.0).json()["clusterStatus"]
            alive = {v["serverId"]: v["hostAlive"] for v in status.values()}
        finally:
            if cluster is not None:
                for server in cluster.servers:
                    cluster.signal(server, signal.SIGKILL)
        bare = bare_loop(root, rows)
        local = in_process(root, rows, repeat)
        duck = duckdb_baseline(root, rows, repeat)
    goals = {
        "filter_1M_rows_per_s_per_server": results["filter"].get("rows_scanned_per_s_per_server", 0) >= 1e6,
        "count_1M_rows_per_s_per_server": results["count_where"].get("rows_scanned_per_s_per_server", 0)
        >= 1e6,
        "group_under_1_5_s": results["group"].get("seconds_median", 99.0) < 1.5,
        "lookups_p99_under_10_ms_during_group": during["p99_ms"] < 10.0,
        "lookups_p99_under_10_ms_during_group_native_client": native["during_group"]["p99_ms"] < 10.0,
        "vs_bare_loop_0_8x": {
            name: results[name].get("rows_scanned_per_s_per_server", 0) >= 0.8 * bare[name]["rows_per_s"]
            for name in QUERIES
        },
        "in_process_vs_bare_loop_0_8x": {name: local[name]["hotstate_vs_bare"] >= 0.8 for name in QUERIES},
    }
    report = {
        "benchmark": "scans: filters on any column, COUNT(*), GROUP BY, top-10 (issue 27)",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "load_average_1m": os.getloadavg()[0],
        "python": platform.python_version(),
        "rows": rows,
        "row_bytes": len(encode_row(row(0))),
        "setup": setup,
        "results": results,
        "lookups_idle": idle,
        "lookups_during_group": during,
        "lookups_during_one_group_client": during_one,
        "lookups_native_client": native,
        "servers_alive_after": alive,
        "bare_loop": bare,
        "in_process": local,
        "duckdb": duck,
        "goals": goals,
    }
    path = out_dir / "scans.json"
    path.write_text(json.dumps(report, indent=2, default=str) + "\n")
    print(json.dumps(goals, indent=2))
    print(f"wrote {path}", file=sys.stderr)


if __name__ == "__main__":
    main()

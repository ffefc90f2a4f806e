"""`make demo`: the main job, end to end.

A local 3-server cluster (racks az-a, az-b, az-c); a clickstream generator dropping JSON files into a
folder; a PySpark Structured Streaming pipeline (clicks and last-seen per user) materialized into hotstate
(8 partitions, 1 standby) while files keep arriving; in the same SparkSession, the bundled sample clicks
(examples/data/clicks) counted per user in 10-minute windows with a watermark into a windowed table, which
pull queries read by key (all its windows, in start order) and by key and WINDOWSTART range, the table
checked against a batch groupBy of the same files; pull queries through one server showing who served
each and its lag; kill -9 of the server holding the most actives; queries still answered (by standbys) and
how long the reroute took; the controller moving the actives; the killed server restarted, catching up
and getting its share of actives back from the controller's assignor; then a summary: events/s,
freshness p50/p99 (file landed -> visible to a pull query), query latency, failed queries. Every process
it starts is stopped at the end, also on Ctrl-C.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import json
import os
import random
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql import SparkSession
from rich.console import Console
from rich.table import Table

import hotstate
from hotstate.cli.local_cluster import LocalCluster, LocalServer
from hotstate.protocol.replica_state import ReplicaState

console = Console(width=min(130, shutil.get_terminal_size((130, 24)).columns))
TABLE = "clicks_per_user"
USERS = 2_000
EVENTS_PER_FILE = 400
FILE_EVERY_S = 0.5
# The windowed step: the bundled clicks (examples/data/clicks) counted per user in 10-minute windows.
WINDOWED_TABLE = "clicks_per_user_10m"
WINDOW = "10 minutes"
WINDOW_USER = "ana"
WINDOW_RANGE = ("2026-11-01T09:10:00", "2026-11-01T09:50:00")  # WINDOWSTART >= first AND < second
# Streaming before the kill and after it; HOTSTATE_DEMO_SECONDS shortens both (the test suite uses it).
WARM_S = float(os.environ.get("HOTSTATE_DEMO_SECONDS", "14"))
AFTER_KILL_S = WARM_S


@dataclass
class Stats:
    events: int = 0
    files: int = 0
    landed: dict[str, float] = field(default_factory=dict)  # probe user -> when its file landed
    freshness_ms: list[float] = field(default_factory=list)
    # (when the file landed, its freshness in ms): to leave out the start-up batches.
    freshness_at: list[tuple[float, float]] = field(default_factory=list)
    query_ms: list[float] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    served: Counter[ReplicaState] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)


def generate(folder: Path, staging: Path, stats: Stats, stop: threading.Event) -> None:
    """Clicks into JSON files, each written aside and renamed in (Spark's file source sees whole files).
    Each file carries one probe user whose arrival in hotstate times the freshness."""
    rng = random.Random(7)
    urls = [f"/item/{i}" for i in range(200)]
    while not stop.is_set():
        n = stats.files
        probe = f"probe-{n:05d}"
        now = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")
        lines = []
        for _ in range(EVENTS_PER_FILE):
            user = f"u{int(rng.paretovariate(1.2)) % USERS:04d}"
            lines.append({"user": user, "url": rng.choice(urls), "ts": now})
        lines.append({"user": probe, "url": "/probe", "ts": now})
        tmp = staging / f"clicks-{n:05d}.json"
        tmp.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
        os.replace(tmp, folder / tmp.name)
        with stats.lock:
            stats.landed[probe] = time.monotonic()
            stats.files += 1
            stats.events += len(lines)
        stop.wait(FILE_EVERY_S)


def _batch_started(progress: Mapping[str, Any]) -> float:
    """When a micro-batch (a progress report) started, as a Unix time."""
    return dt.datetime.fromisoformat(progress["timestamp"].replace("Z", "+00:00")).timestamp()


def batch_spanning(progress: Sequence[Mapping[str, Any]], at: float) -> float | None:
    """The duration (ms) of the micro-batch running at wall time `at`, else of the first one after it."""
    after = None
    for p in progress:
        started = _batch_started(p)
        duration = float(p["durationMs"].get("triggerExecution", 0))
        if started <= at < started + duration / 1000:
            return duration
        if started > at and after is None:
            after = duration
    return after


def watch_freshness(client: hotstate.Client, stats: Stats, stop: threading.Event) -> None:
    """Poll for the probes of landed files; freshness = landed -> visible to a pull query."""
    while not stop.is_set():
        with stats.lock:
            pending = dict(stats.landed)
        if pending:
            keys = ", ".join(f"'{k}'" for k in list(pending)[:50])
            try:
                result = client.query(f"SELECT user FROM {TABLE} WHERE user IN ({keys})", timeout_ms=2000)
            except Exception:
                result = None
            now = time.monotonic()
            if result is not None:
                with stats.lock:
                    for (user,) in result.rows:
                        landed = stats.landed.pop(str(user), None)
                        if landed is not None:
                            stats.freshness_ms.append((now - landed) * 1000)
                            stats.freshness_at.append((landed, (now - landed) * 1000))
        stop.wait(0.025)


def query_loop(client: hotstate.Client, stats: Stats, stop: threading.Event, seed: int) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        user = f"u{rng.randrange(USERS):04d}"
        started = time.monotonic()
        try:
            result = client.query(f"SELECT * FROM {TABLE} WHERE user = '{user}'", timeout_ms=3000)
        except Exception as error:
            with stats.lock:
                stats.failures.append(f"{type(error).__name__}: {error}")
            continue
        with stats.lock:
            stats.query_ms.append((time.monotonic() - started) * 1000)
            for part in result.partitions:
                stats.served[part.state] += 1
        stop.wait(0.01)


def sample_clicks() -> Path:
    """The bundled sample clicks: examples/data/clicks of the source tree hotstate runs from (`make demo`
    installs it editable), else of the working directory."""
    for root in (Path(__file__).resolve().parents[3], Path.cwd()):
        folder = root / "examples" / "data" / "clicks"
        if any(folder.glob("*.json")):
            return folder
    raise FileNotFoundError("examples/data/clicks (the sample clicks): run the demo from the repository")


@dataclass
class Windowed:
    """The windowed step's answers: (WINDOWSTART, WINDOWEND, count) in the order each query gave them."""

    lookup: list[tuple[dt.datetime, dt.datetime, int]]
    in_range: list[tuple[dt.datetime, dt.datetime, int]]
    windows: int  # in the table
    users: int
    matches_batch: bool  # the table equals a batch groupBy of the same files
    seconds: float


def _utc(value: object) -> dt.datetime:
    """A window bound as the answer's JSON (ISO text, naive meaning UTC) or Spark's collect (a naive
    datetime in local time) gives it, as an aware UTC datetime."""
    if isinstance(value, str):
        parsed = dt.datetime.fromisoformat(value)
        return parsed.replace(tzinfo=dt.UTC) if parsed.tzinfo is None else parsed.astimezone(dt.UTC)
    assert isinstance(value, dt.datetime)
    return value.astimezone(dt.UTC)  # a naive datetime's astimezone reads it as local time


def _windows(result: hotstate.QueryResult) -> list[tuple[dt.datetime, dt.datetime, int]]:
    return [(_utc(r["WINDOWSTART"]), _utc(r["WINDOWEND"]), int(r["count"])) for r in result.dicts()]


def windowed_step(
    spark: SparkSession, cluster: LocalCluster, client: hotstate.Client, root: Path
) -> Windowed:
    """The sample clicks through `groupBy(window(ts, 10 minutes), user).count()` with a watermark into a
    windowed table (availableNow: every file, then the query stops), then pull queries by window."""
    from pyspark.sql import functions as F

    from hotstate.spark import last_batch, materialize

    started = time.monotonic()
    folder = sample_clicks()
    schema = "user STRING, url STRING, ts TIMESTAMP"
    clicks = spark.readStream.schema(schema).json(str(folder)).withWatermark("ts", "30 minutes")
    counts = clicks.groupBy(F.window("ts", WINDOW), "user").count()
    query = materialize(
        counts,
        WINDOWED_TABLE,
        key=["user", "window"],
        partitions=4,
        standby_replicas=1,
        cluster=",".join(f"127.0.0.1:{s.rpc_port}" for s in cluster.servers),
        cluster_id=cluster.cluster_id,
        secret=cluster.secret,
        checkpoint=str(root / "checkpoints" / WINDOWED_TABLE),
        trigger={"availableNow": True},
    )
    console.print(
        f"\nwindowed pipeline: {folder.name}/*.json (bundled sample) -> withWatermark(ts, 30 minutes) -> "
        f"groupBy(window(ts, {WINDOW}), user).count() -> materialize({WINDOWED_TABLE!r}, availableNow)"
    )
    query.awaitTermination(120)
    if query.exception() is not None:
        raise RuntimeError(f"the windowed query failed: {_first_line(query.exception())}")
    batch = last_batch(query)
    by_key = f"SELECT * FROM {WINDOWED_TABLE} WHERE user = '{WINDOW_USER}'"
    ranged = f"{by_key} AND WINDOWSTART >= '{WINDOW_RANGE[0]}' AND WINDOWSTART < '{WINDOW_RANGE[1]}'"
    lookup = client.query(by_key, min_batch=batch, timeout_ms=5000)
    in_range = client.query(ranged, min_batch=batch, timeout_ms=5000)
    everything = client.query(f"SELECT * FROM {WINDOWED_TABLE}", min_batch=batch, timeout_ms=5000)
    stored = {(str(r["user"]), _utc(r["WINDOWSTART"])): int(r["count"]) for r in everything.dicts()}
    # The same files, the same aggregation, as one batch job in this session: what the table must hold.
    expected = {
        (str(r["user"]), _utc(r["window"]["start"])): int(r["count"])
        for r in spark.read.schema(schema)
        .json(str(folder))
        .groupBy(F.window("ts", WINDOW), "user")
        .count()
        .collect()
    }
    table = Table(title=f"pull queries on the windowed table {WINDOWED_TABLE}", title_justify="left")
    for column in ("query", "WINDOWSTART (UTC)", "WINDOWEND", "count", "partition", "served by"):
        table.add_column(column)
    for label, result in ((f"user = '{WINDOW_USER}'", lookup), (range_label(), in_range)):
        part = result.partitions[0] if result.partitions else None
        for index, (start, end, count) in enumerate(_windows(result)):
            table.add_row(
                label if index == 0 else "",
                start.strftime("%Y-%m-%d %H:%M"),
                end.strftime("%H:%M"),
                str(count),
                str(part.partition) if part else "-",
                f"server {part.served_by}" if part else "-",
            )
    console.print(table)
    return Windowed(
        lookup=_windows(lookup),
        in_range=_windows(in_range),
        windows=len(stored),
        users=len({user for user, _ in stored}),
        matches_batch=stored == expected,
        seconds=time.monotonic() - started,
    )


def range_label() -> str:
    return f"... AND WINDOWSTART in [{WINDOW_RANGE[0][11:16]}, {WINDOW_RANGE[1][11:16]})"


def _shown(windows: list[tuple[dt.datetime, dt.datetime, int]]) -> str:
    """Windows as `09:00=2 09:10=1`: start (UTC) and count, in the answer's order."""
    return " ".join(f"{start:%H:%M}={count}" for start, _, count in windows) or "-"


def spark_session() -> SparkSession:
    from hotstate.spark.pipeline import build_session

    # shuffle partitions 2: measured, 200 costs 7-16 s per tiny batch on 2 cores.
    spark, _ = build_session("local[2]", 2, app_name="hotstate-demo")
    spark.conf.set("spark.hotstate.rack", "az-a")  # the writers' rack (KIP-925's traffic cost)
    return spark


def show_queries(client: hotstate.Client, users: list[str]) -> None:
    table = Table(title="pull queries", title_justify="left")
    for column in ("user", "clicks", "last_seen", "partition", "served by", "state", "lag"):
        table.add_column(column)
    for user in users:
        result = client.query(f"SELECT * FROM {TABLE} WHERE user = '{user}'", timeout_ms=3000)
        part = result.partitions[0]
        for row in result.dicts():
            table.add_row(
                str(row["user"]),
                str(row["clicks"]),
                str(row["last_seen"])[:19],
                str(part.partition),
                f"server {part.served_by}",
                part.state,
                str(part.offset_lag),
            )
    console.print(table)


def placement(client: hotstate.Client) -> dict[int, dict[str, object]]:
    tables = client.tables()
    table = next(t for t in tables if t["name"] == TABLE)
    return {int(p["partition"]): p for p in table["placement"]}


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(fraction * (len(ordered) - 1)))] if ordered else float("nan")


def run(root: Path) -> bool:
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType, TimestampType

    from hotstate.spark import materialize

    started = time.monotonic()
    console.rule("[bold]hotstate demo: a PySpark pipeline materialized into a highly available table")
    cluster = LocalCluster.create(root / "cluster", 3)
    cluster.write_configs()
    cluster.save()
    cluster.start_all()
    stop = threading.Event()
    threads: list[threading.Thread] = []
    query = None
    spark = None
    try:
        with console.status("starting 3 servers (racks az-a, az-b, az-c) and Spark (local[2])"):
            asyncio.run(cluster.wait_ready(60))
            spark = spark_session()
        console.print(f"cluster up, Spark up ({time.monotonic() - started:.0f} s)")
        first, *others = cluster.servers
        console.print(
            f"[bold]console[/bold] (live while the demo runs): http://127.0.0.1:{first.http_port}/ui; every "
            f"server serves one (ports {', '.join(str(s.http_port) for s in others)})"
        )
        folder, staging = root / "data" / "clicks", root / "data" / "staging"
        folder.mkdir(parents=True)
        staging.mkdir(parents=True)
        stats = Stats()
        schema = StructType(
            [
                StructField("user", StringType()),
                StructField("url", StringType()),
                StructField("ts", TimestampType()),
            ]
        )
        clicks = spark.readStream.schema(schema).option("maxFilesPerTrigger", 20).json(str(folder))
        per_user = clicks.groupBy("user").agg(F.count("*").alias("clicks"), F.max("ts").alias("last_seen"))
        rpc = ",".join(f"127.0.0.1:{s.rpc_port}" for s in cluster.servers)
        query = materialize(
            per_user,
            TABLE,
            key="user",
            partitions=8,
            standby_replicas=1,
            acceptable_lag=1000,
            cluster=rpc,
            cluster_id=cluster.cluster_id,
            secret=cluster.secret,
            checkpoint=str(root / "checkpoints" / TABLE),
        )
        console.print(
            "pipeline: clicks/*.json -> groupBy(user).agg(count, max(ts)) -> "
            f"materialize({TABLE!r}, partitions=8, standby_replicas=1)"
        )
        threads.append(threading.Thread(target=generate, args=(folder, staging, stats, stop), daemon=True))
        threads[-1].start()
        http = [f"127.0.0.1:{s.http_port}" for s in cluster.servers]
        with hotstate.Client(http) as probe_client:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if probe_client.query(f"SELECT * FROM {TABLE} LIMIT 1").rows:
                        break
                except Exception:
                    pass
                time.sleep(0.2)
            actives = Counter(p["active"] for p in placement(probe_client).values())
        victim_id = actives.most_common(1)[0][0]
        victim: LocalServer = next(s for s in cluster.servers if s.node_id == victim_id)
        receiver = next(s for s in cluster.servers if s.node_id != victim_id)
        client = hotstate.Client(f"127.0.0.1:{receiver.http_port}")
        threads.append(threading.Thread(target=watch_freshness, args=(client, stats, stop), daemon=True))
        threads += [
            threading.Thread(
                target=query_loop, args=(hotstate.Client(client.servers), stats, stop, s), daemon=True
            )
            for s in range(2)
        ]
        for thread in threads[1:]:
            thread.start()
        console.print(
            f"queries go through server {receiver.node_id}; files keep arriving every {FILE_EVERY_S} s"
        )
        console.print(
            f"[bold]console[/bold] of server {receiver.node_id}, which stays up: "
            f"http://127.0.0.1:{receiver.http_port}/ui (watch the kill there)"
        )
        # The windowed step runs while the stream warms up (the same SparkSession), so it adds little time.
        warming = time.monotonic()
        windowed = windowed_step(spark, cluster, client, root)
        time.sleep(max(0.0, WARM_S - (time.monotonic() - warming)))
        steady = time.monotonic()  # Spark's first batches (its Python workers starting) are behind
        show_queries(client, ["u0001", "u0002", "u0003", "u0010"])
        before = placement(client)
        moved = [p for p, info in before.items() if info["active"] == victim_id]
        keys = {p: next(f"u{i:04d}" for i in range(USERS) if _partition(f"u{i:04d}") == p) for p in moved}

        console.print(f"\n[red bold]kill -9 server {victim_id}[/red bold] (active of partitions {moved})")
        cluster.signal(victim, signal.SIGKILL)
        killed = time.monotonic()
        killed_wall = time.time()
        reroute = None
        while reroute is None and time.monotonic() - killed < 10:
            for partition, user in keys.items():
                try:
                    result = client.query(f"SELECT * FROM {TABLE} WHERE user = '{user}'", timeout_ms=2000)
                except Exception:
                    continue
                if result.partitions and result.partitions[0].served_by != victim_id:
                    reroute = time.monotonic() - killed
                    console.print(
                        f"partition {partition} answered by server {result.partitions[0].served_by} "
                        f"({result.partitions[0].state}) {reroute * 1000:.0f} ms after the kill"
                    )
                    break
        show_queries(client, [keys[p] for p in moved[:3]])
        moved_at = None
        while time.monotonic() - killed < 15:
            now = placement(client)
            if all(now[p]["active"] not in (victim_id, None) for p in moved):
                moved_at = time.monotonic() - killed
                break
            time.sleep(0.1)
        if moved_at is not None:
            console.print(
                f"the controller moved server {victim_id}'s actives {moved_at:.1f} s after the kill"
            )
        # Bring it back: it catches up from the others, rejoins the ISR, and the controller's assignor
        # gives it its share of actives again, each moved only to an in-sync replica (KIP-441).
        console.print(f"\n[green bold]restart server {victim_id}[/green bold]")
        cluster.start(victim)
        restarted = time.monotonic()
        back_at = None
        while time.monotonic() - restarted < 30:
            try:
                mine = sum(1 for info in placement(client).values() if info["active"] == victim_id)
            except Exception:
                mine = 0
            if mine:
                back_at = time.monotonic() - restarted
                console.print(
                    f"server {victim_id} caught up and holds {mine} active(s) again "
                    f"{back_at:.1f} s after its restart"
                )
                break
            time.sleep(0.1)
        time.sleep(max(0.0, AFTER_KILL_S - (time.monotonic() - killed)))
        show_queries(client, [keys[p] for p in moved[:3]])
        stop.set()
        for thread in threads:
            thread.join(timeout=5)
        elapsed = time.monotonic() - killed + WARM_S
        with stats.lock:
            summary = Table(
                title="summary (2 cores shared by 3 servers, Spark and this demo)", title_justify="left"
            )
            summary.add_column("measure")
            summary.add_column("value", justify="right")
            summary.add_row("events generated", f"{stats.events:,} in {stats.files} files")
            summary.add_row("events/s", f"{stats.events / elapsed:,.0f}")
            summary.add_row(
                "freshness p50 / p99 (file landed -> visible)", _p50_p99(stats.freshness_ms, "ms")
            )
            after_start = [ms for landed, ms in stats.freshness_at if landed >= steady]
            summary.add_row("... of files landed after start-up (kill included)", _p50_p99(after_start, "ms"))
            summary.add_row("pull query latency p50 / p99", _p50_p99(stats.query_ms, "ms"))
            summary.add_row("pull queries answered", f"{len(stats.query_ms):,} ({dict(stats.served)})")
            summary.add_row("failed pull queries", str(len(stats.failures)))
            summary.add_row(
                "reroute to a standby after the kill", f"{reroute * 1000:.0f} ms" if reroute else "-"
            )
            summary.add_row("actives moved by the controller after", f"{moved_at:.1f} s" if moved_at else "-")
            summary.add_row(
                "restarted server holds actives again after", f"{back_at:.1f} s" if back_at else "-"
            )
            summary.add_row("streaming query still active", str(query.isActive))
            summary.add_row(
                f"windowed table {WINDOWED_TABLE} (window {WINDOW})",
                f"{windowed.windows} windows of {windowed.users} users, "
                + ("equal to a batch groupBy" if windowed.matches_batch else "NOT equal to a batch groupBy")
                + f" ({windowed.seconds:.1f} s)",
            )
            summary.add_row(f"windows of {WINDOW_USER} (key only), start=count", _shown(windowed.lookup))
            summary.add_row(range_label(), _shown(windowed.in_range))
            progress = list(query.recentProgress)
            durations = [p["durationMs"].get("triggerExecution", 0) for p in progress]
            if durations:
                summary.add_row(
                    "micro-batch time p50 / max (last batches)",
                    f"{statistics.median(durations):.0f} / {max(durations):.0f} ms",
                )
                slowest = max(progress, key=lambda p: p["durationMs"].get("triggerExecution", 0))
                began = _batch_started(slowest)
                took = slowest["durationMs"].get("triggerExecution", 0)
                summary.add_row(
                    "slowest micro-batch, started (relative to the kill)",
                    f"{took:.0f} ms, {began - killed_wall:+.1f} s",
                )
                spanning = batch_spanning(progress, killed_wall)
                if spanning is not None:
                    summary.add_row(
                        "micro-batch spanning the kill (its writes failed over)",
                        f"{spanning:.0f} ms ({spanning - statistics.median(durations):+.0f} ms against p50)",
                    )
            console.print(summary)
            for failure in stats.failures[:5]:
                console.print(f"[red]failed: {failure}[/red]")
            if not query.isActive:
                console.print(f"[red]the streaming query stopped: {_first_line(query.exception())}[/red]")
            ok = not stats.failures and query.isActive and reroute is not None and windowed.matches_batch
        console.print(
            f"[green]demo finished in {time.monotonic() - started:.0f} s: no pull query failed[/green]"
            if ok
            else "[red]demo finished with failures[/red]"
        )
        return ok
    finally:
        stop.set()
        if query is not None:
            with contextlib.suppress(Exception):
                # Let a running micro-batch finish: stopping inside foreachBatch makes Spark dump a stack.
                deadline = time.monotonic() + 10
                while query.isActive and query.status.get("isTriggerActive") and time.monotonic() < deadline:
                    time.sleep(0.05)
                query.stop()
        if spark is not None:
            spark.stop()
        for server in cluster.servers:
            cluster.stop(server, timeout_s=10)


def _partition(user: str) -> int:
    from hotstate.protocol.keys import encode_key, partition_for

    return partition_for(encode_key((user,)), 8)


def _first_line(error: object) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:500] if text else "no error"


def _p50_p99(values: list[float], unit: str) -> str:
    if not values:
        return "-"
    return f"{statistics.median(values):.0f} / {percentile(values, 0.99):.0f} {unit}"


def main() -> int:
    root = Path(tempfile.mkdtemp(prefix="hotstate-demo-"))

    def interrupted(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, interrupted)
    try:
        return 0 if run(root) else 1
    except KeyboardInterrupt:
        console.print("[yellow]interrupted: stopping everything[/yellow]")
        return 130
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())

"""Write docs/benchmarks.md from bench/results/*.json, so prose and measured numbers never disagree.

Each benchmark gets a small formatter (its key numbers as a table, and what it is compared against);
a result file with no formatter, or whose shape its formatter no longer recognizes, gets a generic
listing of its numbers instead of failing the report. The output is a pure function of the result files:
`tests/docs/test_benchmarks_doc.py` checks that the committed docs/benchmarks.md equals it.

Run: `.venv/bin/python bench/report.py` (writes docs/benchmarks.md; `make bench` runs it last),
`--check` (exit 1 if docs/benchmarks.md is not what the results give), `--results DIR`, `--out FILE`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
RESULTS = BENCH / "results"
OUT = BENCH.parent / "docs" / "benchmarks.md"

# Keys describing the run rather than its results: shown in the run line, left out of generic listings.
RUN_KEYS = frozenset({"benchmark", "date", "cpu_count", "python", "platform", "note", "versions"})


@dataclass(frozen=True)
class Table:
    headers: Sequence[str]
    rows: Sequence[Sequence[object]]
    caption: str = ""


@dataclass(frozen=True)
class Section:
    compared_against: str
    tables: Sequence[Table]
    lines: Sequence[str] = field(default_factory=tuple)


Formatter = Callable[[Mapping[str, Any]], Section]


def fmt(value: object) -> str:
    """One cell: thousands separators, at most 3 decimals, yes/no, and a dash for nothing."""
    if value is None or value == "":
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, float):
        if abs(value) >= 1000:
            return f"{value:,.0f}"
        text = f"{value:.3f}".rstrip("0").rstrip(".")
        return "0" if text in ("", "-0") else text
    if isinstance(value, list | tuple):
        return " / ".join(fmt(v) for v in value)
    return str(value).replace("|", "\\|").replace("\n", " ")


def markdown_table(table: Table) -> list[str]:
    out = [f"*{table.caption}*", ""] if table.caption else []
    out.append("| " + " | ".join(table.headers) + " |")
    out.append("|" + "|".join("---" for _ in table.headers) + "|")
    out.extend("| " + " | ".join(fmt(cell) for cell in row) + " |" for row in table.rows)
    out.append("")
    return out


def load_average(data: Mapping[str, Any]) -> str:
    """Benchmarks record the 1-minute load average under several names (once, or before/after)."""
    parts = []
    for key, value in data.items():
        if not key.startswith("load_average"):
            continue
        when = key.removeprefix("load_average_1m").removeprefix("load_average").strip("_").replace("_", " ")
        if isinstance(value, list) and len(value) == 2:
            parts.append(f"{fmt(value[0])} before, {fmt(value[1])} after")
        else:
            parts.append(f"{fmt(value)} {when}".strip())
    return ", ".join(parts) if parts else "not recorded"


def run_line(data: Mapping[str, Any]) -> str:
    cores = data.get("cpu_count")
    return (
        f"Run: {fmt(cores) if cores is not None else 'core count not recorded'} cores, "
        f"{data.get('date') or 'date not recorded'}, load average (1 min) {load_average(data)}."
    )


# --- one formatter per benchmark -------------------------------------------------------------------


def assignor(data: Mapping[str, Any]) -> Section:
    rows = [
        (
            c["scenario"],
            c["partitions"],
            c["servers"],
            c["seconds"],
            c["baseline_seconds"],
            c["cross_rack_actives"],
            c["baseline_cross_rack_actives"],
            c["cost_ratio"],
        )
        for c in data["cells"]
    ]
    target = data.get("target", {})
    lines = []
    if target:
        lines.append(
            f"Target: {fmt(target['partitions'])} partitions on {fmt(target['servers'])} servers within "
            f"{fmt(target['seconds'])} s; measured {fmt(target['measured_seconds'])} s "
            f"(met: {fmt(target['met'])})."
        )
    return Section(
        "a rack-blind greedy least-loaded assignment of the same input in the same run (`baseline`); "
        "cost is KIP-925's (cross-rack traffic and moves), cost ratio = assignor / baseline.",
        [
            Table(
                (
                    "scenario",
                    "partitions",
                    "servers",
                    "assignor s",
                    "baseline s",
                    "cross-rack actives",
                    "baseline cross-rack",
                    "cost ratio",
                ),
                rows,
            )
        ],
        lines,
    )


def freshness(data: Mapping[str, Any]) -> Section:
    rows = [
        (
            s["offered_events_per_s"],
            s["hotstate_visible_p50_ms"],
            s["hotstate_visible_p99_ms"],
            s["noop_committed_p50_ms"],
            s["noop_committed_p99_ms"],
            s["visible_over_noop_committed_p50"],
            s["hotstate_achieved_events_per_s"],
            s["noop_achieved_events_per_s"],
            (s["hotstate_kept_up"], s["noop_kept_up"]),
            s.get("failed_pull_queries"),
        )
        for s in data["summary"]
    ]
    return Section(
        "the same Spark query with a no-op `foreachBatch` at the same offered rate (Spark alone): "
        "file landed -> visible to a pull query (hotstate) beside file landed -> batch committed (no-op).",
        [
            Table(
                (
                    "offered events/s",
                    "visible p50 ms",
                    "visible p99 ms",
                    "no-op committed p50 ms",
                    "no-op committed p99 ms",
                    "p50 ratio",
                    "hotstate events/s",
                    "no-op events/s",
                    "kept up (hotstate / no-op)",
                    "failed pull queries",
                ),
                rows,
            ),
            *_freshness_kill(data),
        ],
    )


def _freshness_kill(data: Mapping[str, Any]) -> list[Table]:
    kill = data.get("kill_summary")
    if kill is None:
        return []
    return [
        Table(
            (
                "kill run: offered events/s",
                "visible p50 ms",
                "visible p99 ms",
                "visible max ms",
                "batch spanning the kill ms",
                "median batch ms",
                "over the median ms",
                "kept up",
                "failed pull queries",
            ),
            [
                (
                    kill["offered_events_per_s"],
                    kill["visible_p50_ms"],
                    kill["visible_p99_ms"],
                    kill["visible_max_ms"],
                    kill["kill_batch_ms"],
                    kill["median_batch_ms"],
                    kill["kill_batch_over_median_ms"],
                    kill["kept_up"],
                    kill["failed_pull_queries"],
                )
            ],
        )
    ]


def http_servers(data: Mapping[str, Any]) -> Section:
    rows = []
    for r in data["results"]:
        http1 = r["http1"]
        http2 = r.get("http2") if isinstance(r.get("http2"), dict) else {}
        h2 = http2.get("c8m1", {}) if isinstance(http2, dict) else {}
        rows.append(
            (
                r["candidate"],
                r["loop"],
                tuple(http1[c]["server_cpu_us_per_req"] for c in ("c1", "c8", "c32") if c in http1),
                http1["c8"]["requests_per_s"],
                http1["c8"]["latency"]["p99"],
                h2.get("server_cpu_us_per_req"),
            )
        )
    lines = [f"- {line}" for line in data.get("conclusion", {}).get("summary", [])]
    return Section(
        "each other: every candidate ASGI server serves the same minimal RocksDB-lookup app under the same "
        "wrk (HTTP/1.1) and h2load (HTTP/2) load; server CPU per request is the number that carries over.",
        [
            Table(
                (
                    "server",
                    "loop",
                    "HTTP/1.1 server CPU µs/req c1 / c8 / c32",
                    "HTTP/1.1 req/s c8",
                    "p99 ms c8",
                    "HTTP/2 server CPU µs/req (8 conns)",
                ),
                rows,
            )
        ],
        lines,
    )


def log_append(data: Mapping[str, Any]) -> Section:
    rows = [
        (
            r["fsync"],
            r["records_per_batch"],
            r["record_bytes"],
            r["appends_per_s"],
            r["records_per_s"],
            r["append_mb_per_s"],
            r["read_mb_per_s"],
        )
        for r in data["results"]
    ]
    return Section(
        'itself: fsync="never" against fsync="always", one record per append against batches of 100.',
        [
            Table(
                (
                    "fsync",
                    "records/batch",
                    "record bytes",
                    "appends/s",
                    "records/s",
                    "append MB/s",
                    "read MB/s",
                ),
                rows,
            )
        ],
    )


def metadata(data: Mapping[str, Any]) -> Section:
    failover = data["failover_kill9_leader_to_next_commit"]
    commit = data["commit_latency"]
    snapshot = data["snapshot"]

    def latency(name: str, m: Mapping[str, Any]) -> tuple[object, ...]:
        return (name, m["n"], m["p50_ms"], m["p99_ms"], m["max_ms"])

    return Section(
        "a describe request answered without a commit (for commit latency) and replaying the same records "
        "from raw batches (for snapshot load).",
        [
            Table(
                ("measured", "n", "p50 ms", "p99 ms", "max ms"),
                [
                    latency("kill -9 of the leader -> next committed write", failover),
                    latency(f"commit at {fmt(commit['rate_per_s'])} requests/s", commit["commit"]),
                    latency("baseline: describe (no commit)", commit["baseline_describe"]),
                ],
            ),
            Table(
                ("partition records", "snapshot bytes", "write s", "load s", "replay s (baseline)"),
                [
                    (
                        snapshot["partition_records"],
                        snapshot["snapshot_bytes"],
                        snapshot["write_s"],
                        snapshot["load_s"],
                        snapshot["baseline_replay_from_records_s"],
                    )
                ],
            ),
        ],
    )


def control_plane(data: Mapping[str, Any]) -> Section:
    # Parts run alone (`--only`) leave the others out.
    stall = data.get("loop_stall", [])
    snapshot = data.get("snapshot", [])
    rpc_rows = data.get("rpc", [])
    section = Section(
        "the same placement run on the event loop (what a synchronous create stalled it for), the loop's own "
        "stall while idle, and version 1 snapshots (a record per partition) of the same image.",
        [
            Table(
                (
                    "partitions",
                    "brokers",
                    "create s",
                    "longest loop stall ms",
                    "idle stall ms",
                    "placement on the loop s",
                ),
                [
                    (
                        r["partitions"],
                        r["brokers"],
                        r["create_s"],
                        r["longest_loop_stall_ms"],
                        r["longest_idle_stall_ms"],
                        r["placement_on_the_loop_s"],
                    )
                    for r in stall
                ],
                "Creating a table on an in-process controller (real Raft driver and log, 100 brokers "
                "heartbeating).",
            ),
            Table(
                (
                    "partitions",
                    "v1 bytes",
                    "v2 bytes",
                    "v1 encode s",
                    "v2 encode s",
                    "v1 load s",
                    "v2 load s",
                    "load speedup",
                ),
                [
                    (
                        r["partitions"],
                        r["v1_bytes"],
                        r["v2_bytes"],
                        r["v1_encode_s"],
                        r["v2_encode_s"],
                        r["v1_load_s"],
                        r["v2_load_s"],
                        r["load_speedup"],
                    )
                    for r in snapshot
                ],
                "Metadata snapshots, same process, same image.",
            ),
            Table(
                (
                    "partitions",
                    "simulated brokers",
                    "registrations/s",
                    "heartbeats/s held (offered)",
                    "worst heartbeat ms",
                    "create s",
                    "fence s",
                    "copies re-placed s after fence",
                    "others fenced (or the error)",
                ),
                [
                    (
                        r["partitions"],
                        r["simulated_brokers"],
                        r.get("registrations_per_s"),
                        f"{fmt(r.get('heartbeats_per_s_held'))} ({fmt(r.get('heartbeats_offered_per_s'))})",
                        r.get("worst_heartbeat_ms"),
                        r.get("create_tables_s"),
                        r.get("fence_dead_broker_s"),
                        r.get("replace_its_copies_s_after_fence"),
                        r.get("other_brokers_fenced", r.get("error")),
                    )
                    for r in rpc_rows
                ],
                "One real server process (controller only), brokers simulated over real RPC; "
                "broker.removal.delay.ms 2000.",
            ),
            *_control_plane_broker_fails(stall),
            *_control_plane_failover(data.get("failover", ())),
        ],
    )
    # A part run alone leaves the other tables empty: shown only with rows.
    return Section(section.compared_against, [t for t in section.tables if t.rows])


def _control_plane_broker_fails(stall: Sequence[Mapping[str, Any]]) -> list[Table]:
    rows = [(r["partitions"], r["broker_fails"]) for r in stall if "broker_fails" in r]
    if not rows:
        return []
    return [
        Table(
            ("partitions", "fenced s", "copies re-placed s", "longest loop stall ms"),
            [(p, f["fenced_s"], f["copies_replaced_s"], f["longest_loop_stall_ms"]) for p, f in rows],
            "The in-process controller: one broker of 100 stops heartbeating after the table is created "
            "(session 2 s, broker.removal.delay.ms 2 s; times from when it goes silent; goal: stall "
            "< 100 ms).",
        )
    ]


def _control_plane_failover(rows: Sequence[Mapping[str, Any]]) -> list[Table]:
    if not rows:
        return []
    return [
        Table(
            (
                "partitions",
                "simulated brokers",
                "create s",
                "new leader committed s",
                "first change answered s",
                "error",
            ),
            [
                (
                    r["partitions"],
                    r["simulated_brokers"],
                    r.get("create_tables_s"),
                    r.get("new_leader_committed_s"),
                    r.get("first_delete_answered_s"),
                    r.get("error"),
                )
                for r in rows
            ],
            "Controller failover: three controller-only server processes, kill -9 of the active one; the "
            "time until a survivor leads with a higher commit, and until a change sent after the kill is "
            "answered (goal < 1.5 s).",
        )
    ]


def move_throttle(data: Mapping[str, Any]) -> Section:
    r = data["results"]
    before, during = r["queries_before"], r["queries_during"]
    return Section(
        "the same queries in the seconds before the 4th server starts.",
        [
            Table(
                ("value bytes", "moved bytes", "throttle B/s", "moved at B/s", "time to balance s", "failed"),
                [
                    (
                        r["value_bytes"],
                        r["moved_value_bytes"],
                        r["throttle_bytes_per_sec"],
                        r["moved_at_bytes_per_sec"],
                        r["time_to_balance_s"],
                        r["failed_queries"],
                    )
                ],
                f"{data.get('cluster', '')}: a 4th server joins.",
            ),
            Table(
                ("queries", "count", "p50 ms", "p99 ms", "max ms"),
                [
                    (name, q["queries"], q["p50_ms"], q["p99_ms"], q["max_ms"])
                    for name, q in (("before the move", before), ("during the move", during))
                ],
                f"Goal: {data.get('goal', '')}.",
            ),
        ],
    )


def pull_queries(data: Mapping[str, Any]) -> Section:
    cells = data["results"]["lookups"]["cells"]
    rows = []
    for name, by_concurrency in cells.items():
        for concurrency, cell in by_concurrency.items():
            cpu = cell.get("server_cpu_us_per_request", {})
            queried = next((v for k, v in cpu.items() if "queried" in k), None)
            if queried is None and len(cpu) == 1:
                queried = next(iter(cpu.values()))
            latency = cell.get("latency_ms", {})
            rows.append(
                (
                    name,
                    concurrency,
                    cell["requests_per_s"],
                    cell.get("rows_per_s"),
                    latency.get("p50"),
                    latency.get("p99"),
                    queried,
                )
            )
    goals = [
        (name, goal["target"], goal["measured"], goal["met"]) for name, goal in data.get("goals", {}).items()
    ]
    failover = []
    for mode in ("failover_standby_reads_on", "failover_standby_reads_off"):
        f = data["results"].get(mode)
        if f:
            failover.append(
                (
                    fmt(f["standby_reads"]),
                    f["queries"],
                    f["failed"],
                    f["p99_ms"],
                    f["after_kill"]["served_by_standby"],
                    f["actives_moved_off_killed_server_after_ms"],
                )
            )
    tables = [
        Table(
            ("cell", "concurrency", "requests/s", "rows/s", "p50 ms", "p99 ms", "server CPU µs/request"),
            rows,
            "lookups through one server (server CPU: the queried server, or the baseline's process)",
        ),
        Table(("goal", "target", "measured", "met"), goals, "the project's targets"),
    ]
    if failover:
        tables.append(
            Table(
                (
                    "standby reads",
                    "queries",
                    "failed",
                    "p99 ms",
                    "served by a standby after the kill",
                    "actives moved after ms",
                ),
                failover,
                "kill -9 of the server holding the most actives, 4 clients",
            )
        )
    return Section(
        "a raw ASGI + RocksDB + orjson server (`asgi_baseline_local`) and Redis GET / MGET of 100 "
        "(`redis_get`, `redis_mget_100`) measured in the same run, on the same cores.",
        tables,
    )


def raft_sim(data: Mapping[str, Any]) -> Section:
    failover = [
        (f["voters"], f["samples"], f["p50_ms"], f["p99_ms"], f["max_ms"], f["p99_over_election_timeout"])
        for f in data["failover"]
    ]
    throughput = [
        (name, t["voters"], t["committed_per_wall_s"], t["events_per_wall_s"])
        for name, t in data["throughput"].items()
        if isinstance(t, dict)
    ]
    lines = []
    if "ratio_3_voters_to_1" in data["throughput"]:
        lines.append(
            f"3 voters / 1 voter committed per second: {fmt(data['throughput']['ratio_3_voters_to_1'])}."
        )
    return Section(
        "the election timeout (failover, simulated ms) and a 1-voter run in the same process (throughput: "
        "no replication, no elections).",
        [
            Table(
                ("voters", "samples", "p50 ms", "p99 ms", "max ms", "p99 / election timeout"),
                failover,
                "leader crash -> next leader (simulated time)",
            ),
            Table(
                ("run", "voters", "committed/s (wall)", "simulator events/s"),
                throughput,
                "core + simulator throughput",
            ),
        ],
        lines,
    )


def replication(data: Mapping[str, Any]) -> Section:
    rows = [
        (
            _batch_size(name),
            r.get("calls_in_flight", 1),
            r["rows_per_s"],
            r.get("batch_latency_p50_ms"),
            r.get("batch_latency_p99_ms"),
            r.get("follower_lag_records_max"),
            r["baseline_single_rocksdb_rows_per_s"],
            r["ratio_vs_single_rocksdb"],
            " / ".join(fmt(v) for v in r.get("ratio_runs", ())) or "-",
        )
        for name, r in data["results"].items()
    ]
    return Section(
        "the same rows written in the same batches straight into one local RocksDB store in the same run "
        "(the ratio is the price of the network, the log and the replication). Calls in flight: `upsert` "
        "calls under way at once on the one writer, which pipelines their Produces (TableWriter's "
        "max_in_flight); the baseline writes one batch after another either way.",
        [
            Table(
                (
                    "rows/batch",
                    "calls in flight",
                    "committed rows/s",
                    "batch p50 ms",
                    "batch p99 ms",
                    "follower lag max (records)",
                    "one RocksDB rows/s",
                    "ratio",
                    "every run's ratio",
                ),
                rows,
            )
        ],
    )


def _batch_size(name: str) -> int | str:
    """`batch_100` and `batch_100_in_flight_4` -> 100 (the in-flight count has its own column)."""
    size = name.removeprefix("batch_").split("_")[0]
    return int(size) if size.isdigit() else name


def rpc(data: Mapping[str, Any]) -> Section:
    rows = [
        (name.replace("_", " "), r["sequential_rps"], r["pipelined_rps"])
        for name, r in data.items()
        if name.startswith("round_trips")
    ]
    codec = data["codec"]
    return Section(
        "itself: server in a child process (each side on its own core) against server and client on one "
        "event loop, sequential against pipelined.",
        [
            Table(("round trips", "sequential/s", "pipelined/s"), rows),
            Table(
                ("codec message", "bytes", "encode/s", "decode/s", "entries decoded/s"),
                [
                    (
                        codec["message"],
                        codec["encoded_bytes"],
                        codec["encode_per_s"],
                        codec["decode_per_s"],
                        codec["entries_decoded_per_s"],
                    )
                ],
            ),
        ],
    )


def spark_sink(data: Mapping[str, Any]) -> Section:
    results = data["results"]
    rows = [
        (
            name,
            r["events_per_s"],
            r.get("batch_s_median"),
            r.get("wall_s_including_start"),
            r.get("servers_cpu_us_per_changed_row", "-"),
        )
        for name, r in results.items()
        if isinstance(r, dict) and "events_per_s" in r
    ]
    ratios = [f"{name}: {fmt(v)}." for name, v in results.items() if not isinstance(v, dict)]
    floor = results.get("floor")
    if floor:
        ratios.append(
            f"Floor on this machine ({floor['model']}): Spark's side alone (arrow_encode) reaches "
            f"{fmt(floor['arrow_encode_over_noop'])} of the no-op; with the servers' "
            f"{fmt(floor['servers_cpu_us_per_changed_row'])} µs of CPU per written row on the same cores, "
            f"at best {fmt(floor['best_hotstate_over_noop'])} (measured: "
            f"{fmt(floor['measured_hotstate_over_noop'])})."
        )
    return Section(
        "the same streaming aggregation with a no-op `foreachBatch` (Spark alone) and with sinks that "
        "only move or encode the rows, in the same run.",
        [Table(("sink", "events/s", "batch s (median)", "wall s incl. start", "servers' CPU µs/row"), rows)],
        ratios,
    )


def bulk_load(data: Mapping[str, Any]) -> Section:
    base, hot = data["baseline_single_rocksdb"], data["hotstate"]
    lookups = hot["point_lookups_during_load"]
    disk = ", ".join(f"server {node}: {fmt(size)}" for node, size in hot["bytes_on_disk_per_server"].items())
    goals = data["goals"]
    return Section(
        f'{fmt(data["rows"])} rows ({data["row"]}) from Parquet through `df.write.format("hotstate")` '
        f"into 3 servers, {data['partitions']} partitions with 1 standby, beside one local RocksDB store "
        "written the same rows in the same run.",
        [
            Table(
                ("load", "rows/s", "seconds", "other processes' cores"),
                [
                    (
                        "single local RocksDB",
                        base["rows_per_s"],
                        base["seconds"],
                        base.get("other_processes_cores", "–"),
                    ),
                    (
                        "hotstate (Spark batch writer)",
                        hot["rows_per_s"],
                        hot["seconds"],
                        hot.get("other_processes_cores", "–"),
                    ),
                ],
            ),
            Table(
                (
                    "point lookups",
                    "count",
                    "failed",
                    "p50 ms",
                    "p99 ms",
                    "max ms",
                    "server took p99 ms",
                    "forwarded: server took p99 ms",
                ),
                [
                    (
                        "during the load (Python client)",
                        lookups["count"],
                        lookups["failed"],
                        lookups["p50_ms"],
                        lookups["p99_ms"],
                        lookups["max_ms"],
                        lookups.get("server_took_p99_ms", "–"),
                        lookups.get("forwarded_server_took_p99_ms", "–"),
                    ),
                    *(
                        [
                            (
                                "during the load (wrk, at server 1)",
                                native["count"],
                                native["failed"],
                                native["p50_ms"],
                                native["p99_ms"],
                                native["max_ms"],
                                "–",
                                "–",
                            )
                        ]
                        if (native := hot.get("point_lookups_native_client_during_load"))
                        else []
                    ),
                ],
                "At the lookups' client; `took_ms` is the server's own time (the query's start to its "
                "answer), for all lookups and for those forwarded to the key's active on another server.",
            ),
            *(
                [
                    Table(
                        ("server", "event loop CPU s", "event loop waited for a core s"),
                        [(node, t["cpu_s"], t["waited_for_a_core_s"]) for node, t in loops.items()],
                        "Over the load, from /proc/PID/schedstat of each server's event-loop thread: the "
                        "time it ran, and the time it was runnable but waited for one of the cores.",
                    )
                ]
                if (loops := hot.get("event_loop_cpu_and_core_wait_s_per_server"))
                else []
            ),
            *(
                [
                    Table(
                        ("part", "CPU s during the load"),
                        list(parts.items()),
                        "Every thread on the machine over the load, summed by what it is part of.",
                    )
                ]
                if (parts := hot.get("cpu_s_during_load_by_part"))
                else []
            ),
        ],
        [
            f"Ratio to the single RocksDB write: {fmt(data['ratio_vs_single_rocksdb'])} "
            f"(goal {goals['ratio_vs_single_rocksdb']}). Point-lookup p99 during the load: "
            f"{fmt(lookups['p99_ms'])} ms (goal {goals['point_lookup_p99_ms']} ms).",
            f"Spark tasks: {fmt(hot.get('spark_tasks', '–'))} (one Parquet file each); the whole run took "
            f"{fmt(data.get('seconds_total', '–'))} s.",
            f"Every replica in sync {fmt(hot['replicas_in_sync_after_s'])} s after the load returned; "
            f"sampled keys found after it: {fmt(hot['sampled_keys_found'])}.",
            f"Bytes on disk: {disk} (the single store: {fmt(base['bytes_on_disk'])}; the Parquet input: "
            f"{fmt(data['input_parquet_bytes'])}).",
            *(
                [f"Each server's longest event-loop stall (ms, since it started): {fmt(stalls)}."]
                if (stalls := hot.get("loop_stall_max_ms_per_server"))
                else []
            ),
        ],
    )


def scans(data: Mapping[str, Any]) -> Section:
    bare, duck, local = data["bare_loop"], data.get("duckdb") or {}, data.get("in_process") or {}
    threads = sorted(
        {
            key
            for answer in duck.values()
            if isinstance(answer, dict)
            for key in answer
            if key.startswith("threads_")
        },
        key=lambda key: int(key.split("_")[1]),
    )

    def duck_rate(name: str, key: str) -> object:
        return (duck.get(name) or {}).get(key, {}).get("rows_per_s")

    rows = [
        (
            name,
            r["sql"],
            r.get("first_seconds"),
            r.get("seconds_median"),
            r.get("rows_scanned_per_s_per_server"),
            bare.get(name, {}).get("rows_per_s"),
            *(duck_rate(name, key) for key in threads),
        )
        for name, r in data["results"].items()
    ]
    tables = [
        Table(
            (
                "question",
                "SQL",
                "first seconds (warm-up: builds column copies)",
                "seconds (median)",
                "rows scanned/s per server",
                "bare loop rows/s",
                *(f"DuckDB rows/s ({key.split('_')[1]} threads)" for key in threads),
            ),
            rows,
        )
    ]
    if local:
        tables.append(
            Table(
                (
                    "question",
                    "hotstate rows per CPU s",
                    "hotstate vs bare loop (same store)",
                    "steps",
                    "longest step ms (CPU)",
                ),
                [
                    (
                        name,
                        r["hotstate_rows_per_cpu_s"],
                        r["hotstate_vs_bare"],
                        r["steps"],
                        r["longest_step_ms"],
                    )
                    for name, r in local.items()
                ],
                "In one process: the replica's scan steps over one Store holding every row, beside the bare "
                "loop over the same store (CPU time; above 1 is faster than the bare loop).",
            )
        )
        copies = {name: r["column_copy"] for name, r in local.items() if "column_copy" in r}
        if copies:
            tables.append(
                Table(
                    (
                        "question",
                        "first scan CPU s (rows read, copy built)",
                        "from the copy: CPU s",
                        "vs bare loop",
                        "steps",
                        "longest step on the loop ms (CPU)",
                        "off the loop ms (CPU)",
                    ),
                    [
                        (
                            name,
                            c["first_scan_cpu_s"],
                            c["cpu_s"],
                            c["vs_bare"],
                            c["steps"],
                            c["longest_step_ms"],
                            c.get("off_loop_cpu_ms"),
                        )
                        for name, c in copies.items()
                    ],
                    "In one process, on a server's defaults: the first scan reads the rows and leaves the "
                    "partition's column copy (server/column_cache.py); later ones are answered from it, "
                    "their part over the copy decided in the server's scan compute thread (here in place).",
                )
            )
    idle, during = data["lookups_idle"], data["lookups_during_group"]
    one = data.get("lookups_during_one_group_client")
    measured = [("idle", idle), ("during GROUP BY scans (2 clients)", during)]
    measured += [("during GROUP BY scans (1 client)", one)] if one else []
    native = data.get("lookups_native_client") or {}
    measured += [
        (f"{name} (wrk, a native client)", native[key])
        for key, name in (
            ("idle", "idle"),
            ("during_group", "during GROUP BY scans (2 clients)"),
            ("during_one_group_client", "during GROUP BY scans (1 client)"),
        )
        if key in native
    ]
    tables.append(
        Table(
            (
                "point lookups",
                "count",
                "p50 ms",
                "p99 ms",
                "max ms",
                "server took p99 ms",
                "server took max ms",
            ),
            [
                (
                    name,
                    m["n"],
                    m["p50_ms"],
                    m["p99_ms"],
                    m["max_ms"],
                    m.get("server_took_p99_ms"),
                    m.get("server_took_max_ms"),
                )
                for name, m in measured
            ],
            "At the lookups' client; `took_ms` is the server's own time for each (the query's start to its "
            "answer, without the wait for the loop to read the request).",
        )
    )
    lines = [f"Goals met: {fmt(data['goals'])}."]
    if "skipped" in duck:
        lines.append(f"DuckDB: {duck['skipped']}.")
    elif duck:
        lines.append(
            f"DuckDB {fmt(duck.get('version'))} reads a Parquet file of the same rows "
            f"({fmt(duck.get('parquet_bytes'))} bytes) written by pyarrow; warm-up run, then the median."
        )
    return Section(
        f"{fmt(data['rows'])} rows of {data['row_bytes']} bytes on 3 servers, one standby "
        f"({fmt(data.get('cpu_count'))} cores); each question through `/v1/query`, beside a bare Python loop "
        "over one local RocksDB (rocksdict iterator and the same row decoding) and DuckDB over Parquet, in "
        "the same run.",
        tables,
        lines,
    )


def expiry(data: Mapping[str, Any]) -> Section:
    idle, during = data["lookups_idle"], data["lookups_during_expiry"]
    stalls = [
        (
            node,
            s["expired_rows"],
            s["idle"]["stall_exact_ms"] or s["idle"]["stall_at_most_ms"],
            s["expiry"]["stall_exact_ms"] or s["expiry"]["stall_at_most_ms"],
        )
        for node, s in sorted(data["stalls_per_server"].items())
    ]
    return Section(
        f"{fmt(data['rows'])} windowed rows of {data['row_bytes']} bytes on 3 servers, one standby, made "
        "older than their retention at once; point lookups on another table through server 1, idle and "
        "while the actives delete them, in the same run.",
        [
            Table(
                ("expired rows", "seconds", "rows/s", "rows left per server"),
                [
                    (
                        data["rows"],
                        data["expiry_s"],
                        data["expiry_rows_per_s"],
                        fmt(list(data["rows_left_per_server"].values())),
                    )
                ],
            ),
            Table(
                ("point lookups", "count", "p50 ms", "p99 ms", "max ms"),
                [
                    ("idle", idle["n"], idle["p50_ms"], idle["p99_ms"], idle["max_ms"]),
                    ("during expiry", during["n"], during["p50_ms"], during["p99_ms"], during["max_ms"]),
                ],
            ),
            Table(
                ("server", "rows it expired", "longest loop stall idle ms", "longest loop stall expiring ms"),
                stalls,
                "a stall is how late a 10 ms timer fired; shown as its histogram bucket's upper bound "
                "unless it was the server's longest yet",
            ),
        ],
        [f"Lookup p99 during expiry / idle: {fmt(data['p99_ratio_during_vs_idle'])}."],
    )


def compaction(data: Mapping[str, Any]) -> Section:
    rows = [
        (
            node,
            p["replicas"],
            p["live_bytes"],
            p["start_bytes"],
            p["peak_bytes"],
            p["end_bytes"],
            p["end_ratio"],
            data["growth_second_half"].get(node),
            data.get("peak_growth_second_half", {}).get(node),
        )
        for node, p in sorted(data["per_server"].items())
    ]
    peaks = data.get("peaks_per_turnover", {})
    total = data["total"]
    return Section(
        f"A table of {fmt(data['live_rows'])} rows of {data['row_bytes']} bytes (6 partitions, one standby) "
        "whose writer replaces 10x its size (new keys written, the oldest deleted); every server's data "
        "directory measured throughout.",
        [
            Table(
                (
                    "server",
                    "replicas",
                    "live bytes",
                    "start bytes",
                    "peak bytes",
                    "end bytes",
                    "end / live",
                    "end / mid-churn sample",
                    "peak growth, second half",
                ),
                rows,
            )
        ],
        [
            f"Total: start {fmt(total['start_bytes'])}, peak {fmt(total['peak_bytes'])}, end "
            f"{fmt(total['end_bytes'])} bytes, {fmt(total['end_ratio'])}x the live data. Flat: "
            f"{fmt(data['flat'])}.",
            "At the end, partition logs and stores: "
            + "; ".join(
                f"server {node}: logs {fmt(split['logs'])}, stores {fmt(split['stores'])} bytes"
                for node, split in sorted(data.get("breakdown_end", {}).items())
            )
            + ".",
            *(
                [
                    "Peak bytes per turnover of the table (each tenth of the churn): "
                    + "; ".join(
                        f"server {node}: " + ", ".join(fmt(v) for v in values)
                        for node, values in sorted(peaks.items())
                    )
                    + "."
                ]
                if peaks
                else []
            ),
        ],
    )


def push(results: Mapping[str, Any]) -> Section:
    data = results["results"]
    kill = data.get("kill", {})
    latency = data.get("latency_ms", {})
    return Section(
        f"{fmt(data.get('subscriptions'))} feeds on one server of 3 (mix {fmt(data.get('mix'))}) while "
        f"writers produce changes ({fmt(data.get('rate_per_s'))}/s reached), then a kill -9 of that server.",
        [
            Table(
                (
                    "delivery latency p50 ms",
                    "p99 ms",
                    "memory per feed (bytes)",
                    "server CPU us per delivered change",
                    "of it the feeds'",
                ),
                [
                    (
                        latency.get("p50"),
                        latency.get("p99"),
                        data.get("memory_per_subscription_bytes"),
                        data.get("cpu_us_per_delivered_change"),
                        data.get("feeds_cpu_us_per_delivered_change"),
                    )
                ],
            ),
            Table(
                (
                    "after the kill",
                    "feeds resumed",
                    "changes lost",
                    "undelivered",
                    "resynced",
                    "duplicated",
                    "feeds incomplete",
                ),
                [
                    (
                        "",
                        kill.get("feeds_resumed"),
                        kill.get("changes_lost"),
                        kill.get("changes_undelivered"),
                        kill.get("changes_resynced"),
                        kill.get("changes_duplicated"),
                        kill.get("feeds_incomplete"),
                    )
                ],
            ),
        ],
        [
            f"Goal: {fmt(results.get('goal'))}; {fmt(data.get('changes_acked'))} changes acknowledged, "
            f"{fmt(data.get('deliveries_per_s_at_rate'))} deliveries/s due at the rate asked. Lost: a feed "
            "went past a write without delivering it; undelivered: still missing when the run ended; "
            "resynced: covered by a resync (the current rows) instead of the change itself.",
        ],
    )


def gray_failure(data: Mapping[str, Any]) -> Section:
    rows = []
    for fault, modes in data["results"].items():
        if fault == "extra_requests":
            continue
        for mode, m in modes.items():
            rows.append(
                (
                    fault,
                    mode.replace("_", " "),
                    m.get("median_p50_ms"),
                    m.get("median_p99_ms"),
                    m.get("median_first_second_p99_ms", "-"),
                    m.get("median_max_ms"),
                    m.get("failed"),
                )
            )
    extra = data["results"].get("extra_requests", {})
    notes = [
        f"Hedged partitions: {fmt(extra.get('hedged_partitions'))} of "
        f"{fmt(extra.get('forwarded_partitions'))} forwarded ({fmt(extra.get('hedged_fraction'))}), "
        f"{fmt(extra.get('hedges_won'))} answered first."
    ]
    goal = data.get("goal")
    return Section(
        f"the same queries with hedging off, alternating in the same run{f'; goal: {goal}' if goal else ''}. "
        "Medians over the trials of each trial's p50/p99/max (ms) of the queries begun during the fault.",
        [Table(("fault", "hedging", "p50 ms", "p99 ms", "p99 first s", "max ms", "failed"), rows)],
        notes,
    )


def write_failover(data: Mapping[str, Any]) -> Section:
    rows = []
    totals = []
    for cluster, modes in data["results"].items():
        for mode, m in modes.items():
            if isinstance(m, dict):
                rows.append(
                    (cluster.replace("_", " "), mode, m["n"], m.get("p50_s"), m.get("p99_s"), m.get("max_s"))
                )
        if "acked_writes" in modes:
            totals.append(
                f"{cluster.replace('_', ' ')}: {fmt(modes['acked_writes'])} acked writes, "
                f"{fmt(modes.get('write_errors_count'))} write errors."
            )
    goal = data.get("goal")
    return Section(
        f"the goal{f' ({goal})' if goal else ''}: time from a fault to the first acked write on each "
        "partition the victim led (overlapping faults: the longest gap between acked writes).",
        [Table(("cluster", "fault", "n", "p50 s", "p99 s", "max s"), rows)],
        totals,
    )


def cross_rack(data: Mapping[str, Any]) -> Section:
    runs = data["runs"]
    rows = []
    for index, line in enumerate(data["ratios"]):
        for strategy in ("none", "min_traffic"):
            scenario = runs[strategy]["scenarios"][index]
            rows.append(
                (
                    line["scenario"],
                    strategy,
                    scenario["rows"],
                    f"{scenario['actives_in_writer_rack']} of {scenario['partitions']}",
                    scenario["standbys_in_another_rack"],
                    scenario["cross_rack_bytes"],
                    scenario["cross_rack_bytes_per_row"],
                    line["min_traffic_over_none"] if strategy == "min_traffic" else None,
                )
            )
    background = " / ".join(f"{s} {fmt(runs[s]['background_bytes_per_s'])}" for s in ("none", "min_traffic"))
    return Section(
        "the same tables, rows and writers with `rack.aware.assignment.strategy=none`, one cluster per "
        "strategy in the same run; bytes over the rack uplinks (per-veth counters) during the writes, less "
        "the cluster's idle traffic between racks for as long.",
        [
            Table(
                (
                    "scenario",
                    "strategy",
                    "rows",
                    "actives in the writers' rack",
                    "standbys in another rack",
                    "cross-rack bytes",
                    "per row",
                    "min_traffic / none",
                ),
                rows,
            )
        ],
        [
            f"Setup: {fmt(data.get('setup'))}.",
            f"By design: {fmt(data.get('by_design'))}",
            f"Idle traffic between racks (bytes/s): {background}.",
        ],
    )


def chaos(data: Mapping[str, Any]) -> Section:
    rows = [
        (
            kind,
            m["n"],
            m["write_gap_p50_s"],
            m["write_gap_max_s"],
            m["key_write_gap_max_s"],
            m["read_gap_p50_s"],
            m["read_gap_max_s"],
            m["server_read_gap_max_s"],
        )
        for kind, m in data["by_fault"].items()
    ]
    config = data["config"]
    found = data["violations_by_kind"]
    lines = [
        f"{fmt(data['schedules'])} schedules (seeds {data['seeds'][0]}-{data['seeds'][-1]}"
        f"{'' if data.get('complete', True) else ', interrupted before the last'}) of "
        f"{fmt(config['duration_s'])} s of faults each, {fmt(config['servers'])} servers in "
        f"{fmt(config['racks'])} racks (uplinks limited to {fmt(config['rack_rate'])}): "
        f"{fmt(data['writes_acked'])} acknowledged writes, {fmt(data['reads_ok'])} reads, "
        f"{fmt(data['metadata_ops'])} metadata operations with a definite answer. "
        f"Violations: {fmt(data['violations'])}"
        + (" (" + ", ".join(f"{k}: {fmt(v)}" for k, v in sorted(found.items())) + ")" if found else "")
        + (f"; failing seeds {fmt(data['failed_seeds'])}" if data["failed_seeds"] else "")
        + ".",
    ]
    return Section(
        "the rules of docs/chaos.md (no acknowledged write lost, no value read that was never written, "
        "monotonic reads and read-your-writes along consistency tokens, equal replicas, linearizable "
        "metadata): any violation is a defect. Gaps are per fault, from its start to the next fault's "
        "(recovery included): the longest stretch without any acknowledged write, without one for the "
        "worst-hit key, without any successful read, without one through the worst-hit server (the "
        "server killed, paused or cut off included: its own clients wait for it). "
        "Run by `python -m hotstate.chaos` (`make chaos`).",
        [
            Table(
                (
                    "fault",
                    "n",
                    "write gap p50 s",
                    "write gap max s",
                    "worst key max s",
                    "read gap p50 s",
                    "read gap max s",
                    "worst server max s",
                ),
                rows,
            )
        ],
        lines,
    )


FORMATTERS: dict[str, Formatter] = {
    "assignor": assignor,
    "bulk_load": bulk_load,
    "push": push,
    "push_issue_mix": push,  # bench/push.py --mix issue (70% key, 20% range, 10% whole-table feeds)
    "scans": scans,
    "expiry": expiry,
    "compaction": compaction,
    "chaos": chaos,
    "control_plane": control_plane,
    "cross_rack": cross_rack,
    "freshness": freshness,
    "gray_failure": gray_failure,
    "http_servers": http_servers,
    "http2_check": http_servers,  # a short run of bench/http_servers.py --only (HTTP/2 candidates)
    "log_append": log_append,
    "metadata": metadata,
    "move_throttle": move_throttle,
    "pull_queries": pull_queries,
    "raft_sim": raft_sim,
    "replication": replication,
    "rpc": rpc,
    "spark_sink": spark_sink,
    "write_failover": write_failover,
}


# --- unknown or changed shapes ---------------------------------------------------------------------


def scalars(value: Any, path: str = "", depth: int = 0) -> Iterable[tuple[str, object]]:
    """Numbers, booleans and short strings with their dotted paths; lists counted, not listed."""
    if isinstance(value, dict):
        if depth > 3:
            return
        for key, item in value.items():
            if depth == 0 and (key in RUN_KEYS or key.startswith("load_average")):
                continue
            yield from scalars(item, f"{path}.{key}" if path else str(key), depth + 1)
    elif isinstance(value, list):
        yield path, f"list of {len(value)}"
    elif (
        value is None
        or isinstance(value, bool | int | float)
        or (isinstance(value, str) and len(value) <= 60)
    ):
        yield path, value


def generic(data: Mapping[str, Any], limit: int = 40) -> Section:
    found = list(scalars(data))
    rows = [(f"`{path}`", value) for path, value in found[:limit]]
    lines = [f"({len(found) - limit} more values in the JSON file.)"] if len(found) > limit else []
    return Section(
        "not stated (no formatter in bench/report.py yet; its values as recorded).",
        [Table(("key", "value"), rows)],
        lines,
    )


# --- the document ---------------------------------------------------------------------------------


def section(name: str, data: Mapping[str, Any]) -> list[str]:
    formatter = FORMATTERS.get(name)
    note = ""
    try:
        body = formatter(data) if formatter else generic(data)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
        # A benchmark whose JSON changed shape must not break the report of all the others.
        body = generic(data)
        note = (
            f"(Its shape is not what `bench/report.py`'s formatter expects ({type(error).__name__}: "
            f"{error}): values as recorded.)"
        )
    script = BENCH / f"{name}.py"
    source = f"`bench/{name}.py` -> " if script.exists() else ""
    out = [f"## {name}", ""]
    description = data.get("benchmark")
    out.append(f"{source}`bench/results/{name}.json`" + (f": {fmt(description)}." if description else "."))
    out.append("")
    out.append(run_line(data) + (f" {fmt(data['note']).rstrip('.')}." if data.get("note") else ""))
    out.append("")
    out.append(f"Compared against: {body.compared_against}")
    out.append("")
    if note:
        out += [note, ""]
    for table in body.tables:
        out += markdown_table(table)
    if body.lines:
        out += [*body.lines, ""]
    return out


def render(results: Path = RESULTS) -> str:
    files = sorted(results.glob("*.json"))
    out = [
        "# Benchmarks",
        "",
        "<!-- Generated by bench/report.py from bench/results/*.json: edit those, not this file. -->",
        "",
        "Every number here comes from `bench/results/*.json`, written by the benchmarks in `bench/` "
        "(`make bench` runs them all, then this report). Regenerate this page with "
        "`make bench-report` (or `.venv/bin/python bench/report.py`) after a benchmark writes new results; "
        "`make test` fails while it and the results disagree (`tests/docs/test_benchmarks_doc.py`). "
        "Each benchmark records its machine's core count and load: these ran on a 2-core machine shared "
        "with other work, so absolute rates are for that machine, and the comparisons within one run carry "
        "over. `make bench-tools` installs what `pull_queries` and `http_servers` drive their load with "
        "(wrk, h2load, Redis; Debian packages).",
        "",
    ]
    sections: list[str] = []
    for path in files:
        name = path.stem
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            sections += [f"## {name}", "", f"`bench/results/{name}.json` could not be read: {error}.", ""]
            out.append(f"- [{name}](#{name}) (unreadable)")
            continue
        if not isinstance(data, dict):
            data = {"results": data}
        description = data.get("benchmark")
        out.append(f"- [{name}](#{name})" + (f": {fmt(description)}" if description else ""))
        sections += section(name, data)
    if not files:
        out.append("No results yet: run `make bench`.")
    out.append("")
    return "\n".join(out + sections).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--results", type=Path, default=RESULTS, help="folder of *.json results")
    parser.add_argument("--out", type=Path, default=OUT, help="the Markdown file to write")
    parser.add_argument("--check", action="store_true", help="exit 1 if --out differs, write nothing")
    args = parser.parse_args(argv)
    text = render(args.results)
    if args.check:
        current = args.out.read_text() if args.out.exists() else ""
        if current != text:
            print(f"{args.out} is not what {args.results} gives: run .venv/bin/python bench/report.py")
            return 1
        return 0
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(text)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Pull queries over HTTP, driven by wrk, on a real local cluster -> bench/results/pull_queries.json.

A local 3-server cluster (default configs) holds table `bench` (6 partitions, 1 standby, key `user` STRING,
20,000 rows of about 90 bytes). All HTTP load comes from wrk (`wrk -t1`, keep-alive, one connection per
concurrent client, no pipelining) running bench/lua/post_bodies.lua, which POSTs JSON bodies from a file
prepared per cell, cycling through them, counts non-2xx answers and returned rows in its `response()` hook,
and prints latency percentiles as JSON from its `done()` hook. Every cell is an unmeasured 1 s warm-up run
of wrk, then a measured run (5 s; `--quick`: 1 s and concurrency 8 only). Per cell: requests/s, rows/s,
latency p50/p90/p99/p99.9/max as wrk measured it, non-2xx answers and socket errors (any of them, a row
count other than the expected one per request, or a server gone, marks the cell failed), and CPU time per
request: utime+stime from /proc/PID/stat of each server process (the queried one and each peer, so
forwarded work shows where it is done; each includes that server's idle background work, measured alone
in `idle_cpu_fraction`), divided by the requests wrk completed; also wrk's own CPU per request, how many
cores the machine kept busy, and how many of those went to processes not of this benchmark
(`others_busy_cores`; over 0.25 the cell is marked `contended`). wrk and the servers share the machine's
cores: CPU per request, not requests/s, is the number that carries over to a larger machine.

Cells, all through one server (one that is active for some partitions and holds no replica of others):
1. `POST /v1/query {"sql": "SELECT * FROM bench WHERE user = 'k'"}` for keys whose partition's active is
   on the queried server (read locally): concurrency 1, 8, 32.
2. The same for keys whose partition has no replica on the queried server (forwarded once to a peer):
   concurrency 1, 8, 32.
3. `WHERE user IN (100 keys)`, random keys over the whole table (some local, some forwarded), c=8: rows/s.
4. `WHERE user >= 'user-0xxxxx' AND user < ...` spanning 1,000 keys (read on every partition and merged),
   random start, c=8: rows/s.
5. ksqlDB's `POST /query {"ksql": "...;", "streamsProperties": {}}` for the local keys of cell 1, c=8.
Baselines, in the same run on the same machine:
6. A raw ASGI app on uvicorn (httptools, uvloop) in its own process: per POST, the same body as cell 1
   (same keys, same order) parsed with orjson, the key taken from the SQL's string literal, one rocksdict
   get of the same encoded row from one RocksDB holding all 20,000 rows, the row decoded with hotstate's
   row codec and answered as JSON by orjson: c=1, 8, 32.
7. Redis (a redis-server started here) through redis-benchmark, the C client: GET of the same 20,000 rows
   as JSON strings (under redis-benchmark's key names key:000000000000.., random keys), c=1, 8, 32, and
   MGET of 100 random keys, c=8; redis-server's CPU per request. INFO's keyspace misses must stay 0.
Through the Python client (`hotstate.Client`, one process per concurrent client, each looping over its
keys for the measured window after a warm-up that also covers its start; c=1 and 4, `--quick`: c=2):
9. `python_local`: the keys of cell 1, routing off, through the queried server (read there);
10. `python_forwarded`: the keys of cell 2, routing off, through the queried server (forwarded);
11. `python_forwarded_routed`: the keys of cell 2, `routing=True`, the client given only the queried
    server: each lookup goes straight to its partition's active (client/routing.py);
12. `python_local_routed`: the keys of cell 1 with `routing=True` (what routing costs the client).
Per cell: requests/s, latency, how many answers were forwarded, each server's and the clients' CPU per
request. The Python client, not the servers, limits these rates: compare them with each other, not with
wrk's cells.
Then `goals` compares the measurements with the project's targets, and `ratios` gives hotstate over the
baselines, and the Python client's cells over `python_local`.

8. Failover (correctness, Python client): 4 httpx clients query random keys for 5 s through a server
   that stays up; at 1.5 s the server holding the most actives is killed with SIGKILL. Success rate and
   latency over the window, with standby reads on (the default) and off (only actives serve), each on a
   fresh cluster. A query fails if it answers non-200 or takes longer than its timeout_ms (2,000).

Every process started here (servers, redis-server, the ASGI baseline, wrk, redis-benchmark) is stopped at
the end, also on errors, Ctrl-C and SIGTERM.

    python bench/pull_queries.py            # full run (about 2 minutes), writes bench/results/
    python bench/pull_queries.py --quick    # harness check: 1 s cells, c=8 only, writes to /tmp
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import csv
import datetime
import functools
import io
import json
import math
import os
import platform
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from hotstate.cli.local_cluster import LocalCluster, LocalServer, free_ports
from hotstate.client.writer import TableWriter
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError
from hotstate.protocol.keys import encode_key, partition_for
from hotstate.protocol.rows import decode_row, encode_row

BENCH_DIR = Path(__file__).parent
RESULTS = BENCH_DIR / "results" / "pull_queries.json"
LUA = BENCH_DIR / "lua" / "post_bodies.lua"
TABLE = "bench"
KEY = (KeyColumn("user", KeyType.STRING),)
PARTITIONS = 6
STANDBYS = 1
ROWS = 20_000
WRITE_BATCH = 1_000
BATCH_KEYS = 100
RANGE_KEYS = 1_000
BODIES_PER_FILE = 2_000  # IN-list and range bodies: distinct random ones, cycled
ROW_MARKER = '"user-'  # each returned row carries its key once, and nothing else in an answer does
WRK_TIMEOUT = "5s"
IDLE_SAMPLE_S = 2.0
CONTENDED_CORES = 0.25  # a cell during which others' processes kept more cores busy is marked contended
REDIS_KEY = "key:{:012d}"  # what redis-benchmark makes of key:__rand_int__ with -r ROWS
QUERY_TIMEOUT_MS = 2_000
CLIENT_TIMEOUT_S = 5.0  # the failover client gives up later than the query's own timeout
FAILOVER_CLIENTS = 4
FAILOVER_WINDOW_S = 5.0
FAILOVER_KILL_AT_S = 1.5
BUCKET_MS = 250
LAST_SEEN_BASE = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
CLK_TCK = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Mode:
    quick: bool
    measure_s: int  # wrk -d takes whole seconds
    warmup_s: int
    concurrency: tuple[int, ...]
    python_concurrency: tuple[int, ...] = (1, 4)  # Python client processes

    @staticmethod
    def of(quick: bool) -> Mode:
        return Mode(True, 1, 1, (8,), (2,)) if quick else Mode(False, 5, 1, (1, 8, 32), (1, 4))


def user(i: int) -> str:
    return f"user-{i:06d}"


def row(i: int) -> dict[str, object]:
    return {
        "user": user(i),
        "clicks": i,
        "url": f"/page/{i % 977}",
        "last_seen": LAST_SEEN_BASE + datetime.timedelta(seconds=i),
    }


def json_value(i: int) -> bytes:
    r = row(i)
    r["last_seen"] = r["last_seen"].isoformat()  # type: ignore[attr-defined]
    return json.dumps(r, separators=(",", ":")).encode()


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]


def free_port() -> int:
    # Outside the ephemeral range, as the local cluster's (cli/local_cluster.py free_ports).
    return free_ports(1)[0]


# ---------------------------------------------------------------------------------------------- processes
class Children:
    """Every process this script starts, stopped (SIGTERM, then SIGKILL) in reverse order by `stop_all`."""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen[bytes]] = []

    def start(
        self, command: Sequence[str], log: Path | None = None, *, stdin: bool = False
    ) -> subprocess.Popen[bytes]:
        """Output to `log`, or to pipes (read them with `run`); `stdin`: a pipe to write to."""
        with contextlib.ExitStack() as files:
            out = files.enter_context(open(log, "ab")) if log is not None else subprocess.PIPE
            proc = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT if log is not None else subprocess.PIPE,
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches only this script, which then stops it
            )
        self._procs.append(proc)
        return proc

    def run(self, command: Sequence[str], timeout_s: float) -> tuple[int, str, str]:
        """Run to the end (stopped on timeout, Ctrl-C, SIGTERM); exit code, stdout, stderr."""
        proc = self.start(command)
        try:
            out, err = proc.communicate(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.stop(proc)
            raise
        finally:
            self.stop(proc)
        return proc.returncode, out.decode(errors="replace"), err.decode(errors="replace")

    def stop(self, proc: subprocess.Popen[bytes]) -> None:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        with contextlib.suppress(ValueError):
            self._procs.remove(proc)

    def stop_all(self) -> None:
        while self._procs:
            self.stop(self._procs[-1])


def proc_cpu_s(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds; NaN when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except OSError:
        return math.nan
    return math.nan if fields[0] == "Z" else (int(fields[11]) + int(fields[12])) / CLK_TCK


def busy_ticks() -> int:
    """Clock ticks all cores spent busy since boot (not idle, not iowait), from /proc/stat."""
    with open("/proc/stat") as stat:
        values = [int(v) for v in stat.readline().split()[1:]]
    return sum(values[:8]) - values[3] - values[4]  # guest time is already in user


@dataclass(frozen=True)
class CpuSnapshot:
    """CPU seconds so far: of our running processes, of our reaped children (the load generator, once
    it has exited), and the machine's busy ticks."""

    at: float
    processes: dict[int, float]
    children: float
    busy: int

    @staticmethod
    def take(pids: Iterable[int]) -> CpuSnapshot:
        usage = resource.getrusage(resource.RUSAGE_CHILDREN)
        processes = {pid: proc_cpu_s(pid) for pid in pids}
        return CpuSnapshot(time.monotonic(), processes, usage.ru_utime + usage.ru_stime, busy_ticks())


def cpu_report(
    before: CpuSnapshot, after: CpuSnapshot, charged: Mapping[str, int], requests: int, client: str
) -> dict[str, Any]:
    """Per request: CPU of each charged process and of the load generator. Also how many cores the whole
    machine kept busy, and how many of those were others' (not any process of this benchmark)."""
    elapsed = after.at - before.at
    used = {pid: after.processes[pid] - before.processes[pid] for pid in before.processes}
    client_s = after.children - before.children
    machine = (after.busy - before.busy) / CLK_TCK / elapsed
    others = machine - (sum(v for v in used.values() if not math.isnan(v)) + client_s) / elapsed
    gone = sorted(label for label, pid in charged.items() if math.isnan(used[pid]))

    def per_request(seconds: float) -> float | None:
        return None if requests == 0 or math.isnan(seconds) else round(seconds * 1e6 / requests, 1)

    return {
        "server_cpu_us_per_request": {label: per_request(used[pid]) for label, pid in charged.items()},
        f"{client}_cpu_us_per_request": per_request(client_s),
        "machine_busy_cores": round(machine, 2),
        "others_busy_cores": round(max(0.0, others), 2),
        "contended": others > CONTENDED_CORES,
        **({"processes_gone": gone} if gone else {}),
    }


def pids_named(name: str) -> set[int]:
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() == name:
                    pids.add(int(entry.name))
    return pids


def other_processes() -> dict[str, int]:
    """Processes of others that compete for the cores (run when none of ours is up): hotstate servers,
    pytest runs, redis-servers, load generators."""
    counts: Counter[str] = Counter()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        with contextlib.suppress(OSError):
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            if "hotstate.cli.main server" in command:
                counts["hotstate_servers"] += 1
            elif "pytest" in command:
                counts["pytest"] += 1
            elif "redis-server" in command:
                counts["redis_servers"] += 1
            elif command.startswith(("wrk ", "redis-benchmark ")):
                counts["load_generators"] += 1
    return dict(counts)


TOOLS = {
    "wrk": "wrk",
    "redis-server": "redis-server",
    "redis-benchmark": "redis-tools",
    "redis-cli": "redis-tools",
}


def ensure_tools() -> dict[str, object]:
    """wrk, redis-server, redis-benchmark and redis-cli, installing Debian's packages when missing (as
    `make bench` does). Raises when wrk is still missing; Redis's absence only drops its baseline."""
    missing = sorted({package for tool, package in TOOLS.items() if shutil.which(tool) is None})
    info: dict[str, object] = {"installed_by_this_run": missing}
    if missing:
        print(f"missing {missing}: apt-get install -y {' '.join(missing)}", flush=True)
        before = pids_named("redis-server")
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        for command in (["apt-get", "update"], ["apt-get", "install", "-y", *missing]):
            try:
                done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
            except (OSError, subprocess.TimeoutExpired) as error:
                info["install_error"] = f"{' '.join(command)}: {type(error).__name__}: {error}"
                break
            if done.returncode != 0:
                tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
                info["install_error"] = f"{' '.join(command)} exited {done.returncode}: {' | '.join(tail)}"
                break
        # A service the package's scripts may have started is not ours to keep: stop it, by its pid.
        for pid in pids_named("redis-server") - before:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
    if shutil.which("wrk") is None:
        raise RuntimeError(f"wrk is needed (apt-get install -y wrk): {info}")
    version = subprocess.run(["wrk", "--version"], capture_output=True, text=True)
    info["wrk"] = (version.stdout or version.stderr).splitlines()[0].strip()
    if shutil.which("redis-server") and shutil.which("redis-benchmark") and shutil.which("redis-cli"):
        version = subprocess.run(["redis-server", "--version"], capture_output=True, text=True)
        info["redis"] = version.stdout.strip()
    return info


# ---------------------------------------------------------------------------------------------- wrk
@dataclass
class Load:
    """One cell's load: what wrk sends, and which processes' CPU is charged to it."""

    name: str
    url: str  # base URL
    path: str
    bodies: Path
    expected_rows: int  # per request
    servers: Mapping[str, int]  # label -> pid, charged per request
    ours: Sequence[int]  # every other running process of this benchmark (not others' load)


def run_wrk(children: Children, load: Load, concurrency: int, duration_s: int) -> dict[str, Any]:
    return wrk_json(children, load.url, load.path, load.bodies, concurrency, duration_s)


def wrk_json(
    children: Children,
    url: str,
    path: str,
    bodies: Path,
    concurrency: int,
    duration_s: int,
    *,
    row_marker: str = ROW_MARKER,
    timeout: str = WRK_TIMEOUT,
) -> dict[str, Any]:
    """One wrk run of post_bodies.lua: what its done() printed (counts, errors, latency in microseconds)."""
    command = ["wrk", "-t1", f"-c{concurrency}", f"-d{duration_s}s", "--timeout", timeout]
    command += ["-s", str(LUA), url, "--", str(bodies), path, row_marker]
    code, out, err = children.run(command, timeout_s=duration_s + 30)
    return wrk_result(code, out, err)


def wrk_result(code: int | None, out: str, err: str) -> dict[str, Any]:
    """The "WRK_JSON {...}" line post_bodies.lua's done() printed in wrk's output, parsed."""
    line = next((ln for ln in out.splitlines() if ln.startswith("WRK_JSON ")), None)
    if line is None:
        raise RuntimeError(f"wrk exited {code} without a result: {(err or out).strip()[-300:]}")
    result: dict[str, Any] = json.loads(line.removeprefix("WRK_JSON "))
    return result


def measure_wrk(children: Children, load: Load, concurrency: int, mode: Mode) -> dict[str, Any]:
    warm = run_wrk(children, load, concurrency, mode.warmup_s)
    pids = {*load.servers.values(), *load.ours}
    before = CpuSnapshot.take(pids)
    raw = run_wrk(children, load, concurrency, mode.measure_s)
    cpu = cpu_report(before, CpuSnapshot.take(pids), load.servers, raw["requests"], "wrk")
    requests = raw["requests"]
    elapsed = raw["duration_us"] / 1e6
    socket_errors = {k: v for k, v in raw["errors"].items() if k != "status" and v}
    problems = []
    if raw["non2xx"] or raw["errors"]["status"]:
        problems.append(f"{max(raw['non2xx'], raw['errors']['status'])} non-2xx: {raw['first_error'][:200]}")
    if socket_errors:
        problems.append(f"socket errors {socket_errors}")
    if requests == 0:
        problems.append("no request completed")
    elif raw["non2xx"] == 0 and raw["rows"] != requests * load.expected_rows:
        problems.append(f"{raw['rows'] / requests:.2f} rows per request, expected {load.expected_rows}")
    if warm["non2xx"] or warm["requests"] == 0:
        problems.append(f"warm-up: {warm['requests']} requests, {warm['non2xx']} non-2xx")
    if "processes_gone" in cpu:
        problems.append(f"exited during the cell: {cpu['processes_gone']}")
    lat = raw["latency_us"]
    cell: dict[str, Any] = {
        "concurrency": concurrency,
        "duration_s": round(elapsed, 2),
        "requests": requests,
        "requests_per_s": round(requests / elapsed, 1),
        "rows_per_s": round(raw["rows"] / elapsed),
        "rows_per_request": round(raw["rows"] / requests, 2) if requests else None,
        "latency_ms": {
            key: round(lat[key] / 1000, 3) for key in ("p50", "p90", "p99", "p99_9", "max", "mean")
        },
        "non2xx": raw["non2xx"],
        "socket_errors": socket_errors,
        "failed": bool(problems),
        **({"failure": "; ".join(problems)} if problems else {}),
        **cpu,
        "warmup_requests": warm["requests"],
    }
    return cell


def cell_line(name: str, cell: Mapping[str, Any]) -> str:
    if "latency_ms" not in cell:
        return f"{name:20} c={cell['concurrency']:<3} FAILED: {cell['failure']}"
    lat = cell["latency_ms"]
    cpu = " ".join(f"{k}={v}" for k, v in cell["server_cpu_us_per_request"].items())
    state = f"FAILED: {cell['failure']}" if cell["failed"] else "ok"
    return (
        f"{name:20} c={cell['concurrency']:<3}{cell['requests_per_s']:9.1f} req/s"
        f" {cell['rows_per_s']:9} rows/s"
        f"  p50 {lat['p50']:7.3f} p99 {lat['p99']:7.3f} ms  cpu us/req: {cpu}"
        f"  others' cores {cell['others_busy_cores']}  {state}"
    )


# ---------------------------------------------------------------------------------------------- bodies
def write_lines(path: Path, lines: Iterator[str] | Sequence[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def point_sql(key: str) -> str:
    return f"SELECT * FROM {TABLE} WHERE user = '{key}'"


def v1_body(sql: str) -> str:
    return json.dumps({"sql": sql})


def ksql_body(sql: str) -> str:
    return json.dumps({"ksql": sql + ";", "streamsProperties": {}})


def in_sql(rng: random.Random) -> str:
    listed = ", ".join(f"'{user(i)}'" for i in rng.sample(range(ROWS), BATCH_KEYS))
    return f"SELECT * FROM {TABLE} WHERE user IN ({listed})"


def range_sql(rng: random.Random) -> str:
    start = rng.randrange(ROWS - RANGE_KEYS + 1)
    return f"SELECT * FROM {TABLE} WHERE user >= '{user(start)}' AND user < '{user(start + RANGE_KEYS)}'"


# ---------------------------------------------------------------------------------------------- Redis
@dataclass
class RedisServer:
    process: subprocess.Popen[bytes]
    port: int

    @staticmethod
    def start(children: Children, directory: Path) -> RedisServer:
        directory.mkdir(parents=True, exist_ok=True)
        port = free_port()
        command = ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
        command += ["--appendonly", "no", "--dir", str(directory), "--daemonize", "no"]
        return RedisServer(children.start(command, directory / "redis.log"), port)

    def cli(self, *args: str, stdin: bytes | None = None) -> str:
        done = subprocess.run(
            ["redis-cli", "-p", str(self.port), *args], input=stdin, capture_output=True, timeout=60
        )
        if done.returncode != 0:
            raise RuntimeError(f"redis-cli {' '.join(args)}: {done.stderr.decode(errors='replace')}")
        return done.stdout.decode(errors="replace")

    def wait_ready(self, timeout_s: float = 10.0) -> None:
        end = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
                if self.cli("PING").strip() == "PONG":
                    return
            if time.monotonic() > end:
                raise TimeoutError("redis-server did not answer PING")
            time.sleep(0.05)

    def load(self) -> float:
        """The rows as JSON strings under redis-benchmark's key names, through `redis-cli --pipe`."""
        parts = []
        for i in range(ROWS):
            key, value = REDIS_KEY.format(i).encode(), json_value(i)
            parts.append(
                b"*3\r\n$3\r\nSET\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(key), key, len(value), value)
            )
        t0 = time.monotonic()
        out = self.cli("--pipe", stdin=b"".join(parts))
        if f"errors: 0, replies: {ROWS}" not in out:
            raise RuntimeError(f"redis-cli --pipe: {out.strip()[-200:]}")
        got = json.loads(self.cli("GET", REDIS_KEY.format(12_345)))
        assert got["clicks"] == 12_345, got
        return time.monotonic() - t0

    def misses(self) -> int:
        match = re.search(r"keyspace_misses:(\d+)", self.cli("INFO", "stats"))
        return int(match.group(1)) if match else -1


def measure_redis(
    children: Children,
    redis: RedisServer,
    command: Sequence[str],
    concurrency: int,
    mode: Mode,
    ours: Sequence[int],
) -> dict[str, Any]:
    """redis-benchmark, first a warm-up that sizes the measured run to about `mode.measure_s` seconds."""

    def bench(requests: int) -> dict[str, str]:
        args = ["redis-benchmark", "-p", str(redis.port), "-c", str(concurrency), "-n", str(requests)]
        args += ["-r", str(ROWS), "--csv", *command]
        code, out, err = children.run(args, timeout_s=120)
        rows = list(csv.DictReader(io.StringIO(out)))
        if code != 0 or not rows:
            raise RuntimeError(f"redis-benchmark exited {code}: {(err or out).strip()[-300:]}")
        return rows[-1]

    warm = bench(2_000 if command[0] == "GET" else 300)
    requests = max(1_000, round(float(warm["rps"]) * mode.measure_s))
    misses0 = redis.misses()
    charged = {"redis-server": redis.process.pid}
    pids = {redis.process.pid, *ours}
    before = CpuSnapshot.take(pids)
    out = bench(requests)
    after = CpuSnapshot.take(pids)
    cpu = cpu_report(before, after, charged, requests, "redis_benchmark")
    misses = redis.misses() - misses0
    keys = len(command) - 1
    return {
        "concurrency": concurrency,
        "duration_s": round(after.at - before.at, 2),
        "requests": requests,
        "requests_per_s": float(out["rps"]),
        "rows_per_s": round(float(out["rps"]) * keys),
        "latency_ms": {"p50": float(out["p50_latency_ms"]), "p99": float(out["p99_latency_ms"])},
        "keyspace_misses": misses,
        "failed": misses != 0,
        **({"failure": f"{misses} keyspace misses"} if misses else {}),
        **cpu,
    }


# ---------------------------------------------------------------------------------------------- ASGI baseline
def serve_asgi_baseline(db_path: str, port: int) -> None:
    """The baseline server (run in its own process): raw ASGI, one rocksdict get per POST, orjson out."""
    import orjson
    import uvicorn
    from rocksdict import AccessType, Options, Rdict

    db = Rdict(db_path, Options(raw_mode=True), access_type=AccessType.read_only())
    Receive = Callable[[], Any]
    Send = Callable[[dict[str, Any]], Any]

    async def app(scope: dict[str, Any], receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        body = b""
        while True:
            message = await receive()
            body += message.get("body", b"")
            if not message.get("more_body"):
                break
        try:
            key = orjson.loads(body)["sql"].split("'", 2)[1]
        except (orjson.JSONDecodeError, KeyError, IndexError, TypeError, AttributeError):
            status, payload = 400, b'{"message":"expected {\\"sql\\": \\"... = \'key\'\\"}"}'
        else:
            value = db.get(encode_key((key,)))
            rows, columns = [], ["user", "clicks", "url", "last_seen"]
            if value is not None:
                found = decode_row(value)
                columns = list(found)
                rows.append(list(found.values()))
            status, payload = 200, orjson.dumps({"columns": columns, "rows": rows})
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(payload))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": payload})

    uvicorn.run(
        app,
        host="127.0.0.1",
        port=port,
        loop="uvloop",
        http="httptools",
        lifespan="off",
        access_log=False,
        log_level="warning",
    )


def start_asgi_baseline(children: Children, directory: Path) -> tuple[subprocess.Popen[bytes], int]:
    from rocksdict import Options, Rdict

    directory.mkdir(parents=True, exist_ok=True)
    db_path = directory / "rows.rocksdb"
    db = Rdict(str(db_path), Options(raw_mode=True))
    for i in range(ROWS):
        db[encode_key((user(i),))] = encode_row(row(i))
    db.close()
    port = free_port()
    command = [sys.executable, str(Path(__file__).resolve()), "--asgi-baseline", str(db_path), str(port)]
    proc = children.start(command, directory / "baseline.log")
    end = time.monotonic() + 20
    while True:
        if proc.poll() is not None:
            log = (directory / "baseline.log").read_text(errors="replace")[-500:]
            raise RuntimeError(f"ASGI baseline exited with {proc.returncode}: {log}")
        with contextlib.suppress(httpx.HTTPError):
            reply = httpx.post(f"http://127.0.0.1:{port}/", content=v1_body(point_sql(user(7))), timeout=1)
            got = dict(zip(reply.json()["columns"], reply.json()["rows"][0], strict=True))
            assert got["clicks"] == 7 and got["last_seen"] == row(7)["last_seen"].isoformat(), got  # type: ignore[attr-defined]
            return proc, port
        if time.monotonic() > end:
            raise TimeoutError("ASGI baseline did not answer")
        time.sleep(0.1)


# ---------------------------------------------------------------------------------------------- cluster
def stop_clusters(clusters: list[LocalCluster]) -> None:
    while clusters:
        cluster = clusters.pop()
        for server in cluster.servers:
            cluster.stop(server)


def http_url(server: LocalServer) -> str:
    return f"http://127.0.0.1:{server.http_port}"


async def placement(server: LocalServer) -> dict[int, tuple[int, list[int]]]:
    """partition -> (active, standbys) of table `bench`, as `server` sees it."""
    async with httpx.AsyncClient(timeout=5.0) as http:
        reply = await http.get(f"{http_url(server)}/v1/tables")
    reply.raise_for_status()
    table = next(t for t in reply.json()["tables"] if t["name"] == TABLE)
    return {p["partition"]: (p["active"], list(p["standbys"])) for p in table["placement"]}


async def wait_caught_up(cluster: LocalCluster, timeout_s: float = 20.0) -> float:
    """Until every server's lag table shows every replica of `bench` at its end (20,000 rows in all)."""
    started = time.monotonic()
    async with httpx.AsyncClient(timeout=5.0) as http:
        while time.monotonic() - started < timeout_s:
            done = True
            for server in cluster.servers:
                try:
                    view = (await http.get(f"{http_url(server)}/v1/lag")).json()["lags"]
                except (httpx.HTTPError, ValueError, KeyError):
                    done = False
                    break
                replicas = [
                    lag
                    for tables in view.values()
                    for name, partitions in tables.items()
                    if name == TABLE
                    for lag in partitions.values()
                ]
                actives = [lag for lag in replicas if lag["state"] == "active"]
                if (
                    len(replicas) < PARTITIONS * (1 + STANDBYS)
                    or any(lag["offset_lag"] != 0 for lag in replicas)
                    or sum(lag["end_offset_position"] for lag in actives) < ROWS
                ):
                    done = False
                    break
            if done:
                return time.monotonic() - started
            await asyncio.sleep(0.1)
    raise TimeoutError(f"replicas of {TABLE} not caught up after {timeout_s:.0f} s")


async def start_cluster(root: Path, name: str, clusters: list[LocalCluster]) -> dict[str, Any]:
    cluster = LocalCluster.create(root / name, 3)
    cluster.write_configs()
    cluster.save()
    clusters.append(cluster)  # before starting: the caller's finally stops whatever did start
    cluster.start_all()
    t0 = time.monotonic()
    try:
        await cluster.wait_ready(30)
    except TimeoutError:
        for server in cluster.servers:  # the logs go with the temporary directory: show why here
            log = server.directory(cluster.root) / "server.log"
            tail = log.read_text(errors="replace").splitlines()[-8:] if log.exists() else ["(no log)"]
            print(
                f"server {server.node_id} alive={cluster.alive(server)}:", *tail, sep="\n  ", file=sys.stderr
            )
        raise
    ready_s = time.monotonic() - t0
    async with cluster.admin(request_timeout_s=2.0) as admin:
        reply = await admin.create_table(
            TABLE, partitions=PARTITIONS, standby_replicas=STANDBYS, key_columns=KEY
        )
        assert reply.error is ControllerError.NONE, reply
    async with TableWriter(
        cluster.addresses(), TABLE, cluster_id=cluster.cluster_id, secret=cluster.secret
    ) as writer:
        t0 = time.monotonic()
        for start in range(0, ROWS, WRITE_BATCH):
            await writer.upsert([row(i) for i in range(start, min(ROWS, start + WRITE_BATCH))])
        write_s = time.monotonic() - t0
    caught_up_s = await wait_caught_up(cluster)
    return {
        "cluster": cluster,
        "ready_s": round(ready_s, 2),
        "write_s": round(write_s, 2),
        "caught_up_after_write_s": round(caught_up_s, 2),
    }


def choose_server(
    cluster: LocalCluster, parts: dict[int, tuple[int, list[int]]]
) -> tuple[LocalServer, list[int], list[int]]:
    """A server with both partitions it is active for and partitions it holds no replica of."""
    best: tuple[int, LocalServer, list[int], list[int]] | None = None
    for server in cluster.servers:
        local = [p for p, (active, _) in parts.items() if active == server.node_id]
        remote = [p for p, (active, standbys) in parts.items() if server.node_id not in (active, *standbys)]
        score = min(len(local), len(remote))
        if best is None or score > best[0]:
            best = (score, server, local, remote)
    assert best is not None and best[0] > 0, (
        f"no server with both local actives and remote partitions: {parts}"
    )
    return best[1], sorted(best[2]), sorted(best[3])


async def verify(
    server: LocalServer, local_keys: Sequence[str], remote_keys: Sequence[str]
) -> dict[str, Any]:
    """Right rows from both endpoints, and who serves the local and the forwarded cells' keys (a sample)."""
    served: dict[str, Counter[str]] = {"local": Counter(), "forwarded": Counter()}
    async with httpx.AsyncClient(base_url=http_url(server), timeout=CLIENT_TIMEOUT_S) as http:
        for i in (0, 1, 12_345, ROWS - 1):
            reply = await http.post("/v1/query", content=v1_body(point_sql(user(i))))
            assert reply.status_code == 200, reply.text
            body = reply.json()
            got = dict(zip(body["columns"], body["rows"][0], strict=True))
            assert got["clicks"] == i and got["last_seen"] == row(i)["last_seen"].isoformat(), got  # type: ignore[attr-defined]
            reply = await http.post("/query", content=ksql_body(point_sql(user(i))))
            assert reply.status_code == 200, reply.text
            assert reply.json()[1]["row"]["columns"][1] == i, reply.text
        for label, keys in (("local", local_keys), ("forwarded", remote_keys)):
            for key in keys[:: max(1, len(keys) // 20)]:
                reply = await http.post("/v1/query", content=v1_body(point_sql(key)))
                assert reply.status_code == 200, reply.text
                served_by = reply.json()["partitions"][0]["served_by"]
                served[label]["queried server" if served_by == server.node_id else f"server-{served_by}"] += 1
    return {label: dict(counter) for label, counter in served.items()}


def idle_cpu(pids: Mapping[str, int]) -> dict[str, float]:
    """Each process's CPU fraction with no load at all, over IDLE_SAMPLE_S."""
    before = {label: proc_cpu_s(pid) for label, pid in pids.items()}
    time.sleep(IDLE_SAMPLE_S)
    return {label: round((proc_cpu_s(pid) - before[label]) / IDLE_SAMPLE_S, 4) for label, pid in pids.items()}


# ---------------------------------------------------------------------------------------------- lookups
def lookups(root: Path, clusters: list[LocalCluster], children: Children, mode: Mode) -> dict[str, Any]:
    setup = asyncio.run(start_cluster(root, "cluster", clusters))
    cluster: LocalCluster = setup.pop("cluster")
    parts = asyncio.run(placement(cluster.servers[0]))
    server, local_parts, remote_parts = choose_server(cluster, parts)
    by_partition: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    for i in range(ROWS):
        by_partition[partition_for(encode_key((user(i),)), PARTITIONS)].append(user(i))
    rng = random.Random(42)
    local_keys = [k for p in local_parts for k in by_partition[p]]
    remote_keys = [k for p in remote_parts for k in by_partition[p]]
    rng.shuffle(local_keys)
    rng.shuffle(remote_keys)
    served = asyncio.run(verify(server, local_keys, remote_keys))

    files = root / "bodies"
    files.mkdir()
    v1_local = write_lines(files / "v1_local.txt", [v1_body(point_sql(k)) for k in local_keys])
    v1_remote = write_lines(files / "v1_forwarded.txt", [v1_body(point_sql(k)) for k in remote_keys])
    ksql_local = write_lines(files / "ksql_local.txt", [ksql_body(point_sql(k)) for k in local_keys])
    v1_in = write_lines(files / "v1_in.txt", [v1_body(in_sql(rng)) for _ in range(BODIES_PER_FILE)])
    v1_range = write_lines(files / "v1_range.txt", [v1_body(range_sql(rng)) for _ in range(BODIES_PER_FILE)])

    labels = {
        (f"server-{s.node_id} (queried)" if s is server else f"server-{s.node_id}"): s.pid
        for s in cluster.servers
        if s.pid is not None
    }
    url = http_url(server)
    results: dict[str, Any] = {
        "setup": setup,
        "query_server": server.node_id,
        "placement": {str(p): {"active": a, "standbys": s} for p, (a, s) in sorted(parts.items())},
        "local_partitions": local_parts,
        "forwarded_partitions": remote_parts,
        "local_keys": len(local_keys),
        "forwarded_keys": len(remote_keys),
        "served_by_sample": served,
        "idle_cpu_fraction": idle_cpu(labels),
    }
    cells: dict[str, dict[str, Any]] = {}
    results["cells"] = cells
    ours = list(labels.values())  # while the baselines run, the idle servers are ours, not others' load

    def record(name: str, concurrency: int, measure: Callable[[], dict[str, Any]]) -> None:
        """One cell; a load generator that fails to run fails the cell, not the benchmark."""
        try:
            cell = measure()
        except (RuntimeError, OSError, subprocess.SubprocessError) as error:
            cell = {"concurrency": concurrency, "failed": True, "failure": f"{type(error).__name__}: {error}"}
        cells.setdefault(name, {})[f"c{concurrency}"] = cell
        print(cell_line(name, cell), flush=True)

    def wrk_cell(load: Load, concurrency: int) -> None:
        record(load.name, concurrency, lambda: measure_wrk(children, load, concurrency, mode))

    hotstate = [
        (Load("v1_local", url, "/v1/query", v1_local, 1, labels, ()), mode.concurrency),
        (Load("v1_forwarded", url, "/v1/query", v1_remote, 1, labels, ()), mode.concurrency),
        (Load("ksql_query_local", url, "/query", ksql_local, 1, labels, ()), (8,)),
        (Load("v1_in_100", url, "/v1/query", v1_in, BATCH_KEYS, labels, ()), (8,)),
        (Load("v1_range_1000", url, "/v1/query", v1_range, RANGE_KEYS, labels, ()), (8,)),
    ]
    for load, concurrencies in hotstate:
        for concurrency in concurrencies:
            wrk_cell(load, concurrency)

    # The Python client, with and without routing.
    given = f"127.0.0.1:{server.http_port}"
    for name, keys, routing in (
        ("python_local", local_keys, False),
        ("python_forwarded", remote_keys, False),
        ("python_forwarded_routed", remote_keys, True),
        ("python_local_routed", local_keys, True),
    ):
        keys_file = write_lines(files / f"{name}.keys", keys)
        for concurrency in mode.python_concurrency:
            measure = functools.partial(
                measure_python, children, name, given, keys_file, routing, concurrency, mode, labels
            )
            record(name, concurrency, measure)

    # Baseline 1: raw ASGI + rocksdict + orjson, the same bodies as v1_local.
    baseline: dict[str, Any] = {}
    results["asgi_baseline"] = baseline
    try:
        import orjson  # noqa: F401  (only to say clearly why the baseline is missing)

        proc, port = start_asgi_baseline(children, root / "asgi")
    except (ImportError, RuntimeError, TimeoutError, OSError) as error:
        baseline["error"] = f"{type(error).__name__}: {error}"
        print(f"ASGI baseline skipped: {baseline['error']}", flush=True)
    else:
        baseline["port"] = port
        base_url = f"http://127.0.0.1:{port}"
        load = Load("asgi_baseline_local", base_url, "/", v1_local, 1, {"baseline": proc.pid}, ours)
        for concurrency in mode.concurrency:
            wrk_cell(load, concurrency)
        children.stop(proc)

    # Baseline 2: Redis through redis-benchmark.
    redis_info: dict[str, Any] = {}
    results["redis"] = redis_info
    if shutil.which("redis-server") and shutil.which("redis-benchmark") and shutil.which("redis-cli"):
        try:
            redis = RedisServer.start(children, root / "redis")
            redis.wait_ready()
            redis_info["port"] = redis.port
            redis_info["load_s"] = round(redis.load(), 2)
        except (OSError, RuntimeError, TimeoutError, AssertionError, subprocess.SubprocessError) as error:
            redis_info["error"] = f"{type(error).__name__}: {error}"
            print(f"Redis baseline skipped: {redis_info['error']}", flush=True)
        else:
            get = ("GET", REDIS_KEY.replace("{:012d}", "__rand_int__"))
            mget = ("MGET", *[get[1]] * BATCH_KEYS)
            for name, command, concurrencies in (
                ("redis_get", get, mode.concurrency),
                ("redis_mget_100", mget, (8,)),
            ):
                for concurrency in concurrencies:
                    measure = functools.partial(
                        measure_redis, children, redis, command, concurrency, mode, ours
                    )
                    record(name, concurrency, measure)
            children.stop(redis.process)
    else:
        redis_info["error"] = "redis-server, redis-benchmark or redis-cli not installed"
    return results


# ---------------------------------------------------------------------------------------------- python
PYTHON_READY_S = 120.0  # the most a client process may take to start (imports, a first query)


def client_worker(config_text: str) -> None:
    """One Python client process: one query, READY on stdout, then the window's start and end (wall
    clock) from stdin; point lookups of its keys in a loop, warm-up until start, measured until end;
    prints one CLIENT_JSON line."""
    import hotstate

    config = json.loads(config_text)
    keys = Path(config["keys"]).read_text().split()
    random.Random(config["seed"]).shuffle(keys)
    latencies: list[float] = []
    failures: Counter[str] = Counter()
    forwarded = wrong = warmup = 0
    with hotstate.Client(config["server"], routing=config["routing"], timeout_s=CLIENT_TIMEOUT_S) as client:
        client.query(point_sql(keys[0]), timeout_ms=QUERY_TIMEOUT_MS)  # imports and connects
        print("READY", flush=True)
        start, end = map(float, sys.stdin.readline().split())
        i = 0
        while (now := time.time()) < end:
            key = keys[i % len(keys)]
            i += 1
            sent = time.perf_counter()
            try:
                result = client.query(point_sql(key), timeout_ms=QUERY_TIMEOUT_MS)
            except Exception as error:  # a failure is counted, never fatal: the cell reports it
                if now >= start:
                    failures[type(error).__name__] += 1
                continue
            took = time.perf_counter() - sent
            if now < start:
                warmup += 1
                continue
            latencies.append(took)
            forwarded += any(p.served_by != result.coordinator for p in result.partitions)
            wrong += len(result.rows) != 1
    print(
        "CLIENT_JSON "
        + json.dumps(
            {
                "requests": len(latencies),
                "latencies_ms": [round(t * 1000, 3) for t in latencies],
                "forwarded": forwarded,
                "wrong_rows": wrong,
                "failures": dict(failures),
                "warmup_requests": warmup,
            }
        ),
        flush=True,
    )


def measure_python(
    children: Children,
    name: str,
    server: str,
    keys: Path,
    routing: bool,
    concurrency: int,
    mode: Mode,
    labels: Mapping[str, int],
) -> dict[str, Any]:
    """`concurrency` client processes over one window, once all have started; the servers' and the
    clients' CPU over it."""
    procs = []
    for n in range(concurrency):
        config = {"server": server, "keys": str(keys), "routing": routing, "seed": n}
        command = [sys.executable, str(Path(__file__).resolve()), "--client-worker", json.dumps(config)]
        procs.append(children.start(command, stdin=True))
    ready = time.monotonic() + PYTHON_READY_S
    for proc in procs:
        assert proc.stdout is not None and proc.stdin is not None
        while (line := proc.stdout.readline()) != b"READY\n":
            if not line or time.monotonic() > ready:
                for started in procs:
                    children.stop(started)
                raise RuntimeError(f"a Python client did not start: {line.decode(errors='replace')[-300:]}")
    start = time.time() + mode.warmup_s
    end = start + mode.measure_s
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write(f"{start} {end}\n".encode())
        proc.stdin.flush()
    time.sleep(max(0.0, start - time.time()))
    pids = {**labels, **{f"client-{n}": p.pid for n, p in enumerate(procs)}}
    before = {label: proc_cpu_s(pid) for label, pid in pids.items()}
    busy_before, began = busy_ticks(), time.monotonic()
    time.sleep(max(0.0, end - time.time()))
    elapsed = time.monotonic() - began
    used = {label: proc_cpu_s(pid) - before[label] for label, pid in pids.items()}
    machine = (busy_ticks() - busy_before) / CLK_TCK / elapsed
    others = machine - sum(v for v in used.values() if not math.isnan(v)) / elapsed
    answers = []
    problems = []
    for proc in procs:
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            children.stop(proc)
            problems.append("a client did not finish")
            continue
        children.stop(proc)
        said = next((ln for ln in out.decode().splitlines() if ln.startswith("CLIENT_JSON ")), None)
        if said is None:
            problems.append(f"a client exited {proc.returncode}: {err.decode(errors='replace')[-300:]}")
            continue
        answers.append(json.loads(said.removeprefix("CLIENT_JSON ")))
    requests = sum(a["requests"] for a in answers)
    latencies = sorted(t for a in answers for t in a["latencies_ms"])
    failures: Counter[str] = Counter()
    for a in answers:
        failures.update(a["failures"])
    wrong = sum(a["wrong_rows"] for a in answers)
    if failures:
        problems.append(f"failed queries {dict(failures)}")
    if wrong:
        problems.append(f"{wrong} answers without exactly one row")
    if requests == 0:
        problems.append("no request completed")

    def per_request(seconds: float) -> float | None:
        return None if requests == 0 or math.isnan(seconds) else round(seconds * 1e6 / requests, 1)

    servers_cpu = {label: per_request(used[label]) for label in labels}
    return {
        "concurrency": concurrency,
        "routing": routing,
        "duration_s": round(elapsed, 2),
        "requests": requests,
        "requests_per_s": round(requests / elapsed, 1),
        "rows_per_s": round(requests / elapsed),
        **(
            {
                "latency_ms": {f"p{q}": percentile(latencies, q / 100) for q in (50, 90, 99)}
                | {"max": latencies[-1]}
            }
            if latencies
            else {}
        ),
        "forwarded_answers": sum(a["forwarded"] for a in answers),
        "server_cpu_us_per_request": servers_cpu,
        "python_clients_cpu_us_per_request": per_request(
            sum(v for k, v in used.items() if k.startswith("client-"))
        ),
        "machine_busy_cores": round(machine, 2),
        "others_busy_cores": round(max(0.0, others), 2),
        "contended": others > CONTENDED_CORES,
        "warmup_requests": sum(a["warmup_requests"] for a in answers),
        "failed": bool(problems),
        **({"failure": "; ".join(problems)} if problems else {}),
    }


# ---------------------------------------------------------------------------------------------- goals
def get_cell(cells: Mapping[str, Any], name: str, concurrency: int) -> dict[str, Any] | None:
    cell = cells.get(name, {}).get(f"c{concurrency}")
    return cell if cell is not None and not cell["failed"] else None


def queried_cpu(cell: Mapping[str, Any]) -> float:
    return float(next(v for k, v in cell["server_cpu_us_per_request"].items() if k.endswith("(queried)")))


def peers_cpu(cell: Mapping[str, Any]) -> float:
    cpu = cell["server_cpu_us_per_request"]
    return round(float(sum(v for k, v in cpu.items() if not k.endswith("(queried)"))), 1)


def goal(target: float, measured: float | None, at_least: bool) -> dict[str, Any]:
    """met is false when the cell is missing or failed (measured None)."""
    met = measured is not None and (measured >= target if at_least else measured <= target)
    return {"target": (">= " if at_least else "<= ") + str(target), "measured": measured, "met": met}


def goals(cells: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """The targets (measured None and met false where a cell is missing or failed), and the ratios."""

    def at(name: str, c: int, pick: Callable[[dict[str, Any]], float]) -> float | None:
        cell = get_cell(cells, name, c)
        return None if cell is None else pick(cell)

    def ratio(a: float | None, b: float | None) -> float | None:
        return None if a is None or not b else round(a / b, 3)

    def rps(cell: dict[str, Any]) -> float:
        return float(cell["requests_per_s"])

    def rows(cell: dict[str, Any]) -> float:
        return float(cell["rows_per_s"])

    def p99(cell: dict[str, Any]) -> float:
        return float(cell["latency_ms"]["p99"])

    local8 = at("v1_local", 8, rps)
    out = {
        "local_lookups_per_s_c8": goal(10_000, local8, True),
        "server_cpu_us_per_local_lookup_c8": goal(100, at("v1_local", 8, queried_cpu), False),
        "local_p99_ms_c8": goal(5, at("v1_local", 8, p99), False),
        "local_p99_ms_c1": goal(1.5, at("v1_local", 1, p99), False),
        "ratio_local_to_raw_asgi_c8": goal(0.5, ratio(local8, at("asgi_baseline_local", 8, rps)), True),
        "forwarded_lookups_per_s_c8": goal(6_000, at("v1_forwarded", 8, rps), True),
        "peers_cpu_us_per_forwarded_lookup_c8": goal(60, at("v1_forwarded", 8, peers_cpu), False),
        "in_100_rows_per_s_c8": goal(300_000, at("v1_in_100", 8, rows), True),
        "range_1000_rows_per_s_c8": goal(300_000, at("v1_range_1000", 8, rows), True),
        "ksql_query_over_v1_query_c8": goal(0.9, ratio(at("ksql_query_local", 8, rps), local8), True),
        # Issue 29: forwarded-key lookups with client routing on reach 0.9x of local ones (Python client).
        "python_routed_forwarded_over_local_c4": goal(
            0.9, ratio(at("python_forwarded_routed", 4, rps), at("python_local", 4, rps)), True
        ),
    }
    ratios: dict[str, Any] = {}
    for c in (1, 8, 32):
        for name, base in (("asgi", "asgi_baseline_local"), ("redis_get", "redis_get")):
            value = ratio(at("v1_local", c, rps), at(base, c, rps))
            if value is not None:
                ratios[f"v1_local_over_{name}_requests_per_s_c{c}"] = value
            value = ratio(at("v1_forwarded", c, rps), at(base, c, rps))
            if value is not None:
                ratios[f"v1_forwarded_over_{name}_requests_per_s_c{c}"] = value
        value = ratio(at("v1_local", c, queried_cpu), at("asgi_baseline_local", c, queried_cpu_any))
        if value is not None:
            ratios[f"v1_local_over_asgi_server_cpu_per_request_c{c}"] = value
        value = ratio(at("v1_local", c, queried_cpu), at("redis_get", c, queried_cpu_any))
        if value is not None:
            ratios[f"v1_local_over_redis_get_server_cpu_per_request_c{c}"] = value
    for c in (1, 2, 4):
        for name in ("python_forwarded", "python_forwarded_routed", "python_local_routed"):
            value = ratio(at(name, c, rps), at("python_local", c, rps))
            if value is not None:
                ratios[f"{name}_over_python_local_requests_per_s_c{c}"] = value
    for name in ("v1_in_100", "v1_range_1000"):
        value = ratio(at(name, 8, rows), at("redis_mget_100", 8, rows))
        if value is not None:
            ratios[f"{name}_over_redis_mget_100_rows_per_s_c8"] = value
    return out, ratios


def queried_cpu_any(cell: Mapping[str, Any]) -> float:
    """A baseline's one server process."""
    return float(sum(cell["server_cpu_us_per_request"].values()))


# ---------------------------------------------------------------------------------------------- failover
@dataclass(frozen=True, slots=True)
class Sample:
    sent_s: float  # relative to the kill
    latency_ms: float
    ok: bool
    reason: str  # "ok", "HTTP 503", "slow", "ReadTimeout", ...
    standby_served: bool


async def failover(root: Path, clusters: list[LocalCluster], standby_reads: bool) -> dict[str, object]:
    label = "standby_reads_on" if standby_reads else "standby_reads_off"
    setup = await start_cluster(root, f"failover-{label}", clusters)
    cluster: LocalCluster = setup.pop("cluster")
    parts = await placement(cluster.servers[0])
    actives = Counter(active for active, _ in parts.values())
    victim = min(cluster.servers, key=lambda s: (-actives[s.node_id], s.node_id))
    query_server = next(s for s in cluster.servers if s is not victim)
    keys = [user(i) for i in range(ROWS)]
    samples: list[Sample] = []
    started = time.perf_counter()
    kill_at = started + FAILOVER_KILL_AT_S
    end = started + FAILOVER_WINDOW_S
    moved_after_ms: list[float] = []

    payload_extra: dict[str, object] = {"timeout_ms": QUERY_TIMEOUT_MS}
    if not standby_reads:
        payload_extra["standby_reads"] = False

    async def client(index: int, http: httpx.AsyncClient) -> None:
        rng = random.Random(index)
        while time.perf_counter() < end:
            sql = point_sql(rng.choice(keys))
            t0 = time.perf_counter()
            standby = False
            try:
                reply = await http.post("/v1/query", json={"sql": sql, **payload_extra})
                reason = "ok" if reply.status_code == 200 else f"HTTP {reply.status_code}"
                if reply.status_code == 200:
                    standby = reply.json()["partitions"][0]["state"] != "active"
            except httpx.HTTPError as error:
                reason = type(error).__name__
            latency = (time.perf_counter() - t0) * 1000
            if reason == "ok" and latency > QUERY_TIMEOUT_MS:
                reason = "slow"
            samples.append(Sample(t0 - kill_at, latency, reason == "ok", reason, standby))

    async def killer() -> None:
        await asyncio.sleep(max(0.0, kill_at - time.perf_counter()))
        cluster.signal(victim, signal.SIGKILL)
        # When does the surviving query server's metadata show no active on the killed server?
        async with httpx.AsyncClient(timeout=1.0) as http:
            while time.perf_counter() < end + 10:
                with contextlib.suppress(httpx.HTTPError, ValueError, KeyError, StopIteration):
                    reply = await http.get(f"{http_url(query_server)}/v1/tables")
                    table = next(t for t in reply.json()["tables"] if t["name"] == TABLE)
                    if all(p["active"] != victim.node_id for p in table["placement"]):
                        moved_after_ms.append((time.perf_counter() - kill_at) * 1000)
                        return
                await asyncio.sleep(0.05)

    limits = httpx.Limits(max_connections=FAILOVER_CLIENTS, max_keepalive_connections=FAILOVER_CLIENTS)
    async with httpx.AsyncClient(
        base_url=http_url(query_server), limits=limits, timeout=CLIENT_TIMEOUT_S
    ) as http:
        await asyncio.gather(killer(), *(client(i, http) for i in range(FAILOVER_CLIENTS)))

    failed = [s for s in samples if not s.ok]
    after = [s for s in samples if s.sent_s >= 0]
    timeline = []
    first_bucket = -int(FAILOVER_KILL_AT_S * 1000) // BUCKET_MS
    last_bucket = int((FAILOVER_WINDOW_S - FAILOVER_KILL_AT_S) * 1000) // BUCKET_MS
    for bucket in range(first_bucket, last_bucket + 1):
        inside = [s for s in samples if bucket * BUCKET_MS <= s.sent_s * 1000 < (bucket + 1) * BUCKET_MS]
        if inside:
            timeline.append(
                [bucket * BUCKET_MS, sum(s.ok for s in inside), len(inside) - sum(s.ok for s in inside)]
            )
    latencies = [s.latency_ms for s in samples]
    return {
        "setup": setup,
        "standby_reads": standby_reads,
        "killed_server": victim.node_id,
        "killed_server_actives": actives[victim.node_id],
        "query_server": query_server.node_id,
        "queries": len(samples),
        "ok": len(samples) - len(failed),
        "failed": len(failed),
        "success_rate": round((len(samples) - len(failed)) / len(samples), 4),
        "p50_ms": round(percentile(latencies, 0.5), 1),
        "p99_ms": round(percentile(latencies, 0.99), 1),
        "max_ms": round(max(latencies), 1),
        "after_kill": {
            "queries": len(after),
            "success_rate": round(sum(s.ok for s in after) / len(after), 4) if after else None,
            "p99_ms": round(percentile([s.latency_ms for s in after], 0.99), 1) if after else None,
            "served_by_standby": sum(s.standby_served for s in after),
        },
        "failures_by_reason": dict(Counter(s.reason for s in failed)),
        "failures_from_ms_after_kill": round(min(s.sent_s for s in failed) * 1000) if failed else None,
        "failures_until_ms_after_kill": round(max(s.sent_s for s in failed) * 1000) if failed else None,
        "actives_moved_off_killed_server_after_ms": round(moved_after_ms[0]) if moved_after_ms else None,
        "timeline_ms_ok_failed": timeline,
    }


# ---------------------------------------------------------------------------------------------- main
def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)  # unwinds through the finally blocks that stop every process


@dataclass
class Run:
    mode: Mode
    failover: bool
    out: Path
    results: dict[str, Any] = field(default_factory=dict)


def parse_args(argv: Sequence[str]) -> Run:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="1 s cells, concurrency 8 only (harness check)")
    parser.add_argument("--no-failover", action="store_true", help="skip the failover section")
    parser.add_argument(
        "--out",
        type=Path,
        help="results file (default: bench/results/pull_queries.json, "
        "or pull_queries.quick.json in the temporary directory with --quick)",
    )
    args = parser.parse_args(argv)
    default = Path(tempfile.gettempdir()) / "pull_queries.quick.json" if args.quick else RESULTS
    return Run(Mode.of(args.quick), not args.no_failover, args.out or default)


def main(argv: Sequence[str]) -> int:
    if argv[:1] == ["--asgi-baseline"]:
        serve_asgi_baseline(argv[1], int(argv[2]))
        return 0
    if argv[:1] == ["--client-worker"]:
        client_worker(argv[1])
        return 0
    run = parse_args(argv)
    mode = run.mode
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background
    load_before = round(os.getloadavg()[0], 2)
    others_before = other_processes()
    began = time.monotonic()
    results = run.results
    clusters: list[LocalCluster] = []
    children = Children()
    with tempfile.TemporaryDirectory(prefix="hotstate-pull-bench-") as tmp:
        root = Path(tmp)
        try:
            results["tools"] = ensure_tools()
            results["lookups"] = lookups(root, clusters, children, mode)
            stop_clusters(clusters)
            results["goals"], results["ratios"] = goals(results["lookups"]["cells"])
            for standby_reads in (True, False) if run.failover else ():
                key = "failover_standby_reads_on" if standby_reads else "failover_standby_reads_off"
                results[key] = asyncio.run(failover(root, clusters, standby_reads))
                print(f"{key}: {json.dumps(results[key])}", flush=True)
                stop_clusters(clusters)
        finally:
            children.stop_all()
            stop_clusters(clusters)
    report = {
        "benchmark": "pull queries over HTTP (POST /v1/query, POST /query) on a local 3-server cluster, "
        "load from wrk; raw ASGI + rocksdict and Redis (redis-benchmark) as baselines in the same run",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "note": (
            f"the 3 servers, wrk (one thread) and the baselines share the machine's {os.cpu_count()} cores: "
            "requests/s is for this machine only, and at high rates wrk takes a large share of the cores; "
            "server CPU per request (utime+stime of the server process over the requests wrk completed) is "
            "the number that carries over"
            + (
                "; QUICK MODE: 1 s cells, concurrency 8 only (a harness check, not a measurement)"
                if mode.quick
                else ""
            )
        ),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_1m_before": load_before,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "other_processes_before": others_before,
        "other_processes_after": other_processes(),
        "duration_s": round(time.monotonic() - began, 1),
        "parameters": {
            "quick": mode.quick,
            "servers": 3,
            "table": TABLE,
            "partitions": PARTITIONS,
            "standby_replicas": STANDBYS,
            "key": "user STRING",
            "rows": ROWS,
            "row": "user (key, 'user-000123'), clicks (int), url (str), last_seen (timestamp)",
            "server_config": "defaults (LocalCluster)",
            "load_generator": f"wrk -t1 --timeout {WRK_TIMEOUT} -s bench/lua/post_bodies.lua (keep-alive, "
            "one connection per concurrent client, no pipelining); Redis: redis-benchmark -r 20000 (no "
            "pipelining)",
            "cell": f"{mode.warmup_s} s warm-up run of wrk, then a {mode.measure_s} s measured run",
            "concurrency": list(mode.concurrency),
            "v1_body": v1_body(point_sql("user-000123")),
            "ksql_body": ksql_body(point_sql("user-000123")),
            "batch_keys": BATCH_KEYS,
            "range_keys": RANGE_KEYS,
            "bodies_per_batch_or_range_file": BODIES_PER_FILE,
            "cpu_per_request": "utime+stime delta of each process from /proc/PID/stat over the measured run, "
            "divided by the requests wrk completed; includes the process's idle background work "
            "(lookups.idle_cpu_fraction)",
            "asgi_baseline": "raw ASGI on uvicorn (httptools, uvloop), own process, same bodies as v1_local: "
            "orjson.loads, key from the SQL's literal, one rocksdict get (one RocksDB, all rows), "
            "hotstate's decode_row, orjson.dumps",
            "redis": "rows as JSON strings under key:000000000000..; GET key:__rand_int__ and MGET of 100 "
            "such keys; the measured request count sized from a warm-up run to the cell's duration",
            "goals": "from the c=8 cells unless named c1; server CPU per local lookup is the queried "
            "server's; peers' CPU per forwarded lookup is the sum over both peers (the router spreads reads "
            "over a partition's active and standby; each includes its idle background); ratios are "
            "requests/s over requests/s; a missing or failed cell is not met",
            "query_timeout_ms": QUERY_TIMEOUT_MS,
            "failover_clients": FAILOVER_CLIENTS,
            "failover_window_s": FAILOVER_WINDOW_S,
            "failover_kill_at_s": FAILOVER_KILL_AT_S,
            "failover_failure": f"non-200, or slower than timeout_ms={QUERY_TIMEOUT_MS}",
            "failover_cluster": "a fresh cluster per run; SIGKILL of the server holding the most actives; "
            "httpx client",
            "python_client": "hotstate.Client, one process per concurrent client, each given only the "
            "queried server; point lookups of its cell's keys in a shuffled loop; a "
            "the warm-up (once every client has started and queried once) before the measured window",
            "python_concurrency": list(mode.python_concurrency),
        },
        "goals": results.pop("goals", {}),
        "ratios": results.pop("ratios", {}),
        "results": results,
    }
    run.out.parent.mkdir(parents=True, exist_ok=True)
    run.out.write_text(json.dumps(report, indent=2) + "\n")
    print_summary(report)
    print(f"wrote {run.out}")
    return 0


def print_summary(report: dict[str, Any]) -> None:
    results = report["results"]
    print(
        f"\n{report['cpu_count']} cores, load {report['load_average_1m_before']} -> "
        f"{report['load_average_1m']}, {report['duration_s']} s"
    )
    for name, by_c in results["lookups"]["cells"].items():
        for cell in by_c.values():
            print(cell_line(name, cell))
    print("goals:")
    for name, g in report["goals"].items():
        print(f"  {name:40} {g['target']:>12}  measured {g['measured']}  {'met' if g['met'] else 'NOT met'}")
    print(f"ratios: {json.dumps(report['ratios'])}")
    for key in ("failover_standby_reads_on", "failover_standby_reads_off"):
        if key in results:
            run = results[key]
            print(
                f"{key}: success {run['success_rate']:.2%} ({run['failed']}/{run['queries']} failed) "
                f"p99 {run['p99_ms']} ms max {run['max_ms']} ms; failures {run['failures_by_reason']}; "
                f"actives moved after {run['actives_moved_off_killed_server_after_ms']} ms"
            )


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

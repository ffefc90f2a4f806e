"""Benchmark of pull queries over HTTP on a real local cluster -> bench/results/pull_queries.json.

A local 3-server cluster (default configs) holds table `bench` (6 partitions, 1 standby, key `user` STRING,
20,000 rows). A Redis server started by this script holds the same rows as JSON strings under the same keys
and is the baseline, measured in the same run with the same keys and concurrency over a raw asyncio RESP
socket (no pipelining for single GETs).

1. Single-key lookups through one server: keys whose partition's active is on that server (read locally)
   and keys whose partition has no replica on it (forwarded once), sequential and 8 concurrent clients
   (httpx keep-alive); lookups/s, p50/p99 latency, beside Redis GET.
2. Batch lookups `WHERE user IN (100 keys)`: rows/s and latency, beside Redis MGET of the same 100 keys.
3. Failover: 4 clients query random keys for 5 s through a server that stays up; at 1.5 s the server
   holding the most actives is killed with SIGKILL. Success rate and latency over the window, with standby
   reads on (the default) and off (only actives serve, KLIP-12's "before"), each on a fresh cluster.
   A query fails if it answers non-200 or takes longer than its timeout_ms (2,000).

Every process started here (servers, redis-server) is stopped at the end, also on errors, Ctrl-C, SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from hotstate.cli.local_cluster import LocalCluster, LocalServer
from hotstate.client.writer import TableWriter
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError
from hotstate.replica.keys import encode_key, partition_for

RESULTS = Path(__file__).parent / "results" / "pull_queries.json"
TABLE = "bench"
KEY = (KeyColumn("user", KeyType.STRING),)
PARTITIONS = 6
STANDBYS = 1
ROWS = 20_000
WRITE_BATCH = 1_000
ROUNDS = 3  # each cell is measured in ROUNDS slices of SLICE_S, interleaved with the other cells
SLICE_S = 1.0
WARMUP_S = 0.5  # unmeasured seconds of each cell before the first round (connections, caches)
CONCURRENCY = (1, 8)
BATCH_KEYS = 100
QUERY_TIMEOUT_MS = 2_000
CLIENT_TIMEOUT_S = 5.0  # the HTTP client gives up later than the query's own timeout
FAILOVER_CLIENTS = 4
FAILOVER_WINDOW_S = 5.0
FAILOVER_KILL_AT_S = 1.5
BUCKET_MS = 250
LAST_SEEN_BASE = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)


def user(i: int) -> str:
    return f"user-{i:06d}"


def row(i: int) -> dict[str, object]:
    return {
        "user": user(i),
        "clicks": i,
        "url": f"/page/{i % 977}",
        "last_seen": LAST_SEEN_BASE + datetime.timedelta(seconds=i),
    }


def redis_value(i: int) -> bytes:
    r = row(i)
    r["last_seen"] = r["last_seen"].isoformat()  # type: ignore[attr-defined]
    return json.dumps(r, separators=(",", ":")).encode()


def percentile(values: Sequence[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# ---------------------------------------------------------------------------------------------- Redis
class RedisError(Exception):
    pass


class Resp:
    """A minimal RESP2 client on one asyncio connection: one command at a time, or an explicit pipeline."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @staticmethod
    async def connect(port: int) -> Resp:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return Resp(reader, writer)

    @staticmethod
    def encode(*args: bytes | str) -> bytes:
        parts = [b"*%d\r\n" % len(args)]
        for arg in args:
            data = arg.encode() if isinstance(arg, str) else arg
            parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
        return b"".join(parts)

    async def call(self, *args: bytes | str) -> Any:
        self._writer.write(self.encode(*args))
        reply = await self._read()
        if isinstance(reply, RedisError):
            raise reply
        return reply

    async def pipeline(self, commands: Sequence[Sequence[bytes | str]]) -> list[Any]:
        self._writer.write(b"".join(self.encode(*c) for c in commands))
        return [await self._read() for _ in commands]

    async def _read(self) -> Any:
        line = await self._reader.readline()
        if not line:
            raise ConnectionError("redis closed the connection")
        kind, rest = line[:1], line[1:-2]
        if kind == b"+":
            return rest.decode()
        if kind == b"-":
            return RedisError(rest.decode())
        if kind == b":":
            return int(rest)
        if kind == b"$":
            size = int(rest)
            return None if size < 0 else (await self._reader.readexactly(size + 2))[:-2]
        if kind == b"*":
            count = int(rest)
            return None if count < 0 else [await self._read() for _ in range(count)]
        raise RedisError(f"unexpected RESP reply {line!r}")

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError):
            await self._writer.wait_closed()


def redis_pids() -> set[int]:
    pids = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if (entry / "comm").read_text().strip() == "redis-server":
                    pids.add(int(entry.name))
    return pids


def other_processes() -> dict[str, int]:
    """Processes of others that compete for the cores (run when none of ours is up): hotstate servers,
    pytest runs, other redis-servers."""
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
    return dict(counts)


def ensure_redis() -> tuple[str | None, dict[str, object]]:
    """The redis-server binary, installing Debian's package when missing; None and why when impossible."""
    found = shutil.which("redis-server")
    if found:
        return found, {"installed_by_this_run": False}
    print("redis-server not found: apt-get install -y redis-server", flush=True)
    before = redis_pids()
    try:
        done = subprocess.run(
            ["apt-get", "install", "-y", "redis-server"],
            env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
            capture_output=True,
            text=True,
            timeout=300,
        )
    except (OSError, subprocess.TimeoutExpired) as error:
        return None, {"error": f"apt-get install -y redis-server: {type(error).__name__}: {error}"}
    # A service the package's scripts may have started is not ours to keep: stop it, by its pid.
    for pid in redis_pids() - before:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    found = shutil.which("redis-server")
    if done.returncode != 0 or not found:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return None, {
            "error": f"apt-get install -y redis-server exited {done.returncode}: {' | '.join(tail)}"
        }
    return found, {"installed_by_this_run": True}


@dataclass
class RedisServer:
    process: subprocess.Popen[bytes]
    port: int
    version: str

    @staticmethod
    def start(binary: str, directory: Path) -> RedisServer:
        directory.mkdir(parents=True, exist_ok=True)
        version = subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip()
        port = free_port()
        with open(directory / "redis.log", "ab") as out:
            command = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
            command += ["--appendonly", "no", "--dir", str(directory), "--daemonize", "no"]
            process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C reaches only this script, which then stops it
            )
        return RedisServer(process, port, version)

    async def wait_ready(self, timeout_s: float = 10.0) -> None:
        end = time.monotonic() + timeout_s
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            try:
                conn = await Resp.connect(self.port)
                try:
                    if await conn.call("PING") == "PONG":
                        return
                finally:
                    await conn.close()
            except OSError:
                if time.monotonic() > end:
                    raise
            await asyncio.sleep(0.05)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)


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


# ---------------------------------------------------------------------------------------------- cells
class QueryFailed(Exception):
    pass


Op = Callable[[int, random.Random], Awaitable[int]]


@dataclass
class Cell:
    latencies_ms: list[float] = field(default_factory=list)
    rows: int = 0
    errors: int = 0
    first_error: str | None = None
    elapsed_s: float = 0.0
    server_took_ms: list[float] = field(default_factory=list)  # hotstate's own took_ms, per query

    def summary(self) -> dict[str, object]:
        lat = self.latencies_ms or [float("nan")]
        return {
            "ops": len(self.latencies_ms),
            "ops_per_s": round(len(self.latencies_ms) / self.elapsed_s, 1),
            "rows_per_s": round(self.rows / self.elapsed_s),
            "p50_ms": round(percentile(lat, 0.5), 2),
            "p99_ms": round(percentile(lat, 0.99), 2),
            "mean_ms": round(statistics.fmean(lat), 2),
            **(
                {"server_took_p50_ms": round(percentile(self.server_took_ms, 0.5), 2)}
                if self.server_took_ms
                else {}
            ),
            "errors": self.errors,
            **({"first_error": self.first_error} if self.first_error else {}),
        }


async def run_slice(op: Op, concurrency: int, duration_s: float, seed: int, cell: Cell | None) -> None:
    """`concurrency` clients, each calling `op` back to back for `duration_s`; recorded in `cell` if any."""

    async def worker(index: int, end: float, rng: random.Random) -> None:
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            try:
                rows = await op(index, rng)
            except Exception as error:  # counted, never stops the cell
                if cell is not None:
                    cell.errors += 1
                    cell.first_error = cell.first_error or f"{type(error).__name__}: {error}"[:200]
                continue
            if cell is not None:
                cell.latencies_ms.append((time.perf_counter() - t0) * 1000)
                cell.rows += rows

    started = time.perf_counter()
    end = started + duration_s
    await asyncio.gather(*(worker(i, end, random.Random(seed * 1000 + i)) for i in range(concurrency)))
    if cell is not None:
        cell.elapsed_s += time.perf_counter() - started


async def run_cells(
    ops: dict[str, Op], concurrency: int, took: dict[str, list[float]], served: Sequence[Counter[str]]
) -> dict[str, Cell]:
    """Every op warmed up, then measured in ROUNDS interleaved slices, so that a change in the machine's
    load (other processes, the servers' own background work) falls on every cell alike. Within a round
    every op gets the same seeds: cells over the same keys see the same keys in the same order."""
    for op in ops.values():
        await run_slice(op, concurrency, WARMUP_S, 999, None)
    for samples in took.values():
        samples.clear()
    for counter in served:
        counter.clear()
    cells = {name: Cell() for name in ops}
    for round_ in range(ROUNDS):
        for name, op in ops.items():
            await run_slice(op, concurrency, SLICE_S, concurrency * 100 + round_, cells[name])
    for name, samples in took.items():
        cells[name].server_took_ms = list(samples)
    return cells


def hotstate_lookup(
    http: httpx.AsyncClient, keys: Sequence[str], served: Counter[str], node: int, took: list[float]
) -> Op:
    async def op(worker: int, rng: random.Random) -> int:
        key = rng.choice(keys)
        reply = await http.post(
            "/v1/query",
            json={"sql": f"SELECT * FROM {TABLE} WHERE user = '{key}'", "timeout_ms": QUERY_TIMEOUT_MS},
        )
        if reply.status_code != 200:
            raise QueryFailed(f"HTTP {reply.status_code}: {reply.text[:150]}")
        body = reply.json()
        served["local" if body["partitions"][0]["served_by"] == node else "forwarded"] += 1
        took.append(body["took_ms"])
        return len(body["rows"])

    return op


def hotstate_batch(http: httpx.AsyncClient, keys: Sequence[str], took: list[float]) -> Op:
    async def op(worker: int, rng: random.Random) -> int:
        batch = rng.sample(keys, BATCH_KEYS)
        listed = ", ".join(f"'{k}'" for k in batch)
        reply = await http.post(
            "/v1/query",
            json={"sql": f"SELECT * FROM {TABLE} WHERE user IN ({listed})", "timeout_ms": QUERY_TIMEOUT_MS},
        )
        if reply.status_code != 200:
            raise QueryFailed(f"HTTP {reply.status_code}: {reply.text[:150]}")
        body = reply.json()
        took.append(body["took_ms"])
        return len(body["rows"])

    return op


def redis_get(conns: Sequence[Resp], keys: Sequence[str]) -> Op:
    async def op(worker: int, rng: random.Random) -> int:
        value = await conns[worker].call("GET", rng.choice(keys))
        return 0 if value is None else (1 if json.loads(value) else 0)

    return op


def redis_mget(conns: Sequence[Resp], keys: Sequence[str]) -> Op:
    async def op(worker: int, rng: random.Random) -> int:
        values = await conns[worker].call("MGET", *rng.sample(keys, BATCH_KEYS))
        return sum(1 for v in values if v is not None and json.loads(v))

    return op


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


async def verify(http: httpx.AsyncClient, redis: Resp | None, sample: Sequence[int]) -> None:
    for i in sample:
        reply = await http.post("/v1/query", json={"sql": f"SELECT * FROM {TABLE} WHERE user = '{user(i)}'"})
        assert reply.status_code == 200, reply.text
        body = reply.json()
        got = dict(zip(body["columns"], body["rows"][0], strict=True))
        assert got["clicks"] == i and got["last_seen"] == row(i)["last_seen"].isoformat(), got  # type: ignore[attr-defined]
        if redis is not None:
            assert json.loads(await redis.call("GET", user(i)))["clicks"] == i


async def lookups(
    root: Path, clusters: list[LocalCluster], redis: RedisServer | None, redis_info: dict[str, object]
) -> dict[str, object]:
    setup = await start_cluster(root, "cluster", clusters)
    cluster: LocalCluster = setup.pop("cluster")
    parts = await placement(cluster.servers[0])
    server, local_parts, remote_parts = choose_server(cluster, parts)
    by_partition: dict[int, list[str]] = {p: [] for p in range(PARTITIONS)}
    for i in range(ROWS):
        by_partition[partition_for(encode_key((user(i),)), PARTITIONS)].append(user(i))
    local_keys = [k for p in local_parts for k in by_partition[p]]
    remote_keys = [k for p in remote_parts for k in by_partition[p]]
    all_keys = [user(i) for i in range(ROWS)]

    redis_conns: list[Resp] = []
    if redis is not None:
        try:
            await redis.wait_ready()
            redis_conns = [await Resp.connect(redis.port) for _ in range(max(CONCURRENCY))]
            t0 = time.monotonic()
            for start in range(0, ROWS, 1_000):  # loading may pipeline; the measured GETs do not
                replies = await redis_conns[0].pipeline(
                    [("SET", user(i), redis_value(i)) for i in range(start, min(ROWS, start + 1_000))]
                )
                if any(r != "OK" for r in replies):
                    raise RedisError(f"SET answered {next(r for r in replies if r != 'OK')!r}")
            setup["redis_load_s"] = round(time.monotonic() - t0, 2)
        except (OSError, RuntimeError, RedisError) as error:  # no baseline, but the rest still runs
            redis_info["error"] = f"redis-server: {type(error).__name__}: {error}"
            print(f"Redis baseline skipped: {redis_info['error']}", flush=True)
            for conn in redis_conns:
                await conn.close()
            redis_conns = []

    results: dict[str, object] = {
        "setup": setup,
        "query_server": server.node_id,
        "placement": {str(p): {"active": a, "standbys": s} for p, (a, s) in sorted(parts.items())},
        "local_partitions": local_parts,
        "forwarded_partitions": remote_parts,
        "local_keys": len(local_keys),
        "forwarded_keys": len(remote_keys),
    }
    try:
        for concurrency in CONCURRENCY:
            limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
            async with httpx.AsyncClient(
                base_url=http_url(server), limits=limits, timeout=CLIENT_TIMEOUT_S
            ) as http:
                if concurrency == CONCURRENCY[0]:
                    await verify(http, redis_conns[0] if redis_conns else None, (0, 1, 12_345, ROWS - 1))
                served_local: Counter[str] = Counter()
                served_remote: Counter[str] = Counter()
                took: dict[str, list[float]] = {
                    "hotstate_single_local": [],
                    "hotstate_single_forwarded": [],
                    "hotstate_batch_in_100": [],
                }
                ops: dict[str, Op] = {
                    "hotstate_single_local": hotstate_lookup(
                        http, local_keys, served_local, server.node_id, took["hotstate_single_local"]
                    ),
                    "hotstate_single_forwarded": hotstate_lookup(
                        http, remote_keys, served_remote, server.node_id, took["hotstate_single_forwarded"]
                    ),
                    "hotstate_batch_in_100": hotstate_batch(http, all_keys, took["hotstate_batch_in_100"]),
                }
                if redis_conns:
                    # redis_get: the local cell's keys, in the same order (same seeds); MGET: the batches'
                    ops["redis_get"] = redis_get(redis_conns, local_keys)
                    ops["redis_mget_100"] = redis_mget(redis_conns, all_keys)
                order = [
                    "hotstate_single_local",
                    "hotstate_single_forwarded",
                    "redis_get",
                    "hotstate_batch_in_100",
                    "redis_mget_100",
                ]
                measured = await run_cells(
                    {n: ops[n] for n in order if n in ops},
                    concurrency,
                    took,
                    (served_local, served_remote),
                )
                cells: dict[str, object] = {name: cell.summary() for name, cell in measured.items()}
                cells["served_by_local_cell"] = dict(served_local)
                cells["served_by_forwarded_cell"] = dict(served_remote)
                if redis_conns:
                    cells["ratios_hotstate_over_redis"] = ratios(cells)
                results[f"concurrency_{concurrency}"] = cells
                print(f"concurrency {concurrency}: {json.dumps(cells)}", flush=True)
    finally:
        for conn in redis_conns:
            await conn.close()
    return results


def ratios(cells: dict[str, Any]) -> dict[str, float]:
    get, mget = cells["redis_get"], cells["redis_mget_100"]
    out = {}
    for name in ("hotstate_single_local", "hotstate_single_forwarded"):
        short = name.removeprefix("hotstate_single_")
        out[f"{short}_ops_per_s"] = round(cells[name]["ops_per_s"] / get["ops_per_s"], 3)
        out[f"{short}_p50"] = round(cells[name]["p50_ms"] / get["p50_ms"], 1)
        out[f"{short}_p99"] = round(cells[name]["p99_ms"] / get["p99_ms"], 1)
    batch = cells["hotstate_batch_in_100"]
    out["batch_rows_per_s"] = round(batch["rows_per_s"] / mget["rows_per_s"], 3)
    out["batch_p50"] = round(batch["p50_ms"] / mget["p50_ms"], 1)
    out["batch_p99"] = round(batch["p99_ms"] / mget["p99_ms"], 1)
    return out


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
            sql = f"SELECT * FROM {TABLE} WHERE user = '{rng.choice(keys)}'"
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


def main() -> int:
    signal.signal(signal.SIGTERM, _terminate)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # also when started in the background
    load_before = round(os.getloadavg()[0], 2)
    others_before = other_processes()
    began = time.monotonic()
    results: dict[str, object] = {}
    clusters: list[LocalCluster] = []
    redis: RedisServer | None = None
    with tempfile.TemporaryDirectory(prefix="hotstate-pull-bench-") as tmp:
        root = Path(tmp)
        try:
            binary, redis_info = ensure_redis()
            if binary is not None:
                try:
                    redis = RedisServer.start(binary, root / "redis")
                    redis_info.update(version=redis.version, port=redis.port)
                except OSError as error:
                    redis_info["error"] = f"starting redis-server: {error}"
            results["redis"] = redis_info
            if "error" in redis_info:
                print(f"Redis baseline skipped: {redis_info['error']}", flush=True)
            results["lookups"] = asyncio.run(lookups(root, clusters, redis, redis_info))
            stop_clusters(clusters)
            if redis is not None:
                redis.stop()
            for standby_reads in (True, False):
                key = "failover_standby_reads_on" if standby_reads else "failover_standby_reads_off"
                results[key] = asyncio.run(failover(root, clusters, standby_reads))
                print(f"{key}: {json.dumps(results[key])}", flush=True)
                stop_clusters(clusters)
        finally:
            stop_clusters(clusters)
            if redis is not None:
                redis.stop()
    report = {
        "benchmark": "pull queries over HTTP (POST /v1/query) on a local 3-server cluster, Redis as baseline",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "note": (
            "the 3 servers, the benchmark client (one Python process, httpx) and Redis share the machine's "
            f"{os.cpu_count()} cores: numbers are for this machine only, and the Python client is itself a "
            "large part of every latency (most of all Redis's)"
        ),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_1m_before": load_before,
        "load_average_1m": round(os.getloadavg()[0], 2),
        "other_processes_before": others_before,
        "other_processes_after": other_processes(),
        "duration_s": round(time.monotonic() - began, 1),
        "parameters": {
            "servers": 3,
            "table": TABLE,
            "partitions": PARTITIONS,
            "standby_replicas": STANDBYS,
            "key": "user STRING",
            "rows": ROWS,
            "row": "user (key, 'user-000123'), clicks (int), url (str), last_seen (timestamp)",
            "server_config": "defaults (LocalCluster)",
            "cell": f"{ROUNDS} slices of {SLICE_S} s, interleaved with the other cells, after {WARMUP_S} s "
            "of warm-up",
            "concurrency": list(CONCURRENCY),
            "client": "httpx.AsyncClient, keep-alive, one connection per concurrent client; JSON parsed",
            "batch_keys": BATCH_KEYS,
            "query_timeout_ms": QUERY_TIMEOUT_MS,
            "redis": "same rows as JSON strings under the same keys; GET (no pipelining) and MGET of the "
            "same 100 keys; raw asyncio RESP client, one connection per concurrent client; the redis_get "
            "cell uses the local cell's keys in the same order",
            "failover_clients": FAILOVER_CLIENTS,
            "failover_window_s": FAILOVER_WINDOW_S,
            "failover_kill_at_s": FAILOVER_KILL_AT_S,
            "failover_failure": f"non-200, or slower than timeout_ms={QUERY_TIMEOUT_MS}",
            "failover_cluster": "a fresh cluster per run; SIGKILL of the server holding the most actives",
        },
        "results": results,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print_summary(report)
    print(f"wrote {RESULTS}")
    return 0


def print_summary(report: dict[str, Any]) -> None:
    results = report["results"]
    print(f"\n{report['cpu_count']} cores, load {report['load_average_1m']}, {report['duration_s']} s")
    for concurrency in CONCURRENCY:
        cells = results["lookups"][f"concurrency_{concurrency}"]
        print(f"concurrency {concurrency}:")
        for name, cell in cells.items():
            if isinstance(cell, dict) and "ops_per_s" in cell:
                print(
                    f"  {name:28} {cell['ops_per_s']:9.1f} ops/s {cell['rows_per_s']:9} rows/s"
                    f"  p50 {cell['p50_ms']:7.2f} ms  p99 {cell['p99_ms']:7.2f} ms  errors {cell['errors']}"
                )
        if "ratios_hotstate_over_redis" in cells:
            print(f"  hotstate/redis: {cells['ratios_hotstate_over_redis']}")
    for key in ("failover_standby_reads_on", "failover_standby_reads_off"):
        run = results[key]
        print(
            f"{key}: success {run['success_rate']:.2%} ({run['failed']}/{run['queries']} failed) "
            f"p99 {run['p99_ms']} ms max {run['max_ms']} ms; failures {run['failures_by_reason']}; "
            f"actives moved after {run['actives_moved_off_killed_server_after_ms']} ms"
        )


if __name__ == "__main__":
    sys.exit(main())

"""Which ASGI server should hotstate's HTTP API run on? -> bench/results/http_servers.json.

Every candidate serves the same minimal raw ASGI app, started the way hotstate starts its HTTP server: as a
task in an asyncio event loop that the process owns (uvicorn: `Server.serve()` with hotstate's no-op
`capture_signals`; granian: `granian.server.embed.Server.serve()`; hypercorn: `hypercorn.asyncio.serve()`),
beside a 5 ms ticker task that records how late the loop wakes it (event-loop lag, what Raft heartbeats in
the same loop would see). The app handles `POST /query` with a small JSON body
`{"sql": "SELECT * FROM t WHERE k = 'user-000123'"}`: it reads the body, takes the key from it, does one
rocksdict (RocksDB, opened read-only) get of a ~90-byte JSON value and answers a ksqlDB-style JSON array
encoded with orjson. The database (20,000 rows) is made by this script in a temp dir.

Each candidate runs in its own subprocess (this file re-invoked with `--serve CANDIDATE LOOP PORT DBPATH`)
on a free 127.0.0.1 port. Measured per candidate:
1. HTTP/1.1: wrk -t1 at 1, 8 and 32 connections, a Lua script POSTing 1,000 pre-built bodies with random
   keys in turn; MEASURE_S measured per cell, after WARMUP_S unmeasured before a server's first cell.
   requests/s, latency p50/p90/p99/max (wrk's `done()` hook), the server process's CPU time
   (utime+stime of all its threads, /proc/PID/stat; and of its main thread alone) per request, wrk's own
   CPU per request, the CPU used meanwhile by other processes on the machine (noise), and the server's
   event-loop lag (p50/p99/max of the ticker's lateness).
2. HTTP/2 cleartext (prior knowledge) with h2load for the candidates that speak it: 8 connections x 1
   stream and 1 connection x 32 streams, same warm-up and duration, one fixed body (h2load sends one);
   and H2_LONG_REQUESTS requests in turn on one connection (does the server keep a busy connection open?).
3. h2c support: curl with --http2-prior-knowledge and with --http2 (HTTP/1.1 Upgrade: h2c); the HTTP
   version of the answer is recorded.
4. Limits: where a server has a setting, it is configured (header size LIMIT_HEADER_BYTES; header/body read
   and keep-alive timeouts LIMIT_TIMEOUT_S), and raw-socket probes measure what happens to: a connection
   that sends nothing, a head that stalls, a head trickled one byte per 0.3 s (slowloris), a body that
   stalls, an idle keep-alive connection, a 1 MiB header, a 32 MiB body. The setting names each server
   offers are also read from the installed packages.
Then the candidate best by HTTP/1.1 server CPU per request is run again on the stdlib asyncio loop instead
of uvloop.

The load generator shares the machine's 2 cores with the server, so requests/s is bounded by both; server
CPU per request is the fairer comparison. The 1-minute load average before and after is recorded. Every
process started here is stopped at the end, also on errors, Ctrl-C and SIGTERM.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import datetime
import http.client
import importlib.metadata
import inspect
import json
import os
import platform
import random
import re
import resource
import select
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, MutableMapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import orjson

RESULTS = Path(__file__).parent / "results" / "http_servers.json"
ROWS = 20_000
CONCURRENCY = (1, 8, 32)
H2_CONFIGS = ((8, 1), (1, 32))  # (connections, concurrent streams per connection)
H2_LONG_REQUESTS = 5_000  # on one HTTP/2 connection, one at a time: does the server keep it open?
WARMUP_S = 1  # wrk takes whole seconds; before the first cell of each protocol of a server
MEASURE_S = 5
LUA_BODIES = 1_000
LIMIT_HEADER_BYTES = 16 * 1024
LIMIT_TIMEOUT_S = 1.5
PROBE_WAIT_S = 3.0
TRICKLE_EVERY_S = 0.3
BIG_HEADER_BYTES = 1024 * 1024
BIG_BODY_BYTES = 32 * 1024 * 1024
LAG_TICK_S = 0.005
HIGH_LOAD_1M = 0.5  # a 1-minute load average above this before the run means others were using the cores
SEED = 7
CLK_TCK = os.sysconf("SC_CLK_TCK")
QUERY_HEADER = b'{"header":{"queryId":"bench","schema":"`K` STRING KEY, `V` STRING"}}'

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


@dataclass(frozen=True)
class Candidate:
    name: str
    server: str  # uvicorn | granian | hypercorn
    http: str  # the server's HTTP implementation
    http2: bool  # speaks HTTP/2 cleartext as configured here
    description: str


CANDIDATES = (
    Candidate(
        "uvicorn-httptools",
        "uvicorn",
        "httptools",
        False,
        "uvicorn.Server.serve() in our loop, httptools parser (the current stack without hotstate's limits)",
    ),
    Candidate(
        "uvicorn-httptools-limited",
        "uvicorn",
        "hotstate-limited",
        False,
        "as uvicorn-httptools with hotstate's limits (direct_lane.LimitedHttpToolsProtocol) but without its "
        "HTTP/2 detection: the stack before HTTP/2",
    ),
    Candidate(
        "uvicorn-httptools-h2",
        "uvicorn",
        "hotstate-h2",
        True,
        "today's stack: uvicorn with hotstate's LimitedHttpToolsProtocol, which hands a connection that "
        "starts with HTTP/2's preface or asks to upgrade (h2c) to hotstate.server.http.http2 (the h2 "
        "library's state machine, the same ASGI app on the same loop)",
    ),
    Candidate("uvicorn-h11", "uvicorn", "h11", False, "uvicorn.Server.serve() in our loop, h11 parser"),
    Candidate(
        "uvicorn-zttp",
        "uvicorn",
        "zttp",
        True,
        "uvicorn.Server.serve() in our loop, http='zttp', http2=True (zttp: pre-1.0 Zig HTTP/1.1+2 parser)",
    ),
    Candidate(
        "granian-embed",
        "granian",
        "granian",
        True,
        "granian.server.embed.Server.serve() as a task in our loop (Rust/hyper I/O threads, app on our loop)",
    ),
    Candidate(
        "hypercorn",
        "hypercorn",
        "h11+h2",
        True,
        "hypercorn.asyncio.serve() in our loop, h11 for HTTP/1.1 and h2 for HTTP/2",
    ),
)
BY_NAME = {c.name: c for c in CANDIDATES}
LOOPS = ("uvloop", "asyncio")


# ----------------------------------------------------------------------------------------------------------
# Server side (runs in the subprocess)
# ----------------------------------------------------------------------------------------------------------


class LagMonitor:
    """A task that sleeps LAG_TICK_S in a loop and records how late it wakes up."""

    def __init__(self) -> None:
        self.samples: list[float] = []

    async def run(self) -> None:
        while True:  # perf_counter, not loop.time(): uvloop's clock has 1 ms steps
            start = time.perf_counter()
            await asyncio.sleep(LAG_TICK_S)
            self.samples.append(max(0.0, time.perf_counter() - start - LAG_TICK_S))  # uvloop rounds to 1 ms

    def take(self) -> dict[str, float]:
        samples, self.samples = sorted(self.samples), []
        if not samples:
            return {"ticks": 0}
        return {
            "ticks": len(samples),
            "p50_ms": round(samples[len(samples) // 2] * 1e3, 3),
            "p99_ms": round(samples[min(len(samples) - 1, int(len(samples) * 0.99))] * 1e3, 3),
            "max_ms": round(samples[-1] * 1e3, 3),
        }


async def _respond(send: Send, status: int, body: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


def make_app(db_path: str, lag: LagMonitor) -> ASGIApp:
    from rocksdict import AccessType, Options, Rdict

    db = Rdict(db_path, options=Options(raw_mode=True), access_type=AccessType.read_only())
    header = orjson.Fragment(QUERY_HEADER)
    owner_loop, owner_thread = asyncio.get_running_loop(), threading.get_ident()

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope["path"] == "/lag":  # also says whether the app runs on the loop (and thread) that owns it
            on_owner = asyncio.get_running_loop() is owner_loop and threading.get_ident() == owner_thread
            await _respond(send, 200, orjson.dumps({**lag.take(), "app_on_owner_loop": on_owner}))
            return
        chunks: list[bytes] = []
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            if not message.get("more_body", False):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        try:
            key = orjson.loads(body)["sql"].split("'", 2)[1]
        except (orjson.JSONDecodeError, KeyError, TypeError, IndexError, AttributeError):
            await _respond(send, 400, b'{"app_error":"no key in the body, %d bytes read"}' % len(body))
            return
        value = db.get(key.encode())
        if value is None:
            await _respond(send, 404, b'{"app_error":"no such key"}')
            return
        await _respond(send, 200, orjson.dumps([header, {"row": {"columns": [key, orjson.Fragment(value)]}}]))

    return app


async def _serve_uvicorn(candidate: Candidate, app: ASGIApp, port: int, stop: asyncio.Event) -> None:
    import uvicorn

    class QuietServer(uvicorn.Server):  # as hotstate.server.http.api: the process, not uvicorn, owns SIGTERM
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    options: dict[str, Any] = {"timeout_keep_alive": LIMIT_TIMEOUT_S}
    if candidate.http in ("hotstate-limited", "hotstate-h2"):
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        from hotstate.server.http import direct_lane
        from hotstate.server.http import limits as http_limits

        direct_lane.LimitedHttpToolsProtocol.limits = http_limits.HttpLimits(
            max_head_bytes=LIMIT_HEADER_BYTES, read_timeout_s=LIMIT_TIMEOUT_S
        )

        class LimitsOnly(direct_lane.LimitedHttpToolsProtocol):
            """Without the look at a connection's first bytes and at each request's Upgrade header."""

            data_received = HttpToolsProtocol.data_received
            on_headers_complete = HttpToolsProtocol.on_headers_complete

        h2 = candidate.http == "hotstate-h2"
        options["http"] = direct_lane.LimitedHttpToolsProtocol if h2 else LimitsOnly
    elif candidate.http == "h11":
        options.update(http="h11", h11_max_incomplete_event_size=LIMIT_HEADER_BYTES)
    elif candidate.http == "zttp":
        options.update(http="zttp", http2=True)
    else:
        options["http"] = candidate.http
    config = uvicorn.Config(
        app, host="127.0.0.1", port=port, log_level="warning", access_log=False, lifespan="on", **options
    )
    server = QuietServer(config)
    task = asyncio.create_task(server.serve())
    await _until_stopped(task, stop)
    server.should_exit = True
    await task


async def _serve_granian(candidate: Candidate, app: ASGIApp, port: int, stop: asyncio.Event) -> None:
    from granian.constants import HTTPModes, Interfaces
    from granian.http import HTTP1Settings, HTTP2Settings
    from granian.log import LogLevels
    from granian.server.embed import Server

    server = Server(
        app,
        address="127.0.0.1",
        port=port,
        interface=Interfaces.ASGI,
        http=HTTPModes.auto,
        websockets=False,
        http1_settings=HTTP1Settings(
            header_read_timeout=int(LIMIT_TIMEOUT_S * 1000), max_buffer_size=LIMIT_HEADER_BYTES
        ),
        http2_settings=HTTP2Settings(max_headers_size=LIMIT_HEADER_BYTES),
        log_level=LogLevels.warning,
    )
    task = asyncio.create_task(server.serve())
    await _until_stopped(task, stop)
    server.stop()  # type: ignore[no-untyped-call]
    await task


async def _serve_hypercorn(candidate: Candidate, app: ASGIApp, port: int, stop: asyncio.Event) -> None:
    from hypercorn.asyncio import serve
    from hypercorn.config import Config

    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = None
    config.loglevel = "WARNING"
    config.h11_max_incomplete_size = LIMIT_HEADER_BYTES
    config.h2_max_header_list_size = LIMIT_HEADER_BYTES
    config.read_timeout = int(LIMIT_TIMEOUT_S) or 1
    config.keep_alive_timeout = LIMIT_TIMEOUT_S
    config.keep_alive_max_requests = 10**9  # default 1,000 would make wrk reconnect every 1,000 requests
    await serve(app, config, shutdown_trigger=stop.wait)  # type: ignore[arg-type]


async def _until_stopped(task: asyncio.Task[Any], stop: asyncio.Event) -> None:
    waiter = asyncio.create_task(stop.wait())
    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
    waiter.cancel()


SERVERS: dict[str, Callable[[Candidate, ASGIApp, int, asyncio.Event], Awaitable[None]]] = {
    "uvicorn": _serve_uvicorn,
    "granian": _serve_granian,
    "hypercorn": _serve_hypercorn,
}


async def _serve_main(candidate: Candidate, port: int, db_path: str) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    lag = LagMonitor()
    lag_task = asyncio.create_task(lag.run())
    try:
        await SERVERS[candidate.server](candidate, make_app(db_path, lag), port, stop)
    finally:
        lag_task.cancel()


def serve(name: str, loop_name: str, port: int, db_path: str) -> None:
    if loop_name not in LOOPS:
        raise SystemExit(f"loop must be one of {LOOPS}")
    main = _serve_main(BY_NAME[name], port, db_path)
    if loop_name == "uvloop":
        import uvloop

        uvloop.run(main)
    else:
        asyncio.run(main)


# ----------------------------------------------------------------------------------------------------------
# Benchmark side
# ----------------------------------------------------------------------------------------------------------


def make_db(path: Path) -> None:
    from rocksdict import Options, Rdict

    rng = random.Random(SEED)
    db = Rdict(str(path), options=Options(raw_mode=True))
    try:
        for i in range(ROWS):
            key = f"user-{i:06d}"
            value = (
                f'{{"user":"{key}","region":"eu-west-{rng.randint(1, 3)}","clicks":{rng.randint(0, 99999)},'
                f'"last_seen":{1_700_000_000_000 + rng.randint(0, 10**9)}}}'
            )
            db[key.encode()] = value.encode()
    finally:
        db.close()


def value_size(db_path: Path) -> int:
    from rocksdict import AccessType, Options, Rdict

    db = Rdict(str(db_path), options=Options(raw_mode=True), access_type=AccessType.read_only())
    try:
        value = db.get(b"user-000123")
        return len(value) if value is not None else 0
    finally:
        db.close()


def query_body(key_index: int) -> bytes:
    return orjson.dumps({"sql": f"SELECT * FROM t WHERE k = 'user-{key_index:06d}'"})


LUA = """
local requests_ = {}
local i = 0
function init(args)
  math.randomseed(%(seed)d)
  for j = 1, %(bodies)d do
    local key = math.random(0, %(rows)d - 1)
    local body = string.format('{"sql":"SELECT * FROM t WHERE k = \\'user-%%06d\\'"}', key)
    requests_[j] = wrk.format("POST", "/query", {["Content-Type"] = "application/json"}, body)
  end
end
function request()
  i = i %% %(bodies)d + 1
  return requests_[i]
end
function done(summary, latency, requests)
  local e = summary.errors
  io.write(string.format(
    'RESULT {"requests":%%d,"duration_us":%%d,"errors":{"connect":%%d,"read":%%d,"write":%%d,"status":%%d,' ..
    '"timeout":%%d},"p50_us":%%d,"p90_us":%%d,"p99_us":%%d,"max_us":%%d,"mean_us":%%.1f}\\n',
    summary.requests, summary.duration, e.connect, e.read, e.write, e.status, e.timeout,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency.max, latency.mean))
end
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _stat_cpu_s(stat_path: Path) -> float:
    after_comm = stat_path.read_text().rsplit(")", 1)[1].split()
    return (int(after_comm[11]) + int(after_comm[12])) / CLK_TCK  # utime + stime


def proc_cpu_s(pid: int) -> tuple[float, float]:
    """(all threads, the main thread) utime+stime of process pid, in seconds."""
    return _stat_cpu_s(Path(f"/proc/{pid}/stat")), _stat_cpu_s(Path(f"/proc/{pid}/task/{pid}/stat"))


def machine_busy_s() -> float:
    """CPU seconds spent not idle by all cores since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / CLK_TCK  # minus idle and iowait; no guest double count


def children_cpu_s() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class ServerProcess:
    """One candidate in its own subprocess; stopped (SIGTERM, then SIGKILL) by stop()."""

    def __init__(self, candidate: Candidate, loop_name: str, db_path: Path, log_dir: Path) -> None:
        self.candidate = candidate
        self.loop_name = loop_name
        self.port = free_port()
        self.log_path = log_dir / f"{candidate.name}-{loop_name}.log"
        self._log = self.log_path.open("wb")
        cmd = [sys.executable, __file__, "--serve", candidate.name, loop_name, str(self.port), str(db_path)]
        self.proc = subprocess.Popen(cmd, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        deadline = time.monotonic() + timeout_s
        expected = b'"user":"user-000123"'
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.candidate.name} exited {self.proc.returncode}: {self.log_tail()}")
            with contextlib.suppress(OSError, http.client.HTTPException):
                status, body = http_request(self.port, "POST", "/query", query_body(123))
                if status == 200 and expected in body:
                    return
                raise RuntimeError(f"{self.candidate.name} answered {status} {body[:200]!r}")
            time.sleep(0.1)
        raise RuntimeError(f"{self.candidate.name} not ready in {timeout_s} s: {self.log_tail()}")

    def cpu_s(self) -> tuple[float, float]:
        return proc_cpu_s(self.pid)

    def threads(self) -> list[str]:
        tasks = Path(f"/proc/{self.pid}/task")
        return sorted((t / "comm").read_text().strip() for t in tasks.iterdir())

    def rss_mib(self) -> float:
        for line in Path(f"/proc/{self.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
        return float("nan")

    def lag(self) -> dict[str, Any]:
        lag: dict[str, Any] = json.loads(http_request(self.port, "GET", "/lag")[1])
        return lag

    def log_tail(self) -> str:
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-2000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._log.close()


def http_request(port: int, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request(method, path, body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


@dataclass
class Cell:
    """What one load-generator run measured."""

    requests: int
    requests_per_s: float
    server_cpu_us_per_req: float
    server_cpu_us_per_req_main_thread: float  # the event loop's thread; the rest is in other threads
    client_cpu_us_per_req: float
    other_cpu_cores: float  # CPU used meanwhile by processes other than the server and the load generator
    loop_lag: dict[str, Any]
    latency: dict[str, Any]
    errors: dict[str, int]


def measure(
    server: ServerProcess, run: Callable[[float], tuple[int, float, dict[str, Any]]], warm_up: bool
) -> Cell:
    """run(duration_s) -> (requests, elapsed_s, details); a warm-up run if asked, then the measured run."""
    if warm_up:
        run(WARMUP_S)
    server.lag()  # resets the lag samples
    cpu0, busy0, client0, t0 = server.cpu_s(), machine_busy_s(), children_cpu_s(), time.monotonic()
    requests, elapsed_s, details = run(MEASURE_S)
    cpu1, busy1, client1, t1 = server.cpu_s(), machine_busy_s(), children_cpu_s(), time.monotonic()
    lag = server.lag()
    server_cpu, main_cpu, client_cpu = cpu1[0] - cpu0[0], cpu1[1] - cpu0[1], client1 - client0
    n = max(requests, 1)
    return Cell(
        requests=requests,
        requests_per_s=round(requests / elapsed_s, 1),
        server_cpu_us_per_req=round(server_cpu / n * 1e6, 1),
        server_cpu_us_per_req_main_thread=round(main_cpu / n * 1e6, 1),
        client_cpu_us_per_req=round(client_cpu / n * 1e6, 1),
        other_cpu_cores=round(max(0.0, (busy1 - busy0) - server_cpu - client_cpu) / (t1 - t0), 2),
        loop_lag=lag,
        latency=details["latency"],
        errors=details["errors"],
    )


def wrk_runner(
    port: int, lua: Path, connections: int
) -> Callable[[float], tuple[int, float, dict[str, Any]]]:
    def run(duration_s: float) -> tuple[int, float, dict[str, Any]]:
        cmd = ["wrk", "-t1", f"-c{connections}", f"-d{duration_s:g}s", "-s", str(lua)]
        out = subprocess.run(
            [*cmd, f"http://127.0.0.1:{port}/query"], capture_output=True, text=True, timeout=duration_s + 30
        )
        line = next((ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")), None)
        if line is None:
            raise RuntimeError(f"wrk printed no RESULT: {out.stdout[-1000:]} {out.stderr[-1000:]}")
        r = json.loads(line.removeprefix("RESULT "))
        latency = {k: round(r[f"{k}_us"] / 1e3, 3) for k in ("p50", "p90", "p99", "max", "mean")}
        return (
            r["requests"],
            r["duration_us"] / 1e6,
            {"latency": {"unit": "ms", **latency}, "errors": r["errors"]},
        )

    return run


H2_TIME_RE = re.compile(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)\s+(\S+)")


def _h2load_ms(text: str) -> float:
    for unit, scale in (("us", 1e-3), ("ms", 1.0), ("s", 1e3)):
        if text.endswith(unit):
            return round(float(text.removesuffix(unit)) * scale, 3)
    raise ValueError(text)


def h2load_runner(
    port: int, body_file: Path, connections: int, streams: int
) -> Callable[[float], tuple[int, float, dict[str, Any]]]:
    def run(duration_s: float) -> tuple[int, float, dict[str, Any]]:
        cmd = [
            "h2load",
            "-t1",
            f"-c{connections}",
            f"-m{streams}",
            "-D",
            f"{duration_s:g}",
            "-d",
            str(body_file),
        ]
        cmd += ["-H", "content-type: application/json", f"http://127.0.0.1:{port}/query"]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + 30).stdout
        finished = re.search(r"finished in ([\d.]+)s", out)
        done = re.search(r"requests: \d+ total, \d+ started, (\d+) done, (\d+) succeeded, (\d+) failed", out)
        codes = re.search(r"status codes: (\d+) 2xx, (\d+) 3xx, (\d+) 4xx, (\d+) 5xx", out)
        times = H2_TIME_RE.search(out)
        if not (finished and done and codes and times) or "Application protocol: h2c" not in out:
            raise RuntimeError(f"h2load did not speak h2c or printed no result: {out[-1500:]}")
        latency = {"unit": "ms", "min": _h2load_ms(times[1]), "max": _h2load_ms(times[2])}
        latency["mean"] = _h2load_ms(times[3])
        errors = {"failed": int(done[3]), "non_2xx": int(codes[2]) + int(codes[3]) + int(codes[4])}
        return int(codes[1]), float(finished[1]), {"latency": latency, "errors": errors}

    return run


def h2_long_connection(port: int, body_file: Path) -> dict[str, int]:
    """H2_LONG_REQUESTS requests, one at a time, on one HTTP/2 connection."""
    cmd = [
        "h2load",
        "-c1",
        "-m1",
        f"-n{H2_LONG_REQUESTS}",
        "-d",
        str(body_file),
        f"http://127.0.0.1:{port}/query",
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=60).stdout
    done = re.search(r"(\d+) succeeded, (\d+) failed", out)
    if done is None:
        raise RuntimeError(f"h2load printed no result: {out[-1500:]}")
    return {"succeeded": int(done[1]), "failed": int(done[2])}


# ---- h2c and limit probes --------------------------------------------------------------------------------


def h2c_support(port: int, body_file: Path) -> dict[str, str]:
    """The HTTP version and status curl got, with prior knowledge and with Upgrade: h2c (POST and GET)."""
    post = ["-H", "content-type: application/json", "--data-binary", f"@{body_file}", "/query"]
    tries = {
        "prior_knowledge_post": ["--http2-prior-knowledge", *post],
        "upgrade_post": ["--http2", *post],
        "upgrade_get": ["--http2", "/lag"],
    }
    result = {}
    for name, args in tries.items():
        cmd = ["curl", "-s", "-m", "5", "-o", "/dev/null", "-w", "%{http_version} %{http_code}", *args[:-1]]
        out = subprocess.run([*cmd, f"http://127.0.0.1:{port}{args[-1]}"], capture_output=True, text=True)
        version, _, code = out.stdout.partition(" ")
        result[name] = (
            f"HTTP/{version} {code}" if code not in ("", "000") else f"failed (curl {out.returncode})"
        )
    return result


def _status_of(data: bytes) -> int | None:
    match = re.match(rb"HTTP/1\.[01] (\d{3})", data)
    return int(match[1]) if match else None


def _watch(sock: socket.socket, trickle: bool = False) -> dict[str, Any]:
    """Waits PROBE_WAIT_S for the server to answer or close; sends a header byte every TRICKLE_EVERY_S."""
    start = time.monotonic()
    deadline = start + PROBE_WAIT_S
    next_trickle = start + TRICKLE_EVERY_S
    received = b""
    while (now := time.monotonic()) < deadline:
        wait = min(deadline, next_trickle if trickle else deadline) - now
        readable, _, _ = select.select([sock], [], [], max(wait, 0))
        if readable:
            try:
                data = sock.recv(65536)
            except ConnectionError:
                data = b""
            if not data:
                return {"closed_after_s": round(time.monotonic() - start, 2), "status": _status_of(received)}
            received += data
        elif trickle and time.monotonic() >= next_trickle:
            with contextlib.suppress(OSError):
                sock.sendall(b"a")
            next_trickle += TRICKLE_EVERY_S
    return {"closed_after_s": None, "status": _status_of(received)}


def _connect(port: int) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=PROBE_WAIT_S + 2)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _head(content_length: int, extra: bytes = b"") -> bytes:
    return (
        b"POST /query HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
        + extra
        + b"Content-Length: %d\r\n\r\n" % content_length
    )


def _probe_slow(port: int, kind: str) -> dict[str, Any]:
    body = query_body(123)
    with _connect(port) as sock:
        if kind == "stalled_head":
            sock.sendall(b"POST /query HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        elif kind == "trickled_head":
            sock.sendall(b"POST /query HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ")
        elif kind == "stalled_body":
            sock.sendall(_head(len(body)) + body[:10])
        elif kind == "idle_keepalive":
            sock.sendall(_head(len(body)) + body)
            first = _watch_once(sock)
            if first is not None:
                return {"closed_after_s": 0.0, "status": None, "note": "closed after the first response"}
        return _watch(sock, trickle=kind == "trickled_head")


def _watch_once(sock: socket.socket) -> str | None:
    """Reads one response (small, one segment in practice); 'closed' if the server closed instead."""
    sock.settimeout(5)
    data = sock.recv(65536)
    sock.settimeout(PROBE_WAIT_S + 2)
    return "closed" if not data else None


def _probe_big(port: int, kind: str) -> dict[str, Any]:
    if kind == "big_header":
        body = query_body(123)
        payload = _head(len(body), b"X-Big: " + b"a" * BIG_HEADER_BYTES + b"\r\n") + body
    else:
        body = b'{"sql":"' + b"a" * (BIG_BODY_BYTES - 10) + b'"}'
        payload = _head(len(body)) + body
    with _connect(port) as sock:
        sent_all = True
        try:
            sock.sendall(payload)
        except OSError:
            sent_all = False
        received = b""
        with contextlib.suppress(OSError):
            while len(received) < 65536:
                data = sock.recv(65536)
                if not data:
                    break
                received += data
                if b"\r\n\r\n" in received and (b'"app_error"' in received or b"}" in received[-4:]):
                    break
    status = _status_of(received)
    return {
        "status": status,
        "sent_all": sent_all,
        "answered_by": "app" if b'"app_error"' in received else ("server" if status else "nobody (closed)"),
    }


def probe_limits(port: int) -> dict[str, Any]:
    slow = ("idle_new_connection", "stalled_head", "trickled_head", "stalled_body", "idle_keepalive")
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(slow)) as pool:
        futures = {kind: pool.submit(_probe_slow, port, kind) for kind in slow}
        results = {kind: _result(future) for kind, future in futures.items()}
    for kind in ("big_header", "big_body"):
        try:
            results[kind] = _probe_big(port, kind)
        except OSError as exc:
            results[kind] = {"error": repr(exc)}
    return results


def _result(future: concurrent.futures.Future[dict[str, Any]]) -> dict[str, Any]:
    try:
        return future.result()
    except OSError as exc:
        return {"error": repr(exc)}


def limit_settings() -> dict[str, Any]:
    """Setting names each installed server has for size limits and timeouts (read from the packages)."""
    import uvicorn
    from granian.http import HTTP1Settings, HTTP2Settings
    from granian.server.embed import Server as GranianServer
    from hypercorn.config import Config as HypercornConfig

    pattern = re.compile(r"limit|timeout|max|size|keep_alive|backlog|backpressure|concurren")
    uvicorn_params = [p for p in inspect.signature(uvicorn.Config).parameters if pattern.search(p)]
    granian_params = [p for p in inspect.signature(GranianServer).parameters if pattern.search(p)]
    hypercorn_attrs = [a for a in dir(HypercornConfig) if not a.startswith("_") and pattern.search(a)]
    return {
        "found_in_packages": {
            "uvicorn.Config": uvicorn_params,
            "granian.server.embed.Server": granian_params,
            "granian.http.HTTP1Settings": [f.name for f in fields(HTTP1Settings)],
            "granian.http.HTTP2Settings": [f.name for f in fields(HTTP2Settings)],
            "hypercorn.config.Config": hypercorn_attrs,
        },
        "by_control": {
            "request_head_size": {
                "uvicorn-httptools": None,
                "uvicorn-httptools-limited": "hotstate.server.http.limits.HttpLimits.max_head_bytes (431)",
                "uvicorn-httptools-h2": "HttpLimits.max_head_bytes (431; HTTP/2: the h2 decoder's "
                "max_header_list_size, GOAWAY)",
                "uvicorn-h11": "h11_max_incomplete_event_size",
                "uvicorn-zttp": None,
                "granian": "HTTP1Settings.max_buffer_size; HTTP2Settings.max_headers_size",
                "hypercorn": "h11_max_incomplete_size; h2_max_header_list_size",
            },
            "head_or_body_read_timeout": {
                "uvicorn-httptools": None,
                "uvicorn-httptools-limited": "hotstate.server.http.limits.HttpLimits.read_timeout_s (408)",
                "uvicorn-httptools-h2": "HttpLimits.read_timeout_s (408; HTTP/2: per stream)",
                "uvicorn-h11": None,
                "uvicorn-zttp": None,
                "granian": "HTTP1Settings.header_read_timeout (ms; head only)",
                "hypercorn": "read_timeout (s; per socket read, reset by every byte)",
            },
            "body_size": {
                "uvicorn": None,
                "granian": None,
                "hypercorn": "wsgi_max_body_size (WSGI apps only)",
            },
            "keep_alive_idle": {
                "uvicorn": "timeout_keep_alive (s)",
                "granian": "HTTP1Settings.keep_alive (on/off); "
                "HTTP2Settings.keep_alive_interval/_timeout (pings)",
                "hypercorn": "keep_alive_timeout (s), keep_alive_max_requests",
            },
            "concurrency": {
                "uvicorn": "limit_concurrency (503), backlog",
                "granian": "backpressure (per worker), backlog",
                "hypercorn": "backlog, max_app_queue_size, h2_max_concurrent_streams",
            },
        },
        "configured_for_this_run": {
            "header_bytes": LIMIT_HEADER_BYTES,
            "timeouts_s": LIMIT_TIMEOUT_S,
            "hypercorn_read_timeout_s": int(LIMIT_TIMEOUT_S) or 1,
        },
    }


# ---- driver ----------------------------------------------------------------------------------------------


def package_versions() -> dict[str, str]:
    names = (
        "uvicorn",
        "httptools",
        "h11",
        "uvloop",
        "zttp",
        "granian",
        "hypercorn",
        "h2",
        "orjson",
        "rocksdict",
    )
    versions = {}
    for name in names:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = "not installed"
    for tool, flag in (("wrk", "-v"), ("h2load", "--version"), ("curl", "--version")):
        out = subprocess.run([tool, flag], capture_output=True, text=True)
        versions[tool] = (out.stdout or out.stderr).splitlines()[0].strip()
    return versions


def run_candidate(
    candidate: Candidate, loop_name: str, db_path: Path, work: Path, with_extras: bool
) -> dict[str, Any]:
    print(f"== {candidate.name} ({loop_name})", flush=True)
    server = ServerProcess(candidate, loop_name, db_path, work)
    result: dict[str, Any] = {
        "candidate": candidate.name,
        "loop": loop_name,
        "description": candidate.description,
    }
    try:
        server.wait_ready()
        result["threads"] = server.threads()
        result["app_on_owner_loop"] = server.lag()["app_on_owner_loop"]
        result["http1"] = {}
        for c in CONCURRENCY:
            cell = measure(server, wrk_runner(server.port, work / "post.lua", c), warm_up=c == CONCURRENCY[0])
            result["http1"][f"c{c}"] = cell.__dict__
            print(
                f"   h1 c={c:<3} {cell.requests_per_s:>9.0f} req/s {cell.server_cpu_us_per_req:>7.1f} us/req "
                f"p50 {cell.latency['p50']} p99 {cell.latency['p99']} ms",
                flush=True,
            )
        if with_extras and candidate.http2:
            result["http2"] = {}
            for conns, streams in H2_CONFIGS:
                runner = h2load_runner(server.port, work / "body.json", conns, streams)
                cell = measure(server, runner, warm_up=(conns, streams) == H2_CONFIGS[0])
                result["http2"][f"c{conns}m{streams}"] = cell.__dict__
                print(
                    f"   h2 c={conns} m={streams:<2} {cell.requests_per_s:>8.0f} req/s "
                    f"{cell.server_cpu_us_per_req:>7.1f} us/req mean {cell.latency['mean']} ms",
                    flush=True,
                )
        if with_extras and candidate.http2:
            result["h2_long_connection"] = h2_long_connection(server.port, work / "body.json")
        if with_extras:
            result["h2c"] = h2c_support(server.port, work / "body.json")
            result["limit_probes"] = probe_limits(server.port)
            print(f"   h2c {result['h2c']}", flush=True)
        result["threads_after"] = server.threads()
        result["rss_mib_after"] = server.rss_mib()
        if server.proc.poll() is not None:
            raise RuntimeError(f"{candidate.name} died: {server.log_tail()}")
        return result
    finally:
        server.stop()
        result["server_log"] = distinct_log_lines(server.log_path)
        for line in result["server_log"]:
            print(f"   server log: {line}", flush=True)


def distinct_log_lines(path: Path, limit: int = 12) -> list[str]:
    """The server's log lines, each once; of a traceback only its exception line."""
    lines: list[str] = []
    for line in path.read_text(errors="replace").splitlines():
        stripped = line.strip(" |+-")
        in_traceback = line.startswith((" ", "Traceback"))
        if not stripped or (in_traceback and not re.match(r"\w+(Error|Exception)\b", stripped)):
            continue
        if stripped not in lines:
            lines.append(stripped)
    return lines[:limit]


def _mean_cpu(r: dict[str, Any], proto: str = "http1") -> float:
    return statistics.fmean(cell["server_cpu_us_per_req"] for cell in r[proto].values())


def _h2_valid(r: dict[str, Any]) -> bool:
    """Every HTTP/2 cell finished without failed streams, and one connection served H2_LONG_REQUESTS."""
    cells_ok = all(not any(c["errors"].values()) for c in r.get("http2", {}).values())
    return "http2" in r and cells_ok and r["h2_long_connection"]["failed"] == 0


def _closes_slow_heads(r: dict[str, Any]) -> bool:
    probes = r.get("limit_probes", {})
    return all(probes.get(k, {}).get("closed_after_s") is not None for k in ("stalled_head", "trickled_head"))


def conclusion(results: list[dict[str, Any]], load_before: float) -> dict[str, Any]:
    uv = [r for r in results if r["loop"] == "uvloop"]
    by_cpu = sorted(uv, key=_mean_cpu)
    best = by_cpu[0]
    by_rps32 = sorted(uv, key=lambda r: -r["http1"]["c32"]["requests_per_s"])
    h2_ok = sorted((r for r in uv if _h2_valid(r)), key=lambda r: _mean_cpu(r, "http2"))
    h2_failed = [r["candidate"] for r in uv if "http2" in r and not _h2_valid(r)]
    stdlib = next((r for r in results if r["loop"] == "asyncio"), None)
    lines = [
        f"HTTP/1.1 server CPU us/request at c={'/'.join(map(str, CONCURRENCY))} (sorted by mean): "
        + ", ".join(
            f"{r['candidate']} " + "/".join(f"{c['server_cpu_us_per_req']:.0f}" for c in r["http1"].values())
            for r in by_cpu
        ),
        "HTTP/1.1 requests/s at c=32: "
        + ", ".join(f"{r['candidate']} {r['http1']['c32']['requests_per_s']:.0f}" for r in by_rps32),
        "event-loop lag p99 at HTTP/1.1 c=32 (ms): "
        + ", ".join(f"{r['candidate']} {r['http1']['c32']['loop_lag'].get('p99_ms')}" for r in uv),
    ]
    if h2_ok:
        lines.append(
            "HTTP/2 (h2c prior knowledge) server CPU us/request, mean over configs: "
            + ", ".join(
                f"{r['candidate']} {_mean_cpu(r, 'http2'):.0f} "
                f"(best {max(c['requests_per_s'] for c in r['http2'].values()):.0f} req/s)"
                for r in h2_ok
            )
        )
    for name in h2_failed:
        r = next(r for r in uv if r["candidate"] == name)
        lines.append(
            f"{name}: HTTP/2 streams failed under h2load (one connection served "
            f"{r['h2_long_connection']['succeeded']} of {H2_LONG_REQUESTS} requests): its h2 numbers are void"
        )
    if stdlib is not None:
        lines.append(
            f"{stdlib['candidate']} on the stdlib asyncio loop: {_mean_cpu(stdlib):.0f} us/request vs "
            f"{_mean_cpu(best):.0f} on uvloop ({_mean_cpu(stdlib) / _mean_cpu(best):.2f}x)"
        )
    if load_before > HIGH_LOAD_1M:
        lines.append(
            f"1-minute load average was {load_before:.2f} before the run: other work shared the cores"
        )
    with_h2 = sorted(h2_ok, key=_mean_cpu)
    return {
        "best_http1_by_server_cpu": best["candidate"],
        "best_http1_by_requests_per_s_c32": by_rps32[0]["candidate"],
        "best_http2_by_server_cpu": h2_ok[0]["candidate"] if h2_ok else None,
        "http2_void": h2_failed,
        "best_http1_among_working_http2": with_h2[0]["candidate"] if with_h2 else None,
        "close_slow_heads_as_configured": [r["candidate"] for r in uv if _closes_slow_heads(r)],
        "stdlib_loop_cpu_ratio_vs_uvloop": round(_mean_cpu(stdlib) / _mean_cpu(best), 2) if stdlib else None,
        "load_was_high": load_before > HIGH_LOAD_1M,
        "summary": lines,
    }


EMBED_FINDINGS = {
    "granian": {
        "api": "granian.server.embed.Server(app, interface=Interfaces.ASGI|ASGINL, ...); "
        "task = asyncio.create_task(server.serve()); ...; server.stop(); await task",
        "works_in_app_owned_loop": "yes: serve() is a coroutine run on the caller's running loop (uvloop or "
        "stdlib); the ASGI app's coroutines are created as tasks on that loop, so it shares the loop with "
        "other tasks (measured here: the ticker task keeps running, see loop_lag)",
        "threads": "the Rust (tokio/hyper) runtime does socket I/O and HTTP parsing on 3 threads of its own "
        "(runtime_threads=1; all named 'python' in /proc, see 'threads'); each request is handed to the loop "
        "with loop.call_soon_threadsafe (the Rust thread takes the GIL for it and for building the scope) "
        "and responses go back through Rust futures. server_cpu_us_per_req_main_thread is the loop "
        "thread's share: the rest of granian's CPU per request is on its Rust threads (GIL hand-offs and "
        "thread wake-ups included)",
        "logged_as": "'Embedded server is experimental!' (a warning at every serve())",
        "signals": "embed does not install signal handlers; stop() ends serve() (the process keeps SIGTERM)",
        "restrictions": "no WSGI, no reloader, no metrics, no workers_max_rss, blocking_threads must be 1; "
        "Server() calls logging.config.dictConfig (granian's LOGGING_CONFIG, incl. log_dictconfig) on "
        "construction",
    },
    "uvicorn": {
        "api": "uvicorn.Server(config).serve() as a task; server.should_exit = True to stop",
        "works_in_app_owned_loop": "yes (what hotstate does today); Server.capture_signals() replaces "
        "SIGINT/SIGTERM handlers unless overridden (hotstate overrides it)",
    },
    "hypercorn": {
        "api": "hypercorn.asyncio.serve(app, config, shutdown_trigger=event.wait) as a task",
        "works_in_app_owned_loop": "yes; with a shutdown_trigger it installs no signal handlers",
    },
}


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def main(only: tuple[str, ...] = (), out: Path = RESULTS) -> None:
    """Every candidate (then the best on the stdlib loop) into `out`; `only`: just those, no stdlib rerun
    (a short check; the results file is written only by a full run)."""
    unknown = [name for name in only if name not in BY_NAME]
    if unknown:
        raise SystemExit(f"unknown candidates {unknown}; known: {', '.join(BY_NAME)}")
    start = time.monotonic()
    loads = [os.getloadavg()[0]]
    signal.signal(signal.SIGTERM, _interrupt)
    results: list[dict[str, Any]] = []
    errors: dict[str, str] = {}
    with tempfile.TemporaryDirectory(prefix="hotstate-http-bench-") as tmp:
        work = Path(tmp)
        db_path = work / "db"
        make_db(db_path)
        (work / "post.lua").write_text(LUA % {"seed": SEED, "bodies": LUA_BODIES, "rows": ROWS})
        (work / "body.json").write_bytes(query_body(123))
        for candidate in CANDIDATES:
            if only and candidate.name not in only:
                continue
            try:
                results.append(run_candidate(candidate, "uvloop", db_path, work, with_extras=True))
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                errors[candidate.name] = repr(exc)
                print(f"   FAILED: {exc!r}", flush=True)
        if results and not only:
            best = min(
                results,
                key=lambda r: statistics.fmean(c["server_cpu_us_per_req"] for c in r["http1"].values()),
            )
            try:
                results.append(
                    run_candidate(BY_NAME[best["candidate"]], "asyncio", db_path, work, with_extras=False)
                )
            except (RuntimeError, OSError, subprocess.SubprocessError) as exc:
                errors[f"{best['candidate']}-asyncio"] = repr(exc)
        value_bytes = value_size(db_path)
    loads.append(os.getloadavg()[0])
    summary = conclusion(results, loads[0]) if results else None
    report: dict[str, Any] = {
        "benchmark": "ASGI servers for hotstate's HTTP API: minimal raw ASGI app, POST /query, "
        "one rocksdict get",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_1m_before": round(loads[0], 2),
        "load_average_1m_after": round(loads[1], 2),
        "note": "wrk/h2load share the 2 cores with the server: requests/s is bounded by both; compare "
        "server_cpu_us_per_req. other_cpu_cores is CPU used meanwhile by other processes (noise).",
        "duration_s": round(time.monotonic() - start, 1),
        "versions": package_versions(),
        "parameters": {
            "rows": ROWS,
            "value_bytes": value_bytes,
            "request": query_body(123).decode(),
            "http1": f"wrk -t1 -c{{1,8,32}}, Lua: {LUA_BODIES} pre-built POSTs with random keys, in turn",
            "http2": "h2load -t1, (connections, streams) in " + str(list(H2_CONFIGS)) + ", one fixed body",
            "warmup_s": f"{WARMUP_S} before the first HTTP/1.1 and the first HTTP/2 cell of each server",
            "measure_s": MEASURE_S,
            "loop_lag_tick_s": LAG_TICK_S,
            "limits_configured": {"header_bytes": LIMIT_HEADER_BYTES, "timeouts_s": LIMIT_TIMEOUT_S},
            "probe_wait_s": PROBE_WAIT_S,
            "hypercorn_keep_alive_max_requests": "raised from 1,000 to 1e9",
            "candidates": {c.name: c.description for c in CANDIDATES},
        },
        "results": results,
        "errors": errors,
        "embed": EMBED_FINDINGS,
        "limits": limit_settings(),
        "conclusion": summary,
    }
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    for line in summary["summary"] if summary else ["no candidate ran"]:
        print(line)
    print(f"wrote {out} in {report['duration_s']} s")


if __name__ == "__main__":
    if len(sys.argv) == 6 and sys.argv[1] == "--serve":
        serve(sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5])
    elif len(sys.argv) == 4 and sys.argv[1] == "--only":  # --only NAME,NAME OUT.json: a short check
        main(tuple(sys.argv[2].split(",")), Path(sys.argv[3]))
    elif len(sys.argv) == 1:
        main()
    else:
        raise SystemExit(f"usage: {sys.argv[0]} [--only CANDIDATE,... OUT.json]")

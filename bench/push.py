"""Benchmark of push queries (`EMIT CHANGES`) -> bench/results/push.json.

A local 3-server cluster, a table of 6 partitions with 1 standby (so server 1 also tails partitions it
does not hold) and KEYS keys. SUBSCRIPTIONS feeds on server 1, each on its own HTTP/1.1 connection to
`POST /v1/changes`, followed by READERS reader processes (raw sockets reading the chunked lines, each line
through the client's own resume logic, `hotstate.client.subscribe.FeedState`: on a broken stream a feed
resumes on the next server from its positions). WRITERS concurrent writers in the main process produce
RATE changes/s (one upsert per change, each value a sequence number) for DURATION s; in the middle server
1 is killed (SIGKILL) and every feed resumes elsewhere.

The mix. A whole-table feed takes every change, a per-key feed 1/KEYS of them, a range feed of R keys
R/KEYS: at RATE changes/s, the deliveries per second are

    RATE * (key_feeds / KEYS + range_feeds * R / KEYS + table_feeds)

The issue's mix (`--mix issue`: 7,000 per key, 2,000 ranges of 50 keys, 1,000 whole-table) at 1,000
changes/s is 1,000 * (3.5 + 50 + 1,000) = 1,053,500 deliveries/s, 95% of them to the whole-table feeds. At
even 10 us of server CPU per delivery that is 10.5 cores, and the readers parse as many lines, on a machine
of 2 cores that also runs the 3 servers and the writers: no Python server can do it, and every feed falls
behind (ends `fell_behind`, resumes, and past its buffer gets a resync of current rows instead of each
change). The default mix (`--mix app`) is what an application has: 10,000 subscriptions, 9,000 per key
(a user's own row), 990 ranges of 10 keys (a page of rows), 10 whole-table (dashboards, caches), at 1,000
changes/s: 1,000 * (4.5 + 4.95 + 10) = 19,450 deliveries/s.

Reported: delivery latency from a write's acknowledgement to each subscriber that takes it (p50, p99; only
changes delivered by server 1 before the kill; one delivered before the writer saw its ack counts 0),
server 1's memory per subscription (RSS growth while subscribing / count) and CPU per delivered change (its
CPU time from the first write to the kill / the changes its feeds received then), and after the kill: feeds
resumed, and per feed, against the writers' acknowledged history (a write's partition and offset are those
its acknowledgement's token gives):
- lost: an acknowledged write of the feed's keys it never received although its position on that
  partition went past the write's offset (a feed skipped it): must be 0;
- undelivered: one it had not reached when the wait for the feeds ended (a reader or server too slow);
- resynced: one replaced by a resync (the feed fell further behind than the log or its buffer allowed, and
  got the key's current row, as new or newer, instead);
- duplicated: a (partition, offset) received twice.
Strict: every feed resumed, 0 lost, 0 undelivered, 0 duplicated. The readers' garbage collector is off
while they measure (their start-up state frozen): a collection over the state of 5,000 feeds in one process
paused it for up to 500 ms, which the latency counted as the server's.

`python bench/push.py [--quick]` (`--quick`: 200 feeds, 100 changes/s for 6 s, nothing written);
`--subscriptions`, `--rate`, `--duration`, `--mix`, `--readers`, `--no-save` for smaller diagnostic runs.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import gc
import json
import multiprocessing
import os
import platform
import random
import signal
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path

from hotstate.cli.local_cluster import LocalCluster
from hotstate.client.subscribe import Change, FeedState
from hotstate.client.writer import TableWriter
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError
from hotstate.query.tokens import decode

RESULTS = Path(__file__).parent / "results" / "push.json"
TABLE = "pushed"
PARTITIONS = 6
KEYS = 2000
# (per key, range, whole table) fractions of the subscriptions, and the keys of a range feed.
MIXES: dict[str, tuple[float, float, float, int]] = {
    "app": (0.9, 0.099, 0.001, 10),
    "issue": (0.7, 0.2, 0.1, 50),
}
CALIBRATE_S = 5.0  # the writes alone, before the feeds, to tell the feeds' CPU from the writes'
WAIT_S = 30.0  # after the writes, the longest wait for every feed to have what it should


@dataclass(frozen=True, slots=True)
class Spec:
    kind: str
    sql: str
    keys: frozenset[str] | None  # None: a range or the table
    low: str | None = None
    high: str | None = None

    def matches(self, key: str) -> bool:
        if self.keys is not None:
            return key in self.keys
        return (self.low is None or key >= self.low) and (self.high is None or key < self.high)


@dataclass
class Feed:
    """One feed as its reader process follows it."""

    spec: Spec
    state: FeedState
    seqs: set[int] = field(default_factory=set)
    offsets: set[tuple[int, int]] = field(default_factory=set)
    spots: dict[int, tuple[int, int]] = field(default_factory=dict)  # seq -> (partition, offset)
    resynced: dict[str, int] = field(default_factory=dict)  # key -> the newest seq a resync gave
    resyncs: int = 0
    duplicated: int = 0
    received: list[tuple[int, float]] = field(default_factory=list)  # (seq, when) before any resume
    resumed: bool = False


def _key(i: int) -> str:
    return f"k{i:05d}"


def _specs(count: int, mix: str, rng: random.Random) -> list[Spec]:
    key_share, range_share, _, range_keys = MIXES[mix]
    keys, ranges = int(count * key_share), int(count * range_share)
    specs = []
    for n in range(count):
        if n < keys:
            key = _key(rng.randrange(KEYS))
            specs.append(
                Spec("key", f"SELECT * FROM {TABLE} WHERE k = '{key}' EMIT CHANGES", frozenset({key}))
            )
        elif n < keys + ranges:
            low = rng.randrange(KEYS - range_keys)
            a, b = _key(low), _key(low + range_keys)
            sql = f"SELECT * FROM {TABLE} WHERE k >= '{a}' AND k < '{b}' EMIT CHANGES"
            specs.append(Spec("range", sql, None, a, b))
        else:
            specs.append(Spec("table", f"SELECT * FROM {TABLE} EMIT CHANGES", None))
    return specs


# ------------------------------------------------------------------------------------- reader processes
def _reader_main(conn: Connection, specs: list[Spec], ports: list[int]) -> None:
    asyncio.run(_reader(conn, specs, ports))


async def _follow(feed: Feed, ports: list[int], started: asyncio.Event, stop: asyncio.Event) -> None:
    """One feed on its own connection, resuming on the next server as the client library does."""
    state = feed.state
    while not stop.is_set():
        port = ports[state.server]
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            await asyncio.sleep(state.moved_on() or 0.05)
            continue
        body = json.dumps(state.body()).encode()
        writer.write(
            b"POST /v1/changes HTTP/1.1\r\nhost: b\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n%s" % (len(body), body)
        )
        same = False
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise ConnectionError(head.split(b"\r\n", 1)[0].decode())
            buffered = b""
            while True:
                size = int((await reader.readuntil(b"\r\n")).strip(), 16)
                if size == 0:
                    break
                buffered += (await reader.readexactly(size + 2))[:-2]
                *lines, buffered = buffered.split(b"\n")
                now = time.monotonic()
                for line in lines:
                    for change in state.on_line(line.decode()):
                        _take(feed, change, now)
                if state.positions is not None:
                    started.set()
            same = state.end_reason == "fell_behind"
        except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()
        if not stop.is_set():
            feed.resumed = True
            await asyncio.sleep(state.moved_on(same_server=same))


def _take(feed: Feed, change: Change, now: float) -> None:
    kind = change.kind
    row = change.row
    if kind == "resync_begin":
        feed.resyncs += 1
    if row is None:
        return
    seq = int(row["seq"])
    if kind == "resync":
        key = str(change.key[0])
        if seq > feed.resynced.get(key, -2):
            feed.resynced[key] = seq
        return
    if kind != "change":
        return
    spot = (change.partition, int(change.offset or 0))
    if spot in feed.offsets:
        feed.duplicated += 1
    feed.offsets.add(spot)
    feed.seqs.add(seq)
    feed.spots[seq] = spot
    if not feed.resumed:
        feed.received.append((seq, now))


async def _reader(conn: Connection, specs: list[Spec], ports: list[int]) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    feeds = [Feed(spec, FeedState(spec.sql, None, False, len(ports), 0)) for spec in specs]
    starts = [asyncio.Event() for _ in feeds]
    tasks = [
        asyncio.create_task(_follow(feed, ports, started, stop))
        for feed, started in zip(feeds, starts, strict=True)
    ]
    await asyncio.wait_for(asyncio.gather(*(s.wait() for s in starts)), 300.0)
    # A reader stands for thousands of subscriber processes: its collector's pauses over the state of all
    # their feeds (measured: gen2 collections of 220-500 ms, several young ones of 20-60 ms, within a 10 s
    # window) are no server's latency, yet each one delayed every line it was reading.
    gc.freeze()
    gc.disable()
    conn.send("started")
    # The writes run; then the acknowledged history: (seq, key, partition, offset, acked_at), the kill time.
    acked, killed_at = await loop.run_in_executor(None, conn.recv)
    wanted = [{a[0] for a in acked if feed.spec.matches(a[1])} for feed in feeds]
    deadline = time.monotonic() + WAIT_S
    waiting = list(range(len(feeds)))
    while waiting and time.monotonic() < deadline:
        waiting = [i for i in waiting if not wanted[i] <= feeds[i].seqs]
        if waiting:
            await asyncio.sleep(0.25)
    stuck = [
        f"{feeds[i].spec.kind} on server {feeds[i].state.server + 1}, {feeds[i].state.resumes} resumes, "
        f"{len(wanted[i] - feeds[i].seqs)} missing, ends {feeds[i].state.ends[-3:]}"
        for i in waiting[:3]
    ]
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    conn.send(_account(feeds, wanted, acked, killed_at) | {"incomplete": len(waiting), "stuck": stuck})


def _account(
    feeds: list[Feed],
    wanted: list[set[int]],
    acked: list[tuple[int, str, int, int, float]],
    killed_at: float,
) -> dict[str, object]:
    """What this reader's feeds received, against the acknowledged history."""
    history = {a[0]: a for a in acked}
    lost = undelivered = resynced = 0
    lost_examples: list[str] = []
    mismatched = 0
    latencies: list[float] = []
    before_kill = 0
    ends: dict[str, int] = {}
    for feed, want in zip(feeds, wanted, strict=True):
        positions = feed.state.positions or {}
        for seq in want - feed.seqs:
            _, key, partition, offset, _ = history[seq]
            if feed.resynced.get(key, -2) >= seq:
                resynced += 1
            elif positions.get(partition, 0) > offset:
                lost += 1
                if len(lost_examples) < 5:
                    lost_examples.append(
                        f"{feed.spec.sql}: seq {seq} ({key}) at {partition}/{offset}, feed at "
                        f"{positions.get(partition)}; ends {feed.state.ends[-5:]}"
                    )
            else:
                undelivered += 1
        for seq, spot in feed.spots.items():
            found = history.get(seq)
            if found is not None and (found[2], found[3]) != spot:
                mismatched += 1
        for seq, when in feed.received:
            found = history.get(seq)
            if when < killed_at:
                before_kill += 1
                if found is not None:
                    latencies.append(max(0.0, when - found[4]))
        for reason in feed.state.ends:
            ends[reason] = ends.get(reason, 0) + 1
    return {
        "resumed": sum(1 for f in feeds if f.resumed),
        "lost": lost,
        "undelivered": undelivered,
        "resynced": resynced,
        "resyncs": sum(f.resyncs for f in feeds),
        "duplicated": sum(f.duplicated for f in feeds),
        "offset_mismatches": mismatched,
        "lost_examples": lost_examples,
        "latencies": latencies,
        "delivered_before_kill": before_kill,
        "delivered": sum(len(f.seqs) for f in feeds),
        "ends": ends,
    }


# ------------------------------------------------------------------------------------------- the run
async def _write(
    writer: TableWriter,
    rate: int,
    duration_s: float,
    writers: int,
    rng: random.Random,
    begin: float,
    acked: list[tuple[int, str, int, int, float]] | None,
) -> None:
    """RATE upserts a second for `duration_s` from `begin`, `writers` at a time, each value its sequence
    number; the acknowledged ones into `acked` (None: a warm-up, values -1)."""
    seqs = iter(range(10**9))

    async def one() -> None:
        while True:
            seq = next(seqs)
            at = begin + seq / rate
            if at - begin >= duration_s:
                return
            await asyncio.sleep(max(0.0, at - time.monotonic()))
            key = _key(rng.randrange(KEYS))
            try:
                result = await writer.upsert(
                    [{"k": key, "seq": -1 if acked is None else seq}], deadline_s=20.0
                )
            except Exception:
                continue  # unknown outcome: not in the acknowledged history
            if acked is not None:
                now = time.monotonic()
                [((_, partition), position)] = decode(result.consistency_token, None).items()
                acked.append((seq, key, partition, position - 1, now))

    await asyncio.gather(*(one() for _ in range(writers)))


def _proc(pid: int) -> tuple[int, float]:
    """RSS in bytes and CPU seconds (user + system) of process `pid`."""
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1]) * 1024
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return rss, (int(fields[11]) + int(fields[12])) / ticks


def _percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


async def run(
    subscriptions: int, rate: int, duration_s: float, mix: str, readers: int, writers: int, seed: int
) -> dict[str, object]:
    rng = random.Random(seed)
    with tempfile.TemporaryDirectory() as root:
        cluster = LocalCluster.create(Path(root) / "cluster", 3)
        cluster.write_configs(
            http_max_connections=subscriptions * 2 + 100, push_max_subscriptions=subscriptions * 2 + 100
        )
        cluster.save()
        for server in cluster.servers:
            cluster.start(server)
        try:
            return await _measure(cluster, subscriptions, rate, duration_s, mix, readers, writers, rng)
        finally:
            for server in cluster.servers:
                cluster.signal(server, signal.SIGKILL)


async def _measure(
    cluster: LocalCluster,
    subscriptions: int,
    rate: int,
    duration_s: float,
    mix: str,
    readers: int,
    writers: int,
    rng: random.Random,
) -> dict[str, object]:
    loop = asyncio.get_running_loop()
    await cluster.wait_ready(30.0, expect=3)
    async with cluster.admin(request_timeout_s=2.0) as admin:
        reply = await admin.create_table(
            TABLE, partitions=PARTITIONS, standby_replicas=1, key_columns=(KeyColumn("k", KeyType.STRING),)
        )
        assert reply.error is ControllerError.NONE, reply
    writer = TableWriter(cluster.addresses(), TABLE, cluster_id=cluster.cluster_id, secret=cluster.secret)
    await writer.upsert([{"k": _key(i), "seq": -1} for i in range(KEYS)])
    serving = cluster.servers[0]
    assert serving.pid is not None
    ports = [s.http_port for s in cluster.servers]
    # The serving server's CPU for the same writes without feeds (it holds partitions: it applies and
    # replicates them), subtracted from its CPU with them: what the feeds cost.
    _, cpu_quiet = _proc(serving.pid)
    quiet_s = min(CALIBRATE_S, duration_s / 2)
    await _write(writer, rate, quiet_s, writers, rng, time.monotonic(), None)
    writes_cpu_per_s = (_proc(serving.pid)[1] - cpu_quiet) / quiet_s
    rss_before, _ = _proc(serving.pid)
    specs = _specs(subscriptions, mix, rng)
    context = multiprocessing.get_context("spawn")
    pipes: list[Connection] = []
    processes = []
    for n in range(readers):
        mine, theirs = context.Pipe()
        process = context.Process(target=_reader_main, args=(theirs, specs[n::readers], ports), daemon=True)
        process.start()
        pipes.append(mine)
        processes.append(process)
    for pipe in pipes:
        assert await loop.run_in_executor(None, pipe.recv) == "started"
    rss_after, cpu_before = _proc(serving.pid)
    acked: list[tuple[int, str, int, int, float]] = []
    begin = time.monotonic()
    killed_at = begin + duration_s / 2
    cpu_at_kill = cpu_before

    async def kill() -> None:
        nonlocal cpu_at_kill, killed_at
        await asyncio.sleep(max(0.0, killed_at - time.monotonic()))
        _, cpu_at_kill = _proc(serving.pid or 0)
        cluster.signal(serving, signal.SIGKILL)
        killed_at = time.monotonic()

    killer = asyncio.create_task(kill())
    await _write(writer, rate, duration_s, writers, rng, begin, acked)
    await killer
    await writer.close()
    for pipe in pipes:
        pipe.send((acked, killed_at))
    parts = [await loop.run_in_executor(None, pipe.recv) for pipe in pipes]
    for process in processes:
        process.join(10.0)
    latencies = [x for part in parts for x in part["latencies"]]  # type: ignore[attr-defined]

    def total(name: str) -> int:
        return sum(int(part[name]) for part in parts)  # type: ignore[call-overload]

    ends: dict[str, int] = {}
    for part in parts:
        for reason, count in part["ends"].items():  # type: ignore[attr-defined]
            ends[reason] = ends.get(reason, 0) + count
    delivered_before_kill = total("delivered_before_kill")
    range_keys = MIXES[mix][3]
    mix_counts = {kind: sum(1 for s in specs if s.kind == kind) for kind in ("key", "range", "table")}
    return {
        "subscriptions": subscriptions,
        "mix": {**mix_counts, "range_keys": range_keys},
        "deliveries_per_s_at_rate": round(
            rate * (mix_counts["key"] / KEYS + mix_counts["range"] * range_keys / KEYS + mix_counts["table"])
        ),
        "changes_acked": len(acked),
        "rate_per_s": round(len(acked) / duration_s, 1),
        "latency_ms": {
            "p50": None if not latencies else round(statistics.median(latencies) * 1000, 2),
            "p99": None if (p := _percentile(latencies, 0.99)) is None else round(p * 1000, 2),
            "samples": len(latencies),
        },
        "memory_per_subscription_bytes": round((rss_after - rss_before) / subscriptions),
        "cpu_us_per_delivered_change": (
            None
            if not delivered_before_kill
            else round((cpu_at_kill - cpu_before) / delivered_before_kill * 1e6, 1)
        ),
        # The same less the server's CPU for the writes alone (measured before the feeds started).
        "feeds_cpu_us_per_delivered_change": (
            None
            if not delivered_before_kill
            else round(
                (cpu_at_kill - cpu_before - writes_cpu_per_s * (killed_at - begin))
                / delivered_before_kill
                * 1e6,
                1,
            )
        ),
        "delivered_before_kill": delivered_before_kill,
        "server_cpu_s_before_kill": round(cpu_at_kill - cpu_before, 2),
        "server_cpu_s_per_s_writes_alone": round(writes_cpu_per_s, 3),
        "kill": {
            "feeds_resumed": total("resumed"),
            "changes_lost": total("lost"),
            "changes_undelivered": total("undelivered"),
            "changes_resynced": total("resynced"),
            "changes_duplicated": total("duplicated"),
            "resyncs": total("resyncs"),
            "offset_mismatches": total("offset_mismatches"),
            "ends": ends,
            "lost_examples": [x for part in parts for x in part["lost_examples"]][:5],  # type: ignore[attr-defined]
            "feeds_incomplete": total("incomplete"),
            "incomplete_examples": [x for part in parts for x in part["stuck"]][:6],  # type: ignore[attr-defined]
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--subscriptions", type=int, default=10_000)
    parser.add_argument("--rate", type=int, default=1000, help="changes per second")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of writes")
    parser.add_argument("--mix", choices=sorted(MIXES), default="app")
    parser.add_argument("--readers", type=int, default=2, help="reader processes")
    parser.add_argument("--writers", type=int, default=16, help="concurrent writes")
    parser.add_argument("--quick", action="store_true", help="200 feeds, 100 changes/s, 6 s, nothing written")
    parser.add_argument("--no-save", action="store_true", help="print the results, write nothing")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where the JSON goes (default: results/push.json, results/push_issue_mix.json for --mix issue)",
    )
    args = parser.parse_args(argv)
    out: Path = args.out or (RESULTS if args.mix == "app" else RESULTS.with_name(f"push_{args.mix}_mix.json"))
    if args.quick:
        args.subscriptions, args.rate, args.duration, args.no_save = 200, 100, 6.0, True
    load_before = os.getloadavg()[0]
    results = asyncio.run(
        run(args.subscriptions, args.rate, args.duration, args.mix, args.readers, args.writers, args.seed)
    )
    kill = results["kill"]
    assert isinstance(kill, dict)
    report = {
        "benchmark": "push queries: delivery latency, memory and CPU per feed, kill -9 of the serving server",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "note": (
            f"2 cores shared by 3 servers, {args.writers} concurrent writers and {args.readers} reader "
            "processes (their garbage collector off while measuring): numbers are for this machine"
        ),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "setup": f"3 servers, {PARTITIONS} partitions, 1 standby, {KEYS} keys, mix {args.mix!r}",
        "goal": "p99 < 50 ms; every feed resumed after the kill, 0 lost, 0 undelivered, 0 duplicated",
        "strict_ok": (
            kill["feeds_resumed"] == args.subscriptions
            and kill["changes_lost"] == 0
            and kill["changes_undelivered"] == 0
            and kill["changes_duplicated"] == 0
        ),
        "results": results,
    }
    print(json.dumps(report, indent=2))
    if not args.no_save:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

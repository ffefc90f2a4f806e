"""Benchmark of push queries (`EMIT CHANGES`) -> bench/results/push.json.

A local 3-server cluster, a table of 6 partitions with 1 standby (so server 1 also tails partitions it
does not hold). SUBSCRIPTIONS feeds on server 1, mixed: 70% per key, 20% per key range, 10% whole table,
each on its own HTTP/1.1 connection to `POST /v1/changes`, read by the client's own resume logic
(`hotstate.client.subscribe.FeedState`: on a broken stream it resumes on the next server from its
positions). Writers produce RATE changes/s (one upsert per change, each value a sequence number) for
DURATION s; in the middle server 1 is killed (SIGKILL) and every feed resumes elsewhere.

Reported: delivery latency from a write's acknowledgement to each subscriber that takes it (p50, p99; only
changes delivered before the kill, so that the resume does not count), server 1's memory per subscription
(RSS growth while subscribing / count) and CPU per delivered change (its CPU time during the writes before
the kill / the changes it delivered then), and after the kill: feeds resumed, and per feed the changes lost
and duplicated against the writers' acknowledged history (lost: an acknowledged write of its keys it never
received; duplicated: a (partition, offset) received twice).

`python bench/push.py [--quick]` (`--quick`: 40 feeds, 100 changes/s for 4 s, nothing written)
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
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from hotstate.cli.local_cluster import LocalCluster
from hotstate.client.subscribe import FeedState
from hotstate.client.writer import TableWriter
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError

RESULTS = Path(__file__).parent / "results" / "push.json"
TABLE = "pushed"
PARTITIONS = 6
KEYS = 2000


@dataclass
class Feed:
    kind: str
    sql: str
    keys: set[str] | None  # None: a range or the table (matches: below)
    low: str | None = None
    high: str | None = None
    seqs: list[int] = field(default_factory=list)
    offsets: set[tuple[int, int]] = field(default_factory=set)
    duplicated: int = 0
    latencies: list[float] = field(default_factory=list)
    resumed: bool = False

    def matches(self, key: str) -> bool:
        if self.keys is not None:
            return key in self.keys
        return (self.low is None or key >= self.low) and (self.high is None or key < self.high)


def _key(i: int) -> str:
    return f"k{i:05d}"


def _feeds(count: int, rng: random.Random) -> list[Feed]:
    feeds = []
    for n in range(count):
        pick = n % 10
        if pick < 7:
            key = _key(rng.randrange(KEYS))
            feeds.append(Feed("key", f"SELECT * FROM {TABLE} WHERE k = '{key}' EMIT CHANGES", {key}))
        elif pick < 9:
            low = rng.randrange(KEYS - 50)
            a, b = _key(low), _key(low + 50)
            sql = f"SELECT * FROM {TABLE} WHERE k >= '{a}' AND k < '{b}' EMIT CHANGES"
            feeds.append(Feed("range", sql, None, a, b))
        else:
            feeds.append(Feed("table", f"SELECT * FROM {TABLE} EMIT CHANGES", None))
    return feeds


async def _follow(
    feed: Feed, ports: list[int], acked_at: dict[int, float], started: asyncio.Event, stop: asyncio.Event
) -> None:
    """One feed on its own connection, resuming on the next server as the client library does."""
    state = FeedState(feed.sql, None, False, len(ports), 0)
    first = True
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
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 200"):
                raise ConnectionError(head.split(b"\r\n", 1)[0].decode())
            if first:
                started.set()
            buffered = b""
            while not stop.is_set():
                size_line = await reader.readuntil(b"\r\n")
                size = int(size_line.strip(), 16)
                if size == 0:
                    break
                buffered += (await reader.readexactly(size + 2))[:-2]
                *lines, buffered = buffered.split(b"\n")
                now = time.monotonic()
                for line in lines:
                    for change in state.on_line(line.decode()):
                        if change.kind != "change" or change.row is None or change.offset is None:
                            continue
                        seq = int(change.row["seq"])
                        spot = (change.partition, change.offset)
                        if spot in feed.offsets:
                            feed.duplicated += 1
                        feed.offsets.add(spot)
                        feed.seqs.append(seq)
                        acked = acked_at.get(seq)
                        if acked is not None and not feed.resumed:
                            feed.latencies.append(now - acked)
        except (OSError, ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass
        finally:
            writer.close()
        first = False
        if not stop.is_set():
            feed.resumed = True
            await asyncio.sleep(state.moved_on())


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


async def run(subscriptions: int, rate: int, duration_s: float, seed: int) -> dict[str, object]:
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
            return await _measure(cluster, subscriptions, rate, duration_s, rng)
        finally:
            for server in cluster.servers:
                cluster.signal(server, signal.SIGKILL)


async def _measure(
    cluster: LocalCluster, subscriptions: int, rate: int, duration_s: float, rng: random.Random
) -> dict[str, object]:
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
    rss_before, _ = _proc(serving.pid)
    feeds = _feeds(subscriptions, rng)
    acked_at: dict[int, float] = {}
    stop = asyncio.Event()
    starts = [asyncio.Event() for _ in feeds]
    tasks = [
        asyncio.create_task(_follow(feed, ports, acked_at, started, stop))
        for feed, started in zip(feeds, starts, strict=True)
    ]
    await asyncio.wait_for(asyncio.gather(*(s.wait() for s in starts)), 120.0)
    rss_after, cpu_before = _proc(serving.pid)
    acked: list[tuple[int, str]] = []
    seq = 0
    begin = time.monotonic()
    killed_at: float | None = None
    cpu_at_kill = cpu_before
    delivered_at_kill = 0
    while time.monotonic() - begin < duration_s:
        if killed_at is None and time.monotonic() - begin >= duration_s / 2:
            _, cpu_at_kill = _proc(serving.pid)
            delivered_at_kill = sum(len(f.seqs) for f in feeds)
            cluster.signal(serving, signal.SIGKILL)
            killed_at = time.monotonic()
        key = _key(rng.randrange(KEYS))
        try:
            await writer.upsert([{"k": key, "seq": seq}], deadline_s=20.0)
        except Exception:
            seq += 1
            continue  # unknown outcome: not in the acknowledged history
        acked_at[seq] = time.monotonic()
        acked.append((seq, key))
        seq += 1
        behind = begin + len(acked) / rate - time.monotonic()
        if behind > 0:
            await asyncio.sleep(behind)
    await writer.close()
    # Every feed has what it should (or the wait ends).
    wanted = [{s for s, k in acked if feed.matches(k)} for feed in feeds]
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline and any(
        not want <= set(feed.seqs) for feed, want in zip(feeds, wanted, strict=True)
    ):
        await asyncio.sleep(0.1)
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    latencies = [x for feed in feeds for x in feed.latencies]
    lost = sum(len(want - set(feed.seqs)) for feed, want in zip(feeds, wanted, strict=True))
    return {
        "subscriptions": subscriptions,
        "mix": {kind: sum(1 for f in feeds if f.kind == kind) for kind in ("key", "range", "table")},
        "changes_acked": len(acked),
        "rate_per_s": round(len(acked) / duration_s, 1),
        "latency_ms": {
            "p50": None if not latencies else round(statistics.median(latencies) * 1000, 2),
            "p99": None if (p := _percentile(latencies, 0.99)) is None else round(p * 1000, 2),
            "samples": len(latencies),
        },
        "memory_per_subscription_bytes": round((rss_after - rss_before) / subscriptions),
        "cpu_us_per_delivered_change": (
            None if not delivered_at_kill else round((cpu_at_kill - cpu_before) / delivered_at_kill * 1e6, 1)
        ),
        "kill": {
            "feeds_resumed": sum(1 for f in feeds if f.resumed),
            "changes_lost": lost,
            "changes_duplicated": sum(f.duplicated for f in feeds),
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--subscriptions", type=int, default=10_000)
    parser.add_argument("--rate", type=int, default=1000, help="changes per second")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of writes")
    parser.add_argument("--quick", action="store_true", help="40 feeds, 100 changes/s, 4 s, nothing written")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.quick:
        args.subscriptions, args.rate, args.duration = 40, 100, 4.0
    load_before = os.getloadavg()[0]
    results = asyncio.run(run(args.subscriptions, args.rate, args.duration, args.seed))
    report = {
        "benchmark": "push queries: delivery latency, memory and CPU per feed, kill -9 of the serving server",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "note": "2 cores shared by 3 servers, the writer and the feeds' reader: numbers are for this machine",
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "setup": f"3 servers, {PARTITIONS} partitions, 1 standby, {KEYS} keys",
        "goal": "p99 < 50 ms; every feed resumed after the kill, 0 lost, 0 duplicated",
        "results": results,
    }
    print(json.dumps(results, indent=2))
    if not args.quick:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark of writes through failures -> bench/results/write_failover.json.

A local 3-server cluster (combined mode: every server is a metadata voter and a broker), a table of 6
partitions with 1 standby, and one `TableWriter` writing one-row upserts (acks=all) to every partition
without pause (a write every ~10 ms per partition). Then, one at a time, faults:

- `kill_broker`: kill -9 of a server holding actives that does not lead the metadata quorum;
- `kill_leader`: kill -9 of the metadata leader (it hosts the active controller, and holds actives);
- `sigstop`: SIGSTOP of a server holding actives (not the leader): silence, so bounded by the session
  timeout (broker.session.timeout.ms, 2 s here).

Then overlapping faults, on a 5-server cluster (3 would lose the metadata quorum):

- `stop_then_kill_leader`: SIGSTOP of a server holding actives for 3 s, and 0.5 s into it kill -9 of the
  leader, restarted at once;
- `kill_during_recovery`: kill -9 of a server holding actives, restarted at once, and 0.3 s later (while it
  starts) kill -9 of another server holding actives, also restarted at once.

For each single fault, per partition whose active was the victim: the time from the fault to the first
acked write that began after the fault or was retried through it (`WriteResult.retries`), i.e. a write the
victim cannot have answered. For overlapping faults, the longest gap between acked writes on any partition
from a second before the first fault until every partition acked again. After each fault the victims are
restarted (or continued) and the cluster settles before the next.

`python bench/write_failover.py [--kills N] [--quick]`
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import itertools
import json
import os
import platform
import random
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from hotstate.cli.local_cluster import LocalCluster, LocalServer
from hotstate.client.writer import TableWriter, WriteError
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError
from hotstate.protocol.keys import encode_key, partition_for

RESULTS = Path(__file__).parent / "results" / "write_failover.json"
TABLE = "failover"
PARTITIONS = 6
KEY = (KeyColumn("user", KeyType.STRING),)
WRITE_PAUSE_S = 0.01
# A partition that has not acked this long after a fault counts as this (and is reported as such).
GIVE_UP_S = 20.0
STOP_S = 3.0  # how long the overlapping case's SIGSTOP lasts
OVERLAPPING = ("stop_then_kill_leader", "kill_during_recovery")


@dataclass
class Acks:
    """Every acked write: (partition, began, acked, retried)."""

    writes: list[tuple[int, float, float, bool]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def first_after(self, partition: int, fault_at: float) -> float | None:
        for p, began, acked, retried in self.writes:
            if p == partition and acked > fault_at and (began >= fault_at or retried):
                return acked
        return None

    def longest_gap(self, start: float, end: float) -> float:
        """The longest time any partition went without an acked write within [start, end]."""
        longest = 0.0
        for p in range(PARTITIONS):
            times = [start] + [a for q, _, a, _ in self.writes if q == p and start < a <= end] + [end]
            longest = max(longest, max(b - a for a, b in itertools.pairwise(times)))
        return longest


def keys_by_partition() -> list[str]:
    found: dict[int, str] = {}
    i = 0
    while len(found) < PARTITIONS:
        key = f"user-{i}"
        found.setdefault(partition_for(encode_key((key,)), PARTITIONS), key)
        i += 1
    return [found[p] for p in range(PARTITIONS)]


async def write_forever(
    writer: TableWriter, partition: int, key: str, acks: Acks, stop: asyncio.Event
) -> None:
    n = 0
    while not stop.is_set():
        n += 1
        began = time.monotonic()
        try:
            result = await writer.upsert([{"user": key, "n": n}], deadline_s=60.0)
        except WriteError as error:
            acks.errors.append(f"{partition}: {error}")
            continue
        acks.writes.append((partition, began, time.monotonic(), result.retries > 0))
        await asyncio.sleep(WRITE_PAUSE_S)


async def actives(cluster: LocalCluster) -> tuple[int, dict[int, int]]:
    """(metadata leader, active server per partition) as the leader sees them."""
    view = await cluster.wait_ready(30.0)
    assert view.leader_id is not None
    writer = TableWriter(cluster.addresses(), TABLE, cluster_id=cluster.cluster_id, secret=cluster.secret)
    try:
        meta = await writer.metadata(refresh=True)
    finally:
        await writer.close()
    return view.leader_id, {
        p: part.active for p, part in enumerate(meta.partitions) if part.active is not None
    }


async def wait_all_acked(acks: Acks, partitions: Sequence[int], fault_at: float) -> None:
    end = fault_at + GIVE_UP_S
    while time.monotonic() < end:
        if all(acks.first_after(p, fault_at) is not None for p in partitions):
            return
        await asyncio.sleep(0.05)


async def settle(cluster: LocalCluster, acks: Acks) -> None:
    """Every server registered and unfenced, every partition writing again with all its replicas in sync
    (else the next fault could take a partition's last in-sync replica, which no failover may replace),
    and a breath."""
    await cluster.wait_ready(60.0)
    now = time.monotonic()
    await wait_all_acked(acks, range(PARTITIONS), now)
    end = time.monotonic() + 60.0
    async with TableWriter(
        cluster.addresses(), TABLE, cluster_id=cluster.cluster_id, secret=cluster.secret
    ) as writer:
        while time.monotonic() < end:
            meta = await writer.metadata(refresh=True)
            if all(set(p.isr) == set(p.replicas) and p.active is not None for p in meta.partitions):
                break
            await asyncio.sleep(0.2)
    await asyncio.sleep(1.0)


def server(cluster: LocalCluster, node_id: int) -> LocalServer:
    return next(s for s in cluster.servers if s.node_id == node_id)


async def restart(cluster: LocalCluster, node_id: int) -> None:
    victim = server(cluster, node_id)
    while cluster.alive(victim):
        await asyncio.sleep(0.02)
    cluster.start(victim)


async def one_fault(
    cluster: LocalCluster, acks: Acks, mode: str, rng: random.Random
) -> tuple[list[float], dict[str, object]]:
    leader, active_of = await actives(cluster)
    holders = sorted(set(active_of.values()))
    if mode == "kill_leader":
        victim = leader
    else:
        others = [n for n in holders if n != leader] or holders
        victim = rng.choice(others)
    moved = [p for p, n in active_of.items() if n == victim]
    fault_at = time.monotonic()
    if mode in OVERLAPPING:
        if mode == "stop_then_kill_leader":
            first, second = victim, leader
            cluster.signal(server(cluster, first), signal.SIGSTOP)
            await asyncio.sleep(0.5)
        else:
            first = victim
            second = rng.choice([n for n in holders if n != first] or [leader])
            cluster.signal(server(cluster, first), signal.SIGKILL)
            await restart(cluster, first)
            await asyncio.sleep(0.3)
        cluster.signal(server(cluster, second), signal.SIGKILL)
        # Restarted at once: a partition whose only in-sync replica it was waits for it (no replica outside
        # the ISR is ever made the active), so such a gap includes a process start.
        await restart(cluster, second)
        if mode == "stop_then_kill_leader":
            # A pause ends: a partition whose two replicas were the paused server and the killed leader has
            # no in-sync replica until one of them is back.
            await asyncio.sleep(max(0.0, fault_at + STOP_S - time.monotonic()))
            cluster.signal(server(cluster, first), signal.SIGCONT)
        await wait_all_acked(acks, range(PARTITIONS), time.monotonic())
        gap = acks.longest_gap(fault_at - 1.0, time.monotonic())
        await settle(cluster, acks)
        return [gap], {"first": first, "second": second, "leader": leader, "longest_gap_s": round(gap, 3)}
    signum = signal.SIGSTOP if mode == "sigstop" else signal.SIGKILL
    cluster.signal(server(cluster, victim), signum)
    await wait_all_acked(acks, moved, fault_at)
    times = []
    for p in moved:
        acked = acks.first_after(p, fault_at)
        times.append(GIVE_UP_S if acked is None else acked - fault_at)
    if mode == "sigstop":
        cluster.signal(server(cluster, victim), signal.SIGCONT)
    else:
        await restart(cluster, victim)
    await settle(cluster, acks)
    return times, {"victim": victim, "leader": leader, "partitions": moved, "first_ack_s": times}


def summary(values: list[float]) -> dict[str, object]:
    ordered = sorted(values)
    if not ordered:
        return {"n": 0}
    return {
        "n": len(ordered),
        "p50_s": round(statistics.median(ordered), 3),
        "p99_s": round(ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))], 3),
        "max_s": round(ordered[-1], 3),
    }


async def run(servers: int, plan: dict[str, int], seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster.create(Path(tmp) / "cluster", servers)
        cluster.write_configs()
        cluster.save()
        cluster.start_all()
        stop = asyncio.Event()
        writer: TableWriter | None = None
        tasks: list[asyncio.Task[None]] = []
        try:
            await cluster.wait_ready(30.0)
            async with cluster.admin(request_timeout_s=2.0) as admin:
                reply = await admin.create_table(
                    TABLE, partitions=PARTITIONS, standby_replicas=1, key_columns=KEY
                )
                assert reply.error is ControllerError.NONE, reply
            writer = TableWriter(
                cluster.addresses(), TABLE, cluster_id=cluster.cluster_id, secret=cluster.secret
            )
            acks = Acks()
            tasks = [
                asyncio.create_task(write_forever(writer, p, key, acks, stop))
                for p, key in enumerate(keys_by_partition())
            ]
            await settle(cluster, acks)
            for mode, count in plan.items():
                values: list[float] = []
                trials = []
                for i in range(count):
                    measured, detail = await one_fault(cluster, acks, mode, rng)
                    values.extend(measured)
                    trials.append(detail)
                    print(f"{mode} {i + 1}/{count}: {[round(v, 3) for v in measured]}", flush=True)
                results[mode] = {**summary(values), "trials": trials}
            results["write_errors"] = acks.errors[:20]
            results["write_errors_count"] = len(acks.errors)
            results["acked_writes"] = len(acks.writes)
        finally:
            stop.set()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if writer is not None:
                await writer.close()
            for s in cluster.servers:
                cluster.signal(s, signal.SIGCONT)
                cluster.signal(s, signal.SIGKILL)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--kills", type=int, default=20, help="kill -9s of a non-leader server (default 20)")
    parser.add_argument("--quick", action="store_true", help="a few faults of each kind, nothing written")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    if args.quick:
        single = {"kill_broker": 3, "kill_leader": 2, "sigstop": 1}
        overlapping = {"stop_then_kill_leader": 1, "kill_during_recovery": 1}
    else:
        single = {"kill_broker": args.kills, "kill_leader": max(5, args.kills // 2), "sigstop": 5}
        overlapping = {"stop_then_kill_leader": 3, "kill_during_recovery": 3}
    load_before = os.getloadavg()[0]
    results = {
        "three_servers": asyncio.run(run(3, single, args.seed)),
        "five_servers": asyncio.run(run(5, overlapping, args.seed)),
    }
    report = {
        "benchmark": "time from a fault to the first acked write on each partition the victim led",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "note": "2 cores shared by 3 servers and the writer: numbers are for this machine only",
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "cluster": "3, then 5 combined-mode servers; 6 partitions, 1 standby; session timeout 2 s",
        "goal": "kill -9 p99 < 0.5 s",
        "results": results,
    }
    for name, part in results.items():
        for mode, measured in part.items():
            shown = (
                {k: v for k, v in measured.items() if k != "trials"}
                if isinstance(measured, dict)
                else measured
            )
            print(name, mode, shown)
    if not args.quick:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Benchmark of pull queries through gray failures, hedging on vs off -> bench/results/gray_failure.json.

A local 3-server cluster, a table of 6 partitions with 1 standby and 3,000 rows. Clients (4 concurrent
loops, each one query at a time) send point lookups through server R for keys whose active is on another
server X (not the metadata leader), so every query is forwarded to X. Faults on X, each run with hedging
on and with hedging off (the `hedging` field of `/v1/query`), alternating, in the same run:

- `sigstop`: SIGSTOP of X for 3 s. Heartbeats mark X down after about a second
  (heartbeat.missed.threshold), the controller fences it after the session timeout (2 s); the latency p99
  is reported for the first second (before heartbeats notice) and for the whole stop.
- `slow_peer`: X paused 40 ms out of every 100 ms for 4 s (SIGSTOP / SIGCONT): alive by heartbeats
  throughout, but its answers stall (a GC-like gray failure).

The extra requests hedging costs: R's `hotstate_query_forwards_total{outcome="hedged"}` over all forwards
of the whole run (from /metrics).

`python bench/gray_failure.py [--quick]`
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import os
import platform
import random
import re
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

from hotstate.cli.local_cluster import LocalCluster, LocalServer
from hotstate.client.writer import TableWriter
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError
from hotstate.protocol.keys import encode_key, partition_for

RESULTS = Path(__file__).parent / "results" / "gray_failure.json"
TABLE = "gray"
PARTITIONS = 6
ROWS = 3000
CLIENTS = 4
STOP_S = 3.0
FIRST_WINDOW_S = 1.0
SLOW_S = 4.0
PAUSE_MS, PERIOD_MS = 40, 100
FORWARDS = re.compile(r'^hotstate_query_forwards_total\{outcome="([a-z_]+)"\} ([0-9.e+]+)$', re.M)


def percentile(values: list[float], fraction: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(fraction * len(ordered)))], 2)


async def forwards(http: httpx.AsyncClient, server: LocalServer) -> dict[str, float]:
    text = (await http.get(f"http://127.0.0.1:{server.http_port}/metrics")).text
    return {outcome: float(value) for outcome, value in FORWARDS.findall(text)}


async def query_loop(
    http: httpx.AsyncClient,
    receiver: LocalServer,
    keys: list[str],
    hedging: bool,
    stop: asyncio.Event,
    out: list[tuple[float, float, bool]],
    rng: random.Random,
) -> None:
    """(began, ms, ok) of each query until `stop`."""
    url = f"http://127.0.0.1:{receiver.http_port}/v1/query"
    while not stop.is_set():
        key = rng.choice(keys)
        body = {"sql": f"SELECT * FROM {TABLE} WHERE k = '{key}'", "hedging": hedging, "timeout_ms": 10_000}
        began = time.monotonic()
        try:
            reply = await http.post(url, json=body, timeout=15.0)
            ok = reply.status_code == 200
        except httpx.HTTPError:
            ok = False
        out.append((began, (time.monotonic() - began) * 1000, ok))


async def setup(cluster: LocalCluster) -> dict[int, list[str]]:
    """Creates and fills the table; returns the keys per active server."""
    async with cluster.admin(request_timeout_s=2.0) as admin:
        reply = await admin.create_table(
            TABLE, partitions=PARTITIONS, standby_replicas=1, key_columns=(KeyColumn("k", KeyType.STRING),)
        )
        assert reply.error is ControllerError.NONE, reply
    async with TableWriter(
        cluster.addresses(), TABLE, cluster_id=cluster.cluster_id, secret=cluster.secret
    ) as writer:
        await writer.upsert([{"k": f"k{i:05d}", "v": i} for i in range(ROWS)])
    return await keys_by_active(cluster)


async def keys_by_active(cluster: LocalCluster) -> dict[int, list[str]]:
    async with TableWriter(
        cluster.addresses(), TABLE, cluster_id=cluster.cluster_id, secret=cluster.secret
    ) as writer:
        meta = await writer.metadata(refresh=True)
    out: dict[int, list[str]] = {}
    for i in range(ROWS):
        key = f"k{i:05d}"
        active = meta.partitions[partition_for(encode_key((key,)), PARTITIONS)].active
        if active is not None:
            out.setdefault(active, []).append(key)
    return out


async def wait_actives_back(cluster: LocalCluster, node_id: int, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        await cluster.wait_ready(30.0)
        if (await keys_by_active(cluster)).get(node_id):
            return
        await asyncio.sleep(0.5)


async def trial(
    cluster: LocalCluster, http: httpx.AsyncClient, kind: str, hedging: bool, rng: random.Random
) -> dict[str, object]:
    view = await cluster.wait_ready(30.0)
    by_active = await keys_by_active(cluster)
    leader = view.leader_id
    victim_id = max((n for n in by_active if n != leader), key=lambda n: len(by_active[n]))
    receiver = next(s for s in cluster.servers if s.node_id != victim_id)
    victim = next(s for s in cluster.servers if s.node_id == victim_id)
    stop = asyncio.Event()
    samples: list[tuple[float, float, bool]] = []
    loops = [
        asyncio.create_task(query_loop(http, receiver, by_active[victim_id], hedging, stop, samples, rng))
        for _ in range(CLIENTS)
    ]
    await asyncio.sleep(1.0)  # warm: the hedge delays learn the peer's normal answer times
    fault_at = time.monotonic()
    if kind == "sigstop":
        cluster.signal(victim, signal.SIGSTOP)
        await asyncio.sleep(STOP_S)
        cluster.signal(victim, signal.SIGCONT)
        window = STOP_S
    else:
        end = fault_at + SLOW_S
        while time.monotonic() < end:
            cluster.signal(victim, signal.SIGSTOP)
            await asyncio.sleep(PAUSE_MS / 1000)
            cluster.signal(victim, signal.SIGCONT)
            await asyncio.sleep((PERIOD_MS - PAUSE_MS) / 1000)
        window = SLOW_S
    stop.set()
    await asyncio.gather(*loops)
    during = [(b, ms, ok) for b, ms, ok in samples if fault_at <= b < fault_at + window]
    first = [ms for b, ms, ok in during if b < fault_at + FIRST_WINDOW_S]
    before = [ms for b, ms, ok in samples if b < fault_at]
    result: dict[str, object] = {
        "victim": victim_id,
        "receiver": receiver.node_id,
        "queries_during": len(during),
        "failed_during": sum(1 for _, _, ok in during if not ok),
        "p50_ms": percentile([ms for _, ms, _ in during], 0.5),
        "p99_ms": percentile([ms for _, ms, _ in during], 0.99),
        "max_ms": percentile([ms for _, ms, _ in during], 1.0),
        "before_p99_ms": percentile(before, 0.99),
    }
    if kind == "sigstop":
        result["first_second_p99_ms"] = percentile(first, 0.99)
        await wait_actives_back(cluster, victim_id)
    await asyncio.sleep(1.0)
    return result


def summarize(trials: list[dict[str, object]]) -> dict[str, object]:
    def values(name: str) -> list[float]:
        return [float(t[name]) for t in trials if t.get(name) is not None]  # type: ignore[arg-type]

    out: dict[str, object] = {"trials": trials}
    for name in ("p99_ms", "first_second_p99_ms", "p50_ms", "max_ms"):
        got = values(name)
        if got:
            out[f"median_{name}"] = round(statistics.median(got), 2)
    out["failed"] = sum(int(t["failed_during"]) for t in trials)  # type: ignore[call-overload]
    return out


async def run(repeats: int, seed: int) -> dict[str, object]:
    rng = random.Random(seed)
    results: dict[str, object] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster.create(Path(tmp) / "cluster", 3)
        cluster.write_configs()
        cluster.save()
        cluster.start_all()
        try:
            await cluster.wait_ready(30.0)
            await setup(cluster)
            async with httpx.AsyncClient() as http:
                before = {s.node_id: await forwards(http, s) for s in cluster.servers}
                for kind in ("sigstop", "slow_peer"):
                    runs: dict[bool, list[dict[str, object]]] = {True: [], False: []}
                    for i in range(repeats):
                        for hedging in (True, False):
                            measured = await trial(cluster, http, kind, hedging, rng)
                            runs[hedging].append(measured)
                            print(kind, "hedging" if hedging else "no hedging", i + 1, measured, flush=True)
                    results[kind] = {
                        "hedging_on": summarize(runs[True]),
                        "hedging_off": summarize(runs[False]),
                    }
                after = {s.node_id: await forwards(http, s) for s in cluster.servers}
            hedged = sum(after[n].get("hedged", 0) - before[n].get("hedged", 0) for n in after)
            won = sum(after[n].get("hedge_won", 0) - before[n].get("hedge_won", 0) for n in after)
            total = sum(
                v - before[n].get(k, 0)
                for n in after
                for k, v in after[n].items()
                if k not in ("hedged", "hedge_won")
            )
            results["extra_requests"] = {
                "hedged_partitions": hedged,
                "hedges_won": won,
                "forwarded_partitions": total,
                "hedged_fraction": round(hedged / total, 4) if total else None,
                "note": "over the whole run, hedging-off trials included (they forward without hedges)",
            }
        finally:
            for s in cluster.servers:
                cluster.signal(s, signal.SIGCONT)
                cluster.signal(s, signal.SIGKILL)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=3, help="trials per fault and mode (default 3)")
    parser.add_argument("--quick", action="store_true", help="one trial of each, nothing written")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args(argv)
    load_before = os.getloadavg()[0]
    results = asyncio.run(run(1 if args.quick else args.repeats, args.seed))
    report = {
        "benchmark": "pull query latency while a peer is stopped or stalling, hedging on vs off",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "note": "2 cores shared by 3 servers and the client loops: numbers are for this machine only",
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "setup": f"3 servers, {PARTITIONS} partitions, 1 standby, {ROWS} rows, {CLIENTS} client loops",
        "goal": "sigstop p99 with hedging < 50 ms; hedged fraction < 10% over the run",
        "results": results,
    }
    for kind in ("sigstop", "slow_peer"):
        part = results[kind]
        assert isinstance(part, dict)
        for mode, summary in part.items():
            print(kind, mode, {k: v for k, v in summary.items() if k != "trials"})
    print("extra", results["extra_requests"])
    if not args.quick:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

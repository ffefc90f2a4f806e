"""Chaos schedules against a real cluster in network namespaces: one (`run_schedule`), many (`run_many`), and
`python -m hotstate.chaos`.

A run: build the fabric (a namespace per server, racks, a client namespace), start the servers inside
it, create the table, run the workload and the nemesis's schedule together, heal, make the final reads,
let the replicas converge, kill the servers, read their stores, check. Whatever happens (a failure, Ctrl-C),
the servers are killed and every namespace made is deleted.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hotstate.chaos.checker import availability, check, summarize
from hotstate.chaos.nemesis import KINDS, Nemesis, schedule
from hotstate.chaos.netns import Fabric, in_namespace, kill_processes, unavailable_reason
from hotstate.chaos.workload import Workload, WorkloadConfig, read_stores
from hotstate.cli.local_cluster import RACKS, LocalCluster, LocalServer

RPC_PORT = 9092
HTTP_PORT = 8088


@dataclass(frozen=True, slots=True)
class RunConfig:
    servers: int = 3
    racks: int = 3
    duration_s: float = 30.0
    kinds: tuple[str, ...] = KINDS
    rack_rate: str | None = None  # e.g. "100mbit": every rack's uplink, both ways
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    hold_s: tuple[float, float] = (3.0, 6.0)
    calm_s: tuple[float, float] = (2.0, 4.0)


def make_cluster(root: Path, fabric: Fabric) -> LocalCluster:
    cluster = LocalCluster.create(root, len(fabric.hosts))
    cluster.servers = [
        LocalServer(h.node_id, h.rack, RPC_PORT, HTTP_PORT, host=h.address, netns=h.netns)
        for h in sorted(fabric.hosts.values(), key=lambda h: h.node_id)
    ]
    cluster.write_configs()
    cluster.save()
    return cluster


def run_schedule(seed: int, config: RunConfig, root: Path, *, log: Any = None) -> dict[str, Any]:
    """Run schedule `seed` and check it; the result as recorded in bench/results/chaos.json."""
    nodes = list(range(1, config.servers + 1))
    steps = schedule(
        seed, nodes, config.duration_s, kinds=config.kinds, hold_s=config.hold_s, calm_s=config.calm_s
    )
    placement = {n: RACKS[(n - 1) % min(config.racks, len(RACKS))] for n in nodes}
    fabric = Fabric.build(placement, rack_rate=config.rack_rate)
    cluster: LocalCluster | None = None
    try:
        cluster = make_cluster(root, fabric)
        workload = Workload(cluster, config.workload, seed)
        nemesis = Nemesis(cluster, fabric)
        outcome: dict[str, Any] = {}

        async def main() -> None:
            assert cluster is not None
            cluster.start_all()
            await cluster.wait_ready(60.0)
            await workload.create_table()
            stop = asyncio.Event()
            clients = asyncio.ensure_future(workload.run(stop))
            t0 = time.monotonic()
            try:
                await nemesis.run(steps, t0)
                await asyncio.sleep(max(0.0, t0 + config.duration_s - time.monotonic()))
            finally:
                stop.set()
                await clients
            outcome["end"] = time.monotonic()
            outcome["ready"] = await _ready(cluster)
            await workload.final_reads()
            outcome["converged"] = await workload.converge()
            outcome["bytes"] = fabric.rack_bytes()

        in_namespace(fabric.client_netns, main)
        # Every process in the servers' namespaces, the servers' own and any other (there should be
        # none: a second server on one data directory would be a harness defect), killed and gone
        # before the stores are opened.
        known = {server.pid for server in cluster.servers}
        strays = {}
        for node, host in sorted(fabric.hosts.items()):
            extra = sorted(set(kill_processes(host.netns)) - known)
            if extra:
                strays[node] = extra
        for server in cluster.servers:
            _wait_gone(cluster, server)
        stores = read_stores(cluster)
        linearizable, explanation, definite = workload.check_metadata()
        report = check(
            workload.writes,
            workload.reads,
            stores=stores,
            metadata_error=None if linearizable is not False else explanation,
            unrecovered=[]
            if outcome.get("ready")
            else ["not every server was back and unfenced 60 s after healing"],
        )
        figures = availability(nemesis.windows(outcome["end"]), workload.writes, workload.reads)
        violations = [v.as_dict() for v in report.violations]
        if strays:  # the harness broke its own rule; what the run saw is suspect
            violations.append({"kind": "harness-error", "message": f"processes beside the servers: {strays}"})
        result = {
            "seed": seed,
            "ok": not violations,
            "violations": violations,
            "faults": figures,
            "writes_acked": report.writes_acked,
            "writes_unknown": report.writes_unknown,
            "reads_ok": report.reads_ok,
            "reads_failed": report.reads_failed,
            "metadata_ops": definite,
            "metadata_linearizable": linearizable,
            "ready_after_heal": outcome.get("ready"),
            "converged": outcome.get("converged"),
            "rack_bytes": outcome.get("bytes"),
            "stray_processes": strays,
        }
        if log is not None:
            print(_line(result), file=log, flush=True)
        return result
    except BaseException:
        if cluster is not None and log is not None:
            print(_logs(cluster), file=log, flush=True)
        raise
    finally:
        if cluster is not None:
            for server in cluster.servers:
                cluster.signal(server, signal.SIGKILL)
        fabric.close()


async def _ready(cluster: LocalCluster) -> bool:
    try:
        await cluster.wait_ready(60.0)
    except TimeoutError:
        return False
    return True


def _wait_gone(cluster: LocalCluster, server: LocalServer) -> None:
    for _ in range(500):
        if not cluster.alive(server):
            return
        time.sleep(0.02)


def _line(result: dict[str, Any]) -> str:
    kinds = ", ".join(f["detail"] for f in result["faults"]) or "no faults"
    verdict = "ok" if result["ok"] else f"{len(result['violations'])} VIOLATIONS"
    return (
        f"seed {result['seed']}: {verdict}; {result['writes_acked']} writes acked, "
        f"{result['writes_unknown']} unknown, {result['reads_ok']} reads ({result['reads_failed']} failed), "
        f"{result['metadata_ops']} metadata ops; faults: {kinds}"
    )


def _logs(cluster: LocalCluster, lines: int = 30) -> str:
    out = []
    for server in cluster.servers:
        path = server.directory(cluster.root) / "server.log"
        if path.exists():
            tail = path.read_text(errors="replace").splitlines()[-lines:]
            out.append(f"--- server {server.node_id}\n" + "\n".join(tail))
    return "\n".join(out)


def replay_command(seed: int, config: RunConfig) -> str:
    """The command that runs schedule `seed` alone again, with the same options."""
    words = [
        f"python -m hotstate.chaos --schedules 1 --seed {seed} --duration {config.duration_s:g}",
        f"--servers {config.servers} --racks {config.racks}",
    ]
    if config.rack_rate is not None:
        words.append(f"--rack-rate {config.rack_rate}")
    if tuple(config.kinds) != KINDS:
        words.append(f"--kinds {','.join(config.kinds)}")
    return " ".join(words)


def _harness_error(seed: int, error: Exception) -> dict[str, Any]:
    message = f"{type(error).__name__}: {error}"[:2000]
    return {
        "seed": seed,
        "ok": False,
        "violations": [{"kind": "harness-error", "message": message}],
        "faults": [],
        "writes_acked": 0,
        "writes_unknown": 0,
        "reads_ok": 0,
        "reads_failed": 0,
        "metadata_ops": 0,
    }


def run_many(
    seeds: Sequence[int],
    config: RunConfig,
    *,
    log: Any = sys.stdout,
    progress: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Every schedule in turn; `progress` gets the summary so far after each one (a long run interrupted
    keeps what it did)."""
    results: list[dict[str, Any]] = []
    for seed in seeds:
        print(f"seed {seed}: replay with `{replay_command(seed, config)}`", file=log, flush=True)
        with tempfile.TemporaryDirectory(prefix="hotstate-chaos-") as tmp:
            try:
                results.append(run_schedule(seed, config, Path(tmp), log=log))
            except Exception as error:  # the harness failed, not necessarily hotstate: recorded, next seed
                print(f"seed {seed}: HARNESS ERROR {type(error).__name__}: {error}", file=log, flush=True)
                results.append(_harness_error(seed, error))
        if progress is not None:
            progress(summarize_runs(results))
    return summarize_runs(results)


def summarize_runs(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    figures = [f for r in results for f in r["faults"]]
    violations: dict[str, int] = {}
    for r in results:
        for v in r["violations"]:
            violations[v["kind"]] = violations.get(v["kind"], 0) + 1
    return {
        "schedules": len(results),
        "seeds": [r["seed"] for r in results],
        "violations": sum(len(r["violations"]) for r in results),
        "violations_by_kind": violations,
        "failed_seeds": [r["seed"] for r in results if not r["ok"]],
        "by_fault": summarize(figures),
        "writes_acked": sum(r["writes_acked"] for r in results),
        "reads_ok": sum(r["reads_ok"] for r in results),
        "metadata_ops": sum(r["metadata_ops"] for r in results),
        "runs": list(results),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hotstate.chaos", description=__doc__)
    parser.add_argument("--schedules", type=int, default=10, help="how many schedules (seeds) to run")
    parser.add_argument("--seed", type=int, default=None, help="the first seed (default: random, printed)")
    parser.add_argument("--duration", type=float, default=60.0, help="seconds of faults per schedule")
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--racks", type=int, default=3)
    parser.add_argument("--rack-rate", default=None, help="tc rate limit of every rack uplink, e.g. 100mbit")
    parser.add_argument(
        "--kinds", default=",".join(KINDS), help=f"fault kinds, comma-separated ({', '.join(KINDS)})"
    )
    parser.add_argument("--out", type=Path, default=None, help="write the results here (JSON)")
    args = parser.parse_args(argv)
    reason = unavailable_reason()
    if reason is not None:
        print(f"cannot run the chaos schedules: {reason}", file=sys.stderr)
        return 2
    first = args.seed if args.seed is not None else random.SystemRandom().randrange(1, 1_000_000)
    config = RunConfig(
        servers=args.servers,
        racks=args.racks,
        duration_s=args.duration,
        kinds=tuple(k.strip() for k in args.kinds.split(",") if k.strip()),
        rack_rate=args.rack_rate,
        workload=WorkloadConfig(standby_replicas=min(2, args.servers - 1)),
    )
    print(
        f"chaos: {args.schedules} schedules from seed {first}, {args.duration:g} s each, "
        f"{args.servers} servers"
    )
    started = time.time()
    load_before = os.getloadavg()[0]

    def body(summary: dict[str, Any], complete: bool) -> dict[str, Any]:
        return {
            "benchmark": (
                "chaos: a nemesis of kills, pauses, partitions, lossy and slow links against a real cluster"
            ),
            "date": datetime.now(UTC).isoformat(timespec="seconds"),
            "cpu_count": os.cpu_count(),
            "note": f"{os.cpu_count()} cores shared by {args.servers} servers, the workload and the nemesis",
            "python": platform.python_version(),
            "platform": platform.platform(),
            "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
            "config": {
                "servers": args.servers,
                "racks": args.racks,
                "duration_s": args.duration,
                "rack_rate": args.rack_rate,
                "kinds": list(config.kinds),
                "workload": asdict(config.workload),
            },
            "complete": complete,
            "wall_s": round(time.time() - started, 1),
            **summary,
        }

    def write(summary: dict[str, Any], complete: bool = False) -> None:
        if args.out is not None:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            tmp = args.out.with_suffix(".tmp")
            tmp.write_text(json.dumps(body(summary, complete), indent=2) + "\n")
            tmp.replace(args.out)

    summary = run_many(range(first, first + args.schedules), config, progress=write)
    write(summary, complete=True)
    print(
        f"chaos: {summary['schedules']} schedules, {summary['violations']} violations"
        + (f" (seeds {summary['failed_seeds']})" if summary["failed_seeds"] else "")
        + (f"; wrote {args.out}" if args.out is not None else "")
    )
    return 0 if summary["violations"] == 0 else 1

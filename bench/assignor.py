"""Benchmark the assignor against a greedy least-loaded baseline on the same input.

Grid: 1,000 / 10,000 / 100,000 partitions x 10 / 100 / 1,000 servers in 3 racks. The partitions form
10 tables whose writers sit in one rack each (table i in rack i mod 3); one standby per partition.
Two scenarios per cell:

- ``fresh``: no previous assignment (a new cluster);
- ``add_server``: the previous assignment is the assignor's own result on the cluster without its
  last server, every replica caught up; then the last server joins.

For each cell: wall time of ``assign`` and of the baseline, and the KIP-925 cost of the actives
(traffic_cost x cross-rack + non_overlap_cost x moved) and their cross-rack count, for both. The
assignor's figures are for its balanced target (where the actives end up; the baseline has no
warmups and moves at once); ``now_*`` are the actives placed right away while warmups restore.
The baseline is rack-blind: each active stays on its previous server while that server is below
ceil(P / N), else goes to the least loaded server; each standby to the least loaded other server.

Run: ``python bench/assignor.py`` (writes bench/results/assignor.json).
"""

from __future__ import annotations

import argparse
import datetime as dt
import heapq
import json
import os
import platform
import sys
import time
from collections.abc import Mapping
from pathlib import Path

import ortools

from hotstate.assignor import (
    Assignment,
    AssignorConfig,
    PartitionId,
    Placement,
    Server,
    Table,
    assign,
)

RACKS = ("az-a", "az-b", "az-c")
PARTITIONS = (1_000, 10_000, 100_000)
SERVERS = (10, 100, 1_000)
TABLES = 10
CELL_BUDGET_S = 60.0
TARGET = {"partitions": 10_000, "servers": 1_000, "seconds": 2.0}


def cluster(n: int) -> list[Server]:
    return [Server(f"s{i:04d}", rack=RACKS[i % len(RACKS)]) for i in range(n)]


def tables(partitions: int) -> list[Table]:
    return [
        Table(f"t{t}", partitions // TABLES, writer_racks=(RACKS[t % len(RACKS)],)) for t in range(TABLES)
    ]


def caught_up(previous: Assignment) -> dict[PartitionId, dict[str, int]]:
    return {pid: dict.fromkeys(pa.replicas(), 0) for pid, pa in previous.partitions.items()}


def greedy_baseline(
    servers: list[Server], table_list: list[Table], previous: Mapping[PartitionId, Placement]
) -> dict[PartitionId, Placement]:
    """Rack-blind, sticky, least-loaded: what an assignor without KIP-925 would do."""
    ids = [s.id for s in servers]
    total = sum(t.partitions for t in table_list)
    cap = -(-total // len(ids))
    load = dict.fromkeys(ids, 0)
    actives: dict[PartitionId, str] = {}
    pids = [PartitionId(t.name, i) for t in table_list for i in range(t.partitions)]
    for pid in pids:
        prev = previous.get(pid)
        if prev is not None and prev.active in load and load[prev.active] < cap:
            actives[pid] = prev.active
            load[prev.active] += 1
    heap = [(load[s], s) for s in ids]
    heapq.heapify(heap)
    for pid in pids:
        if pid in actives:
            continue
        n, s = heapq.heappop(heap)
        actives[pid] = s
        load[s] = n + 1
        heapq.heappush(heap, (n + 1, s))
    standby_load = dict.fromkeys(ids, 0)
    sheap = [(0, s) for s in ids]
    out = {}
    for pid in pids:
        stash = []
        while True:
            n, s = heapq.heappop(sheap)
            if s != actives[pid]:
                break
            stash.append((n, s))
        standby_load[s] = n + 1
        heapq.heappush(sheap, (n + 1, s))
        for entry in stash:
            heapq.heappush(sheap, entry)
        out[pid] = Placement(actives[pid], (s,))
    return out


def active_cost(
    placement: Mapping[PartitionId, Placement],
    servers: list[Server],
    table_list: list[Table],
    previous: Mapping[PartitionId, Placement],
    config: AssignorConfig,
) -> tuple[int, int]:
    """(KIP-925 cost, cross-rack actives), computed here from the definition, not by the assignor."""
    rack = {s.id: s.rack for s in servers}
    sources = {t.name: set(t.writer_racks) for t in table_list}
    cost = cross = 0
    for pid, pa in placement.items():
        if rack[pa.active] not in sources[pid.table]:
            cost += config.traffic_cost
            cross += 1
        prev = previous.get(pid)
        if prev is None or prev.active != pa.active:
            cost += config.non_overlap_cost
    return cost, cross


def run_cell(partitions: int, n_servers: int, scenario: str, config: AssignorConfig) -> dict[str, object]:
    servers = cluster(n_servers)
    table_list = tables(partitions)
    previous: Mapping[PartitionId, Placement] = {}
    lags = None
    prev_arg = None
    if scenario == "add_server":
        before = assign(servers[:-1], table_list, None, None, config)
        previous, lags, prev_arg = before.partitions, caught_up(before), before
    start = time.perf_counter()
    result = assign(servers, table_list, prev_arg, lags, config)
    seconds = time.perf_counter() - start
    start = time.perf_counter()
    baseline = greedy_baseline(servers, table_list, previous)
    baseline_seconds = time.perf_counter() - start
    targets = {
        r.partition: Placement(r.target or r.server)
        for r in result.explanation.replicas
        if r.role == "active"
    }
    cost, cross = active_cost(targets, servers, table_list, previous, config)
    now_cost, now_cross = active_cost(result.partitions, servers, table_list, previous, config)
    b_cost, b_cross = active_cost(baseline, servers, table_list, previous, config)
    return {
        "partitions": partitions,
        "servers": n_servers,
        "racks": len(RACKS),
        "scenario": scenario,
        "seconds": round(seconds, 3),
        "baseline_seconds": round(baseline_seconds, 3),
        "time_ratio": round(seconds / baseline_seconds, 1) if baseline_seconds else None,
        "cost": cost,
        "cross_rack_actives": cross,
        "cross_rack_cost": cross * config.traffic_cost,
        "baseline_cost": b_cost,
        "baseline_cross_rack_actives": b_cross,
        "baseline_cross_rack_cost": b_cross * config.traffic_cost,
        "cost_ratio": round(cost / b_cost, 4) if b_cost else None,
        "cross_rack_ratio": round(cross / b_cross, 4) if b_cross else None,
        "now_cost": now_cost,
        "now_cross_rack_actives": now_cross,
        "warmups": sum(len(pa.warmups) for pa in result.partitions.values()),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "assignor.json"))
    parser.add_argument("--max-partitions", type=int, default=max(PARTITIONS))
    args = parser.parse_args(argv)
    config = AssignorConfig()
    cells: list[dict[str, object]] = []
    skipped: list[dict[str, object]] = []
    for scenario in ("fresh", "add_server"):
        for n_servers in SERVERS:
            last: tuple[int, float] | None = None
            for partitions in PARTITIONS:
                if partitions > args.max_partitions:
                    skipped.append(
                        {
                            "partitions": partitions,
                            "servers": n_servers,
                            "scenario": scenario,
                            "why": f"--max-partitions {args.max_partitions}",
                        }
                    )
                    continue
                # Time grows about linearly in partitions; skip a cell predicted to blow the budget.
                if last is not None and last[1] * partitions / last[0] > CELL_BUDGET_S:
                    skipped.append(
                        {
                            "partitions": partitions,
                            "servers": n_servers,
                            "scenario": scenario,
                            "why": f"predicted over {CELL_BUDGET_S:.0f} s from the smaller cell",
                        }
                    )
                    continue
                cell = run_cell(partitions, n_servers, scenario, config)
                cells.append(cell)
                last = (partitions, float(cell["seconds"]))  # type: ignore[arg-type]
                print(json.dumps(cell), file=sys.stderr, flush=True)
    # A run limited below the target's size (--max-partitions) has no target cell to report.
    target = next(
        (
            c
            for c in cells
            if c["scenario"] == "fresh"
            and c["partitions"] == TARGET["partitions"]
            and c["servers"] == TARGET["servers"]
        ),
        {"seconds": None},
    )
    report = {
        "benchmark": "hotstate.assignor vs greedy least-loaded baseline",
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "ortools": ortools.__version__,
        "config": config.properties(),
        "workload": {
            "tables": TABLES,
            "writer_racks": "table i writes from rack i mod 3",
            "standbys_per_partition": config.num_standby_replicas,
            "scenarios": {
                "fresh": "no previous assignment",
                "add_server": "previous = assignor result without the last server, all replicas caught up",
            },
        },
        "target": {
            **TARGET,
            "measured_seconds": target["seconds"],
            "met": None if target["seconds"] is None else target["seconds"] < TARGET["seconds"],  # type: ignore[operator]
        },
        "cells": cells,
        "skipped": skipped,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {out}: {len(cells)} cells, {len(skipped)} skipped, target met: {report['target']['met']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Bytes crossing racks when writers sit in a rack, per `rack.aware.assignment.strategy` (KIP-925, measured).

One run of `measure(strategy)`: a fabric of servers in racks (`chaos/netns.py`), a real cluster in it with
the strategy set on every server, tables whose writer racks the controller knows (`CreateTable` with
`writer_rack`, as a Spark sink's driver sends it), and their `TableWriter`s (acks=all) running in a client
namespace on their rack's bridge (`Fabric.rack_client`). Each *scenario* is a set of tables and the rack
each one's writer runs in; its write phase is measured on the rack uplinks' counters (`rack_bytes`), with
the cluster's own background traffic (heartbeats, lag reports, metadata) measured while idle and taken
off.

What crosses racks by design: with standbys in another rack than their active (KIP-708 spreads them
over racks), replicating every row from its active to its standby crosses once whatever the strategy.
The writer -> active hop crosses only for actives outside the writer's rack, and that is what
`min_traffic` can save: as far as balance allows (every server holds between floor and ceil of its share
of all actives), it puts a table's actives in its writers' racks.
"""

from __future__ import annotations

import asyncio
import signal
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from hotstate.assignor import AssignorConfig
from hotstate.chaos.netns import Fabric, in_namespace
from hotstate.chaos.run import make_cluster
from hotstate.cli.local_cluster import LocalCluster
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError

KEY = (KeyColumn("user", KeyType.STRING),)
RACK_NAMES = ("az-a", "az-b", "az-c")
BATCH = 500
PAYLOAD = "x" * 200  # a row of about 250 bytes, so the rows outweigh the framing


@dataclass(frozen=True, slots=True)
class TableSpec:
    name: str
    partitions: int
    writer_rack: str  # where its writer runs, and what the controller is told at CreateTable


@dataclass(frozen=True, slots=True)
class Scenario:
    name: str
    tables: tuple[TableSpec, ...]
    rows: int  # in all, split evenly over the tables


def per_rack_tables(partitions: int, rows: int) -> Scenario:
    """One table per rack, each written from its own rack (three Spark jobs, one per zone)."""
    tables = tuple(TableSpec(f"t_{rack.replace('-', '_')}", partitions, rack) for rack in RACK_NAMES)
    return Scenario("a table per rack, each written from its rack", tables, rows)


def one_table(partitions: int, rows: int, rack: str = RACK_NAMES[0]) -> Scenario:
    return Scenario(f"one table written from {rack}", (TableSpec("one", partitions, rack),), rows)


def placement_of(servers_per_rack: int) -> dict[int, str]:
    """Node id -> rack, racks taken in turn (1 az-a, 2 az-b, 3 az-c, 4 az-a, ...)."""
    count = servers_per_rack * len(RACK_NAMES)
    return {n: RACK_NAMES[(n - 1) % len(RACK_NAMES)] for n in range(1, count + 1)}


def row(table: str, i: int) -> dict[str, object]:
    return {"user": f"{table}-user-{i:07d}", "n": i, "payload": PAYLOAD}


def cross_bytes(before: Mapping[str, Mapping[str, int]], after: Mapping[str, Mapping[str, int]]) -> int:
    """Bytes that went from one rack to another between two `rack_bytes` readings: each left exactly one
    rack over its uplink, so the sum of the racks' `out`."""
    return sum(after[rack]["out"] - before[rack]["out"] for rack in after)


def measure(
    strategy: str,
    scenarios: Sequence[Scenario],
    *,
    servers_per_rack: int = 2,
    standby_replicas: int = 1,
    idle_s: float = 4.0,
    root: Path | None = None,
) -> dict[str, Any]:
    """Run every scenario on one cluster whose servers use `strategy`; what each placed and sent."""
    placement = placement_of(servers_per_rack)
    fabric = Fabric.build(placement)
    cluster: LocalCluster | None = None
    with tempfile.TemporaryDirectory(prefix="hs-cross-rack-") as tmp:
        try:
            cluster = make_cluster(Path(root or tmp), fabric)
            cluster.write_configs(assignor=AssignorConfig(rack_aware_assignment_strategy=strategy))
            return _measure(fabric, cluster, strategy, scenarios, standby_replicas, idle_s)
        finally:
            if cluster is not None:
                for server in cluster.servers:
                    cluster.signal(server, signal.SIGKILL)
            fabric.close()


def _measure(
    fabric: Fabric,
    cluster: LocalCluster,
    strategy: str,
    scenarios: Sequence[Scenario],
    standby_replicas: int,
    idle_s: float,
) -> dict[str, Any]:
    racks = {h.node_id: h.rack for h in fabric.hosts.values()}

    async def setup() -> None:
        cluster.start_all()
        await cluster.wait_ready(90.0)
        async with cluster.admin(request_timeout_s=2.0) as admin:
            for scenario in scenarios:
                for spec in scenario.tables:
                    reply = await admin.create_table(
                        spec.name,
                        partitions=spec.partitions,
                        standby_replicas=standby_replicas,
                        key_columns=KEY,
                        writer_rack=spec.writer_rack,
                        deadline_s=30.0,
                    )
                    if reply.error != ControllerError.NONE:
                        raise RuntimeError(f"cannot create table {spec.name}: {reply}")

    in_namespace(fabric.client_netns, setup)
    names = [spec.name for scenario in scenarios for spec in scenario.tables]
    settled_s = in_namespace(fabric.client_netns, partial(_settle, cluster, names, 1 + standby_replicas))
    # Every writer connects and writes one batch before anything is measured (metadata, connections).
    for scenario in scenarios:
        for spec in scenario.tables:
            in_namespace(
                fabric.rack_client(spec.writer_rack), partial(_write, cluster, spec.name, range(BATCH))
            )
    before = fabric.rack_bytes()
    time.sleep(idle_s)
    background = cross_bytes(before, fabric.rack_bytes()) / idle_s
    out: dict[str, Any] = {
        "strategy": strategy,
        "background_bytes_per_s": round(background),
        "placement_settled_after_s": round(settled_s, 1),
    }
    results = []
    for scenario in scenarios:
        tables: list[dict[str, Any]] = []
        total_raw, total_s, per_table = 0, 0.0, scenario.rows // len(scenario.tables)
        for spec in scenario.tables:
            places_before = in_namespace(fabric.client_netns, partial(_placement, cluster, spec.name))
            start = fabric.rack_bytes()
            elapsed = in_namespace(
                fabric.rack_client(spec.writer_rack),
                partial(_write, cluster, spec.name, range(BATCH, BATCH + per_table)),
            )
            end = fabric.rack_bytes()
            places = in_namespace(fabric.client_netns, partial(_placement, cluster, spec.name))
            raw = cross_bytes(start, end)
            total_raw += raw
            total_s += elapsed
            tables.append(
                {
                    "table": spec.name,
                    "partitions": spec.partitions,
                    "writer_rack": spec.writer_rack,
                    "rows": per_table,
                    "write_s": round(elapsed, 3),
                    "cross_rack_bytes_raw": raw,
                    "rack_bytes_out": {r: end[r]["out"] - start[r]["out"] for r in sorted(end)},
                    "placement": [
                        {
                            "partition": p,
                            "active": a,
                            "active_rack": racks[a],
                            "standbys": s,
                            "standby_racks": [racks[n] for n in s],
                        }
                        for p, a, s in places
                    ],
                    "placement_moved_while_writing": places != places_before,
                    "actives_in_writer_rack": sum(racks[a] == spec.writer_rack for _, a, _ in places),
                    "standbys_in_another_rack": all(racks[n] != racks[a] for _, a, s in places for n in s),
                    "standbys_per_partition": sorted({len(s) for _, _, s in places}),
                }
            )
        rows = per_table * len(scenario.tables)
        net = max(0, round(total_raw - background * total_s))
        results.append(
            {
                "scenario": scenario.name,
                "rows": rows,
                "write_s": round(total_s, 3),
                "cross_rack_bytes_raw": total_raw,
                "background_bytes_estimate": round(background * total_s),
                "cross_rack_bytes": net,
                "cross_rack_bytes_per_row": round(net / rows, 1),
                "partitions": sum(t["partitions"] for t in tables),
                "actives_in_writer_rack": sum(t["actives_in_writer_rack"] for t in tables),
                "standbys_in_another_rack": all(t["standbys_in_another_rack"] for t in tables),
                "tables": tables,
            }
        )
    out["scenarios"] = results
    return out


async def _write(cluster: LocalCluster, table: str, indexes: range) -> float:
    """Upsert rows `indexes` of `table` in batches (acks=all, one batch at a time); the seconds taken."""
    async with cluster.writer(table, request_timeout_s=5.0) as writer:
        started = time.monotonic()
        for first in range(indexes.start, indexes.stop, BATCH):
            rows = [row(table, i) for i in range(first, min(first + BATCH, indexes.stop))]
            await writer.upsert(rows, deadline_s=60.0)
        return time.monotonic() - started


async def _settle(
    cluster: LocalCluster,
    tables: Sequence[str],
    copies: int,
    *,
    quiet_s: float = 6.0,
    timeout_s: float = 90.0,
) -> float:
    """Wait until every partition of `tables` has `copies` replicas and the placement has not changed for
    `quiet_s` (three reassignment intervals at the default 2 s: right after the creates the controller may
    still move standbys, e.g. when a table's actives all went to its writers' rack and its standbys could
    not even out the racks' loads); the seconds waited."""
    started = time.monotonic()
    last: list[list[tuple[int, int, list[int]]]] | None = None
    since = started
    while time.monotonic() - started < timeout_s:
        now = [await _placement(cluster, table) for table in tables]
        whole = all(len(standbys) + 1 == copies for places in now for _, _, standbys in places)
        if now != last or not whole:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            return time.monotonic() - started
        await asyncio.sleep(0.5)
    raise TimeoutError(f"the placement of {', '.join(tables)} did not settle in {timeout_s:.0f} s: {last}")


async def _placement(cluster: LocalCluster, table: str) -> list[tuple[int, int, list[int]]]:
    """(partition, active, standbys) of every partition of `table`, as the metadata says now."""
    async with cluster.writer(table, request_timeout_s=5.0) as writer:
        meta = await writer.metadata(refresh=True, deadline_s=20.0)
    out = []
    for part in sorted(meta.partitions, key=lambda p: p.partition):
        if part.active is None:
            raise RuntimeError(f"partition {part.partition} of {table} has no active")
        out.append((part.partition, part.active, [n for n in part.replicas if n != part.active]))
    return out


def ratio(none: Mapping[str, Any], min_traffic: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Per scenario: cross-rack bytes with min_traffic over those with none."""
    out = []
    for a, b in zip(none["scenarios"], min_traffic["scenarios"], strict=True):
        out.append(
            {
                "scenario": a["scenario"],
                "none_bytes": a["cross_rack_bytes"],
                "min_traffic_bytes": b["cross_rack_bytes"],
                "min_traffic_over_none": round(b["cross_rack_bytes"] / a["cross_rack_bytes"], 3)
                if a["cross_rack_bytes"]
                else None,
                "actives_in_writer_rack": {
                    "none": a["actives_in_writer_rack"],
                    "min_traffic": b["actives_in_writer_rack"],
                },
                "partitions": a["partitions"],
            }
        )
    return out

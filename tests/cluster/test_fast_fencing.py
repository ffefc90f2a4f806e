"""Failover on proof of death between real processes (docs/replication.md, "what evidence fences").

Each test sets the slow path (session expiry, Raft fetch timeout) far beyond the test's own wait, so a
failover within the wait can only have come from a refused probe: the tests assert the mechanism, not a
latency on a loaded machine.
"""

from __future__ import annotations

import asyncio
import signal
import time

from hotstate.cli.local_cluster import LocalCluster
from hotstate.client.writer import TableWriter
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError
from hotstate.protocol.cluster import DescribeClusterResponse
from hotstate.raft.config import RaftConfig

from .conftest import StartCluster

SLOW_MS = 120_000  # session timeout / Raft fetch timeout: never reached within a test
WAIT_S = 20.0


async def leader_view(cluster: LocalCluster) -> DescribeClusterResponse | None:
    async with cluster.admin(request_timeout_s=1.0) as admin:
        views = await admin.describe_each()
    for view in views:
        if isinstance(view, DescribeClusterResponse) and view.node_id == view.leader_id:
            return view
    return None


async def wait_fenced(cluster: LocalCluster, node_id: int) -> DescribeClusterResponse:
    end = time.monotonic() + WAIT_S
    while time.monotonic() < end:
        view = await leader_view(cluster)
        if view is not None and any(s.node_id == node_id and s.fenced for s in view.servers):
            return view
        await asyncio.sleep(0.1)
    raise AssertionError(f"server {node_id} not fenced within {WAIT_S} s")


async def make_table(cluster: LocalCluster) -> TableWriter:
    async with cluster.admin(request_timeout_s=2.0) as admin:
        reply = await admin.create_table(
            "t", partitions=6, standby_replicas=1, key_columns=(KeyColumn("k", KeyType.STRING),)
        )
        assert reply.error is ControllerError.NONE, reply
    writer = TableWriter(cluster.addresses(), "t", cluster_id=cluster.cluster_id, secret=cluster.secret)
    await writer.upsert([{"k": f"k{i}", "v": i} for i in range(60)])
    return writer


def test_a_killed_server_is_fenced_on_a_refused_probe_long_before_its_session_expires(
    start_cluster: StartCluster,
) -> None:
    running = start_cluster(3, session_timeout_ms=SLOW_MS)
    cluster = running.cluster
    leader = running.leader()
    victim = next(s.node_id for s in cluster.servers if s.node_id != leader)

    async def main() -> None:
        writer = await make_table(cluster)
        try:
            running.kill(victim)
            view = await wait_fenced(cluster, victim)
            assert next(s for s in view.servers if s.node_id == victim).actives == 0
            # Every partition is writable again (acks=all) with the victim gone.
            result = await writer.upsert([{"k": f"k{i}", "v": -i} for i in range(60)], deadline_s=WAIT_S)
            assert result.rows == 60
        finally:
            await writer.close()

    running.run(main())
    assert "refuses connections: fenced without waiting for its session" in running.logs()


def test_a_paused_server_is_silence_and_is_not_fenced_on_a_probe(start_cluster: StartCluster) -> None:
    running = start_cluster(3, session_timeout_ms=SLOW_MS)
    cluster = running.cluster
    leader = running.leader()
    victim = next(s.node_id for s in cluster.servers if s.node_id != leader)

    async def main() -> None:
        running.kill(victim, signal.SIGSTOP)
        try:
            await asyncio.sleep(3.0)
            view = await leader_view(cluster)
            assert view is not None
            assert not next(s for s in view.servers if s.node_id == victim).fenced
        finally:
            running.kill(victim, signal.SIGCONT)

    running.run(main())


def test_a_killed_metadata_leader_is_replaced_and_fenced_without_waiting_for_timeouts(
    start_cluster: StartCluster,
) -> None:
    raft = RaftConfig(fetch_timeout_ms=SLOW_MS)
    running = start_cluster(3, session_timeout_ms=SLOW_MS, raft=raft)
    cluster = running.cluster
    leader = running.leader()

    async def main() -> None:
        writer = await make_table(cluster)
        try:
            running.kill(leader)
            view = await wait_fenced(cluster, leader)
            assert view.leader_id != leader
            result = await writer.upsert([{"k": f"k{i}", "v": -i} for i in range(60)], deadline_s=WAIT_S)
            assert result.rows == 60
        finally:
            await writer.close()

    running.run(main())
    assert "refuses connections: standing for election now" in running.logs()

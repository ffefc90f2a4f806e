"""Client routing (`hotstate.Client(routing=True)`, client/routing.py) against real server processes: each
key lookup lands on its partition's active and is served there (no forward, by the answer and by the
servers' forward counters), and it keeps answering every lookup when a holder is killed."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

import hotstate
from hotstate.cli.local_cluster import LocalCluster
from hotstate.client.writer import TableWriter
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError

from .conftest import RunningCluster

# One worker takes the whole module, so its module-scoped fixture starts once (--dist loadgroup).
pytestmark = pytest.mark.xdist_group("client_routing")

ROWS = 24
KEYS = [f"u{i}" for i in range(ROWS)]


async def _setup(cluster: LocalCluster) -> None:
    async with cluster.admin(request_timeout_s=2.0) as admin:
        reply = await admin.create_table(
            "clicks", partitions=6, standby_replicas=1, key_columns=(KeyColumn("user", KeyType.STRING),)
        )
        assert reply.error is ControllerError.NONE, reply
    writer = TableWriter(cluster.addresses(), "clicks", cluster_id=cluster.cluster_id, secret=cluster.secret)
    await writer.upsert([{"user": key, "clicks": i} for i, key in enumerate(KEYS)])
    await writer.close()


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningCluster]:
    """One 3-server cluster for the module; the test that kills a server runs last."""
    root: Path = tmp_path_factory.mktemp("client-routing")
    cluster = LocalCluster.create(root, 3)
    cluster.write_configs()
    cluster.save()
    running = RunningCluster(cluster)
    try:
        for server in cluster.servers:
            cluster.start(server)
        running.run(cluster.wait_ready(30.0, expect=3))
        running.run(_setup(cluster))
        yield running
    finally:
        for server in cluster.servers:
            cluster.signal(server, signal.SIGKILL)


def _address(running: RunningCluster, node: int) -> str:
    return f"127.0.0.1:{running.server(node).http_port}"


def _forwards(running: RunningCluster) -> float:
    """Every live server's count of partition queries it forwarded."""
    total = 0.0
    for server in running.cluster.servers:
        if not running.cluster.alive(server):
            continue
        text = httpx.get(f"http://{_address(running, server.node_id)}/metrics", timeout=5.0).text
        total += sum(
            sample.value
            for family in text_string_to_metric_families(text)
            if family.name == "hotstate_query_forwards"
            for sample in family.samples
            if sample.name.endswith("_total")
        )
    return total


def _read_all(client: hotstate.Client) -> list[hotstate.QueryResult]:
    results = [client.query(f"SELECT * FROM clicks WHERE user = '{key}'") for key in KEYS]
    assert [r.rows for r in results] == [[[key, i]] for i, key in enumerate(KEYS)]
    return results


def _forwarded(result: hotstate.QueryResult) -> bool:
    return any(p.served_by != result.coordinator for p in result.partitions)


def test_routed_lookups_are_served_where_they_land(running: RunningCluster) -> None:
    given = _address(running, 1)
    # Without routing, the lookups of the partitions server 1 does not lead are forwarded.
    with hotstate.Client(given) as plain:
        assert sum(_forwarded(r) for r in _read_all(plain)) > 0
    with hotstate.Client(given, routing=True) as client:
        _read_all(client)  # learns the map
        before = _forwards(running)
        results = _read_all(client)
        assert [r for r in results if _forwarded(r)] == []
        assert _forwards(running) == before
        # Every partition's active answered its own keys, at the address it advertises.
        assert {r.server for r in results} == {_address(running, s.node_id) for s in running.cluster.servers}

    async def routed_async() -> list[hotstate.QueryResult]:
        async with hotstate.AsyncClient(given, routing=True) as client:
            return [await client.query(f"SELECT * FROM clicks WHERE user = '{key}'") for key in KEYS]

    assert [r for r in asyncio.run(routed_async()) if _forwarded(r)] == []


def test_routing_keeps_answering_when_a_holder_is_killed(running: RunningCluster) -> None:
    servers = [_address(running, s.node_id) for s in running.cluster.servers]
    with hotstate.Client(servers, routing=True, timeout_s=20.0) as client:
        victim = {r.server for r in _read_all(client)} - {servers[0]}
        killed = sorted(victim)[0]
        node = next(s.node_id for s in running.cluster.servers if _address(running, s.node_id) == killed)
        running.kill(node)
        # Its partitions' map still names it: each lookup costs a refused connection, then is answered.
        results = _read_all(client)
        assert killed not in {r.server for r in results}
        # Once the cluster has moved its actives (it fences the dead server), lookups land on the new ones.
        end = time.monotonic() + 60.0
        while any(_forwarded(r) for r in results):
            assert time.monotonic() < end, [(r.server, r.partitions) for r in results if _forwarded(r)]
            time.sleep(0.5)
            results = _read_all(client)

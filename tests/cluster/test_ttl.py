"""TTL of plain tables between real processes: created over HTTP, the CLI and the admin client, shown by
GET /v1/tables and `table describe`, and rows past it deleted by the actives on every replica alike
(tombstones through the log), by write time and by a timestamp column."""

from __future__ import annotations

import asyncio
import datetime as dt
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

from hotstate.cli.local_cluster import LocalCluster
from hotstate.cli.main import app
from hotstate.client.admin import CLIENT_NODE_ID
from hotstate.client.writer import TableWriter
from hotstate.controller.records import KeyColumn, KeyType, TableTtl, TableWindow
from hotstate.controller.requests import ControllerError
from hotstate.protocol.keys import decode_key
from hotstate.protocol.wire import MESSAGES
from hotstate.replica.messages import (
    PartitionQueryRequest,
    QueryPartitionsRequest,
    QueryPartitionsResponse,
    ReplicaError,
)
from hotstate.rpc import NOT_SENT, PeerPool, RpcError

from .conftest import RunningCluster

# One worker takes the whole module, so its module-scoped cluster starts once (--dist loadgroup).
pytestmark = pytest.mark.xdist_group("ttl")

PARTITIONS = 2
KEY = (KeyColumn("user", KeyType.STRING),)


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningCluster]:
    root: Path = tmp_path_factory.mktemp("ttl")
    cluster = LocalCluster.create(root / "cluster", 3)
    cluster.write_configs()
    cluster.save()
    for server in cluster.servers:
        cluster.start(server)
    started = RunningCluster(cluster)
    try:
        started.run(cluster.wait_ready(30.0, expect=3))
        yield started
    except BaseException:
        print(started.logs())
        raise
    finally:
        for server in cluster.servers:
            cluster.signal(server, signal.SIGKILL)


def _base(running: RunningCluster, node: int = 1) -> str:
    return f"http://127.0.0.1:{running.server(node).http_port}"


async def _replica_keys(running: RunningCluster, node: int, table: str, until: set[str]) -> set[str]:
    """The users `node`'s own replicas of `table` hold (a partition query is never forwarded), once they
    are exactly `until`, or as they are at the deadline."""
    cluster = running.cluster
    pool = PeerPool(CLIENT_NODE_ID, cluster.cluster_id, cluster.secret, MESSAGES)
    pool.update({node: cluster.addresses()[node - 1]})
    held: set[str] = set()
    end = time.monotonic() + 15.0
    try:
        while time.monotonic() < end:
            held = set()
            for partition in range(PARTITIONS):
                request = QueryPartitionsRequest(
                    (PartitionQueryRequest(table, partition, (), True, None, None, None, None),)
                )
                try:
                    answer = await pool.request(node, request, 2.0)
                except (*NOT_SENT, RpcError):
                    answer = None
                if not (
                    isinstance(answer, QueryPartitionsResponse)
                    and answer.answers[0].error is ReplicaError.NONE
                ):
                    held = {"<unanswered>"}
                    break
                held |= {str(decode_key(key)[0]) for key, _ in answer.answers[0].items}
            if held == until:
                return held
            await asyncio.sleep(0.05)  # the actives sweep a page every half second
        return held
    finally:
        await pool.close()


async def _write(running: RunningCluster, table: str, rows: list[dict[str, object]]) -> None:
    cluster = running.cluster
    async with TableWriter(
        cluster.addresses(), table, cluster_id=cluster.cluster_id, secret=cluster.secret
    ) as writer:
        await writer.upsert(rows)


def test_rows_expire_by_write_time_on_every_replica(running: RunningCluster) -> None:
    # standby_replicas 2: every server holds every partition, an active or a standby.
    made = httpx.post(
        f"{_base(running)}/v1/tables",
        json={"name": "sessions", "key_columns": [{"name": "user", "type": "STRING"}], "partitions": 2,
              "standby_replicas": 2, "ttl": "3s"},
        timeout=20.0,
    )  # fmt: skip
    assert made.status_code == 201, made.text
    [shown] = [
        t for t in httpx.get(f"{_base(running, 2)}/v1/tables").json()["tables"] if t["name"] == "sessions"
    ]
    assert shown["ttl"] == {"ttl_us": 3_000_000, "ttl": "3s", "column": None}
    old = {f"old{i}" for i in range(40)}
    running.run(_write(running, "sessions", [{"user": user, "n": 1} for user in old]))
    written = time.monotonic()
    # Not before the ttl: right after the write every replica still has every row.
    assert running.run(_replica_keys(running, 3, "sessions", old)) == old
    assert time.monotonic() - written < 3.0
    # Rewriting a row restarts its ttl: "old0" rewritten 1.5 s later outlives the others by that much.
    # (A TTL is wall time: the test lets time pass to make the two write times differ.)
    running.run(asyncio.sleep(max(0.0, 1.5 - (time.monotonic() - written))))
    running.run(_write(running, "sessions", [{"user": "old0", "n": 2}]))
    for server in running.cluster.servers:
        held = running.run(_replica_keys(running, server.node_id, "sessions", {"old0"}))
        assert held == {"old0"}, (server.node_id, len(held))
    assert time.monotonic() - written >= 3.0
    for server in running.cluster.servers:
        assert running.run(_replica_keys(running, server.node_id, "sessions", set())) == set(), server.node_id


def test_rows_expire_by_their_timestamp_column_on_every_replica(running: RunningCluster) -> None:
    async def create() -> None:
        async with running.cluster.admin(request_timeout_s=2.0) as admin:
            reply = await admin.create_table(
                "orders", partitions=2, standby_replicas=2, key_columns=KEY, ttl=TableTtl(3_600_000_000, "at")
            )
            assert reply.error is ControllerError.NONE, reply

    running.run(create())
    now = dt.datetime.now(dt.UTC)
    rows: list[dict[str, object]] = [
        {"user": f"gone{i}", "at": now - dt.timedelta(hours=2)} for i in range(30)
    ]
    rows += [{"user": f"kept{i}", "at": now - dt.timedelta(minutes=30)} for i in range(30)]
    rows += [{"user": "no-time", "at": None}, {"user": "no-column"}]
    running.run(_write(running, "orders", rows))
    kept = {f"kept{i}" for i in range(30)} | {"no-time", "no-column"}
    for server in running.cluster.servers:
        assert running.run(_replica_keys(running, server.node_id, "orders", kept)) == kept, server.node_id


def test_ttls_that_cannot_be_are_refused_clearly(running: RunningCluster) -> None:
    def create(**body: object) -> httpx.Response:
        return httpx.post(
            f"{_base(running)}/v1/tables",
            json={"name": "bad", "key_columns": [{"name": "user", "type": "STRING"}], **body},
            timeout=20.0,
        )

    for body, text in [
        ({"ttl": "7 fortnights"}, "positive whole number and a unit"),
        ({"ttl": "1d", "ttl_column": "user"}, "not a TIMESTAMP"),
        ({"ttl_column": "at"}, "without a ttl"),
    ]:
        reply = create(**body)
        assert reply.status_code == 400 and text in reply.json()["message"], (body, reply.text)

    async def windowed() -> str:
        key = (
            KeyColumn("user", KeyType.STRING),
            KeyColumn("WINDOWSTART", KeyType.WINDOW_START),
            KeyColumn("WINDOWEND", KeyType.WINDOW_END),
        )
        async with running.cluster.admin(request_timeout_s=2.0) as admin:
            reply = await admin.create_table(
                "bad", partitions=1, standby_replicas=0, key_columns=key,
                window=TableWindow("window", "TUMBLING", 60_000_000, 60_000_000), ttl=TableTtl(60_000_000),
            )  # fmt: skip
            assert reply.error is ControllerError.INVALID_REQUEST
            return reply.message

    assert "retention" in running.run(windowed())


def test_the_cli_creates_and_describes_a_ttl(running: RunningCluster) -> None:
    at = ["--dir", str(running.cluster.root)]
    runner = CliRunner()
    made = runner.invoke(
        app, ["table", "create", "visits", "-k", "user:STRING", "-k", "seen:TIMESTAMP", "-p", "1",
              "--ttl", "7d", "--ttl-column", "seen", *at]
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    described = runner.invoke(app, ["table", "describe", "visits", *at])
    assert "ttl: 7d after column seen" in " ".join(described.stdout.split()), described.output
    bad = runner.invoke(app, ["table", "create", "nope", "-k", "user:STRING", "--ttl", "soon", *at])
    assert bad.exit_code == 2 and "positive whole number" in " ".join(bad.stderr.split()), bad.output

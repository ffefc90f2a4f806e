"""The HTTP query client (`hotstate.Client`, `hotstate.AsyncClient`) and `hotstate query | status`:
against real server processes, and against fake transports for the answers a healthy cluster never gives."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

import hotstate
from hotstate.cli.main import app
from hotstate.client.query import ClusterUnreachable, PartitionServed, QueryFailed, Unavailable
from hotstate.client.writer import TableWriter
from hotstate.controller.records import KeyColumn, KeyType

from .conftest import RunningCluster, StartCluster

KEY = (KeyColumn("user", KeyType.STRING),)
ROWS = [{"user": f"u{i}", "clicks": i} for i in range(12)]


def _closed_port() -> int:
    # Bound then closed: nothing listens there, so connecting is refused at once.
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _http(running: RunningCluster) -> list[str]:
    return [f"127.0.0.1:{s.http_port}" for s in running.cluster.servers]


def _make_table(running: RunningCluster, name: str = "clicks", partitions: int = 4) -> None:
    cluster = running.cluster

    async def go() -> None:
        async with cluster.admin() as admin:
            created = await admin.create_table(
                name, partitions=partitions, standby_replicas=1, key_columns=KEY
            )
            assert created.table_id > 0, created
        async with TableWriter(
            cluster.addresses(), name, cluster_id=cluster.cluster_id, secret=cluster.secret
        ) as writer:
            await writer.upsert(ROWS)

    running.run(go())


def _wait_caught_up(client: hotstate.Client, table: str, replicas: int) -> None:
    """Until every replica of `table` reports lag 0, so any of them serves every row."""
    deadline = time.monotonic() + 15.0
    lags: list[int] = []
    while time.monotonic() < deadline:
        status = client.cluster_status()
        lags = [
            lag["offsetLag"]
            for server in status.values()
            for lag in server["hostStoreLags"]["stateStoreLags"]
            .get(table, {})
            .get("lagByPartition", {})
            .values()
        ]
        if len(lags) == replicas and not any(lags):
            return
        time.sleep(0.1)
    raise AssertionError(f"replicas of {table} not caught up: {lags}")


class CountingTransport(httpx.HTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.urls.append(str(request.url))
        return super().handle_request(request)


# ---------------------------------------------------------------------------------------- real cluster


def test_client_queries_fail_over_and_refuses_bad_sql_once(start_cluster: StartCluster) -> None:
    running = start_cluster(3)
    _make_table(running)
    s1, s2, s3 = _http(running)
    dead = f"127.0.0.1:{_closed_port()}"

    with hotstate.Client([dead, s1, s2, s3], timeout_s=10.0) as client:
        result = client.query("SELECT * FROM clicks")
        assert result.server == s1  # the dead port was skipped
        assert client.last_server == s1
        assert result.columns == ["user", "clicks"]
        assert sorted(result.rows) == sorted([r["user"], r["clicks"]] for r in ROWS)
        assert sorted(result.dicts(), key=lambda r: r["clicks"]) == ROWS
        assert [p.partition for p in result.partitions] == [0, 1, 2, 3]
        assert all(isinstance(p, PartitionServed) and p.served_by in (1, 2, 3) for p in result.partitions)
        # Standby reads are on: a caught-up standby may serve (a hedge on a loaded machine, or a peer
        # judged slow for a moment), never a lagging replica.
        assert all(p.state in ("active", "standby") and p.offset_lag == 0 for p in result.partitions)
        assert (
            result.table == "clicks" and result.coordinator == 1 and result.query_id and result.took_ms >= 0
        )

        one = client.query("SELECT clicks FROM clicks WHERE user = 'u7'", max_lag=0, standby_reads=False)
        assert one.rows == [[7]] and len(one.partitions) == 1

        [table] = client.tables()
        assert table["name"] == "clicks" and len(table["placement"]) == 4
        assert client.lags()["server"] == 1
        _wait_caught_up(client, "clicks", replicas=8)

        with pytest.raises(QueryFailed) as missing:
            client.query("SELECT * FROM nowhere")
        assert missing.value.status == 404 and missing.value.error_code == 40400
        assert "nowhere" in missing.value.message

    # A 4xx is the caller's mistake: every server would refuse it, so only one is asked.
    counting = CountingTransport()
    with hotstate.Client([s2, s3, s1], transport=counting) as client, pytest.raises(QueryFailed) as bad:
        client.query("SELEC * FROM clicks")
    assert (
        bad.value.status == 400 and bad.value.error_code == 40001 and not isinstance(bad.value, Unavailable)
    )
    assert bad.value.message.startswith("invalid SQL")
    assert counting.urls == [f"http://{s2}/v1/query"]

    async def asynchronous() -> None:
        async with hotstate.AsyncClient(f"{dead},http://{s3}") as client:
            answer = await client.query("SELECT * FROM clicks WHERE user IN ('u1', 'u2')", timeout_ms=5000)
            assert answer.server == f"http://{s3}"
            assert sorted(answer.dicts(), key=lambda r: r["clicks"]) == ROWS[1:3]
            assert {p.partition for p in answer.partitions} <= {0, 1, 2, 3}
            assert len(await client.tables()) == 1
            assert set(await client.cluster_status()) == {s1, s2, s3}

    asyncio.run(asynchronous())

    # SIGKILL the server a client has been using (its pooled connection dies with it): the next query
    # goes to the next address, which routes every partition to a live replica.
    with hotstate.Client([s1, s2, s3], timeout_s=10.0) as client:
        assert client.query("SELECT * FROM clicks").server == s1
        running.kill(1)
        after = client.query("SELECT * FROM clicks")
        assert after.server == s2 and after.coordinator == 2
        assert sorted(after.dicts(), key=lambda r: r["clicks"]) == ROWS
        assert all(p.served_by in (2, 3) for p in after.partitions)
        assert client.query("SELECT * FROM clicks WHERE user = 'u3'").server == s2  # sticks to s2


def test_cli_query_json_errors_and_status(start_cluster: StartCluster) -> None:
    running = start_cluster(3)
    _make_table(running, partitions=3)
    s1, s2, s3 = _http(running)
    runner = CliRunner()

    shown = runner.invoke(app, ["query", "SELECT * FROM clicks WHERE user = 'u5'", "--server", s2])
    assert shown.exit_code == 0, shown.output
    assert "u5" in shown.stdout and "clicks" in shown.stdout
    assert (
        "partition " in shown.stdout and ": served by " in shown.stdout and "(active, lag 0)" in shown.stdout
    )

    # No --server: the servers of the local cluster in --dir.
    dumped = runner.invoke(
        app,
        ["query", "SELECT * FROM clicks", "--json", "--max-lag", "100", "--dir", str(running.cluster.root)],
    )
    assert dumped.exit_code == 0, dumped.output
    body = json.loads(dumped.stdout)
    assert set(body) >= {"query_id", "table", "columns", "rows", "partitions", "took_ms", "consistency_token"}
    assert len(body["rows"]) == len(ROWS) and [p["partition"] for p in body["partitions"]] == [0, 1, 2]
    # The answer's token passed back: monotonic reads from the CLI too; a damaged one is a clear error.
    again = runner.invoke(
        app, ["query", "SELECT * FROM clicks", "--json", "--token", body["consistency_token"], "-s", s3]
    )
    assert again.exit_code == 0, again.output
    positions = {p["partition"]: p["position"] for p in json.loads(again.stdout)["partitions"]}
    assert all(positions[p["partition"]] >= p["position"] for p in body["partitions"])
    damaged = runner.invoke(app, ["query", "SELECT * FROM clicks", "--token", "hs1.@@", "-s", s1])
    assert damaged.exit_code == 1 and "consistency_token" in damaged.stderr

    refused = runner.invoke(app, ["query", "SELECT * FROM clicks WHERE", "-s", s1])
    assert refused.exit_code == 1
    assert "Traceback" not in refused.output
    assert refused.exception is None or isinstance(refused.exception, SystemExit)
    assert refused.stderr.strip() and not refused.stdout.strip()

    unknown = runner.invoke(app, ["query", "SELECT * FROM nowhere", "-s", s1])
    assert unknown.exit_code == 1 and "table 'nowhere' does not exist" in unknown.stderr

    running.kill(3)
    status = runner.invoke(app, ["status", "--server", f"127.0.0.1:{_closed_port()}", "--server", s1])
    assert status.exit_code == 0, status.output
    for text in ("az-a", "az-b", "az-c", s1, s2, s3, "clicks", "lag per replica", f"as {s1} sees"):
        assert text in status.stdout, status.stdout
    # The killed server is reported down once the others' failure detectors notice.
    deadline = time.monotonic() + 10.0
    while "(down)" not in status.stdout and time.monotonic() < deadline:
        time.sleep(0.2)
        status = runner.invoke(app, ["status", "--dir", str(running.cluster.root)])
    assert status.exit_code == 0 and "NO" in status.stdout and "3 (down)" in status.stdout, status.stdout


# ---------------------------------------------------------------------------------------- no cluster


def test_every_address_unreachable_raises_cluster_unreachable_naming_them() -> None:
    addresses = [f"127.0.0.1:{_closed_port()}", f"http://127.0.0.1:{_closed_port()}"]
    started = time.monotonic()
    with hotstate.Client(addresses) as client, pytest.raises(ClusterUnreachable) as error:
        client.query("SELECT * FROM t")
    assert time.monotonic() - started < 5.0
    assert all(a in str(error.value) for a in addresses) and "ConnectError" in str(error.value)
    assert error.value.servers == addresses


def test_503_is_tried_on_every_server_once_then_raised_as_unavailable() -> None:
    asked: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.host)
        if request.url.host == "down":
            raise httpx.ConnectError("refused", request=request)
        body = {"@type": "generic_error", "error_code": 50300, "message": f"no replica ({request.url.host})"}
        return httpx.Response(503, json=body)

    client = hotstate.Client(["a:1", "down:1", "b:1"], transport=httpx.MockTransport(handler))
    with pytest.raises(Unavailable) as error:
        client.query("SELECT * FROM t")
    assert asked == ["a", "down", "b"]
    assert (
        error.value.status == 503
        and error.value.error_code == 50300
        and error.value.message == "no replica (b)"
    )


def test_round_robin_starts_from_the_last_server_that_answered() -> None:
    asked: list[str] = []
    up = {"b"}

    async def handler(request: httpx.Request) -> httpx.Response:
        asked.append(request.url.host)
        if request.url.host not in up:
            raise httpx.ReadTimeout("slow", request=request)
        body = {
            "query_id": "q",
            "table": "t",
            "columns": ["k"],
            "rows": [[1]],
            "partitions": [],
            "took_ms": 1,
        }
        return httpx.Response(200, json=body)

    async def go() -> None:
        async with hotstate.AsyncClient(
            ["a:1", "b:1", "c:1"], transport=httpx.MockTransport(handler)
        ) as client:
            assert (await client.query("SELECT * FROM t")).server == "b:1"
            up.add("c")
            up.discard("b")
            assert (await client.query("SELECT * FROM t")).server == "c:1"
            assert (await client.query("SELECT * FROM t")).server == "c:1"

    asyncio.run(go())
    assert asked == ["a", "b", "b", "c", "c"]


def test_a_non_hotstate_error_page_still_raises_query_failed() -> None:
    transport = httpx.MockTransport(lambda request: httpx.Response(404, text="<html>nope</html>"))
    with hotstate.Client("x:1", transport=transport) as client, pytest.raises(QueryFailed) as error:
        client.query("SELECT 1")
    assert (error.value.status, error.value.error_code, error.value.message) == (
        404,
        40400,
        "<html>nope</html>",
    )


def test_cli_usage_and_connection_errors_exit_without_a_traceback(tmp_path: Path) -> None:
    runner = CliRunner()
    no_cluster = runner.invoke(app, ["query", "SELECT * FROM t", "--dir", str(tmp_path)])
    assert no_cluster.exit_code == 2 and "--server" in no_cluster.stderr
    bad_address = runner.invoke(app, ["status", "--server", "nonsense"])
    assert bad_address.exit_code == 2 and "HOST:PORT" in bad_address.stderr
    negative = runner.invoke(app, ["query", "SELECT * FROM t", "--max-lag", "-1", "-s", "a:1"])
    assert negative.exit_code == 2
    dead = f"127.0.0.1:{_closed_port()}"
    unreachable = runner.invoke(app, ["query", "SELECT * FROM t", "--server", dead])
    assert unreachable.exit_code == 1 and dead in unreachable.stderr
    for result in (no_cluster, bad_address, unreachable):
        assert "Traceback" not in result.output
        assert result.exception is None or isinstance(result.exception, SystemExit)

"""Scans through /v1/query between real server processes: filters on any column, expressions, aggregates,
GROUP BY/HAVING, ORDER BY ... LIMIT (also through /query, /query-stream, the client and the CLI), their 400s,
a client that disconnects mid-scan, and a replica killed (-9) under running aggregates."""

from __future__ import annotations

import asyncio
import json
import select
import signal
import socket
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

import hotstate
from hotstate.cli.local_cluster import LocalCluster
from hotstate.cli.main import app as cli
from hotstate.client.writer import TableWriter
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError

from .conftest import RunningCluster

# One worker takes the whole module, so its module-scoped fixture starts once (--dist loadgroup).
pytestmark = pytest.mark.xdist_group("scans")

ROWS = 3000
PARTITIONS = 6
KEY = (KeyColumn("user", KeyType.STRING),)


def _row(i: int) -> dict[str, object]:
    return {"user": f"u{i:05d}", "clicks": i % 100, "region": f"r{i % 7}", "score": i * 0.5}


async def _setup(running: RunningCluster) -> None:
    cluster = running.cluster
    async with cluster.admin(request_timeout_s=2.0) as admin:
        reply = await admin.create_table("events", partitions=PARTITIONS, standby_replicas=1, key_columns=KEY)
        assert reply.error is ControllerError.NONE, reply
    writer = TableWriter(cluster.addresses(), "events", cluster_id=cluster.cluster_id, secret=cluster.secret)
    await writer.upsert([_row(i) for i in range(ROWS)])
    await writer.close()


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningCluster]:
    root: Path = tmp_path_factory.mktemp("scans")
    cluster = LocalCluster.create(root / "cluster", 3)
    # Small steps: a scan of this table takes many turns of the event loop, as a big one would.
    cluster.write_configs(scan_step_rows=50)
    cluster.save()
    for server in cluster.servers:
        cluster.start(server)
    started = RunningCluster(cluster)
    try:
        started.run(cluster.wait_ready(30.0, expect=3))
        started.run(_setup(started))
        yield started
    except BaseException:
        print(started.logs())
        raise
    finally:
        for server in cluster.servers:
            cluster.signal(server, signal.SIGKILL)


def _base(running: RunningCluster, node: int = 1) -> str:
    server = running.server(node)
    return f"http://127.0.0.1:{server.http_port}"


def _query(running: RunningCluster, sql: str, node: int = 1, **options: object) -> httpx.Response:
    return httpx.post(f"{_base(running, node)}/v1/query", json={"sql": sql, **options}, timeout=20.0)


def _rows(running: RunningCluster, sql: str, node: int = 1) -> list[list[object]]:
    reply = _query(running, sql, node)
    assert reply.status_code == 200, reply.text
    rows: list[list[object]] = reply.json()["rows"]
    return rows


def test_filters_on_any_column_and_expressions(running: RunningCluster) -> None:
    expected = [[f"u{i:05d}", i % 100 * 2] for i in range(ROWS) if i % 100 > 97 and i % 7 == 3]
    rows = _rows(running, "SELECT user, clicks * 2 AS double FROM events WHERE clicks > 97 AND region = 'r3'")
    assert rows == expected  # in key order
    reply = _query(running, "SELECT * FROM events WHERE region LIKE 'r1%' OR clicks IS NULL LIMIT 5")
    body = reply.json()
    assert [row[0] for row in body["rows"]] == [f"u{i:05d}" for i in range(ROWS) if i % 7 == 1][:5]
    assert body["columns"][:2] == ["user", "clicks"]
    assert len(body["partitions"]) == PARTITIONS and body["cursor"]
    # The key part of the WHERE still narrows what is read: one partition for one key.
    one = _query(running, "SELECT user FROM events WHERE user = 'u00042' AND clicks = 42").json()
    assert one["rows"] == [["u00042"]] and len(one["partitions"]) == 1


def test_aggregates_group_by_having(running: RunningCluster) -> None:
    assert _rows(running, "SELECT COUNT(*), SUM(clicks), MIN(user), MAX(score) FROM events") == [
        [ROWS, sum(i % 100 for i in range(ROWS)), "u00000", (ROWS - 1) * 0.5]
    ]
    by_region = Counter(f"r{i % 7}" for i in range(ROWS) if i % 100 >= 50)
    rows = _rows(
        running,
        "SELECT region, COUNT(*) AS n, COUNT(DISTINCT clicks) FROM events WHERE clicks >= 50 "
        "GROUP BY region HAVING COUNT(*) > 0 ORDER BY region",
    )
    assert rows == [[region, by_region[region], 50] for region in sorted(by_region)]
    top = _rows(running, "SELECT user, score FROM events ORDER BY score DESC LIMIT 3", node=2)
    assert top == [[f"u{i:05d}", i * 0.5] for i in (ROWS - 1, ROWS - 2, ROWS - 3)]


def test_ksqldb_endpoints_the_client_and_the_cli_answer_scans(running: RunningCluster) -> None:
    sql = "SELECT region, COUNT(*) AS n, AVG(score) AS mean FROM events GROUP BY region ORDER BY region"
    expected = [
        [f"r{r}", len(range(r, ROWS, 7)), sum(i * 0.5 for i in range(r, ROWS, 7)) / len(range(r, ROWS, 7))]
        for r in range(7)
    ]
    base = _base(running, 3)
    ksql = httpx.post(f"{base}/query", json={"ksql": sql + ";"}, timeout=20.0)
    assert ksql.status_code == 200, ksql.text[:500]
    header, *rows = ksql.json()
    assert header["header"]["schema"] == "`region` STRING, `n` BIGINT, `mean` DOUBLE"
    assert [row["row"]["columns"] for row in rows] == expected
    with hotstate.Client([base.removeprefix("http://")], timeout_s=20.0) as client:
        frame = client.query(sql).to_pandas()
    assert list(frame.columns) == ["region", "n", "mean"]
    assert frame.values.tolist() == expected
    assert str(frame["n"].dtype).lower().startswith("int")
    stream = httpx.post(f"{base}/query-stream", json={"sql": sql}, timeout=20.0)
    assert stream.status_code == 200, stream.text[:500]
    head, *lines = [json.loads(line) for line in stream.text.splitlines() if line.strip()]
    assert head["columnNames"] == ["region", "n", "mean"]
    assert head["columnTypes"] == ["STRING", "BIGINT", "DOUBLE"]
    assert lines == expected
    runner = CliRunner()
    shown = runner.invoke(cli, ["query", sql, "--server", base.removeprefix("http://")])
    assert shown.exit_code == 0, shown.output
    assert all(f"r{r}" in shown.stdout for r in range(7)) and "mean" in shown.stdout
    dumped = runner.invoke(cli, ["query", sql, "--json", "--server", base.removeprefix("http://")])
    assert dumped.exit_code == 0, dumped.output
    assert json.loads(dumped.stdout)["rows"] == expected
    refused = runner.invoke(cli, ["query", "SELECT region FROM events GROUP BY clicks", "-s", base[7:]])
    assert refused.exit_code == 1 and "must be in GROUP BY" in refused.stderr


@pytest.mark.parametrize(
    ("sql", "fragment"),
    [
        ("SELECT * FROM events WHERE region > 5", "cannot compare string"),
        ("SELECT * FROM events WHERE 'abc' > 5", "cannot compare string with number"),
        ("SELECT * FROM events WHERE nope = 1", "no row has column 'nope'"),
        ("SELECT region, clicks FROM events GROUP BY region", "must be in GROUP BY"),
        ("SELECT * FROM events WHERE frob(clicks) = 1", "unknown function FROB"),
        ("SELECT clicks / 0 FROM events WHERE user = 'u00001'", "division by zero"),
        ("SELECT * FROM events a JOIN events b ON a.user = b.user", "joins are not supported"),
        ("SELECT * FROM events WHERE region LIKE 'r%' ESCAPE 'ab'", "ESCAPE takes one character"),
    ],
)
def test_mistakes_are_400s_and_the_server_stays_healthy(
    running: RunningCluster, sql: str, fragment: str
) -> None:
    reply = _query(running, sql)
    assert reply.status_code == 400, reply.text[:500]
    assert fragment in reply.json()["message"], reply.text[:500]
    assert _rows(running, "SELECT COUNT(*) FROM events") == [[ROWS]]


# A scan that takes seconds per server: every row builds and rewrites strings of some 120 kB (long enough
# that a poll of a loaded peer's /metrics finds its part running).
SLOW_SCAN = (
    "SELECT COUNT(*) FROM events WHERE LENGTH(REPLACE(REPLACE(REPLACE(CONCAT(user, '"
    + "x" * 120_000
    + "'), 'x', 'yy'), 'y', 'zz'), 'z', 'ww')) = 0"
)


def _scan_metrics(running: RunningCluster, node: int) -> tuple[float, float]:
    """(partition scans running, scans cancelled so far) on server `node`, from its /metrics."""
    text = httpx.get(f"{_base(running, node)}/metrics", timeout=5.0).text
    found = {"running": 0.0, "cancelled": 0.0}
    for line in text.splitlines():
        if line.startswith("hotstate_partition_scans_running "):
            found["running"] = float(line.split()[-1])
        elif line.startswith('hotstate_partition_scans_cancelled_total{reason="client_gone"}'):
            found["cancelled"] = float(line.split()[-1])
    return found["running"], found["cancelled"]


def _until(condition: Callable[[], bool], what: str, timeout: float = 15.0) -> None:
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, f"timed out waiting until {what}"
        time.sleep(0.02)


def _disconnect_mid_scan(running: RunningCluster, path: str) -> bool:
    """Sends SLOW_SCAN to server 1 and closes the connection once a peer scans; True when that peer then
    counts its scan cancelled, False when its scan had already ended by itself (a race the caller
    retries)."""
    peers = (2, 3)
    before = {node: _scan_metrics(running, node)[1] for node in peers}
    timeout = {"timeout_ms": 120_000}  # the scan must not end by its budget either
    native = path == "/v1/query"
    request = {"sql": SLOW_SCAN, **timeout} if native else {"sql": SLOW_SCAN, "properties": timeout}
    body = json.dumps(request).encode()
    scanning: list[int] = []

    def a_peer_scans() -> bool:
        scanning.extend(node for node in peers if _scan_metrics(running, node)[0] > 0)
        return bool(scanning)

    server = running.server(1)
    with socket.create_connection(("127.0.0.1", server.http_port), timeout=10.0) as client:
        client.sendall(
            f"POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\n\r\n".encode()
            + body
        )

        def answered() -> bool:
            return bool(select.select([client], [], [], 0)[0])

        # The answer may come before any poll of the peers' /metrics saw them scanning (on a loaded machine
        # a poll can take longer than a peer's part): a lost try, which the caller retries.
        _until(lambda: a_peer_scans() or answered(), "a peer scans or the scan is answered", timeout=60.0)
        if not scanning:
            return False
    peer = scanning[0]
    _until(lambda: all(_scan_metrics(running, node)[0] == 0 for node in (1, *peers)), "no scan runs", 60.0)
    return _scan_metrics(running, peer)[1] > before[peer]


# Only /v1/query (the direct HTTP/1.1 lane): the ASGI doors let a scan run to its end (docs/queries.md).
@pytest.mark.parametrize("path", ["/v1/query"])
def test_a_client_that_goes_away_stops_its_scan_on_every_server(running: RunningCluster, path: str) -> None:
    """/v1/query is answered by the direct HTTP/1.1 lane: a client that disconnects mid-scan cancels the
    scan here and, by an RPC cancel, on the peers. The socket
    closes while a peer scans; the peer's scan may still end by itself between the two, or before a poll
    saw it running, so up to five tries, each needing the peer to count a cancelled scan: without the RPC
    cancel none does."""
    assert any(_disconnect_mid_scan(running, path) for _ in range(5)), "no peer's scan was cancelled"
    assert _rows(running, "SELECT COUNT(*) FROM events") == [[ROWS]]


def _copy_metrics(running: RunningCluster) -> float:
    """Column copies the servers keep, from their /metrics."""
    total = 0.0
    for node in (1, 2, 3):
        text = httpx.get(f"{_base(running, node)}/metrics", timeout=5.0).text
        total += sum(
            float(line.split()[-1])
            for line in text.splitlines()
            if line.startswith("hotstate_scan_column_copies ")
        )
    return total


def test_column_copies_answer_scans_again_and_every_write_since_is_in_their_answers(
    running: RunningCluster,
) -> None:
    # A table of its own: rows written, deleted and added here.
    model: dict[str, dict[str, Any]] = {
        f"c{i:04d}": {"user": f"c{i:04d}", "clicks": i % 10, "region": f"r{i % 3}"} for i in range(600)
    }
    cluster = running.cluster

    async def write(rows: list[dict[str, Any]], gone: list[str], *, create: bool = False) -> str:
        if create:
            async with cluster.admin(request_timeout_s=2.0) as admin:
                reply = await admin.create_table("copies", partitions=3, standby_replicas=1, key_columns=KEY)
                assert reply.error is ControllerError.NONE, reply
        writer = TableWriter(
            cluster.addresses(), "copies", cluster_id=cluster.cluster_id, secret=cluster.secret
        )
        try:
            token = (await writer.upsert(rows)).consistency_token
            if gone:
                token = (await writer.delete(gone)).consistency_token
        finally:
            await writer.close()
        return token

    def expected() -> dict[str, list[list[object]]]:
        rows = [model[user] for user in sorted(model)]
        sums: Counter[str] = Counter()
        for row in rows:
            sums[row["region"]] += row["clicks"]
        return {
            "SELECT user FROM copies WHERE clicks = 3": [[row["user"]] for row in rows if row["clicks"] == 3],
            "SELECT COUNT(*) FROM copies WHERE clicks >= 5": [[sum(1 for row in rows if row["clicks"] >= 5)]],
            "SELECT region, SUM(clicks) FROM copies GROUP BY region ORDER BY region": [
                [region, sums[region]] for region in sorted(sums)
            ],
            "SELECT COUNT(*) FROM copies": [[len(rows)]],
        }

    def answers(token: str) -> dict[str, list[list[object]]]:
        out = {}
        for sql in expected():
            reply = _query(running, sql, consistency_token=token)
            assert reply.status_code == 200, reply.text
            out[sql] = reply.json()["rows"]
        return out

    token = running.run(write(list(model.values()), [], create=True))
    # The rows read; a server's first such scan loads the column engine (in a thread), a later one leaves
    # each partition's copy behind.
    end = time.monotonic() + 20.0
    while True:
        assert answers(token) == expected()
        if _copy_metrics(running) > 0:
            break
        assert time.monotonic() < end, "no server keeps a column copy"
        time.sleep(0.05)
    assert answers(token) == expected()  # from the copies
    changed: list[dict[str, Any]] = [{**model[f"c{i:04d}"], "clicks": 3} for i in range(0, 600, 7)]
    added: list[dict[str, Any]] = [
        {"user": f"c{i:04d}", "clicks": i % 10, "region": "r9"} for i in range(600, 650)
    ]
    gone = [f"c{i:04d}" for i in range(1, 600, 11)]
    for row in changed + added:
        model[str(row["user"])] = row
    for user in gone:
        del model[user]
    token = running.run(write(changed + added, gone))
    assert answers(token) == expected()  # the copies, patched with the keys written since


def test_kill_9_a_replica_under_running_aggregates_never_gives_a_wrong_total(running: RunningCluster) -> None:
    # Last in this module: it kills a server. Every partition has a standby, so each COUNT(*) whose replica
    # dies mid-scan is answered by another replica: a retry, never a partial total.
    base = _base(running, 1)
    placement = next(t for t in httpx.get(f"{base}/v1/tables").json()["tables"] if t["name"] == "events")
    victim = Counter(p["active"] for p in placement["placement"] if p["active"] != 1).most_common(1)[0][0]
    stop = threading.Event()
    totals: Counter[object] = Counter()
    failures: list[str] = []

    def client() -> None:
        with httpx.Client(timeout=20.0) as http:
            while not stop.is_set():
                try:
                    # SUM of an expression: the rows are read (a column copy would answer in one step),
                    # so the kill finds scans under way.
                    reply = http.post(
                        f"{base}/v1/query", json={"sql": "SELECT COUNT(*), SUM(clicks + 0) FROM events"}
                    )
                except httpx.HTTPError as error:
                    failures.append(f"{type(error).__name__}: {error}")
                    continue
                if reply.status_code != 200:
                    failures.append(f"{reply.status_code}: {reply.text[:300]}")
                    continue
                totals[tuple(reply.json()["rows"][0])] += 1

    threads = [threading.Thread(target=client) for _ in range(2)]
    for thread in threads:
        thread.start()
    try:
        end = time.monotonic() + 10.0
        while sum(totals.values()) < 5 and time.monotonic() < end:
            time.sleep(0.05)
        running.kill(victim)
        killed_at = time.monotonic()
        while time.monotonic() - killed_at < 6.0:
            time.sleep(0.1)
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    print(f"\ntotals: {dict(totals)}; failures: {len(failures)}")
    assert set(totals) == {(ROWS, sum(i % 100 for i in range(ROWS)))}, totals
    assert sum(totals.values()) > 10
    assert not failures, failures[:5]
    assert asyncio.iscoroutinefunction(_setup)

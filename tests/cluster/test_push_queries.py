"""Push queries (`... EMIT CHANGES`) between real server processes, on one cluster for the module: per-key
and range feeds through the Python client, /query-stream over HTTP/1.1 and HTTP/2 and Server-Sent Events;
a filtered feed (a WHERE on a non-key column, a computed column) whose rows leave and enter its view;
a snapshot of a partition held elsewhere, in pages, written to meanwhile;
a resync from a position the log no longer holds; a subscriber that stops reading, and one that never
reads (dropped after push.send.timeout.ms); the subscription limit; a dropped table; and (last: it kills
a server) a kill -9 of the serving server while a writer writes, the client resuming on another server
with every acknowledged change received exactly once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from hotstate.cli.local_cluster import LocalCluster
from hotstate.client.query import AsyncClient, Client, QueryFailed
from hotstate.client.subscribe import Change
from hotstate.client.writer import TableWriter
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError
from hotstate.query.tokens import cluster_tag, encode
from hotstate.replica.core import ReplicaConfig
from hotstate.server.config import render_toml

from .conftest import RunningCluster

# One worker takes the whole module, so its module-scoped fixture starts once (--dist loadgroup).
pytestmark = pytest.mark.xdist_group("push_queries")

BOUND = 40  # push.buffer.max.changes
LIMIT = 8  # push.max.subscriptions
RETENTION = 100  # replica.log.retention.records
KEY = (KeyColumn("user", KeyType.STRING),)
SEND_TIMEOUT_MS = 1500  # push.send.timeout.ms of server DROPPING only (the others keep the default)
DROPPING = 2


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningCluster]:
    local = LocalCluster.create(Path(tmp_path_factory.mktemp("push")) / "cluster", 3)
    local.write_configs(
        push_buffer_max_changes=BOUND,
        push_max_subscriptions=LIMIT,
        replica=ReplicaConfig(log_retention_records=RETENTION),
    )
    dropping = next(s for s in local.servers if s.node_id == DROPPING)
    config = local.config_for(
        dropping,
        push_buffer_max_changes=BOUND,
        push_max_subscriptions=LIMIT,
        push_send_timeout_ms=SEND_TIMEOUT_MS,
        replica=ReplicaConfig(log_retention_records=RETENTION),
    )
    (dropping.directory(local.root) / "server.toml").write_text(render_toml(config))
    local.save()
    for server in local.servers:
        local.start(server)
    cluster = RunningCluster(local)
    try:
        cluster.run(local.wait_ready(30.0, expect=3))
        yield cluster
    finally:
        for server in local.servers:
            local.signal(server, signal.SIGKILL)


def _base(running: RunningCluster, node: int) -> str:
    return f"http://127.0.0.1:{running.server(node).http_port}"


def _bases(running: RunningCluster, first: int = 1) -> list[str]:
    nodes = [first] + [n for n in (1, 2, 3) if n != first]
    return [_base(running, n) for n in nodes]


def _table(running: RunningCluster, name: str, partitions: int = 3, standbys: int = 2) -> int:
    """A table (by default with a replica of every partition on every server)."""

    async def create() -> int:
        async with running.cluster.admin(request_timeout_s=2.0) as admin:
            reply = await admin.create_table(
                name, partitions=partitions, standby_replicas=standbys, key_columns=KEY
            )
            assert reply.error is ControllerError.NONE, reply
            return reply.table_id

    table_id = running.run(create())
    # Every server's image has the table and its replicas (a feed needs them all local).
    end = time.monotonic() + 15.0
    for node in (1, 2, 3):
        while True:
            tables = httpx.get(f"{_base(running, node)}/v1/tables").json()["tables"]
            if any(t["name"] == name for t in tables) or time.monotonic() > end:
                break
            time.sleep(0.05)
    return table_id


def _writer(running: RunningCluster, table: str) -> TableWriter:
    cluster = running.cluster
    return TableWriter(cluster.addresses(), table, cluster_id=cluster.cluster_id, secret=cluster.secret)


def _upsert(running: RunningCluster, table: str, rows: list[dict[str, Any]]) -> None:
    """Rows written from this thread (a writer lives on one event loop, so each call has its own)."""

    async def write() -> None:
        writer = _writer(running, table)
        try:
            await writer.upsert(rows)
        finally:
            await writer.close()

    running.run(write())


async def _subscribe_ready(client: AsyncClient, sql: str, **options: Any) -> Any:
    """A subscription whose feed has started (its header read), retried while replicas are opening."""
    end = time.monotonic() + 15.0
    while True:
        subscription = client.subscribe(sql, **options)
        try:
            return subscription, await asyncio.wait_for(subscription.__anext__(), 10.0)
        except QueryFailed:
            raise
        except Exception:
            if time.monotonic() > end:
                raise
            await asyncio.sleep(0.1)


def test_per_key_and_range_feeds_through_the_python_client(running: RunningCluster) -> None:
    _table(running, "keyed")

    async def scenario() -> None:
        writer = _writer(running, "keyed")
        await writer.upsert([{"user": "u1", "clicks": 1}, {"user": "r1", "clicks": 1}])
        async with AsyncClient(_bases(running), timeout_s=20.0) as client:
            keyed, first = await _subscribe_ready(
                client, "SELECT * FROM keyed WHERE user = 'u1' EMIT CHANGES"
            )
            assert (first.kind, first.key, first.row) == ("snapshot", ("u1",), {"user": "u1", "clicks": 1})
            ranged = client.subscribe(
                "SELECT user, clicks FROM keyed WHERE user >= 'r' AND user < 's' EMIT CHANGES", snapshot=False
            )
            ranged_first = asyncio.ensure_future(ranged.__anext__())
            while ranged.state.start is None:  # its feed has started: what follows is a change
                await asyncio.sleep(0.01)
            await writer.upsert([{"user": "u1", "clicks": 2}, {"user": "u2", "clicks": 9}])
            await writer.delete([("u1",)])
            await writer.upsert([{"user": "u1", "clicks": 3}, {"user": "ra", "clicks": 4}])
            await writer.upsert([{"user": "s1", "clicks": 5}, {"user": "q", "clicks": 6}])
            await writer.upsert([{"user": "r1", "clicks": 7}])
            got = [await asyncio.wait_for(keyed.__anext__(), 10.0) for _ in range(3)]
            assert [(c.kind, c.key, c.row) for c in got] == [
                ("change", ("u1",), {"user": "u1", "clicks": 2}),
                ("change", ("u1",), None),
                ("change", ("u1",), {"user": "u1", "clicks": 3}),
            ]
            assert got[1].deleted and got[0].offset is not None and got[0].offset < got[2].offset
            in_range = [await asyncio.wait_for(ranged_first, 10.0)]
            in_range.append(await asyncio.wait_for(ranged.__anext__(), 10.0))
            assert sorted((c.key, c.row) for c in in_range) == [
                (("r1",), {"user": "r1", "clicks": 7}),
                (("ra",), {"user": "ra", "clicks": 4}),
            ]
            await keyed.aclose()
            await ranged.aclose()
        await writer.close()

    running.run(scenario())


def test_a_filtered_feed_is_a_filtered_view_rows_leave_and_enter_it(running: RunningCluster) -> None:
    _table(running, "scored")
    _upsert(running, "scored", [{"user": "a", "clicks": 7}, {"user": "b", "clicks": 1}])

    async def scenario() -> list[tuple[str, tuple[Any, ...], Any, bool]]:
        writer = _writer(running, "scored")
        async with AsyncClient(_bases(running), timeout_s=20.0) as client:
            sql = "SELECT user, clicks * 10 AS tens FROM scored WHERE clicks >= 5 EMIT CHANGES"
            subscription, first = await _subscribe_ready(client, sql)
            await writer.upsert([{"user": "b", "clicks": 2}])  # not in the view, and stays out: nothing
            await writer.upsert([{"user": "a", "clicks": 3}])  # leaves the view
            await writer.upsert([{"user": "b", "clicks": 9}])  # enters it
            got = [first] + [await asyncio.wait_for(subscription.__anext__(), 10.0) for _ in range(2)]
            await subscription.aclose()
        await writer.close()
        return [(c.kind, c.key, c.row, c.left) for c in got]

    assert running.run(scenario()) == [
        ("snapshot", ("a",), {"user": "a", "tens": 70}, False),
        ("change", ("a",), None, True),
        ("change", ("b",), {"user": "b", "tens": 90}, False),
    ]
    # The same filter over Server-Sent Events (the console's feed): only the matching row's snapshot.
    with httpx.Client() as h1:
        url = f"{_base(running, 3)}/v1/tables/scored/changes"
        with h1.stream("GET", url, params={"where": "clicks >= 5"}, timeout=20.0) as response:
            kinds = []
            for line in response.iter_lines():
                if line.startswith("data: "):
                    event = json.loads(line[6:])
                    kinds.append((event["type"], event.get("key")))
                    if event["type"] == "snapshot_end":
                        break
    assert kinds == [("header", None), ("row", ["b"]), ("snapshot_end", None)]


def _stream_lines(
    client: httpx.Client, base: str, body: dict[str, Any], count: int, write: Any, write_after: int
) -> list[Any]:
    """The first `count` lines of a /query-stream answer, calling `write` once `write_after` were read."""
    lines: list[Any] = []
    with client.stream("POST", f"{base}/query-stream", json=body, timeout=20.0) as response:
        assert response.status_code == 200, response.read()
        if write_after == 0:
            write()
        for line in response.iter_lines():
            if not line:
                continue
            lines.append(json.loads(line))
            if len(lines) == write_after:
                write()
            if len(lines) >= count:
                break
    return lines


def test_a_feed_over_partitions_held_elsewhere_reads_them_from_their_servers(running: RunningCluster) -> None:
    """Without standbys each server holds some partitions: a server tails the others' from a server that
    holds them (one tail per partition), with the same snapshot, order and resume."""
    _table(running, "spread", partitions=6, standbys=0)
    placement = httpx.get(f"{_base(running, 1)}/v1/tables").json()["tables"]
    parts = next(t["placement"] for t in placement if t["name"] == "spread")
    held = [p for p in parts if p["active"] == 1 or 1 in p["standbys"] + p["warmups"]]
    assert len(held) < 6, "server 1 holds every partition: nothing here is read from elsewhere"
    _upsert(running, "spread", [{"user": f"u{i}", "clicks": i} for i in range(30)])
    sql = "SELECT * FROM spread EMIT CHANGES"

    def rows(changes: list[Change]) -> list[tuple[Any, ...]]:
        return sorted((c.kind, c.key, c.row["clicks"] if c.row else None) for c in changes)

    with Client(_bases(running, 1), timeout_s=20.0) as client:
        subscription = client.subscribe(sql)
        snapshot = [next(subscription) for _ in range(30)]
        assert rows(snapshot) == sorted(("snapshot", (f"u{i}",), i) for i in range(30))
        _upsert(running, "spread", [{"user": f"u{i}", "clicks": 100 + i} for i in range(12)])
        changed = [next(subscription) for _ in range(12)]
        assert rows(changed) == sorted(("change", (f"u{i}",), 100 + i) for i in range(12))
        token = subscription.token
        subscription.close()
    _upsert(running, "spread", [{"user": f"u{i}", "clicks": 200 + i} for i in range(10)])
    with Client(_bases(running, 2), timeout_s=20.0) as client:
        resumed = client.subscribe(sql, from_token=token)
        replayed = [next(resumed) for _ in range(10)]
        assert rows(replayed) == sorted(("change", (f"u{i}",), 200 + i) for i in range(10))
        _upsert(running, "spread", [{"user": "u0", "clicks": 300}])
        assert next(resumed).row == {"user": "u0", "clicks": 300}
        resumed.close()


def test_a_remote_snapshot_larger_than_a_page_comes_whole_once_with_its_changes_in_order(
    running: RunningCluster,
) -> None:
    """A feed on a server without a replica of the partition: its holder sends the snapshot in pages of one
    view (about 1 MiB each), written to meanwhile; every row comes once, then every later change in order."""
    _table(running, "paged", partitions=1, standbys=0)
    placement = httpx.get(f"{_base(running, 1)}/v1/tables").json()["tables"]
    (part,) = next(t["placement"] for t in placement if t["name"] == "paged")
    holders = {part["active"], *part["standbys"], *part["warmups"]}
    node = next(n for n in (1, 2, 3) if n not in holders)
    pad = "x" * 2000  # a key of ~2 KB in the key and the row: 600 rows are 3 pages
    count = 600
    updated = range(0, count, 60)  # 30 changes: below the bound, so the feed catches up change by change
    _upsert(running, "paged", [{"user": f"u{i:04}{pad}", "clicks": 0} for i in range(count)])
    sql = "SELECT * FROM paged EMIT CHANGES"

    async def follow() -> tuple[list[Change], list[Change]]:
        async with AsyncClient(_bases(running, node), timeout_s=20.0) as client:
            writes = asyncio.ensure_future(updates())
            subscription, first = await _subscribe_ready(client, sql)
            events = [first]
            while sum(1 for e in events if e.kind == "snapshot") < count:
                events.append(await asyncio.wait_for(subscription.__anext__(), 10.0))
            await writes
            model = {e.key: e.row["clicks"] for e in events if e.row}
            later: list[Change] = []
            while any(model[(f"u{i:04}{pad}",)] != 3 for i in updated):
                change = await asyncio.wait_for(subscription.__anext__(), 10.0)
                later.append(change)
                model[change.key] = change.row["clicks"]
            await subscription.aclose()
            return events, later

    async def updates() -> None:  # while the feed starts: each key's clicks go 1, 2, 3
        writer = _writer(running, "paged")
        try:
            for j in range(1, 4):
                await writer.upsert([{"user": f"u{i:04}{pad}", "clicks": j} for i in updated])
        finally:
            await writer.close()

    events, later = running.run(follow())
    snapshot = [e for e in events if e.kind == "snapshot"]
    assert sorted(e.key for e in snapshot) == sorted((f"u{i:04}{pad}",) for i in range(count))
    changes = [e for e in events if e.kind == "change"] + later
    for i in updated:
        seen = [c.row["clicks"] for c in changes if c.key == (f"u{i:04}{pad}",) and c.row]
        assert seen == sorted(seen), f"changes of u{i:04} out of order: {seen}"
        assert len(seen) == len(set(seen)), f"a change of u{i:04} came twice: {seen}"


def test_the_cli_follows_a_feed(running: RunningCluster) -> None:
    _table(running, "followed")
    _upsert(running, "followed", [{"user": "f", "clicks": 1}])
    command = [sys.executable, "-m", "hotstate.cli.main", "query", "--follow", "--server"]
    command += [f"127.0.0.1:{running.server(1).http_port}", "SELECT * FROM followed WHERE user = 'f'"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert process.stdout is not None
        first = json.loads(process.stdout.readline())
        assert (first["kind"], first["row"]) == ("snapshot", {"user": "f", "clicks": 1})
        _upsert(running, "followed", [{"user": "f", "clicks": 2}])
        second = json.loads(process.stdout.readline())
        assert (second["kind"], second["key"], second["row"]) == ("change", ["f"], {"user": "f", "clicks": 2})
    finally:
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=20.0)
    assert json.loads(err.strip().splitlines()[-1])["token"].startswith("hs1.")


def test_query_stream_over_http11_and_http2_and_server_sent_events(running: RunningCluster) -> None:
    _table(running, "streamed")
    _upsert(running, "streamed", [{"user": "a", "clicks": 1}])
    base = _base(running, 2)
    sql = "SELECT * FROM streamed WHERE user = 'a' EMIT CHANGES"

    def write(value: int) -> Any:
        return lambda: _upsert(running, "streamed", [{"user": "a", "clicks": value}])

    with httpx.Client() as h1:  # the delimited format, each line a chunk
        lines = _stream_lines(h1, base, {"sql": sql}, 3, write(2), 2)
    assert lines[0]["columnNames"] == ["user", "clicks"] and lines[1:] == [["a", 1], ["a", 2]]
    with httpx.Client(http1=False, http2=True) as h2:  # HTTP/2 with prior knowledge, as ksqlDB's clients
        latest = {"sql": sql, "properties": {"auto.offset.reset": "latest"}}
        # Without a declared schema, SELECT *'s header waits for the first row to name the columns.
        lines = _stream_lines(h2, base, latest, 2, write(3), 0)
    assert lines[0]["columnNames"] == ["user", "clicks"] and lines[1] == ["a", 3]
    with httpx.Client(http1=False, http2=True) as h2:
        lines = []
        with h2.stream("POST", f"{base}/query-stream", json={"sql": sql}, timeout=20.0) as response:
            for line in response.iter_lines():
                lines.append(json.loads(line))
                if len(lines) == 2:
                    write(4)()
                if len(lines) == 3:
                    break
        assert lines[1:] == [["a", 3], ["a", 4]]

    # Server-Sent Events: the events, each with the token to resume from as its id.
    events: list[tuple[str, str | None, dict[str, Any]]] = []
    with httpx.Client() as h1:
        url = f"{base}/v1/tables/streamed/changes"
        with h1.stream("GET", url, params={"where": "user = 'a'"}, timeout=20.0) as response:
            assert response.headers["content-type"] == "text/event-stream"
            kind, ident = "", None
            for line in response.iter_lines():
                if line.startswith("event: "):
                    kind = line[7:]
                elif line.startswith("id: "):
                    ident = line[4:]
                elif line.startswith("data: "):
                    events.append((kind, ident, json.loads(line[6:])))
                    if kind == "snapshot_end":
                        write(5)()
                    if kind == "change":
                        break
                    ident = None
    assert [k for k, _, _ in events] == ["header", "row", "snapshot_end", "change"]
    assert events[1][2]["row"] == {"user": "a", "clicks": 4}
    assert events[3][2]["row"] == {"user": "a", "clicks": 5} and events[3][1] is not None
    # The last event's id resumes after it: nothing is sent again.
    with httpx.Client() as h1:
        headers = {"last-event-id": events[3][1] or ""}
        with h1.stream("GET", url, params={"where": "user = 'a'"}, headers=headers, timeout=20.0) as response:
            sse = response.iter_lines()
            assert next(sse) == "event: header"
            write(6)()
            assert json.loads(next(sse)[6:])["type"] == "header"
            data = next(json.loads(line[6:]) for line in sse if line.startswith("data: "))
            assert data["type"] == "change" and data["row"]["clicks"] == 6


def test_ksql_python_ng_reads_a_push_query_over_http2(running: RunningCluster) -> None:
    from ksql import KSQLAPI

    _table(running, "ksqlpush")
    _upsert(running, "ksqlpush", [{"user": "k", "clicks": 1}])
    api = KSQLAPI(_base(running, 3), check_version=False)
    rows = api.query("SELECT * FROM ksqlpush EMIT CHANGES", use_http2=True, parse=True)
    assert next(rows) == {"user": "k", "clicks": 1}
    _upsert(running, "ksqlpush", [{"user": "k", "clicks": 2}])
    assert next(rows) == {"user": "k", "clicks": 2}
    rows.close()


def test_a_position_the_log_no_longer_holds_gets_a_resync(running: RunningCluster) -> None:
    table_id = _table(running, "retained", partitions=1)
    for start in range(0, 6 * RETENTION, 50):
        _upsert(running, "retained", [{"user": f"u{i % 7}", "clicks": i} for i in range(start, start + 50)])
    token = encode({(table_id, 0): 1}, cluster_tag(running.cluster.cluster_id))
    with Client(_bases(running, 2), timeout_s=20.0) as client:
        subscription = client.subscribe("SELECT * FROM retained EMIT CHANGES", from_token=token)
        got = [next(subscription) for _ in range(8)]
        subscription.close()
    assert [c.kind for c in got] == ["resync_begin"] + ["resync"] * 7
    last = 6 * RETENTION - 1
    assert sorted((c.key, c.row) for c in got[1:]) == sorted(
        ((f"u{i % 7}",), {"user": f"u{i % 7}", "clicks": i}) for i in range(last - 6, last + 1)
    )
    assert subscription.state.positions == {0: 6 * RETENTION}


@pytest.mark.parametrize("standbys", [2, 0])
def test_a_resume_further_behind_than_the_buffer_gets_every_change_from_the_log(
    running: RunningCluster, standbys: int
) -> None:
    """More changes since the token than a feed buffers (BOUND), fewer than the log keeps: each one, in
    order, replayed on every server asked (it used to be a resync), from its own log (a replica on every
    server) or read from the one holding the partition (no standby), then the live ones."""
    table = f"behind{standbys}"
    table_id = _table(running, table, partitions=1, standbys=standbys)
    _upsert(running, table, [{"user": f"u{i % 5}", "clicks": i} for i in range(10)])
    behind = 2 * BOUND + 10
    _upsert(running, table, [{"user": f"u{i % 5}", "clicks": i} for i in range(10, 10 + behind)])
    for node in (1, 2, 3):  # each replays the live changes of the servers before it too
        token = encode({(table_id, 0): 10}, cluster_tag(running.cluster.cluster_id))
        replayed = behind + node - 1
        with Client(_bases(running, node), timeout_s=20.0) as client:
            subscription = client.subscribe(f"SELECT * FROM {table} EMIT CHANGES", from_token=token)
            got = [next(subscription) for _ in range(replayed)]
            _upsert(running, table, [{"user": "live", "clicks": 1000 + node}])
            live = next(subscription)
            subscription.close()
        assert {c.kind for c in got} == {"change"}, node
        assert [c.offset for c in got] == list(range(10, 10 + replayed)), node
        clicks = list(range(10, 10 + behind)) + [1000 + n for n in range(1, node)]
        assert [c.row["clicks"] for c in got if c.row] == clicks, node
        assert live.kind == "change" and live.row == {"user": "live", "clicks": 1000 + node}, node
        assert live.offset == 10 + replayed, node


def test_a_subscriber_that_stops_reading_is_told_it_fell_behind(running: RunningCluster) -> None:
    _table(running, "stalled", partitions=1)
    base = _base(running, 1)
    port = running.server(1).http_port
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # fills at once: the server must buffer
    sock.connect(("127.0.0.1", port))
    body = json.dumps({"sql": "SELECT * FROM stalled EMIT CHANGES", "snapshot": False}).encode()
    sock.sendall(
        b"POST /v1/changes HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    big = "x" * 50_000
    # Far more than the socket buffers hold, in rows of 50 kB: the feed's own buffer fills past BOUND.
    for start in range(0, 400, 20):
        _upsert(running, "stalled", [{"user": f"u{i}", "pad": big} for i in range(start, start + 20)])
    # Writes were not slowed: a pull query, and another feed on the same server, are answered meanwhile.
    assert httpx.post(f"{base}/v1/query", json={"sql": "SELECT user FROM stalled WHERE user = 'u3'"}).json()[
        "rows"
    ] == [["u3"]]
    sock.settimeout(20.0)
    received = b""
    while not received.endswith(b"\r\n0\r\n\r\n"):  # the last chunk: the stream ended
        chunk = sock.recv(1 << 20)
        assert chunk, "the server closed the connection without ending the stream"
        received += chunk
    sock.close()
    text = _dechunked(received.split(b"\r\n\r\n", 1)[1]).decode()
    end = json.loads(text.splitlines()[-1])
    assert end["reason"] == "fell_behind" and end["final"] is False
    assert 0 < end["positions"]["0"] < 400
    delivered = text.count('"type":"change"')
    assert delivered == end["positions"]["0"]  # everything up to its positions was sent, nothing after
    assert 'hotstate_push_feeds_ended_total{reason="fell_behind"} 1.0' in httpx.get(f"{base}/metrics").text


def test_a_client_that_never_reads_is_dropped_after_the_send_timeout(running: RunningCluster) -> None:
    _table(running, "unread", partitions=1)
    big = "x" * 50_000
    # A snapshot of 6 MB: more than the socket buffers between server and client hold.
    for start in range(0, 120, 40):
        _upsert(running, "unread", [{"user": f"u{i}", "pad": big} for i in range(start, start + 40)])
    base = _base(running, DROPPING)
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(("127.0.0.1", running.server(DROPPING).http_port))
    body = json.dumps({"sql": "SELECT * FROM unread EMIT CHANGES"}).encode()
    sock.sendall(
        b"POST /v1/changes HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
        b"content-length: %d\r\n\r\n%s" % (len(body), body)
    )
    try:
        end = time.monotonic() + 30.0
        while "hotstate_push_clients_dropped_total 1.0" not in httpx.get(f"{base}/metrics").text:
            assert time.monotonic() < end, "the client that never read was not dropped"
            time.sleep(0.1)
        sock.settimeout(20.0)
        received = 0
        with contextlib.suppress(ConnectionResetError):
            while chunk := sock.recv(1 << 20):
                received += len(chunk)
        assert received < 6_000_000  # the connection closed before the snapshot was all sent
    finally:
        sock.close()
    assert "hotstate_push_subscriptions 0.0" in httpx.get(f"{base}/metrics").text


def _dechunked(body: bytes) -> bytes:
    """An HTTP/1.1 chunked body's data."""
    out: list[bytes] = []
    at = 0
    while True:
        line_end = body.index(b"\r\n", at)
        size = int(body[at:line_end], 16)
        if size == 0:
            return b"".join(out)
        out.append(body[line_end + 2 : line_end + 2 + size])
        at = line_end + 2 + size + 2


def test_too_many_subscriptions_are_refused_clearly(running: RunningCluster) -> None:
    _table(running, "limited", partitions=1)
    base = _base(running, 3)
    sql = {"sql": "SELECT * FROM limited EMIT CHANGES"}
    with httpx.Client(timeout=10.0) as http:
        opened = []
        try:
            for _ in range(LIMIT + 1):
                stream = http.stream("POST", f"{base}/v1/changes", json=sql)
                response = stream.__enter__()
                opened.append(stream)
                if response.status_code != 200:
                    break
            refused = response.read()
            assert response.status_code == 503, refused
            assert b"push.max.subscriptions=8" in refused
            assert f"hotstate_push_subscriptions {LIMIT}.0" in http.get(f"{base}/metrics").text
            assert len(opened) <= LIMIT + 1
        finally:
            for stream in opened:
                stream.__exit__(None, None, None)
        # The closed feeds are let go: the server takes subscriptions again.
        end = time.monotonic() + 10.0
        while True:
            with http.stream("POST", f"{base}/v1/changes", json=sql) as response:
                if response.status_code == 200 or time.monotonic() > end:
                    assert response.status_code == 200
                    break
            time.sleep(0.05)


def test_bad_push_queries_are_refused_before_a_stream_starts(running: RunningCluster) -> None:
    table_id = _table(running, "refusing", partitions=2)
    base = _base(running, 1)

    def changes(**body: object) -> httpx.Response:
        return httpx.post(f"{base}/v1/changes", json=body, timeout=10.0)

    sql = "SELECT * FROM refusing EMIT CHANGES"
    foreign = encode({(table_id, 0): 1}, cluster_tag("another cluster"))
    assert "another cluster" in changes(sql=sql, from_token=foreign).json()["message"]
    other_table = encode({(table_id + 100, 0): 1}, cluster_tag(running.cluster.cluster_id))
    assert "names no partition" in changes(sql=sql, from_token=other_table).json()["message"]
    assert changes(sql="SELECT * FROM nope EMIT CHANGES").status_code == 404
    assert "EMIT FINAL" in changes(sql="SELECT * FROM refusing EMIT FINAL").json()["message"]
    assert "LIMIT" in changes(sql="SELECT * FROM refusing LIMIT 2 EMIT CHANGES").json()["message"]
    aggregate = changes(sql="SELECT COUNT(*) FROM refusing EMIT CHANGES")
    assert aggregate.status_code == 400
    assert "aggregates and GROUP BY are not supported on a push query" in aggregate.json()["message"]
    pull = httpx.post(f"{base}/v1/query", json={"sql": sql}, timeout=10.0)
    assert pull.status_code == 400 and "/query-stream" in pull.json()["message"]


def test_a_dropped_table_ends_its_feeds_with_a_final_event(running: RunningCluster) -> None:
    _table(running, "dropping")
    _upsert(running, "dropping", [{"user": "d", "clicks": 1}])

    async def scenario() -> list[Change]:
        async with AsyncClient(_bases(running, 2), timeout_s=20.0) as client:
            subscription, first = await _subscribe_ready(client, "SELECT * FROM dropping EMIT CHANGES")
            async with running.cluster.admin(request_timeout_s=2.0) as admin:
                reply = await admin.delete_table("dropping")
                assert reply.error is ControllerError.NONE
            rest = [change async for change in subscription]  # ends: no resume
            assert subscription.end_reason == "dropped"
            return [first, *rest]

    assert [c.row for c in running.run(asyncio.wait_for(scenario(), 30.0))] == [{"user": "d", "clicks": 1}]


def test_a_server_stopping_ends_its_feeds_and_the_client_resumes_elsewhere(running: RunningCluster) -> None:
    """SIGTERM: the feed's last event says the server is stopping, with its positions; the client goes on
    from there on the next server."""
    _table(running, "stopping")
    _upsert(running, "stopping", [{"user": "s", "clicks": 1}])

    async def scenario() -> tuple[list[Change], list[str]]:
        async with AsyncClient(_bases(running, 2), timeout_s=30.0) as client:
            subscription, first = await _subscribe_ready(client, "SELECT * FROM stopping EMIT CHANGES")
            pending = asyncio.ensure_future(subscription.__anext__())  # reads on while server 2 stops
            running.kill(2, signal.SIGTERM)
            server = running.server(2)
            deadline = time.monotonic() + 20.0
            while running.cluster.alive(server) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            await asyncio.to_thread(_upsert, running, "stopping", [{"user": "s", "clicks": 2}])
            second = await asyncio.wait_for(pending, 20.0)
            return [first, second], subscription.state.ends

    try:
        changes, ends = running.run(scenario())
        assert [c.row for c in changes] == [{"user": "s", "clicks": 1}, {"user": "s", "clicks": 2}]
        assert ends[:1] == ["shutdown"]
    finally:
        running.restart(2)
        running.run(running.cluster.wait_ready(30.0, expect=3))


def test_kill_9_of_the_serving_server_mid_feed_loses_and_repeats_nothing(running: RunningCluster) -> None:
    """Last in the module: it kills server 1 (and restarts it)."""
    _table(running, "killed", partitions=4, standbys=1)  # servers also tail partitions held elsewhere
    writes = 400

    async def scenario() -> tuple[list[Change], list[int], dict[int, int]]:
        writer = _writer(running, "killed")
        acked: list[int] = []
        async with AsyncClient(_bases(running, 1), timeout_s=30.0) as client:
            subscription = client.subscribe("SELECT * FROM killed EMIT CHANGES", snapshot=False)
            received: list[Change] = []

            async def read() -> None:
                async for change in subscription:
                    received.append(change)

            reader = asyncio.create_task(read())
            while subscription.state.start is None:
                await asyncio.sleep(0.01)

            async def write() -> None:
                for i in range(writes):
                    try:
                        await writer.upsert([{"user": f"k{i % 17}", "seq": i}], deadline_s=20.0)
                    except Exception:
                        continue  # unknown outcome: not in the acknowledged history
                    acked.append(i)
                    if i == writes // 3:
                        running.kill(1)
                    await asyncio.sleep(0.002)

            await write()
            end = time.monotonic() + 30.0
            while not set(acked) <= {c.row["seq"] for c in received if c.row} and time.monotonic() < end:
                await asyncio.sleep(0.05)
            reader.cancel()
            await writer.close()
            assert subscription.resumes >= 1
            assert subscription.state.start is not None
            return received, acked, subscription.state.start

    received, acked, start = running.run(scenario())
    try:
        seqs = [c.row["seq"] for c in received if c.row]
        assert set(acked) <= set(seqs), sorted(set(acked) - set(seqs))[:20]
        # Every record of every partition from the feed's start, once, in order: no loss, no duplicate
        # (a write retried across the kill may be in the log twice, at two offsets, and is received twice).
        by_partition: dict[int, list[int]] = {}
        for change in received:
            assert change.offset is not None
            by_partition.setdefault(change.partition, []).append(change.offset)
        for partition, offsets in by_partition.items():
            assert offsets == list(range(start[partition], start[partition] + len(offsets))), partition
    finally:
        running.restart(1)
        running.run(running.cluster.wait_ready(30.0, expect=3))

"""Bad input on the query path gets a clear 4xx and leaves the server serving; values JSON has no number
for travel as ksqlDB writes them. Between real server processes."""

from __future__ import annotations

import math
import socket
import time

import httpx

from hotstate.client.writer import TableWriter

from .conftest import StartCluster
from .test_pull_queries import _http, _placement, _setup

MAX_LAG_LIMIT = 2**63 - 1


def _post(base: str, path: str, body: bytes) -> httpx.Response:
    return httpx.post(f"{base}{path}", content=body, headers={"Content-Type": "application/json"}, timeout=30)


def _raw_request(port: int, request: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while True:
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks)


def test_each_bad_request_gets_its_clear_4xx_and_the_server_keeps_serving(
    start_cluster: StartCluster,
) -> None:
    running = start_cluster(3)
    cluster = running.cluster
    # No standbys: two of the three partitions are forwarded from any one server.
    running.run(_setup(running, "clicks", partitions=3, standbys=0, rows=30))
    base = _http(cluster, 1)
    placement_before = _placement(base, "clicks")
    in_100k = "SELECT * FROM clicks WHERE user IN (" + ", ".join(f"'u{i}'" for i in range(100_000)) + ")"
    ands = "SELECT * FROM clicks WHERE " + " AND ".join("user = 'u1'" for _ in range(20_000))
    cases: list[tuple[str, bytes, int, int, str]] = [
        (
            "/v1/query",
            b'{"sql": "SELECT * FROM clicks", "max_lags": 3}',
            400,
            40000,
            "unknown field 'max_lags'",
        ),
        ("/v1/query", b'{"sql": 7}', 400, 40000, "sql: must be a string"),
        ("/v1/query", b'{"max_lag": 1}', 400, 40000, "sql: Field required"),
        ("/v1/query", b'{"sql": "SELECT * FROM clicks", "max_lag": -1}', 400, 40000, "max_lag"),
        (
            "/v1/query",
            b'{"sql": "SELECT * FROM clicks", "max_lag": 18446744073709551616}',
            400,
            40000,
            "max_lag",
        ),
        (
            "/v1/query",
            b'{"sql": "SELECT * FROM clicks", "max_lag": 9223372036854775808}',
            400,
            40001,
            "from 0 to",
        ),
        (
            "/v1/query",
            b'{"sql": "SELECT * FROM clicks", "standby_reads": "maybe"}',
            400,
            40000,
            "standby_reads",
        ),
        ("/v1/query", b'{"sql": "SELECT * FROM clicks", "hedging": "no"}', 400, 40000, "hedging"),
        (
            "/v1/query",
            b'{"sql": "SELECT * FROM clicks", "consistency_token": 5}',
            400,
            40000,
            "consistency_token",
        ),
        (
            "/v1/query",
            b'{"sql": "SELECT * FROM clicks", "consistency_token": "hs1.@@"}',
            400,
            40001,
            "damaged",
        ),
        ("/v1/query", b'{"sql": "SELECT * FROM clicks", "min_batch": -1}', 400, 40000, "min_batch"),
        (
            "/v1/query",
            b'{"sql": "SELECT * FROM clicks", "partitions": [0, 99]}',
            400,
            40001,
            "partitions: must be a list of partition numbers of clicks",
        ),
        ("/v1/query", b'{"sql": "SELECT * FROM clicks", "partitions": "0"}', 400, 40001, "partitions"),
        (
            "/v1/query",
            b'{"sql": "SELECT * FROM clicks LIMIT 5", "after": "not a cursor!"}',
            400,
            40001,
            "after: must be the cursor of an earlier answer",
        ),
        (
            "/query",
            b'{"ksql": "SELECT * FROM clicks;", "streamsProperties": {"min_batch": "3"}}',
            400,
            40001,
            "min_batch",
        ),
        (
            "/query",
            b'{"ksql": "SELECT * FROM clicks;", "streamsProperties": {"max_lags": 3}}',
            400,
            40001,
            "unknown property 'max_lags'; known:",
        ),
        (
            "/query",
            b'{"ksql": "SELECT * FROM clicks;", "streamsProperties": '
            b'{"ksql.query.pull.max.allowed.offset.lag": "99999999999999999999"}}',
            400,
            40001,
            "from 0 to 9223372036854775807",
        ),
        ("/query", b'{"ksql": "SELECT * FROM clicks;", "streamsProperties": []}', 400, 40000, "JSON object"),
        (
            "/query",
            b'{"ksql": "SELECT * FROM clicks;", "sessionVariables": {"a": 1}}',
            400,
            40000,
            "not supported",
        ),
        ("/query", b'{"ksql": "SELECT * FROM clicks;", "ksqlx": 1}', 400, 40000, "unknown field 'ksqlx'"),
        ("/v1/query", b'{"sql": "SELECT * FROM clicks LIMIT 9223372036854775808"}', 400, 40001, "LIMIT"),
        ("/v1/query", b'{"sql": "SELECT * FROM clicks LIMIT 99999999999999999999999"}', 400, 40001, "LIMIT"),
        # A lone surrogate, escaped or as raw bytes, and bytes that are not UTF-8: not JSON text.
        (
            "/v1/query",
            b'{"sql": "SELECT * FROM clicks WHERE user = \'\\ud800\'"}',
            400,
            40000,
            "malformed JSON",
        ),
        (
            "/v1/query",
            b'{"sql": "SELECT * FROM clicks WHERE user = \'\xed\xa0\x80\'"}',
            400,
            40000,
            "malformed JSON",
        ),
        ("/v1/query", b'{"sql": "\xff"}', 400, 40000, "malformed JSON"),
        ("/v1/query", b"", 400, 40000, "malformed JSON"),
        ("/v1/query", b'"SELECT 1"', 400, 40000, "JSON object"),
        ("/v1/query", b'{"sql": "' + in_100k.encode() + b'"}', 400, 40001, "characters"),
        ("/v1/query", b'{"sql": "' + ands.encode() + b'"}', 400, 40001, "AND"),
        ("/v1/query", b'{"sql": "' + b"x" * (5 * 1024 * 1024) + b'"}', 413, 41300, "larger than"),
    ]
    for path, body, status, code, fragment in cases:
        started = time.monotonic()
        reply = _post(base, path, body)
        took = time.monotonic() - started
        shown = body[:120]
        assert reply.status_code == status, (shown, reply.text[:500])
        payload = reply.json()
        assert payload["error_code"] == code and fragment in payload["message"], (shown, payload)
        assert "Traceback" not in reply.text
        assert took < 5.0, (shown, took)  # a refusal, not minutes of parsing

    # Limits that still answer: the largest LIMIT and bound there are, on forwarded partitions too.
    most = _post(base, "/v1/query", b'{"sql": "SELECT * FROM clicks LIMIT 9223372036854775807"}')
    assert most.status_code == 200 and len(most.json()["rows"]) == 30, most.text
    bounded = _post(base, "/v1/query", b'{"sql": "SELECT * FROM clicks", "max_lag": %d}' % MAX_LAG_LIMIT)
    assert bounded.status_code == 200 and len(bounded.json()["rows"]) == 30, bounded.text
    assert sum(p["served_by"] != 1 for p in bounded.json()["partitions"]) == 2
    ignored = _post(
        base,
        "/query",
        b'{"ksql": "SELECT * FROM clicks WHERE user = \'u3\';", '
        b'"streamsProperties": {"ksql.streams.auto.offset.reset": "earliest"}}',
    )
    assert ignored.status_code == 200 and ignored.json()[1]["row"]["columns"] == ["u3", 3]

    # An oversized request head is refused before any route runs.
    port = next(s.http_port for s in cluster.servers if s.node_id == 1)
    head = b"POST /v1/query HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (200 * 1024) + b"\r\n\r\n"
    answer = _raw_request(port, head)
    assert answer.startswith(b"HTTP/1.1 431"), answer[:200]

    # The query routes answered in front of FastAPI are still documented, with their bodies.
    paths = httpx.get(f"{base}/openapi.json").json()["paths"]
    for path, field in (("/v1/query", "sql"), ("/query", "ksql")):
        schema = paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert field in schema["properties"] and schema["additionalProperties"] is False, schema

    # Nothing above disturbed the cluster: no server was fenced, no active moved.
    assert _placement(base, "clicks") == placement_before
    ok = _post(base, "/v1/query", b'{"sql": "SELECT * FROM clicks WHERE user = \'u7\'"}')
    assert ok.status_code == 200 and ok.json()["rows"] == [["u7", 7]]


def test_nan_and_infinities_are_written_and_read_back_on_every_endpoint(start_cluster: StartCluster) -> None:
    running = start_cluster(3)
    cluster = running.cluster
    running.run(_setup(running, "scores", partitions=2, standbys=1, rows=0))

    async def write() -> None:
        async with TableWriter(
            cluster.addresses(), "scores", cluster_id=cluster.cluster_id, secret=cluster.secret
        ) as writer:
            await writer.upsert(
                [
                    {"user": "nan", "score": math.nan, "history": [1.5, math.inf, -math.inf]},
                    {"user": "plain", "score": 1.5, "history": [2.0]},
                    {"user": "deep", "score": 0.0, "history": [{"x": -math.inf}]},
                ]
            )

    running.run(write())
    # max_lag 0: a standby that has not applied the rows yet refuses instead of answering without them.
    for node in (1, 2, 3):
        base = _http(cluster, node)
        reply = _post(base, "/v1/query", b'{"sql": "SELECT user, score, history FROM scores", "max_lag": 0}')
        assert reply.status_code == 200, reply.text
        rows = {row[0]: row[1:] for row in reply.json()["rows"]}
        assert rows == {
            "deep": [0.0, [{"x": "-Infinity"}]],
            "nan": ["NaN", [1.5, "Infinity", "-Infinity"]],
            "plain": [1.5, [2.0]],
        }
        ksql = _post(
            base,
            "/query",
            b'{"ksql": "SELECT * FROM scores WHERE user = \'nan\';", "streamsProperties": {"max_lag": 0}}',
        )
        assert ksql.status_code == 200, ksql.text
        header, row = ksql.json()
        assert row["row"]["columns"] == ["nan", "NaN", [1.5, "Infinity", "-Infinity"]]
        # The column is still a DOUBLE: only its JSON spelling is a string.
        assert "`score` DOUBLE" in header["header"]["schema"], header

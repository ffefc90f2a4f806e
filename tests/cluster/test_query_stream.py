"""ksqlDB's streaming API (`POST /query-stream`, `/close-query`, `/query` by Accept) over HTTP/2 and
HTTP/1.1 between real server processes: an unmodified ksqlDB client library from PyPI (ksql-python-ng,
pinned in the dev extra, over HTTP/2; over HTTP/1.1 from a venv of its own, as its HTTP/1.1 path
cannot run on httpx 0.28) and raw requests
over both protocols (httpx over h2 with prior knowledge and over HTTP/1.1; curl by upgrade)."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from ksql import KSQLAPI

from .conftest import StartCluster
from .test_pull_queries import _http, _placement, _setup

DELIMITED = "application/vnd.ksqlapi.delimited.v1"
GENERIC = "generic_error"
ROWS = 40
# ksql-python-ng in a venv of its own (Makefile: ksql-client), for its HTTP/1.1 path.
KSQL_CLIENT = Path(__file__).resolve().parents[2] / ".venv" / "ksql-client" / "bin" / "python"


def _h2() -> httpx.Client:
    """HTTP/2 only, cleartext with prior knowledge: how ksqlDB's Java client and ksql-python-ng connect."""
    return httpx.Client(http1=False, http2=True, timeout=30.0)


def _lines(response: httpx.Response) -> list[Any]:
    assert response.text.endswith("\n"), response.text
    return [json.loads(line) for line in response.text.splitlines()]


def _ready(base: str, table: str) -> None:
    """Every partition answers a bounded read (the standbys have caught up)."""
    _placement(base, table)
    end = time.monotonic() + 15.0
    while True:
        reply = httpx.post(
            f"{base}/v1/query", json={"sql": f"SELECT * FROM {table}", "max_lag": 0}, timeout=10.0
        )
        if (reply.status_code == 200 and len(reply.json()["rows"]) == ROWS) or time.monotonic() > end:
            assert reply.status_code == 200, reply.text
            return
        time.sleep(0.1)


def test_ksql_python_ng_runs_pull_queries_over_http2_and_http11(start_cluster: StartCluster) -> None:
    running = start_cluster(3)
    running.run(_setup(running, "clicks", partitions=3, standbys=1, rows=ROWS))
    base = _http(running.cluster, 1)
    _ready(base, "clicks")

    # check_version=False: the version check (GET /info) and the library's HTTP/1.1 query path pass
    # `cert=` to httpx's top-level functions, which httpx 0.28 removed (TypeError before any request).
    api = KSQLAPI(base, check_version=False)

    # HTTP/2 (prior knowledge) to /query-stream; the library parses the delimited rows frame by frame.
    one = list(api.query("SELECT * FROM clicks WHERE user = 'u7'", use_http2=True, parse=True))
    assert one == [{"user": "u7", "clicks": 7}]
    keys = ", ".join(f"'u{i}'" for i in range(0, ROWS, 3))
    many = list(
        api.query(
            f"SELECT user, clicks FROM clicks WHERE user IN ({keys})",
            use_http2=True,
            parse=True,
            stream_properties={"ksql.query.pull.max.allowed.offset.lag": 0},
        )
    )
    assert sorted(many, key=lambda r: r["clicks"]) == [
        {"user": f"u{i}", "clicks": i} for i in range(0, ROWS, 3)
    ]
    scan = list(api.query("SELECT * FROM clicks", use_http2=True, parse=True))
    assert sorted(r["clicks"] for r in scan) == list(range(ROWS))
    # Unparsed, it yields the header and each row as it came: one DATA frame each.
    raw = list(api.query("SELECT * FROM clicks WHERE user IN ('u1', 'u2')", use_http2=True))
    header = json.loads(raw[0])
    assert header["columnNames"] == ["user", "clicks"]
    assert header["columnTypes"] == ["STRING", "BIGINT"]
    assert sorted(json.loads(chunk) for chunk in raw[1:]) == [["u1", 1], ["u2", 2]]

    # A pull query is complete when answered: /close-query (over HTTP/1.1 here) has nothing to close; the
    # library reads ksqlDB's 400 as False.
    assert api.close_query(header["queryId"]) is False

    # Errors reach the library with ksqlDB's codes.
    with pytest.raises(ValueError, match="404") as missing:
        list(api.query("SELECT * FROM nope WHERE user = 'u1'", use_http2=True, parse=True))
    assert '"error_code":40400' in str(missing.value)

    # HTTP/1.1: the same library, unmodified, from its own venv (`make ksql-client`), where httpx < 0.28
    # lets its HTTP/1.1 path run: the version check (GET /info), then `/query`, whose JSON array it yields
    # in chunks as they came (its parser is for /query-stream's format, so the rows are parsed here).
    if not KSQL_CLIENT.exists():
        pytest.skip(f"{KSQL_CLIENT} is missing: `make ksql-client` makes it (make test does)")
    script = (
        "import json, sys; from ksql import KSQLAPI\n"
        "api = KSQLAPI(sys.argv[1])\n"  # with the version check
        "lag = {'ksql.query.pull.max.allowed.offset.lag': 0}\n"
        "chunks = api.query(sys.argv[2], use_http2=False, stream_properties=lag)\n"
        "print(json.dumps(json.loads(''.join(chunks))))\n"
    )
    ran = subprocess.run(
        [str(KSQL_CLIENT), "-c", script, base, "SELECT * FROM clicks WHERE user IN ('u4', 'u5');"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ran.returncode == 0, ran.stderr
    answer = json.loads(ran.stdout)
    assert answer[0]["header"]["schema"] == "`user` STRING KEY, `clicks` BIGINT"
    assert sorted(item["row"]["columns"] for item in answer[1:]) == [["u4", 4], ["u5", 5]]


def test_query_stream_formats_errors_and_properties_over_both_protocols(start_cluster: StartCluster) -> None:
    running = start_cluster(3)
    running.run(_setup(running, "clicks", partitions=3, standbys=1, rows=ROWS))
    base = _http(running.cluster, 2)
    _ready(base, "clicks")
    point = {"sql": "SELECT * FROM clicks WHERE user = 'u3';"}
    expected_header = {"columnNames": ["user", "clicks"], "columnTypes": ["STRING", "BIGINT"]}

    with _h2() as h2, httpx.Client(timeout=30.0) as h1:
        for client, version in ((h2, "HTTP/2"), (h1, "HTTP/1.1")):
            # The default (no Accept, or */*): delimited, a header line then one line per row.
            for headers in ({}, {"Accept": "*/*"}, {"Accept": DELIMITED}):
                reply = client.post(f"{base}/query-stream", json=point, headers=headers)
                assert reply.http_version == version
                assert reply.status_code == 200, reply.text
                assert reply.headers["content-type"] == DELIMITED
                header, *rows = _lines(reply)
                assert {k: header[k] for k in expected_header} == expected_header
                assert isinstance(header["queryId"], str) and header["queryId"]
                assert rows == [["u3", 3]]
            if version == "HTTP/1.1":
                assert reply.headers["transfer-encoding"] == "chunked"  # as ksqlDB on HTTP/1.1
            # application/json: the header and the rows as one JSON array.
            reply = client.post(f"{base}/query-stream", json=point, headers={"Accept": "application/json"})
            assert reply.status_code == 200
            assert reply.headers["content-type"] == "application/json"
            array = reply.json()
            assert array[1:] == [["u3", 3]] and array[0]["columnNames"] == ["user", "clicks"]
            # application/vnd.ksql.v1+json: the /query format (ksqlDB's JsonStreamedRowResponseWriter).
            reply = client.post(
                f"{base}/query-stream", json=point, headers={"Accept": "application/vnd.ksql.v1+json"}
            )
            assert reply.json()[1:] == [{"row": {"columns": ["u3", 3]}}]
            # Weights choose: delimited is preferred over JSON here.
            reply = client.post(
                f"{base}/query-stream",
                json=point,
                headers={"Accept": f"application/json;q=0.5, {DELIMITED};q=0.9"},
            )
            assert reply.headers["content-type"] == DELIMITED

            # /query honours Accept as ksqlDB's does: its own format by default, delimited when asked.
            ksql = {"ksql": "SELECT * FROM clicks WHERE user = 'u3';"}
            reply = client.post(f"{base}/query", json=ksql)
            assert reply.http_version == version
            assert reply.json()[1:] == [{"row": {"columns": ["u3", 3]}}]
            reply = client.post(f"{base}/query", json=ksql, headers={"Accept": DELIMITED})
            assert reply.headers["content-type"] == DELIMITED
            assert _lines(reply)[1:] == [["u3", 3]]

            # Errors: ksqlDB's shapes and codes, the same on both protocols.
            cases: list[tuple[str, bytes, dict[str, str], int, str, int, str]] = [
                ("/query-stream", b'{"sql": "SELECT', {}, 400, "generic_error", 40000, "malformed JSON"),
                ("/query-stream", b'{"ksql": "SELECT 1"}', {}, 400, "generic_error", 40000, "unknown field"),
                ("/query-stream", b"{}", {}, 400, "generic_error", 40000, "sql: Field required"),
                (
                    "/query-stream",
                    b'{"sql": "SELECT * FROM nope WHERE user = \'u1\'"}',
                    {},
                    404,
                    "statement_error",
                    40400,
                    "nope",
                ),
                (
                    "/query-stream",
                    b'{"sql": "SELECT * FROM clicks WHERE user = 5"}',
                    {},
                    400,
                    "statement_error",
                    40001,
                    "user",
                ),
                (
                    "/query-stream",
                    b'{"sql": "SELECT * FROM clicks", "properties": {"max_lags": 1}}',
                    {},
                    400,
                    "statement_error",
                    40001,
                    "unknown property 'max_lags'",
                ),
                (
                    "/query-stream",
                    b'{"sql": "SELECT * FROM clicks", "properties": '
                    b'{"ksql.query.pull.max.allowed.offset.lag": "x"}}',
                    {"Accept": DELIMITED},
                    400,
                    "statement_error",
                    40001,
                    "ksql.query.pull.max.allowed.offset.lag='x'",
                ),
                (
                    "/query-stream",
                    b'{"sql": "SELECT 1"}',
                    {"Accept": "text/html"},
                    406,
                    "generic_error",
                    40600,
                    "",
                ),
                ("/query", b'{"ksql": "SELECT 1"}', {"Accept": "text/csv"}, 406, "generic_error", 40600, ""),
                (
                    "/close-query",
                    b'{"queryId": "q1"}',
                    {},
                    400,
                    "generic_error",
                    40000,
                    "No query with id q1",
                ),
                ("/close-query", b"[1]", {}, 400, "generic_error", 40000, "malformed request"),
            ]
            for path, body, headers, status, kind, code, message in cases:
                reply = client.post(f"{base}{path}", content=body, headers=headers)
                assert reply.status_code == status, (version, path, body, reply.text)
                error = reply.json()
                assert (error["@type"], error["error_code"]) == (kind, code), (version, body, error)
                assert message in error["message"], (version, body, error)
                if kind == "statement_error":
                    assert "statementText" in error and error["entities"] == []

            # Oversized: 413/41300 before the rest is read.
            big = b'{"sql": "' + b"x" * (5 * 1024 * 1024) + b'"}'
            reply = client.post(f"{base}/query-stream", content=big)
            assert (reply.status_code, reply.json()["error_code"]) == (413, 41300), version

            # The same properties mean the same on every endpoint: one parser, one service.
            token = httpx.post(f"{base}/v1/query", json={"sql": "SELECT * FROM clicks"}).json()[
                "consistency_token"
            ]
            for properties, status in (
                ({"ksql.query.pull.max.allowed.offset.lag": 0}, 200),
                ({"ksql.query.pull.enable.standby.reads": "false"}, 200),
                ({"consistency_token": token}, 200),
                ({"ksql.query.pull.enable.standby.reads": "maybe"}, 400),
                ({"consistency_token": "hs1.@@"}, 400),
            ):
                answers = [
                    client.post(f"{base}/query-stream", json={**point, "properties": properties}),
                    client.post(
                        f"{base}/query", json={"ksql": point["sql"], "streamsProperties": properties}
                    ),
                ]
                for reply in answers:
                    assert reply.status_code == status, (version, properties, reply.text)
                if status == 400:
                    assert answers[0].json()["message"] == answers[1].json()["message"]
                else:
                    assert _lines(answers[0])[1:] == [["u3", 3]]

    # After all of that, HTTP/1.1 keep-alive still works as before on the same port.
    with httpx.Client(timeout=10.0) as h1:
        for i in range(5):
            reply = h1.post(f"{base}/query", json={"ksql": f"SELECT * FROM clicks WHERE user = 'u{i}';"})
            assert reply.http_version == "HTTP/1.1"
            assert reply.json()[1:] == [{"row": {"columns": [f"u{i}", i]}}]


def test_curl_upgrade_and_prior_knowledge(start_cluster: StartCluster) -> None:
    running = start_cluster(1)
    running.run(_setup(running, "clicks", partitions=2, standbys=0, rows=ROWS))
    base = _http(running.cluster, 1)
    _ready(base, "clicks")
    body = "{\"sql\": \"SELECT * FROM clicks WHERE user IN ('u1', 'u2')\"}"
    for mode in ("--http2", "--http2-prior-knowledge"):  # --http2: HTTP/1.1 with Upgrade: h2c, then 101
        done = subprocess.run(
            ["curl", "-sS", "-v", mode, "-d", body, f"{base}/query-stream"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        )
        assert "< HTTP/2 200" in done.stderr, done.stderr
        if mode == "--http2":
            assert "< HTTP/1.1 101 Switching Protocols" in done.stderr
        header, *rows = (json.loads(line) for line in done.stdout.splitlines())
        assert header["columnNames"] == ["user", "clicks"]
        assert sorted(rows) == [["u1", 1], ["u2", 2]]
    # The upgrade path for a GET served by FastAPI too.
    done = subprocess.run(
        ["curl", "-sS", "-v", "--http2", f"{base}/info"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    )
    assert "< HTTP/2 200" in done.stderr and json.loads(done.stdout)["KsqlServerInfo"]["serverId"] == 1

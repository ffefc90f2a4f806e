"""QueryRoutes (http/endpoints.py) on a real uvicorn server with hotstate's protocol: the query endpoints are
answered in front of the framework over HTTP/1.1 keep-alive and over HTTP/2 alike, in the format the Accept
header picks, and the delimited format leaves one line per chunk. The endpoints here only record what they
were asked (the query path itself runs between real servers in tests/cluster/test_query_stream.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any, cast

import httpx

from hotstate.server.http.endpoints import QueryRoutes
from hotstate.server.http.queries import DELIMITED, KSQL_V1_JSON, Answer, QueryEndpoints

from .helpers import serving

Message = MutableMapping[str, Any]


class _Recorder:
    """Stands in for QueryEndpoints: records (endpoint, body, format) and answers in that format."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, bytes, str | None]] = []

    async def native(self, body: bytes) -> Answer:
        self.calls.append(("native", body, None))
        return 200, b'{"rows":[]}'

    async def ksql(self, body: bytes, media: str = KSQL_V1_JSON) -> Answer:
        self.calls.append(("ksql", body, media))
        return (200, [b'{"h":1}\n', b"[1]\n"]) if media == DELIMITED else (200, b"[]")

    async def stream(self, body: bytes, media: str = DELIMITED) -> Answer:
        self.calls.append(("stream", body, media))
        return (200, [b'{"h":1}\n', b"[1]\n", b"[2]\n"]) if media == DELIMITED else (200, b"[]")

    async def close_query(self, body: bytes) -> Answer:
        self.calls.append(("close", body, None))
        return 400, b"{}"

    def changes(self, body: bytes) -> Answer:
        self.calls.append(("changes", body, None))
        return 200, _Stream([b"a\n", b"b\n"])

    def changes_sse(self, table: str, query_string: bytes, headers: list[tuple[bytes, bytes]]) -> Answer:
        self.calls.append(("sse", table.encode() + b"?" + query_string, None))
        return 200, _Stream([b"data: 1\n\n"])


class _Stream:
    """A streaming answer: its chunks, one ASGI message each, then the end."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.closed = False

    async def run(self, send: Any, receive: Any, abort: Any = None) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"x/y")]})
        for chunk in self.chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    def close(self) -> None:
        self.closed = True


@asynccontextmanager
async def _server() -> AsyncIterator[tuple[str, _Recorder, list[str]]]:
    recorder = _Recorder()
    framework: list[str] = []  # paths that reached the app behind QueryRoutes

    async def app(
        scope: MutableMapping[str, Any], receive: Callable[[], Awaitable[Message]], send: Any
    ) -> None:
        framework.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]})
        await send({"type": "http.response.body", "body": b"{}"})

    routes = QueryRoutes(cast(QueryEndpoints, recorder), app)
    async with serving(routes) as (port, _):
        yield f"http://127.0.0.1:{port}", recorder, framework


def test_the_query_endpoints_are_answered_in_front_of_the_framework_on_both_protocols() -> None:
    async def run() -> None:
        async with _server() as (base, recorder, framework):
            for client in (httpx.AsyncClient(), httpx.AsyncClient(http1=False, http2=True)):
                async with client:
                    for i in range(3):  # one keep-alive connection (HTTP/1.1) or one HTTP/2 connection
                        reply = await client.post(f"{base}/query", content=b"q%d" % i)
                        assert reply.status_code == 200 and reply.text == "[]"
                    reply = await client.post(f"{base}/query-stream", content=b"s")
                    assert reply.headers["content-type"] == DELIMITED
                    assert reply.text == '{"h":1}\n[1]\n[2]\n'
                    reply = await client.post(f"{base}/query", content=b"d", headers={"Accept": DELIMITED})
                    assert reply.text == '{"h":1}\n[1]\n'
                    reply = await client.post(
                        f"{base}/query-stream", content=b"j", headers={"Accept": "text/x"}
                    )
                    assert (reply.status_code, reply.json()["error_code"]) == (406, 40600)
                    assert (await client.post(f"{base}/v1/query", content=b"n")).status_code == 200
                    assert (await client.post(f"{base}/close-query", content=b"c")).status_code == 400
                    assert (await client.get(f"{base}/info")).text == "{}"
            expected = [
                ("ksql", b"q0", KSQL_V1_JSON),
                ("ksql", b"q1", KSQL_V1_JSON),
                ("ksql", b"q2", KSQL_V1_JSON),
                ("stream", b"s", DELIMITED),
                ("ksql", b"d", DELIMITED),
                ("native", b"n", None),
                ("close", b"c", None),
            ]
            assert recorder.calls == expected * 2
            assert framework == ["/info", "/info"]  # only what QueryRoutes does not answer

    asyncio.run(run())


def test_streams_and_event_streams_are_answered_in_front_of_the_framework_on_both_protocols() -> None:
    async def run() -> None:
        async with _server() as (base, recorder, framework):
            for client in (httpx.AsyncClient(), httpx.AsyncClient(http1=False, http2=True)):
                async with client:
                    reply = await client.post(f"{base}/v1/changes", content=b"c")
                    assert reply.text == "a\nb\n"
                    reply = await client.get(f"{base}/v1/tables/my%20t/changes?from=x")
                    assert reply.text == "data: 1\n\n"
                    assert (await client.get(f"{base}/v1/tables/a/b/changes")).text == "{}"
            assert recorder.calls == [("changes", b"c", None), ("sse", b"my t?from=x", None)] * 2
            assert framework == ["/v1/tables/a/b/changes"] * 2  # not an endpoint's path

    asyncio.run(run())


def test_delimited_lines_leave_as_one_chunk_each_on_http1() -> None:
    async def run() -> None:
        async with _server() as (base, _, _):
            port = int(base.rsplit(":", 1)[1])
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(b"POST /query-stream HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n\r\ns")
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            assert b"transfer-encoding: chunked" in head.lower()
            body = await asyncio.wait_for(reader.readuntil(b"0\r\n\r\n"), 5.0)
            writer.close()
            assert body == b'8\r\n{"h":1}\n\r\n4\r\n[1]\n\r\n4\r\n[2]\n\r\n0\r\n\r\n'

    asyncio.run(run())

"""The direct lane (direct_lane.py): pull queries answered by hotstate's HTTP/1.1 protocol without ASGI, on a
real uvicorn server in this process. Its answers are byte for byte those of the ASGI way, pipelined requests
keep their order across both ways, and what it does not take (Expect: 100-continue, HTTP/1.0, a guard that
must check credentials first) goes the ASGI way. The endpoints stand in for QueryEndpoints (the query path
itself runs between real servers in tests/cluster)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any, cast

import uvicorn

from hotstate.server.coordinator import CURRENT_USER
from hotstate.server.http import direct_lane
from hotstate.server.http.asgi import Scope, Send
from hotstate.server.http.direct_lane import limited_protocol
from hotstate.server.http.endpoints import QueryRoutes
from hotstate.server.http.limits import HttpLimits
from hotstate.server.http.queries import (
    DELIMITED,
    KSQL_V1_JSON,
    Answer,
    Endpoint,
    QueryEndpoints,
)

from .helpers import serving

Message = MutableMapping[str, Any]


class _Endpoints:
    """Stands in for QueryEndpoints. The body says how to answer: `now:<x>` at once, `wait:<ms>:<x>` after a
    wait (as a forwarded query), `boom` raises. Each answer names the user the query ran as."""

    def __init__(self) -> None:
        self.users: list[str] = []
        self.waiting = asyncio.Event()  # a `wait:` answer is under way

    def _answer(self, body: bytes, label: bytes) -> Answer | Awaitable[Answer]:
        if body == b"boom":
            raise RuntimeError("a bug")
        self.users.append(CURRENT_USER.get())
        user = CURRENT_USER.get().encode()
        if body.startswith(b"wait:"):
            _, ms, rest = body.split(b":", 2)

            async def later() -> Answer:
                self.waiting.set()
                await asyncio.sleep(int(ms) / 1000)
                return 200, b'{"%s":"%s","user":"%s"}' % (label, rest, CURRENT_USER.get().encode())

            return later()
        return 200, b'{"%s":"%s","user":"%s"}' % (label, body, user)

    def native(self, body: bytes) -> Answer | Awaitable[Answer]:
        return self._answer(body, b"native")

    def ksql(self, body: bytes, media: str = KSQL_V1_JSON) -> Answer | Awaitable[Answer]:
        if media == DELIMITED:
            return 200, [b"[1]\n"]
        return self._answer(body, media.encode())

    def stream(self, body: bytes, media: str = "") -> Answer | Awaitable[Answer]:
        return 200, [b"[1]\n"]

    async def close_query(self, body: bytes) -> Answer:
        return 400, b"{}"

    def changes(self, body: bytes) -> Answer:
        return 404, b"{}"


class _Guard:
    """Admits a request with `Authorization: ok` as alice, at once; any other goes the ASGI way, where
    `admit` lets it through as bob."""

    async def admit(self, scope: Scope, send: Send) -> bool:
        CURRENT_USER.set("bob")
        return True

    def admitted_now(self, method: str, path: str, headers: Iterable[tuple[bytes, bytes]]) -> str | None:
        return "alice" if (b"authorization", b"ok") in list(headers) else None


class _Routes(QueryRoutes):
    """QueryRoutes that counts the requests it sent the direct way."""

    directed = 0

    def direct(self, url: bytes, headers: list[tuple[bytes, bytes]]) -> tuple[Endpoint, str] | None:
        chosen = super().direct(url, headers)
        self.directed += chosen is not None
        return chosen


async def _other(scope: Message, receive: Callable[[], Awaitable[Message]], send: Any) -> None:
    """The framework behind QueryRoutes: answers everything else with its path."""
    body = scope["path"].encode()
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]}
    )
    await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def _server(
    direct: bool = True, guard: _Guard | None = None
) -> AsyncIterator[tuple[int, _Routes, _Endpoints, uvicorn.Server]]:
    endpoints = _Endpoints()
    routes = _Routes(cast(QueryEndpoints, endpoints), _other, guard)
    protocol = limited_protocol(HttpLimits(), None, routes if direct else None)
    async with serving(routes, http=protocol) as (port, server):
        yield port, routes, endpoints, server


def _post(path: str, body: bytes, *headers: bytes, version: bytes = b"1.1") -> bytes:
    head = b"POST %s HTTP/%s\r\nHost: x\r\nContent-Length: %d\r\n" % (path.encode(), version, len(body))
    return head + b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body


async def _responses(port: int, request: bytes, count: int) -> list[bytes]:
    """Send `request` (one or several, pipelined) in one write; read `count` responses (date removed)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(request)
    await writer.drain()
    out = []
    for _ in range(count):
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
        length = int(re.search(rb"content-length: (\d+)", head, re.IGNORECASE).group(1))  # type: ignore[union-attr]
        body = await reader.readexactly(length)
        out.append(re.sub(rb"date: [^\r]*\r\n", b"", head) + body)
    writer.close()
    return out


REQUESTS = [
    _post("/v1/query", b"now:a"),
    _post("/v1/query", b"wait:20:b"),
    _post("/v1/query", b"boom"),
    _post("/query", b"now:c"),
    _post("/query", b"wait:5:d", b"Accept: application/json"),
    _post("/query", b"now:e", b"Accept: text/html"),  # 406, in ksqlDB's error shape
    _post("/v1/query?x=1", b"now:f"),  # not a path the direct lane takes: the ASGI way
    b"GET /v1/tables HTTP/1.1\r\nHost: x\r\n\r\n",
]


def test_direct_answers_are_byte_for_byte_those_of_the_asgi_way_and_pipelined_ones_keep_their_order() -> None:
    async def run() -> list[list[bytes]]:
        answers = []
        for direct in (True, False):
            async with _server(direct) as (port, routes, _, _):
                one_by_one = [(await _responses(port, request, 1))[0] for request in REQUESTS]
                pipelined = await _responses(port, b"".join(REQUESTS), len(REQUESTS))
                assert pipelined == one_by_one
                answers.append(one_by_one)
                # 6 of the 8 one by one; pipelined, those read while the second waits queue the ASGI way
                assert routes.directed == (6 + 2 if direct else 0)
        return answers

    direct, asgi = asyncio.run(run())
    assert direct == asgi
    # uvicorn's default headers (here its server header) first, as it writes them
    assert direct[0].startswith(b"HTTP/1.1 200 OK\r\nserver: uvicorn\r\ncontent-type: application/json\r\n")
    assert direct[0].endswith(b'{"native":"now:a","user":""}')
    assert direct[1].endswith(b'{"native":"b","user":""}')
    assert direct[2].startswith(b"HTTP/1.1 500") and b"internal error: RuntimeError" in direct[2]
    assert direct[5].startswith(b"HTTP/1.1 406") and b"cannot answer in 'text/html'" in direct[5]
    assert direct[7].endswith(b"/v1/tables")


def test_what_the_direct_lane_does_not_take_goes_the_asgi_way() -> None:
    async def raw(port: int, request: bytes, end: bytes) -> bytes:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(request)
        answer = await asyncio.wait_for(reader.readuntil(end), 5.0)
        writer.close()
        return answer

    async def run() -> None:
        async with _server() as (port, routes, _, _):
            expecting = await raw(port, _post("/v1/query", b"now:a", b"Expect: 100-continue"), b"}")
            assert expecting.startswith(b"HTTP/1.1 100 Continue"), expecting
            old = await raw(port, _post("/v1/query", b"now:a", version=b"1.0"), b"}")
            assert b"connection: close" in old and old.endswith(b'"user":""}')
            delimited = b"Accept: application/vnd.ksqlapi.delimited.v1"
            chunked = await raw(port, _post("/query", b"x", delimited), b"0\r\n\r\n")
            assert b"transfer-encoding: chunked" in chunked and b"[1]" in chunked
            assert routes.directed == 0

    asyncio.run(run())


def test_a_body_over_the_limit_is_refused_413_and_the_connection_goes_on(monkeypatch: Any) -> None:
    monkeypatch.setattr(direct_lane, "MAX_BODY_BYTES", 8)

    async def run() -> None:
        async with _server() as (port, _, _, _):
            big, small = _post("/v1/query", b"now:" + b"x" * 20), _post("/v1/query", b"now:a")
            too_large, answered = await _responses(port, big + small, 2)
            assert too_large.startswith(b"HTTP/1.1 413")
            assert b'"error_code":41300' in too_large and b"larger than 8 bytes" in too_large
            assert answered.endswith(b'{"native":"now:a","user":""}')

    asyncio.run(run())


def test_queries_run_as_the_user_the_guard_admitted_and_the_protocol_keeps_none() -> None:
    async def run() -> None:
        async with _server(guard=_Guard()) as (port, routes, endpoints, _):
            now = _post("/v1/query", b"now:a", b"Authorization: ok")
            later = _post("/v1/query", b"wait:5:b", b"Authorization: ok")
            unknown = _post("/v1/query", b"now:c", b"Authorization: check-me")
            answers = [(await _responses(port, request, 1))[0] for request in (now, later, unknown, now)]
            assert [a.rsplit(b'"user":', 1)[1] for a in answers] == [
                b'"alice"}',
                b'"alice"}',
                b'"bob"}',
                b'"alice"}',
            ]
            assert routes.directed == 3
            assert endpoints.users == ["alice", "alice", "bob", "alice"]
        assert CURRENT_USER.get() == ""

    asyncio.run(run())


def test_a_shutdown_while_a_direct_answer_waits_sends_it_and_closes_the_connection() -> None:
    async def run() -> None:
        async with _server() as (port, _, endpoints, server):
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.write(_post("/v1/query", b"wait:300:late"))
            await writer.drain()
            async with asyncio.timeout(5):
                await endpoints.waiting.wait()
            server.should_exit = True
            answer = await asyncio.wait_for(reader.read(), 5.0)  # to the end: the server closes
            writer.close()
            assert answer.startswith(b"HTTP/1.1 200 OK") and b"connection: close\r\n" in answer
            assert answer.endswith(b'{"native":"late","user":""}')

    asyncio.run(run())

"""HTTP/2 on the HTTP port (http2.py, handed over by h2c_handoff.py), on a real uvicorn server in this process
with a small ASGI app: prior knowledge and upgrade, one DATA frame per body message, flow control, many
streams, limits, and HTTP/1.1 keep-alive left on uvicorn's path. Also the Accept negotiation of ksqlDB's
query endpoints (query_http.accepted)."""

from __future__ import annotations

import asyncio
import base64
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine, MutableMapping
from contextlib import AbstractAsyncContextManager
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import httpx
import pytest
import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from hotstate.server.http.direct_lane import LimitedHttpToolsProtocol
from hotstate.server.http.http2 import Http2Protocol
from hotstate.server.http.limits import HttpLimits
from hotstate.server.http.queries import (
    DELIMITED,
    JSON,
    KSQL_V1_JSON,
    QUERY_PRODUCES,
    STREAM_PRODUCES,
    accepted,
)

from .helpers import serving

Scope = MutableMapping[str, Any]
Test = Callable[..., Coroutine[Any, Any, None]]
BIG = 1024 * 1024


async def _until(condition: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
    """Poll what uvicorn gives no event for (its connection and task sets), within a deadline."""
    async with asyncio.timeout(timeout_s):
        while not condition():
            await asyncio.sleep(0.01)


def _sync(test: Test) -> Callable[..., None]:
    """The test run on its own event loop (pytest takes the fixtures from the wrapped signature)."""

    @functools.wraps(test)
    def run(*args: Any, **kwargs: Any) -> None:
        asyncio.run(test(*args, **kwargs))

    return run


async def _app(
    scope: Scope,
    receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
    send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
) -> None:
    if scope["path"] == "/ignore":  # answers without reading the body, which has arrived by then
        await asyncio.sleep(0.02)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ignored"})
        return
    body = b""
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body += message.get("body", b"")
        more = message.get("more_body", False)
    if scope["path"] == "/listen":  # as Starlette's StreamingResponse: listens for a disconnect meanwhile
        waiter = asyncio.ensure_future(receive())
        await asyncio.sleep(0.05)
        blocked = not waiter.done()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"blocked" if blocked else b"returned at once"})
        message = await asyncio.wait_for(waiter, 1.0)
        assert message["type"] == "http.disconnect", message
        return
    if scope["path"] == "/lines":  # three body messages
        await send(
            {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}
        )
        for i in range(3):
            await send({"type": "http.response.body", "body": b"line %d\n" % i, "more_body": i < 2})
        return
    if scope["path"] == "/big":
        answer = b"x" * BIG
    elif scope["path"] == "/slow":
        await asyncio.sleep(0.05)
        answer = b"slow"
    else:
        answer = b"%s %s %s %d" % (
            scope["http_version"].encode(),
            scope["method"].encode(),
            scope["path"].encode(),
            len(body),
        )
    headers = [(b"content-type", b"text/plain"), (b"content-length", b"%d" % len(answer))]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": answer})


def _server() -> AbstractAsyncContextManager[tuple[int, uvicorn.Server]]:
    return serving(_app)


class _RawH2:
    """A client-side h2 connection on a socket, to see frames as the server sends them."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, window: int) -> None:
        self.reader = reader
        self.writer = writer
        config = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.conn = h2.connection.H2Connection(config=config)
        self.conn.local_settings = h2.settings.Settings(
            client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window}
        )

    async def events(self) -> list[h2.events.Event]:
        self.writer.write(self.conn.data_to_send())
        data = await asyncio.wait_for(self.reader.read(65536), 5.0)
        if not data:
            raise ConnectionError("closed")
        return self.conn.receive_data(data)


async def _open_raw(port: int, window: int = 65535) -> _RawH2:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    raw = _RawH2(reader, writer, window)
    raw.conn.initiate_connection()
    return raw


def _request(raw: _RawH2, path: str, body: bytes = b"", end: bool = True) -> int:
    stream_id = raw.conn.get_next_available_stream_id()
    headers = [(b":method", b"POST"), (b":path", path.encode()), (b":scheme", b"http"), (b":authority", b"t")]
    raw.conn.send_headers(stream_id, headers, end_stream=end and not body)
    if body:
        raw.conn.send_data(stream_id, body, end_stream=end)
    return stream_id


@_sync
async def test_prior_knowledge_each_body_message_is_its_own_data_frame() -> None:
    async with _server() as (port, _):
        raw = await _open_raw(port)
        stream_id = _request(raw, "/lines", b"{}")
        frames: list[bytes] = []
        status = None
        ended = False
        while not ended:
            for event in await raw.events():
                if isinstance(event, h2.events.ResponseReceived):
                    status = dict(event.headers)[b":status"]
                elif isinstance(event, h2.events.DataReceived) and event.stream_id == stream_id:
                    frames.append(event.data)
                    raw.conn.acknowledge_received_data(event.flow_controlled_length, stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    ended = True
        raw.writer.close()
    assert status == b"200"
    assert frames == [b"line 0\n", b"line 1\n", b"line 2\n"]


@_sync
async def test_a_large_answer_waits_for_the_clients_window() -> None:
    async with _server() as (port, _):
        raw = await _open_raw(port, window=16384)  # the client's receive window: 64 times smaller
        stream_id = _request(raw, "/big")
        received = 0
        ended = False
        while not ended:
            for event in await raw.events():
                if isinstance(event, h2.events.DataReceived):
                    received += len(event.data)
                    raw.conn.acknowledge_received_data(event.flow_controlled_length, stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    ended = True
        raw.writer.close()
    assert received == BIG


@_sync
async def test_many_concurrent_streams_on_one_connection_and_http1_beside_it() -> None:
    async with _server() as (port, server):
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(http1=False, http2=True) as h2c:
            replies = await asyncio.gather(*(h2c.post(f"{base}/slow", content=b"b" * i) for i in range(60)))
            assert all(r.http_version == "HTTP/2" and r.text == "slow" for r in replies)
            reply = await h2c.post(f"{base}/echo", content=b"12345")
            assert reply.text == "2 POST /echo 5"
            # uvicorn types its connections as its own protocols; ours switch to Http2Protocol.
            connections: list[object] = list(server.server_state.connections)
            assert [type(c) for c in connections] == [Http2Protocol]
        # HTTP/1.1 keep-alive: several requests on one connection, all on uvicorn's httptools path.
        async with httpx.AsyncClient() as h1:
            for i in range(3):
                reply = await h1.post(f"{base}/echo", content=b"a" * i)
                assert (reply.http_version, reply.text) == ("HTTP/1.1", f"1.1 POST /echo {i}")
                assert [type(c) for c in server.server_state.connections] == [LimitedHttpToolsProtocol]


@_sync
async def test_after_the_body_receive_waits_for_the_end_and_unread_bodies_return_the_window() -> None:
    async with _server() as (port, server):
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(http1=False, http2=True, timeout=10.0) as h2c:
            reply = await h2c.post(f"{base}/listen", content=b"{}")
            assert reply.text == "blocked"
            # 24 MiB of bodies the app never reads, on one connection whose window is 16 MiB.
            for _ in range(24):
                reply = await h2c.post(f"{base}/ignore", content=b"x" * BIG)
                assert reply.text == "ignored"
        await _until(lambda: not server.server_state.tasks, "the streams' tasks to end")


@_sync
async def test_upgrade_from_http1_reads_the_body_then_answers_on_stream_1() -> None:
    settings = base64.urlsafe_b64encode(b"").decode()
    async with _server() as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        body = b"x" * 100_000  # more than one read
        writer.write(
            b"POST /echo?a=1 HTTP/1.1\r\nHost: t\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
            b"HTTP2-Settings: %s\r\nContent-Length: %d\r\n\r\n" % (settings.encode(), len(body))
        )
        await writer.drain()
        await asyncio.sleep(0.05)
        writer.write(body)
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
        assert head.startswith(b"HTTP/1.1 101 Switching Protocols\r\n")
        raw = _RawH2(reader, writer, 65535)
        raw.conn.initiate_upgrade_connection()
        answer = b""
        ended = False
        while not ended:
            for event in await raw.events():
                if isinstance(event, h2.events.DataReceived) and event.stream_id == 1:
                    answer += event.data
                elif isinstance(event, h2.events.StreamEnded) and event.stream_id == 1:
                    ended = True
        writer.close()
    assert answer == b"2 POST /echo 100000"


@_sync
async def test_an_upgrading_request_with_an_oversized_body_is_refused() -> None:
    async with _server() as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /echo HTTP/1.1\r\nHost: t\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
            b"HTTP2-Settings: \r\nContent-Length: %d\r\n\r\n" % (64 * 1024 * 1024)
        )
        answer = await asyncio.wait_for(reader.read(), 5.0)
        writer.close()
    assert answer.startswith(b"HTTP/1.1 413 ")
    assert b'"error_code":41300' in answer


@_sync
async def test_a_stream_whose_request_never_ends_is_answered_408(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LimitedHttpToolsProtocol, "limits", HttpLimits(read_timeout_s=0.3))
    async with _server() as (port, _):
        raw = await _open_raw(port)
        stream_id = _request(raw, "/echo", b"partial", end=False)
        status = None
        while status is None:
            for event in await raw.events():
                if isinstance(event, h2.events.ResponseReceived) and event.stream_id == stream_id:
                    status = dict(event.headers)[b":status"]
        raw.writer.close()
    assert status == b"408"


@_sync
async def test_an_oversized_header_list_closes_the_connection(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LimitedHttpToolsProtocol, "limits", HttpLimits(max_head_bytes=4096))
    async with _server() as (port, _):
        raw = await _open_raw(port)
        stream_id = raw.conn.get_next_available_stream_id()
        headers = [(b":method", b"GET"), (b":path", b"/"), (b":scheme", b"http"), (b":authority", b"t")]
        raw.conn.send_headers(stream_id, [*headers, (b"x-big", b"v" * 8192)], end_stream=True)
        terminated = False
        try:
            while not terminated:
                terminated = any(isinstance(e, h2.events.ConnectionTerminated) for e in await raw.events())
        except ConnectionError:
            terminated = True
        raw.writer.close()
    assert terminated


@_sync
async def test_a_client_goaway_with_streams_in_flight_ends_them_quietly(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async with _server() as (port, server):
        raw = await _open_raw(port)
        _request(raw, "/slow", b"{}")  # answered after 50 ms
        await raw.events()
        raw.conn.close_connection()
        raw.writer.write(raw.conn.data_to_send())
        await _until(
            lambda: not server.server_state.connections and not server.server_state.tasks,
            "the connection and its streams to end",
        )
        raw.writer.close()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING], caplog.text


@_sync
async def test_an_idle_connection_is_closed_with_goaway() -> None:
    async with _server() as (port, server):
        # uvicorn annotates these int; its timers take any number of seconds.
        server.config.timeout_keep_alive = 0.2  # type: ignore[assignment]  # read when switching to HTTP/2
        for protocol in server.server_state.connections:
            if isinstance(protocol, HttpToolsProtocol):
                protocol.timeout_keep_alive = 0.2  # type: ignore[assignment]
        raw = await _open_raw(port)
        await raw.events()  # the server's SETTINGS
        events: list[h2.events.Event] = []
        while not any(isinstance(e, h2.events.ConnectionTerminated) for e in events):
            events = await raw.events()
        raw.writer.close()


@pytest.mark.parametrize(
    ("accept", "produces", "chosen"),
    [
        ("", STREAM_PRODUCES, DELIMITED),
        ("*/*", STREAM_PRODUCES, DELIMITED),
        ("*/*", QUERY_PRODUCES, KSQL_V1_JSON),
        ("application/json", STREAM_PRODUCES, JSON),
        ("application/json", QUERY_PRODUCES, JSON),
        (DELIMITED, QUERY_PRODUCES, DELIMITED),
        ("application/*", STREAM_PRODUCES, DELIMITED),
        ("text/html, application/json;q=0.2", STREAM_PRODUCES, JSON),
        (f"application/json;q=0.5, {DELIMITED};q=0.9", STREAM_PRODUCES, DELIMITED),
        (f"application/json, {DELIMITED}", STREAM_PRODUCES, JSON),  # equal weights: the header's order
        ("APPLICATION/JSON; charset=utf-8", STREAM_PRODUCES, JSON),
        ("application/json;q=0", STREAM_PRODUCES, None),
        ("text/html", STREAM_PRODUCES, None),
        ("application/json;q=x", QUERY_PRODUCES, None),
    ],
)
def test_accept_negotiation(accept: str, produces: tuple[str, ...], chosen: str | None) -> None:
    assert accepted(accept, produces) == chosen


@_sync
async def test_an_upgrade_with_a_damaged_settings_header_is_refused_400() -> None:
    async with _server() as (port, _):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"GET /echo HTTP/1.1\r\nHost: t\r\nConnection: Upgrade, HTTP2-Settings\r\nUpgrade: h2c\r\n"
            b"HTTP2-Settings: %%%%not-base64\r\n\r\n"
        )
        answer = await asyncio.wait_for(reader.read(), 5.0)
        writer.close()
    assert answer.startswith(b"HTTP/1.1 400 "), answer
    assert b"HTTP2-Settings" in answer

"""The request limits uvicorn lacks (http/limits.py), on a real uvicorn server in this process: a slow
client is answered 408 and closed, an oversized head 431, and a normal request is untouched."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter

from hotstate.server.http import direct_lane
from hotstate.server.http.direct_lane import LimitedHttpToolsProtocol, limited_protocol
from hotstate.server.http.limits import HttpLimits

from .helpers import serving


async def _app(
    scope: MutableMapping[str, Any],
    receive: Callable[[], Awaitable[MutableMapping[str, Any]]],
    send: Callable[[MutableMapping[str, Any]], Awaitable[None]],
) -> None:
    body = b""
    more = True
    while more:
        message = await receive()
        body += message.get("body", b"")
        more = message.get("more_body", False)
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]}
    )
    await send({"type": "http.response.body", "body": body})


@asynccontextmanager
async def _server(limits: HttpLimits | None = None, counter: Counter | None = None) -> AsyncIterator[int]:
    protocol = LimitedHttpToolsProtocol if limits is None else limited_protocol(limits, counter)
    idle = {} if limits is None else {"timeout_keep_alive": limits.idle_timeout_s}
    async with serving(_app, http=protocol, **idle) as (port, _):
        yield port


async def _exchange(port: int, *parts: bytes, pause_s: float = 0.0) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    for part in parts:
        writer.write(part)
        await writer.drain()
        await asyncio.sleep(pause_s)
    answer = await asyncio.wait_for(reader.read(), 5.0)
    writer.close()
    return answer


@pytest.fixture
def short_timeout(monkeypatch: pytest.MonkeyPatch) -> float:
    monkeypatch.setattr(LimitedHttpToolsProtocol, "limits", HttpLimits(read_timeout_s=0.3))
    return 0.3


def test_a_request_not_read_in_time_is_answered_408_and_closed(short_timeout: float) -> None:
    async def run() -> None:
        async with _server() as port:
            # Headers that never end (slowloris), a body that never comes, and a connection that says nothing.
            half_head = await _exchange(port, b"POST / HTTP/1.1\r\nHost: x\r\n")
            assert half_head.startswith(b"HTTP/1.1 408"), half_head
            assert b"not received within 0.3 s" in half_head
            no_body = await _exchange(port, b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 10\r\n\r\nabc")
            assert no_body == b"", no_body  # the app had started on it: closed, nothing half-sent
            silent = await _exchange(port)
            assert silent.startswith(b"HTTP/1.1 408"), silent

    asyncio.run(run())


def test_a_request_sent_in_pieces_within_the_limit_is_answered(short_timeout: float) -> None:
    async def run() -> None:
        async with _server() as port:
            answer = await _exchange(
                port,
                b"POST / HTTP/1.1\r\nHost: x\r\n",
                b"Content-Length: 5\r\nConnection: close\r\n\r\n",
                b"hello",
                pause_s=0.05,
            )
            assert answer.startswith(b"HTTP/1.1 200") and answer.endswith(b"hello"), answer

    asyncio.run(run())


def test_the_read_timeout_runs_from_each_requests_start_on_a_kept_alive_connection(
    short_timeout: float,
) -> None:
    """One timer serves the connection's requests: a request begun after others is held to its own start."""

    async def run() -> None:
        async with _server() as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            request = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nok"
            loop = asyncio.get_running_loop()
            began = loop.time()
            while loop.time() - began < 0.5:  # requests for longer than the timeout: none is cut off
                writer.write(request)
                await writer.drain()
                answer = await asyncio.wait_for(reader.readuntil(b"ok"), 2.0)
                assert answer.startswith(b"HTTP/1.1 200"), answer
                await asyncio.sleep(0.1)
            writer.write(b"POST / HTTP/1.1\r\nHost: x\r\n")  # then one that stalls
            await writer.drain()
            stalled = loop.time()
            answer = await asyncio.wait_for(reader.read(), 5.0)
            took = loop.time() - stalled
            assert answer.startswith(b"HTTP/1.1 408"), answer
            assert 0.2 <= took <= 1.5, took  # from its own start, give or take the timer's wake-up
            writer.close()

    asyncio.run(run())


def test_an_oversized_head_is_answered_431() -> None:
    async def run() -> None:
        async with _server() as port:
            big = (
                b"GET / HTTP/1.1\r\nHost: x\r\nX-Big: "
                + b"a" * (HttpLimits().max_head_bytes + 1)
                + b"\r\n\r\n"
            )
            answer = await _exchange(port, big)
            assert answer.startswith(b"HTTP/1.1 431"), answer[:100]
            long_url = b"GET /" + b"a" * (HttpLimits().max_head_bytes + 1) + b" HTTP/1.1\r\nHost: x\r\n\r\n"
            assert (await _exchange(port, long_url)).startswith(b"HTTP/1.1 431")
            fine = b"GET / HTTP/1.1\r\nHost: x\r\nX-Ok: " + b"a" * 1000 + b"\r\nConnection: close\r\n\r\n"
            assert (await _exchange(port, fine)).startswith(b"HTTP/1.1 200")

    asyncio.run(run())


class _Transport:
    def __init__(self) -> None:
        self.writes: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.writes.append(data)

    def is_closing(self) -> bool:
        return self.closed

    def close(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0

    def get_extra_info(self, name: str) -> str:
        return f"info:{name}"


def test_a_response_head_and_body_leave_in_one_write() -> None:
    async def run() -> None:
        transport = _Transport()
        joined = direct_lane.JoinedWrites(transport, asyncio.get_running_loop())  # type: ignore[arg-type]
        joined.write(b"HTTP/1.1 200 OK\r\n\r\n")
        joined.write(b"body")
        assert transport.writes == [] and joined.get_write_buffer_size() == 23
        await asyncio.sleep(0)
        assert transport.writes == [b"HTTP/1.1 200 OK\r\n\r\nbody"]
        joined.write(b"last")
        joined.close()  # what was written goes out before the close
        assert transport.writes[-1] == b"last" and transport.closed
        await asyncio.sleep(0)  # the scheduled flush finds nothing left and a closed transport
        assert len(transport.writes) == 2
        assert joined.get_extra_info("peername") == "info:peername"

    asyncio.run(run())


_GET = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"


def test_a_head_trickled_a_byte_at_a_time_is_cut_off_at_the_read_timeout() -> None:
    """Slow-loris: one byte every 0.2 s keeps the connection busy but never finishes the head."""

    async def run() -> None:
        async with _server(HttpLimits(read_timeout_s=1.0)) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            start = asyncio.get_running_loop().time()
            head = b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: " + b"a" * 1000
            answer = b""
            for byte in head:
                try:
                    writer.write(bytes([byte]))
                    await writer.drain()
                except ConnectionError:
                    break
                try:
                    answer = await asyncio.wait_for(reader.read(1000), 0.2)
                except TimeoutError:
                    continue
                break  # the server spoke (or closed)
            answer += await asyncio.wait_for(reader.read(), 5.0)
            elapsed = asyncio.get_running_loop().time() - start
            writer.close()
            assert answer.startswith(b"HTTP/1.1 408"), answer
            assert 0.9 <= elapsed < 2.0, elapsed

    asyncio.run(run())


def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout() -> None:
    async def run() -> None:
        async with _server(HttpLimits(idle_timeout_s=0.5)) as port:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
            loop = asyncio.get_running_loop()
            for _ in range(2):  # a connection in use stays open
                writer.write(_GET)
                await reader.readuntil(b"\r\n\r\n")
                await asyncio.sleep(0.3)
            start = loop.time()
            assert await asyncio.wait_for(reader.read(), 5.0) == b""  # closed, nothing said
            assert 0.1 <= loop.time() - start < 1.5
            writer.close()

    asyncio.run(run())


def test_a_connection_over_the_cap_is_answered_503_and_closed_and_the_count_frees_up() -> None:
    counter = Counter("refused", "refused", registry=CollectorRegistry())

    async def run() -> None:
        async with _server(HttpLimits(max_connections=3), counter) as port:
            held = [await asyncio.open_connection("127.0.0.1", port) for _ in range(3)]
            for reader, writer in held:  # answered, so accepted and counted before the fourth comes
                writer.write(_GET)
                assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            over = await _exchange(port)
            assert over.startswith(b"HTTP/1.1 503"), over
            assert b'"error_code":50300' in over and b"3 HTTP connections open" in over
            for reader, writer in held:  # the ones inside the cap are served
                writer.write(_GET)
                assert (await reader.readuntil(b"\r\n\r\n")).startswith(b"HTTP/1.1 200")
            reader, writer = held.pop()
            writer.close()
            await asyncio.sleep(0.1)  # for the server to hear of the close: no event; a retry would count
            fine = await _exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert fine.startswith(b"HTTP/1.1 200"), fine
            for _, writer in held:
                writer.close()

    asyncio.run(run())
    (metric,) = counter.collect()
    assert [s.value for s in metric.samples if s.name.endswith("_total")] == [1.0]

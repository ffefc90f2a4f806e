"""Limits on how a client may send a request, which uvicorn's httptools protocol does not have: a
request's head (request line and headers) larger than MAX_HEAD_BYTES is refused with 431, and a request
not read in full within REQUEST_READ_TIMEOUT_S of its first byte (or a new connection that sends
nothing) is answered 408 and closed, so a slow client cannot hold a connection and its buffers forever.
Idle keep-alive connections are closed by uvicorn itself (`timeout_keep_alive`)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

MAX_HEAD_BYTES = 64 * 1024
REQUEST_READ_TIMEOUT_S = 30.0


class _HeadTooLarge(Exception):
    pass


class _JoinedWrites:
    """The transport as uvicorn sees it: what it writes in one loop iteration (a response's head and its
    body are two writes, each a send(2) on uvloop) leaves in one write at the end of the iteration."""

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []

    def write(self, data: bytes) -> None:
        if not self._held:
            self._loop.call_soon(self._flush)
        self._held.append(data)

    def _flush(self) -> None:
        held, self._held = self._held, []
        if held and not self._transport.is_closing():
            self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def get_write_buffer_size(self) -> int:
        return sum(map(len, self._held)) + self._transport.get_write_buffer_size()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._head_bytes = 0
        self._head_too_large = False
        self._read_timer: asyncio.TimerHandle | None = None

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(cast(asyncio.Transport, _JoinedWrites(transport, self.loop)))
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._head_bytes = 0
        self._arm()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        super().on_header(name, value)

    def on_message_complete(self) -> None:
        self._disarm()
        super().on_message_complete()

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers every parser error with 400; an oversized head gets its own status.
        if self._head_too_large:
            self._refuse(
                b"431 Request Header Fields Too Large", f"request head larger than {MAX_HEAD_BYTES} bytes"
            )
        else:
            super().send_400_response(msg)

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > MAX_HEAD_BYTES:
            self._head_too_large = True
            raise _HeadTooLarge  # stops the parser; uvicorn then calls send_400_response

    def _arm(self) -> None:
        if self._read_timer is None:
            self._read_timer = self.loop.call_later(REQUEST_READ_TIMEOUT_S, self._read_timed_out)

    def _disarm(self) -> None:
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete:  # the app has not started on it: say why
            self._refuse(b"408 Request Timeout", f"request not received within {REQUEST_READ_TIMEOUT_S:g} s")
        else:
            self.transport.close()

    def _refuse(self, status: bytes, message: str) -> None:
        body = b'{"@type":"generic_error","error_code":%d,"message":"%s"}' % (
            int(status[:3]) * 100,
            message.encode(),
        )
        head = b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close"
        self.transport.write(head % (status, len(body)) + b"\r\n\r\n" + body)
        self.transport.close()

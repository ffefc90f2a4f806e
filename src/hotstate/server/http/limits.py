"""Limits on how a client may use a connection, which uvicorn's httptools protocol does not have
(`HttpLimits`, from the `http.*` settings; docs/security.md): a request's head (request line and headers)
larger than `max_head_bytes` is refused with 431; a request not read in full within `read_timeout_s` of
its first byte (or a new connection that sends no whole request that long) is answered 408 and closed,
so a slow client cannot hold a connection and its buffers forever; a new connection while
`max_connections` are open is answered 503 at once and closed, its request unread (as Kafka and ksqlDB
refuse connections over their caps rather than queueing them). Idle keep-alive connections are closed by
uvicorn itself after `idle_timeout_s` (`timeout_keep_alive`, which the server sets from the limits).

`RequestLimits` is uvicorn's protocol with these limits; h2c_handoff.py (HTTP/2 on the same port) and
direct_lane.py (pull queries answered without ASGI) build on it, and direct_lane.py assembles the protocol
class the server runs (`LimitedHttpToolsProtocol`).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any, ClassVar

from prometheus_client import Counter
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """The defaults are the `http.*` settings' (ServerConfig)."""

    max_head_bytes: int = 64 * 1024
    read_timeout_s: float = 30.0
    idle_timeout_s: float = 30.0
    max_connections: int = 512


class _HeadTooLarge(Exception):
    pass


class RequestLimits(HttpToolsProtocol):
    limits: ClassVar[HttpLimits] = HttpLimits()
    refused: ClassVar[Counter | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.over_cap = False
        self._head_bytes = 0
        self._head_too_large = False
        self._read_timer: asyncio.TimerHandle | None = None
        self._reading_since: float | None = None  # loop time a request (or the connection) began, if unread

    def data_received(self, data: bytes) -> None:
        if self.over_cap:
            return
        HttpToolsProtocol.data_received(self, data)  # not super(): this runs for every read

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections:
            self.over_cap = True
            if self.refused is not None:
                self.refused.inc()
            message = f"this server has {len(self.connections)} HTTP connections open, its most; try later"
            transport.write(_refusal(b"503 Service Unavailable", message))
            transport.close()
            return
        super().connection_made(self._transport_for(transport))
        self._arm()

    def _transport_for(self, transport: asyncio.Transport) -> asyncio.Transport:
        """The transport uvicorn is to write to (a subclass may stand something in front of it)."""
        return transport

    def raw_transport(self) -> asyncio.Transport:
        """The connection's own transport, for a protocol that takes the connection over."""
        transport: asyncio.Transport = self.transport
        return transport

    def _abort(self) -> None:
        self.raw_transport().abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.over_cap:  # never counted as a connection, nothing was set up
            return
        self._disarm()
        super().connection_lost(exc)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        # A push query's stream drops a client that reads nothing with this: closing would wait, forever,
        # for the data buffered for it to be sent.
        extensions: dict[str, object] = dict(self.scope.get("extensions") or {})
        extensions["hotstate.abort"] = self._abort
        self.scope["extensions"] = extensions  # type: ignore[typeddict-item]
        self._head_bytes = 0
        self._arm()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        super().on_url(url)

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        HttpToolsProtocol.on_header(self, name, value)  # not super(): this runs for every header

    def on_message_complete(self) -> None:
        self.request_read()
        HttpToolsProtocol.on_message_complete(self)

    def request_read(self) -> None:
        """The request is read in full: the read timeout no longer runs for it."""
        self._reading_since = None  # the timer stays: the next request usually begins before it fires

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers every parser error with 400; an oversized head gets its own status.
        if self.transport.is_closing():  # refused already (an upgrading request's body too large)
            return
        if self._head_too_large:
            self.refuse(
                b"431 Request Header Fields Too Large",
                f"request head larger than {self.limits.max_head_bytes} bytes",
            )
        else:
            super().send_400_response(msg)

    def stop_limits(self) -> None:
        """The connection leaves this protocol (HTTP/2 takes it over): no more read timeouts here."""
        self._disarm()

    def _count(self, size: int) -> None:
        self._head_bytes += size
        if self._head_bytes > self.limits.max_head_bytes:
            self._head_too_large = True
            raise _HeadTooLarge  # stops the parser; uvicorn then calls send_400_response

    def _arm(self) -> None:
        """A request (or the connection) begins: it must be read within the read timeout. One timer per
        connection, not one per request: it stays armed across requests and, when it fires, looks at the
        request then being read (a timer made and cancelled per request cost 1.8 us of each lookup)."""
        self._reading_since = now = self.loop.time()
        if self._read_timer is None:
            self._read_timer = self.loop.call_at(now + self.limits.read_timeout_s, self._read_timed_out)

    def _disarm(self) -> None:
        self._reading_since = None
        if self._read_timer is not None:
            self._read_timer.cancel()
            self._read_timer = None

    def _read_timed_out(self) -> None:
        self._read_timer = None
        since = self._reading_since
        if since is None or self.transport.is_closing():  # nothing being read: the next request re-arms
            return
        deadline = since + self.limits.read_timeout_s
        if self.loop.time() < deadline:  # a later request, still within its time
            self._read_timer = self.loop.call_at(deadline, self._read_timed_out)
            return
        if self.cycle is None or self.cycle.response_complete:  # the app has not started on it: say why
            self.refuse(
                b"408 Request Timeout", f"request not received within {self.limits.read_timeout_s:g} s"
            )
        else:
            self.transport.close()

    def refuse(self, status: bytes, message: str) -> None:
        """Answers `status` with `message` and closes the connection."""
        self.transport.write(_refusal(status, message))
        self.transport.close()


def _refusal(status: bytes, message: str) -> bytes:
    """A whole response, ksqlDB's error shape, that closes the connection."""
    body = b'{"@type":"generic_error","error_code":%d,"message":"%s"}' % (
        int(status[:3]) * 100,
        message.encode(),
    )
    head = b"HTTP/1.1 %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\nconnection: close"
    return head % (status, len(body)) + b"\r\n\r\n" + body

"""Limits on how a client may use a connection, which uvicorn's httptools protocol does not have
(`HttpLimits`, from the `http.*` settings; docs/security.md): a request's head (request line and headers)
larger than `max_head_bytes` is refused with 431; a request not read in full within `read_timeout_s` of
its first byte (or a new connection that sends no whole request that long) is answered 408 and closed,
so a slow client cannot hold a connection and its buffers forever; a new connection while
`max_connections` are open is answered 503 at once and closed, its request unread (as Kafka and ksqlDB
refuse connections over their caps rather than queueing them). Idle keep-alive connections are closed by
uvicorn itself after `idle_timeout_s` (`timeout_keep_alive`, which the server sets from the limits).

It also hands HTTP/2 connections to http2.py: one that starts with HTTP/2's preface (prior knowledge), and
one whose request asks to upgrade (`Upgrade: h2c`, answered 101 and then over HTTP/2 as stream 1). Only a
connection's first bytes and each request's Upgrade header are looked at, so HTTP/1.1 keeps uvicorn's
httptools path as it was.

And it answers pull queries itself (the *direct lane*): a POST that `direct` (QueryRoutes.direct) takes, on a
keep-alive HTTP/1.1 connection with nothing else in flight, is read here and handed to its endpoint without
ASGI; the answer is written as uvicorn would write it (same status line, headers and body). An endpoint
that needs to wait (a forward to a peer) finishes in a task, and uvicorn's own bookkeeping takes over as
for any response (keep-alive timer, pipelined requests queued behind it). Everything else, and these
requests when anything is unusual (Expect: 100-continue, an upgrade, a client not reading its answers),
goes the ASGI way. uvicorn's per-request work (the scope, a task, the ASGI messages, the header checks)
was a fifth of a local lookup's CPU."""

from __future__ import annotations

import asyncio
import logging
import sys
import urllib.parse
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, cast

import httptools
from prometheus_client import Counter
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from hotstate.server.coordinator import CURRENT_USER
from hotstate.server.http2 import PREFACE, Http2Protocol
from hotstate.server.query_http import (
    MAX_BODY_BYTES,  # a request that upgrades is read whole first
    Answer,
    Endpoint,
    body_too_large,
    internal_error,
)

log = logging.getLogger(__name__)


class DirectRoutes(Protocol):
    """QueryRoutes: (endpoint, user) for a POST to `url` that the protocol answers itself, else None."""

    def direct(self, url: bytes, headers: list[tuple[bytes, bytes]]) -> tuple[Endpoint, str] | None: ...


@dataclass(frozen=True, slots=True)
class HttpLimits:
    """The defaults are the `http.*` settings' (ServerConfig)."""

    max_head_bytes: int = 64 * 1024
    read_timeout_s: float = 30.0
    idle_timeout_s: float = 30.0
    max_connections: int = 512


def limited_protocol(
    limits: HttpLimits, refused: Counter | None = None, routes: DirectRoutes | None = None
) -> type[LimitedHttpToolsProtocol]:
    """The protocol class uvicorn instantiates per connection, with these limits; `refused` counts the
    connections refused over the cap; `routes` picks the requests answered without ASGI."""
    return type(
        "LimitedHttpToolsProtocol",
        (LimitedHttpToolsProtocol,),
        {"limits": limits, "refused": refused, "routes": routes},
    )


class _DirectCycle:
    """What uvicorn finds as the connection's cycle while a direct answer is being made: it queues
    pipelined requests behind it (response_complete); shutdown and a lost connection mark it as its own."""

    __slots__ = ("disconnected", "keep_alive", "response_complete")

    def __init__(self) -> None:
        self.response_complete = False
        self.keep_alive = True
        self.disconnected = False

    @property
    def message_event(self) -> _DirectCycle:
        return self

    def set(self) -> None:  # message_event.set(): nothing waits on a direct request's body
        pass


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

    def write_whole(self, data: bytes) -> None:
        """A whole response (head and body in one): out at once when nothing is held before it."""
        if self._held:
            self._held.append(data)
        elif not self._transport.is_closing():
            self._transport.write(data)

    def close(self) -> None:
        self._flush()
        self._transport.close()

    def unwrapped(self) -> asyncio.Transport:
        """The transport itself, with what was held written: for a protocol that takes the connection over."""
        self._flush()
        return self._transport

    def get_write_buffer_size(self) -> int:
        return sum(map(len, self._held)) + self._transport.get_write_buffer_size()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._transport, name)


class LimitedHttpToolsProtocol(HttpToolsProtocol):
    limits: ClassVar[HttpLimits] = HttpLimits()
    refused: ClassVar[Counter | None] = None
    routes: ClassVar[DirectRoutes | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._over_cap = False
        self._head_bytes = 0
        self._head_too_large = False
        self._read_timer: asyncio.TimerHandle | None = None
        self._reading_since: float | None = None  # loop time a request (or the connection) began, if unread
        self._first_bytes: bytes | None = b""  # None once the connection is known to be HTTP/1.1
        self._h2c_settings: bytes | None = None  # the request asks to upgrade to HTTP/2
        self._h2c_offset = -1  # where the upgrading request's head ended in the last bytes read
        self._h2c_length = 0
        self._h2c_body: list[bytes] = []
        self._direct: tuple[Endpoint, str] | None = None  # the request being read goes the direct lane
        self._direct_body: list[bytes] = []
        self._direct_size = 0

    def data_received(self, data: bytes) -> None:
        if self._over_cap:
            return
        if self._first_bytes is not None:
            data = self._first_bytes + data
            if data[: len(PREFACE)] != PREFACE[: len(data)]:  # not HTTP/2's preface: HTTP/1.1
                self._first_bytes = None
            elif len(data) < len(PREFACE):  # could still be the preface
                self._first_bytes = data
                return
            else:
                self._switch_to_http2(data)
                return
        if self._h2c_offset < 0:
            HttpToolsProtocol.data_received(self, data)  # not super(): this runs for every read
            if self._h2c_offset < 0:  # set during that call when the request asks to upgrade
                return
            self._start_h2c()
            data = data[self._h2c_offset :]
        if not self.transport.is_closing():
            self._read_h2c_body(data)

    def _start_h2c(self) -> None:
        length = next((value for name, value in self.headers if name == b"content-length"), b"0")
        try:
            self._h2c_length = int(length)
        except ValueError:
            self._h2c_length = -1
        if not 0 <= self._h2c_length <= MAX_BODY_BYTES:
            self._refuse(b"413 Content Too Large", f"request body larger than {MAX_BODY_BYTES} bytes")

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if len(self.connections) >= self.limits.max_connections:
            self._over_cap = True
            if self.refused is not None:
                self.refused.inc()
            message = f"this server has {len(self.connections)} HTTP connections open, its most; try later"
            transport.write(_refusal(b"503 Service Unavailable", message))
            transport.close()
            return
        super().connection_made(cast(asyncio.Transport, _JoinedWrites(transport, self.loop)))
        self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        if self._over_cap:  # never counted as a connection, nothing was set up
            return
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
        HttpToolsProtocol.on_header(self, name, value)  # not super(): this runs for every header

    def on_headers_complete(self) -> None:
        routes = self.routes
        if (
            routes is not None
            and (self.cycle is None or self.cycle.response_complete)
            and not self.flow.write_paused
            and not self.expect_100_continue
            and self.parser.get_method() == b"POST"
            and self.parser.should_keep_alive()
            and self.parser.get_http_version() == "1.1"
            and not self.parser.should_upgrade()
        ):
            self._direct = routes.direct(self.url, self.headers)
            if self._direct is not None:
                self._direct_size = 0
                self._h2c_settings = None
                return
        self._h2c_settings = self._h2c_request() if self.parser.should_upgrade() else None
        HttpToolsProtocol.on_headers_complete(self)  # returns at once when upgrading (see _should_upgrade)

    def on_body(self, body: bytes) -> None:
        if self._direct is None:
            HttpToolsProtocol.on_body(self, body)
            return
        self._direct_size += len(body)
        if self._direct_size <= MAX_BODY_BYTES:  # beyond it, refused (413) without keeping the rest
            self._direct_body.append(body)

    def _should_upgrade(self) -> bool:
        return self._h2c_settings is not None or super()._should_upgrade()

    def handle_websocket_upgrade(self) -> None:  # uvicorn's only upgrade hook; reached for h2c too
        if self._h2c_settings is None:
            super().handle_websocket_upgrade()
        else:  # the switch waits for the request's body, which follows the head (see data_received)
            error = sys.exc_info()[1]
            self._h2c_offset = error.args[0] if isinstance(error, httptools.HttpParserUpgrade) else 0

    def _h2c_request(self) -> bytes | None:
        """The HTTP2-Settings of a request that asks to upgrade to h2c (RFC 7540 3.2), else None. A chunked
        body is not read for an upgrade (curl and ksqlDB's clients send a Content-Length)."""
        if self._get_upgrade() != b"h2c" or any(name == b"transfer-encoding" for name, _ in self.headers):
            return None
        return next((value for name, value in self.headers if name == b"http2-settings"), None)

    def _read_h2c_body(self, data: bytes) -> None:
        """Bytes after an upgrading request's head: its body (Content-Length), then the switch."""
        self._h2c_body.append(data)
        received = sum(map(len, self._h2c_body))
        if received < self._h2c_length:
            return
        rest = b"".join(self._h2c_body)
        self._h2c_body = []
        self._h2c_offset = -1
        assert self._h2c_settings is not None
        protocol = self._switch_to_h2c(self._h2c_settings, rest[: self._h2c_length])
        if len(rest) > self._h2c_length:  # the client's preface, if it did not wait for the 101
            protocol.data_received(rest[self._h2c_length :])

    def on_message_complete(self) -> None:
        self._reading_since = None  # the timer stays: the next request usually begins before it fires
        if self._direct is None:
            HttpToolsProtocol.on_message_complete(self)
            return
        (endpoint, user), self._direct = self._direct, None
        body = self._direct_body[0] if len(self._direct_body) == 1 else b"".join(self._direct_body)
        self._direct_body = []
        if self._direct_size > MAX_BODY_BYTES:
            self._write_answer(body_too_large(MAX_BODY_BYTES).refusal())
            return
        # As the guard sets it in an ASGI request's task: what the query runs as (forwards carry it).
        token = CURRENT_USER.set(user) if user else None
        try:
            answer = endpoint(body)
            if isinstance(answer, tuple):
                self._write_answer(answer)
            else:
                cycle = self.cycle = cast(Any, _DirectCycle())
                task = self.loop.create_task(self._answer_later(answer, cycle, self.url))
                task.add_done_callback(self.tasks.discard)
                self.tasks.add(task)
        except Exception as error:  # never a stack trace in a body
            log.exception("unexpected error answering %s", self.url.decode("latin-1"))
            self._write_answer(internal_error(error))
        finally:
            if token is not None:
                CURRENT_USER.reset(token)

    async def _answer_later(self, answer: Awaitable[Answer], cycle: _DirectCycle, url: bytes) -> None:
        """`url`: the request's, kept (self.url may hold a pipelined later request's by now)."""
        try:
            answered = await answer
        except Exception as error:
            log.exception("unexpected error answering %s", url.decode("latin-1"))
            answered = internal_error(error)
        cycle.response_complete = True
        if not cycle.disconnected:
            self._write_answer(answered, cycle.keep_alive)

    def _write_answer(self, answer: Answer, keep_alive: bool = True) -> None:
        """The response uvicorn writes for send_json's messages (its default headers first), then what it
        does once a response is complete."""
        status, payload = answer
        assert isinstance(payload, bytes)  # `direct` takes only endpoints answering one JSON body
        head = [STATUS_LINE[status]]
        for name, value in self.server_state.default_headers:
            head += (name, b": ", value, b"\r\n")
        head.append(b"content-type: application/json\r\ncontent-length: %d\r\n" % len(payload))
        if not keep_alive:
            head.append(b"connection: close\r\n")
        head += (b"\r\n", payload)
        cast(_JoinedWrites, self.transport).write_whole(b"".join(head))
        if not keep_alive:
            self.transport.close()
        self.on_response_complete()

    def send_400_response(self, msg: str) -> None:
        # uvicorn answers every parser error with 400; an oversized head gets its own status.
        if self.transport.is_closing():  # refused already (an upgrading request's body too large)
            return
        if self._head_too_large:
            self._refuse(
                b"431 Request Header Fields Too Large",
                f"request head larger than {self.limits.max_head_bytes} bytes",
            )
        else:
            super().send_400_response(msg)

    def _http2(self) -> Http2Protocol:
        self._disarm()
        self._unset_keepalive_if_required()
        self.connections.discard(self)
        protocol = Http2Protocol(
            self.app,
            self.loop,
            connections=self.connections,
            tasks=self.tasks,
            app_state=self.app_state,
            server=self.server,
            client=self.client,
            idle_timeout_s=self.timeout_keep_alive,
            read_timeout_s=self.limits.read_timeout_s,
            max_header_bytes=self.limits.max_head_bytes,
        )
        transport = cast(_JoinedWrites, self.transport).unwrapped()
        transport.set_protocol(protocol)
        protocol.connection_made(transport)
        return protocol

    def _switch_to_http2(self, data: bytes) -> None:
        self._first_bytes = None
        self._http2().start(data)

    def _switch_to_h2c(self, settings: bytes, body: bytes) -> Http2Protocol:
        scope = cast(dict[str, Any], self.scope)
        url = httptools.parse_url(self.url)
        path = url.path.decode("ascii", "replace")
        scope["path"] = urllib.parse.unquote(path) if "%" in path else path
        scope["raw_path"] = url.path
        scope["query_string"] = url.query or b""
        skip = (b"connection", b"upgrade", b"http2-settings", b"keep-alive", b"transfer-encoding")
        scope["headers"] = [(name, value) for name, value in self.headers if name not in skip]
        protocol = self._http2()
        protocol.start_upgraded(settings, scope, body)
        return protocol

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
            self._refuse(
                b"408 Request Timeout", f"request not received within {self.limits.read_timeout_s:g} s"
            )
        else:
            self.transport.close()

    def _refuse(self, status: bytes, message: str) -> None:
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

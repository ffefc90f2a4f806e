"""The *direct lane*: pull queries answered by hotstate's HTTP/1.1 protocol itself, without ASGI.

A POST that `direct` (QueryRoutes.direct, http/endpoints.py) takes, on a keep-alive HTTP/1.1 connection with
nothing else in flight, is read here and handed to its endpoint; the answer is written as uvicorn would
write it (same status line, headers and body). An endpoint that needs to wait (a forward to a peer)
finishes in a task, and uvicorn's own bookkeeping takes over as for any response (keep-alive timer,
pipelined requests queued behind it). Everything else, and these requests when anything is unusual (Expect:
100-continue, an upgrade, a client not reading its answers), goes the ASGI way. uvicorn's per-request work
(the scope, a task, the ASGI messages, the header checks) was a fifth of a local lookup's CPU.

`LimitedHttpToolsProtocol` is the protocol class the server runs: this lane, over the HTTP/2 hand-off
(http/h2c_handoff.py), over the limits (http/limits.py).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable
from typing import Any, ClassVar, Protocol, cast

from prometheus_client import Counter
from uvicorn.protocols.http.httptools_impl import STATUS_LINE

from hotstate.server.coordinator import CURRENT_USER
from hotstate.server.http.h2c_handoff import Http2Handoff
from hotstate.server.http.limits import HttpLimits
from hotstate.server.http.queries import (
    MAX_BODY_BYTES,
    Answer,
    Endpoint,
    body_too_large,
    internal_error,
)

log = logging.getLogger(__name__)


class DirectRoutes(Protocol):
    """QueryRoutes: (endpoint, user) for a POST to `url` that the protocol answers itself, else None."""

    def direct(self, url: bytes, headers: list[tuple[bytes, bytes]]) -> tuple[Endpoint, str] | None: ...


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


class DirectCycle:
    """What uvicorn finds as the connection's cycle while a direct answer is being made: it queues
    pipelined requests behind it (response_complete); shutdown and a lost connection mark it as its own."""

    __slots__ = ("disconnected", "keep_alive", "response_complete")

    def __init__(self) -> None:
        self.response_complete = False
        self.keep_alive = True
        self.disconnected = False

    @property
    def message_event(self) -> DirectCycle:
        return self

    def set(self) -> None:  # message_event.set(): nothing waits on a direct request's body
        pass


class JoinedWrites:
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


class LimitedHttpToolsProtocol(Http2Handoff):
    routes: ClassVar[DirectRoutes | None] = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._direct: tuple[Endpoint, str] | None = None  # the request being read goes the direct lane
        self._direct_body: list[bytes] = []
        self._direct_size = 0
        # The direct answer being made, if it had to wait (one at a time: a pipelined request queues).
        self._answering: asyncio.Task[None] | None = None

    def _transport_for(self, transport: asyncio.Transport) -> asyncio.Transport:
        return cast(asyncio.Transport, JoinedWrites(transport, self.loop))

    def raw_transport(self) -> asyncio.Transport:
        return cast(JoinedWrites, self.transport).unwrapped()

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
                return
        Http2Handoff.on_headers_complete(self)

    def on_body(self, body: bytes) -> None:
        if self._direct is None:
            Http2Handoff.on_body(self, body)
            return
        self._direct_size += len(body)
        if self._direct_size <= MAX_BODY_BYTES:  # beyond it, refused (413) without keeping the rest
            self._direct_body.append(body)

    def on_message_complete(self) -> None:
        if self._direct is None:
            Http2Handoff.on_message_complete(self)
            return
        self.request_read()
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
                cycle = self.cycle = cast(Any, DirectCycle())
                task = self._answering = self.loop.create_task(self._answer_later(answer, cycle, self.url))
                task.add_done_callback(self.tasks.discard)
                self.tasks.add(task)
        except Exception as error:  # never a stack trace in a body
            log.exception("unexpected error answering %s", self.url.decode("latin-1"))
            self._write_answer(internal_error(error))
        finally:
            if token is not None:
                CURRENT_USER.reset(token)

    def connection_lost(self, exc: Exception | None) -> None:
        answering = self._answering
        if answering is not None and not answering.done():
            # Nobody is left to read the answer: stop making it (a scan stops on every server it reached).
            answering.cancel()
        super().connection_lost(exc)

    async def _answer_later(self, answer: Awaitable[Answer], cycle: DirectCycle, url: bytes) -> None:
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
        cast(JoinedWrites, self.transport).write_whole(b"".join(head))
        if not keep_alive:
            self.transport.close()
        self.on_response_complete()

"""HTTP/2 cleartext (h2c) on the HTTP port, beside uvicorn's HTTP/1.1: ksqlDB's clients speak HTTP/2 to
`/query-stream`, either with prior knowledge (the connection starts with HTTP/2's preface) or by asking an
HTTP/1.1 request to upgrade (`Upgrade: h2c`). `Http2Handoff` (http/h2c_handoff.py) notices both and
hands the connection to `Http2Protocol`, which runs the same ASGI app (the query endpoints in front of
FastAPI) for each stream. The HTTP/2 state machine (frames, HPACK, flow control, stream states) is the `h2`
library's; this module only moves bytes between it and the socket, and requests and answers between it
and the app.

Each ASGI `http.response.body` message leaves as its own DATA frame(s), as ksqlDB's server writes each
line of a `/query-stream` answer, which some clients read frame by frame. What one loop iteration writes
leaves in one `transport.write`.

Limits, as on HTTP/1.1 (http/limits.py): a header list over `max_head_bytes` closes the connection (h2
refuses it; a stream cannot be answered before its headers are read), a request not read in full within
`read_timeout_s` of its headers is answered 408, at most MAX_CONCURRENT_STREAMS streams at once, and
a connection without open streams for `idle_timeout_s` is closed with GOAWAY.
"""

from __future__ import annotations

import asyncio
import binascii
import contextlib
import logging
import urllib.parse
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from hotstate.server.http.asgi import ASGIApp, Message, Scope

log = logging.getLogger(__name__)

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
MAX_CONCURRENT_STREAMS = 100
# Receive windows: a whole query body (at most 4 MiB) may arrive without waiting for window updates.
STREAM_WINDOW = 4 * 1024 * 1024
CONNECTION_WINDOW = 16 * 1024 * 1024
# Header fields that mean something only to HTTP/1.1 (RFC 9113 8.2.2): never sent on a stream.
_HOP_BY_HOP = frozenset((b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"))
_TIMEOUT_BODY = b'{"@type":"generic_error","error_code":40800,"message":"request not received within %d s"}'
_SWITCHING = b"HTTP/1.1 101 Switching Protocols\r\nconnection: Upgrade\r\nupgrade: h2c\r\n\r\n"
_BAD_SETTINGS_BODY = (
    b'{"@type":"generic_error","error_code":40000,"message":"malformed HTTP2-Settings header"}'
)
_BAD_SETTINGS = (
    b"HTTP/1.1 400 Bad Request\r\ncontent-type: application/json\r\nconnection: close\r\n"
    b"content-length: %d\r\n\r\n%s" % (len(_BAD_SETTINGS_BODY), _BAD_SETTINGS_BODY)
)
_JSON_HEADERS = [(b"content-type", b"application/json")]
_ERROR_BODY = b'{"@type":"generic_error","error_code":50000,"message":"internal error"}'


class _Stream:
    __slots__ = (
        "body",
        "delivered",
        "ended",
        "gone",
        "id",
        "read_timer",
        "received",
        "response_ended",
        "response_headers",
        "response_started",
        "unacked",
        "window",
    )

    def __init__(self, stream_id: int) -> None:
        self.id = stream_id
        self.body: list[bytes] = []
        self.unacked = 0  # flow-controlled bytes given to the app but not yet acknowledged
        self.ended = False  # the client sent END_STREAM
        self.delivered = False  # the app was given the whole body
        self.gone = False  # reset, or the connection closed: the app's sends are dropped
        self.received = asyncio.Event()
        self.window = asyncio.Event()
        self.response_headers: list[tuple[bytes, bytes]] | None = None
        self.response_started = False
        self.response_ended = False
        self.read_timer: asyncio.TimerHandle | None = None


class Http2Protocol(asyncio.Protocol):
    """One HTTP/2 connection: the `h2` state machine and one ASGI task per stream."""

    def __init__(
        self,
        app: ASGIApp,
        loop: asyncio.AbstractEventLoop,
        *,
        connections: set[Any],
        tasks: set[asyncio.Task[None]],
        app_state: dict[str, Any],
        server: tuple[str, int | None] | None,
        client: tuple[str, int] | None,
        idle_timeout_s: float,
        read_timeout_s: float,
        max_header_bytes: int,
    ) -> None:
        self._app = app
        self._loop = loop
        self._connections = connections
        self._tasks = tasks
        self._app_state = app_state
        self._server = server
        self._client = client
        self._idle_timeout_s = idle_timeout_s
        self._read_timeout_s = read_timeout_s
        # What clients send is checked (a malformed request never reaches the app); what the app answers is
        # not checked again: its headers are lowercased and stripped of HTTP/1.1's here (_send), and the
        # checks were ~10% of a request's CPU.
        config = h2.config.H2Configuration(
            client_side=False,
            header_encoding=None,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
        self._h2 = h2.connection.H2Connection(config=config)
        self._h2.local_settings = h2.settings.Settings(
            client=False,
            initial_values={
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_CONCURRENT_STREAMS,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: max_header_bytes,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: STREAM_WINDOW,
            },
        )
        # At once, not only once the client acknowledges the SETTINGS that announce it.
        self._h2.decoder.max_header_list_size = max_header_bytes
        self._transport: asyncio.Transport | None = None
        self._streams: dict[int, _Stream] = {}
        self._flush_scheduled = False
        self._writable = asyncio.Event()
        self._writable.set()
        self._idle_timer: asyncio.TimerHandle | None = None
        self._closing = False

    # ------------------------------------------------------------------------------------------ starting
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]
        self._connections.add(self)

    def start(self, data: bytes) -> None:
        """A connection that began with the preface: `data` is everything read so far."""
        self._h2.initiate_connection()
        self._open_windows()
        self._arm_idle()
        self.data_received(data)
        self._flush()

    def start_upgraded(self, settings: bytes, scope: Scope, body: bytes) -> None:
        """A connection upgraded from HTTP/1.1 (`Upgrade: h2c`): its request, already read, is stream 1."""
        assert self._transport is not None
        try:
            self._h2.initiate_upgrade_connection(settings)
        except (h2.exceptions.ProtocolError, ValueError, binascii.Error):  # a damaged HTTP2-Settings header
            self._transport.write(_BAD_SETTINGS)
            self._transport.close()
            return
        self._transport.write(_SWITCHING)  # before what h2 has to send (flushed below)
        self._open_windows()
        stream = _Stream(1)
        stream.ended = True
        if body:
            stream.body.append(body)
        self._streams[1] = stream
        scope["http_version"] = "2"
        self._run(stream, scope)
        self._flush()

    def _open_windows(self) -> None:
        self._h2.increment_flow_control_window(CONNECTION_WINDOW - self._h2.inbound_flow_control_window)

    # ------------------------------------------------------------------------------------------- reading
    def data_received(self, data: bytes) -> None:
        try:
            events = self._h2.receive_data(data)
        except h2.exceptions.ProtocolError as error:
            log.info("HTTP/2 connection closed: %s", error)
            self._flush()
            self._close()
            return
        started: list[_Stream] = []
        for event in events:
            if isinstance(event, h2.events.DataReceived):
                self._on_data(event)
            elif isinstance(event, h2.events.RequestReceived):
                started.append(self._on_request(event))
            elif isinstance(event, h2.events.StreamEnded):
                self._on_stream_ended(event.stream_id)
            elif isinstance(event, h2.events.StreamReset):
                self._on_reset(event.stream_id)
            elif isinstance(event, h2.events.WindowUpdated):
                self._on_window(event.stream_id)
            elif isinstance(event, h2.events.ConnectionTerminated):  # GOAWAY: h2 sends nothing more
                self._closing = True
                for stream in list(self._streams.values()):
                    self._forget(stream)
                self._close()
        for stream in started:  # a request that came whole in these bytes (most do) needs no read timer
            if not stream.ended and not stream.gone:
                stream.read_timer = self._loop.call_later(self._read_timeout_s, self._read_timed_out, stream)
        self._flush_soon()

    def _on_request(self, event: h2.events.RequestReceived) -> _Stream:
        stream = _Stream(event.stream_id)
        self._streams[event.stream_id] = stream
        self._disarm_idle()
        self._run(stream, self._scope(event.headers or []))
        return stream

    def _on_data(self, event: h2.events.DataReceived) -> None:
        stream = self._streams.get(event.stream_id)
        if stream is None or stream.gone:  # an answered or reset stream: give the window back at once
            self._h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            return
        stream.body.append(event.data or b"")
        stream.unacked += event.flow_controlled_length
        stream.received.set()

    def _on_stream_ended(self, stream_id: int) -> None:
        stream = self._streams.get(stream_id)
        if stream is not None:
            stream.ended = True
            self._cancel_read_timer(stream)
            stream.received.set()

    def _on_reset(self, stream_id: int) -> None:
        stream = self._streams.get(stream_id)
        if stream is not None:
            self._forget(stream)

    def _on_window(self, stream_id: int) -> None:
        if stream_id == 0:
            for stream in self._streams.values():
                stream.window.set()
        elif stream_id in self._streams:
            self._streams[stream_id].window.set()

    def _scope(self, headers: list[tuple[bytes, bytes]]) -> Scope:
        method = raw_path = b""
        authority: bytes | None = None
        plain: list[tuple[bytes, bytes]] = []
        has_host = False
        for name, value in headers:
            if name[:1] == b":":
                if name == b":method":
                    method = value
                elif name == b":path":
                    raw_path = value
                elif name == b":authority":
                    authority = value
            else:
                has_host = has_host or name == b"host"
                plain.append((name, value))
        if authority is not None and not has_host:
            plain.insert(0, (b"host", authority))
        path, _, query = raw_path.partition(b"?")
        text = path.decode("ascii", "replace")
        return {
            "type": "http",
            "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": "2",
            "server": self._server,
            "client": self._client,
            "scheme": "http",
            "method": method.decode("ascii", "replace"),
            "root_path": "",
            "path": urllib.parse.unquote(text) if "%" in text else text,
            "raw_path": path,
            "query_string": query,
            "headers": plain,
            "state": self._app_state.copy(),
        }

    # --------------------------------------------------------------------------------------- the app
    def _run(self, stream: _Stream, scope: Scope) -> None:
        task = self._loop.create_task(self._serve(stream, scope))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self, stream: _Stream, scope: Scope) -> None:
        async def receive() -> Message:
            # Once the whole body was given, as uvicorn: wait for the client to go or the answer to end
            # (an app listening for a disconnect must not be answered at once, again and again).
            while not stream.gone and (stream.delivered or (not stream.body and not stream.ended)):
                if stream.response_ended:
                    break
                stream.received.clear()
                await stream.received.wait()
            if stream.gone or stream.delivered:
                return {"type": "http.disconnect"}
            body = stream.body.pop(0) if stream.body else b""
            self._acknowledge(stream)
            more = bool(stream.body) or not stream.ended
            stream.delivered = not more
            return {"type": "http.request", "body": body, "more_body": more}

        async def send(message: Message) -> None:
            await self._send(stream, message)

        try:
            await self._app(scope, receive, send)
        except Exception:  # never a stack trace in a body
            log.exception("unexpected error answering %s over HTTP/2", scope.get("path"))
            if not stream.response_started:
                start = {"type": "http.response.start", "status": 500, "headers": _JSON_HEADERS}
                await self._send(stream, start)
                await self._send(stream, {"type": "http.response.body", "body": _ERROR_BODY})
        finally:
            if not stream.gone and not stream.response_ended:  # the app ended without finishing its answer
                self._reset(stream, h2.errors.ErrorCodes.INTERNAL_ERROR)
            elif not stream.gone and not stream.ended:  # answered before the whole request arrived
                self._reset(stream, h2.errors.ErrorCodes.NO_ERROR)
            self._forget(stream)

    async def _send(self, stream: _Stream, message: Message) -> None:
        kind = message["type"]
        if kind == "http.response.start":
            headers = [(b":status", b"%d" % message["status"])]
            for name, value in message.get("headers", ()):
                name = bytes(name).lower()
                if name not in _HOP_BY_HOP:
                    headers.append((name, bytes(value)))
            stream.response_headers = headers
            return
        if kind != "http.response.body" or stream.gone or stream.response_ended:
            return
        body: bytes = message.get("body", b"")
        end = not message.get("more_body", False)
        try:
            if not stream.response_started:
                if stream.response_headers is None:
                    raise RuntimeError("http.response.body before http.response.start")
                stream.response_started = True
                self._cancel_read_timer(stream)
                self._h2.send_headers(stream.id, stream.response_headers, end_stream=end and not body)
                if end and not body:
                    stream.response_ended = True
            if body:
                await self._send_data(stream, body, end)
            elif end and not stream.response_ended:
                self._h2.end_stream(stream.id)
            stream.response_ended = end
            if end:
                stream.received.set()  # a receive() waiting for a disconnect returns
        except h2.exceptions.ProtocolError:  # the stream was reset or the connection closed meanwhile
            stream.gone = True
        self._flush_soon()

    async def _send_data(self, stream: _Stream, data: bytes, end: bool) -> None:
        while True:
            if stream.gone:
                return
            if not self._writable.is_set():
                await self._writable.wait()
                continue
            room = min(self._h2.local_flow_control_window(stream.id), self._h2.max_outbound_frame_size)
            if room <= 0:
                stream.window.clear()
                self._flush()
                await stream.window.wait()
                continue
            last = len(data) <= room
            self._h2.send_data(stream.id, data[:room], end_stream=end and last)
            if last:
                return
            data = data[room:]

    def _acknowledge(self, stream: _Stream) -> None:
        if stream.unacked:
            with contextlib.suppress(h2.exceptions.ProtocolError):  # reset, or the connection closed
                self._h2.acknowledge_received_data(stream.unacked, stream.id)
            stream.unacked = 0
            self._flush_soon()

    def _read_timed_out(self, stream: _Stream) -> None:
        stream.read_timer = None
        if stream.gone or stream.ended:
            return
        if not stream.response_started:
            body = _TIMEOUT_BODY % self._read_timeout_s
            headers = [(b":status", b"408"), (b"content-type", b"application/json")]
            try:
                self._h2.send_headers(stream.id, headers)
                self._h2.send_data(stream.id, body, end_stream=True)
            except (h2.exceptions.ProtocolError, h2.exceptions.FlowControlError):
                pass
            stream.response_started = stream.response_ended = True
        codes = h2.errors.ErrorCodes
        self._reset(stream, codes.NO_ERROR if stream.response_ended else codes.CANCEL)
        self._flush_soon()

    def _reset(self, stream: _Stream, code: h2.errors.ErrorCodes) -> None:
        with contextlib.suppress(h2.exceptions.ProtocolError):  # already closed on both sides
            self._h2.reset_stream(stream.id, code)
        stream.gone = True
        stream.received.set()
        stream.window.set()
        self._flush_soon()

    def _forget(self, stream: _Stream) -> None:
        self._acknowledge(stream)  # what the app never read gives the connection's window back
        stream.gone = True
        stream.received.set()
        stream.window.set()
        self._cancel_read_timer(stream)
        if self._streams.pop(stream.id, None) is not None and not self._streams:
            if self._closing:
                self._flush()
                self._close()
            else:
                self._arm_idle()

    def _cancel_read_timer(self, stream: _Stream) -> None:
        if stream.read_timer is not None:
            stream.read_timer.cancel()
            stream.read_timer = None

    # ------------------------------------------------------------------------------------------- writing
    def _flush_soon(self) -> None:
        if not self._flush_scheduled:
            self._flush_scheduled = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        data = self._h2.data_to_send()
        if data and self._transport is not None and not self._transport.is_closing():
            self._transport.write(data)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    # ------------------------------------------------------------------------------------------- closing
    def _arm_idle(self) -> None:
        self._disarm_idle()
        self._idle_timer = self._loop.call_later(self._idle_timeout_s, self.shutdown)

    def _disarm_idle(self) -> None:
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None

    def shutdown(self) -> None:
        """GOAWAY: no new streams; the connection closes once the open ones are answered (uvicorn calls this
        on a graceful shutdown, the idle timer when no stream has been open for a while)."""
        self._idle_timer = None
        if not self._closing:
            self._closing = True
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self._h2.close_connection()
        self._flush()
        if not self._streams:
            self._close()

    def _close(self) -> None:
        if self._transport is not None and not self._transport.is_closing():
            self._transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.discard(self)
        self._disarm_idle()
        self._writable.set()
        for stream in list(self._streams.values()):
            stream.gone = True
            stream.received.set()
            stream.window.set()
            self._cancel_read_timer(stream)

"""The server end of the RPC transport: `RpcServer` accepts authenticated peer connections and serves them.

Each connection must pass the handshake (handshake.py) within `handshake_timeout`, then may send REQUEST
frames (answered by `handler` with RESPONSE or ERROR under the same correlation id, in whatever order they
finish), ONEWAY frames (given to `on_oneway`) and cancels (frames.py: the named request's running handler
is cancelled, nothing is answered; a cancel is read like any frame, so while a flooding client's connection
is paused at the concurrency limit, its cancels wait with the rest).

A request whose payload does not decode is answered with an ERROR (code "bad_message") rather than a
closed connection: the framing is intact, and closing would only turn a version skew into a reconnect loop.
"""

from __future__ import annotations

import asyncio
import collections
import inspect
import logging
import ssl
from collections.abc import Callable

from hotstate.rpc.channel import (
    DEFAULT_HANDSHAKE_TIMEOUT,
    DEFAULT_MAX_CONCURRENT_REQUESTS,
    ERROR_BAD_MESSAGE,
    ERROR_BAD_RESPONSE,
    ERROR_INTERNAL,
    HANDSHAKE_MAX_FRAME_BYTES,
    Channel,
    Handler,
    OnewayHandler,
    PeerInfo,
    format_address,
)
from hotstate.rpc.errors import FrameError, RemoteError
from hotstate.rpc.frames import DEFAULT_MAX_FRAME_BYTES, Frame, FrameKind, encode_frame, is_cancel
from hotstate.rpc.handshake import HandshakeRefused, ServerHandshake, normalize_secret
from hotstate.rpc.schema import DecodeError, EncodeError, TypeRegistry
from hotstate.tls import TlsListener

logger = logging.getLogger(__name__)


class _ServerChannel(Channel):
    def __init__(self, server: RpcServer) -> None:
        super().__init__(server.max_frame_bytes)
        self._server = server
        self._handshake = ServerHandshake(server.cluster_id, server._secret, server.node_id)
        self._timer: asyncio.TimerHandle | None = None
        self.peer: PeerInfo | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        # Running requests' correlation ids, by task (a cancel looks one up; cancels are rare).
        self._requests: dict[asyncio.Task[None], int] = {}
        self._backlog: collections.deque[Frame] = collections.deque()
        self._in_flight = 0
        self._reading_paused = False
        self._bad_message_logged = False

    def _who(self) -> str:
        if self.peer is not None:
            return f"from {self.peer}"
        claimed = self._handshake.peer_node_id
        claim = f" (claims node {claimed})" if claimed is not None else ""
        return f"from {self.remote}{claim}"

    def _describe_closing(self) -> str:
        return f"{'closed' if self._authenticated else 'refused'} connection {self._who()}"

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._server._channels.add(self)
        self._timer = self._loop.call_later(self._server.handshake_timeout, self._handshake_timed_out)

    def _handshake_timed_out(self) -> None:
        if not self._authenticated:
            self._refuse(HandshakeRefused(f"handshake timed out after {self._server.handshake_timeout:g} s"))

    def _refuse(self, refusal: HandshakeRefused) -> None:
        if self._closing:
            return
        if refusal.peer_message:
            # Tell the peer why, so its operator sees the reason too; tiny, so the close flushes it.
            self._send(encode_frame(FrameKind.ERROR, 0, [refusal.code, refusal.peer_message]))
        logger.warning("refused connection %s: %s", self._who(), refusal.reason)
        self.shutdown(refusal.reason)

    def _on_handshake_frame(self, frame: Frame) -> None:
        try:
            kind, payload = self._handshake.step(frame.kind, frame.payload)
        except HandshakeRefused as refusal:
            self._refuse(refusal)
            return
        self._send(encode_frame(kind, 0, payload))
        if self._handshake.done:
            assert self._handshake.peer_node_id is not None
            self._authenticated = True
            if self._timer is not None:
                self._timer.cancel()
            self._decoder.max_frame_bytes = self._max_frame_bytes
            self.peer = PeerInfo(self._handshake.peer_node_id, self.remote_host, self.remote_port)
            logger.info("accepted connection from %s", self.peer)

    def _on_frame(self, frame: Frame) -> None:
        if is_cancel(frame):  # handled here, not in a task of its own behind the concurrency limit
            self._cancel(frame.correlation_id)
            return
        if frame.kind is FrameKind.REQUEST or frame.kind is FrameKind.ONEWAY:
            if self._in_flight < self._server.max_concurrent_requests:
                self._start(frame)
            else:
                # At the concurrency limit: hold what was already read and stop reading more, so a
                # flooding client is slowed by TCP instead of growing our memory.
                self._backlog.append(frame)
                if not self._reading_paused and self._transport is not None:
                    self._reading_paused = True
                    self._transport.pause_reading()
            return
        self._abort(f"unexpected {frame.kind.name} frame from a client")

    def _start(self, frame: Frame) -> None:
        self._in_flight += 1
        task = self._loop.create_task(self._serve(frame))
        self._tasks.add(task)
        if frame.kind is FrameKind.REQUEST:
            self._requests[task] = frame.correlation_id
        task.add_done_callback(self._finished)

    def _cancel(self, cid: int) -> None:
        for task, running in self._requests.items():
            if running == cid:
                logger.debug("request %d %s cancelled by the client", cid, self._who())
                task.cancel()
                return

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        self._requests.pop(task, None)
        self._in_flight -= 1
        if not task.cancelled() and task.exception() is not None:
            logger.error("request task %s failed", self._who(), exc_info=task.exception())
        if self._closing:
            return
        limit = self._server.max_concurrent_requests
        while self._backlog and self._in_flight < limit:
            self._start(self._backlog.popleft())
        if not self._backlog and self._reading_paused and self._transport is not None:
            self._reading_paused = False
            self._transport.resume_reading()

    async def _serve(self, frame: Frame) -> None:
        server = self._server
        peer = self.peer
        assert peer is not None
        try:
            message = server.registry.from_wire(frame.payload)
        except DecodeError as e:
            self._bad_message(frame, e)
            return
        if frame.kind is FrameKind.ONEWAY:
            await self._deliver_oneway(peer, message)
            return
        cid = frame.correlation_id
        try:
            result = await server.handler(peer, message)
        except RemoteError as e:
            self._reply_error(cid, e.code, e.message)
            return
        except Exception as e:
            logger.exception("handler failed on %s %s", type(message).__name__, self._who())
            self._reply_error(cid, ERROR_INTERNAL, f"{type(e).__name__}: {e}")
            return
        try:
            wire = None if result is None else server.registry.to_wire(result)
            data = encode_frame(FrameKind.RESPONSE, cid, wire, self._max_frame_bytes)
        except (EncodeError, FrameError) as e:
            logger.error("cannot send the response to %s %s: %s", type(message).__name__, self._who(), e)
            self._reply_error(cid, ERROR_BAD_RESPONSE, str(e))
            return
        if self._send(data) and self._write_paused:
            # Hold the concurrency slot until the client reads: a client that does not read stops
            # getting its requests served instead of making us buffer every response.
            await self.drain()

    async def _deliver_oneway(self, peer: PeerInfo, message: object) -> None:
        on_oneway = self._server.on_oneway
        if on_oneway is None:
            logger.debug(
                "dropped one-way %s %s: the server has no one-way handler", type(message).__name__, peer
            )
            return
        try:
            result = on_oneway(peer, message)
            if inspect.isawaitable(result):
                await result
        except Exception:
            logger.exception("one-way handler failed on %s %s", type(message).__name__, self._who())

    def _bad_message(self, frame: Frame, error: DecodeError) -> None:
        # Logged at WARNING once per connection: a peer of another version may send many of these.
        level = logging.DEBUG if self._bad_message_logged else logging.WARNING
        self._bad_message_logged = True
        logger.log(level, "undecodable %s %s: %s", frame.kind.name, self._who(), error)
        if frame.kind is FrameKind.REQUEST:
            self._reply_error(frame.correlation_id, ERROR_BAD_MESSAGE, str(error))

    def _reply_error(self, cid: int, code: str, message: str) -> None:
        # Error texts come from exceptions and may be long; the cap keeps the frame far below any limit.
        self._send(encode_frame(FrameKind.ERROR, cid, [code, message[:4000]]))

    def _lost(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._server._channels.discard(self)
        self._backlog.clear()
        for task in self._tasks:
            task.cancel()
        if not self._authenticated and self.close_reason == "closed by the peer":
            logger.info("connection %s closed during the handshake", self._who())
        elif self.peer is not None:
            logger.debug("connection from %s ended: %s", self.peer, self.close_reason)
            on_peer_lost = self._server.on_peer_lost
            if self.closed_by_peer and on_peer_lost is not None:
                on_peer_lost(self.peer)

    async def cancel_tasks(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class RpcServer:
    """Accepts authenticated peer connections and serves their requests.

    `handler(peer, message)` answers REQUEST frames: its return value (a registered object, or None) is
    the response; a `RemoteError` it raises reaches the caller with its code; any other exception is
    logged here and reaches the caller as code "internal". Each request runs as its own task, at most
    `max_concurrent_requests` per connection, so answers may come back in any order.
    `on_oneway(peer, message)` receives ONEWAY frames (it may be a plain function or a coroutine function;
    it is called in arrival order and shares the concurrency limit). When a connection closes, its running
    handlers are cancelled: nobody is left to read their answers, and a long-polling fetch must not outlive
    its caller. `on_peer_lost(peer)`, when set, hears of every authenticated connection the peer closed or
    reset (not one this side closed): the first hint that the peer's process may have died.
    """

    def __init__(
        self,
        host: str,
        port: int,
        cluster_id: str,
        secret: bytes | str,
        node_id: int,
        handler: Handler,
        registry: TypeRegistry,
        *,
        on_oneway: OnewayHandler | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
        max_concurrent_requests: int = DEFAULT_MAX_CONCURRENT_REQUESTS,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        if not cluster_id:
            raise ValueError("cluster_id must not be empty")
        if max_frame_bytes < HANDSHAKE_MAX_FRAME_BYTES:
            raise ValueError(f"max_frame_bytes must be at least {HANDSHAKE_MAX_FRAME_BYTES}")
        if handshake_timeout <= 0 or max_concurrent_requests < 1:
            raise ValueError("handshake_timeout and max_concurrent_requests must be positive")
        self.host = host
        self._requested_port = port
        self.cluster_id = cluster_id
        self._secret = normalize_secret(secret)
        self.node_id = node_id
        self.handler = handler
        self.on_oneway = on_oneway
        self.registry = registry
        self.max_frame_bytes = max_frame_bytes
        self.handshake_timeout = handshake_timeout
        self.max_concurrent_requests = max_concurrent_requests
        self.on_peer_lost: Callable[[PeerInfo], None] | None = None
        # TLS under the handshake (tls.server_context): each connection is encrypted before any frame.
        self.tls = tls
        self._server: asyncio.Server | TlsListener | None = None
        self._channels: set[_ServerChannel] = set()

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("RpcServer already started")
        loop = asyncio.get_running_loop()
        if self.tls is None:
            self._server = await loop.create_server(
                lambda: _ServerChannel(self), self.host, self._requested_port, reuse_address=True
            )
        else:
            self._server = await TlsListener.start(
                lambda: _ServerChannel(self),
                self.host,
                self._requested_port,
                self.tls,
                handshake_timeout=self.handshake_timeout,
                what="RPC",
            )
        logger.info(
            "node %d serving RPC%s on %s",
            self.node_id,
            " over TLS" if self.tls is not None else "",
            format_address(self.host, self.port),
        )

    @property
    def port(self) -> int:
        """The bound port (the real one when constructed with port 0)."""
        if self._server is None or not self._server.sockets:
            return self._requested_port
        return int(self._server.sockets[0].getsockname()[1])

    @property
    def connections(self) -> int:
        """Open connections, including those still in the handshake."""
        return len(self._channels)

    async def close(self) -> None:
        """Stop listening, drop every connection and wait for running handlers to be cancelled."""
        server = self._server
        if server is None:
            return
        self._server = None
        server.close()
        channels = list(self._channels)
        for channel in channels:
            channel.abort_quietly("server closing")
        await asyncio.gather(*(channel.cancel_tasks() for channel in channels), return_exceptions=True)
        await server.wait_closed()

    async def __aenter__(self) -> RpcServer:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

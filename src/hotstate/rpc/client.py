"""The client end of the RPC transport: `Connection` keeps one connection to one peer address,
reconnecting with exponential backoff and jitter, and `PeerPool` keeps one `Connection` per peer node id.
"""

from __future__ import annotations

import asyncio
import logging
import random
import ssl
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hotstate.rpc.channel import (
    DEFAULT_BACKOFF_INITIAL,
    DEFAULT_BACKOFF_MAX,
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_HANDSHAKE_TIMEOUT,
    HANDSHAKE_MAX_FRAME_BYTES,
    Channel,
    format_address,
)
from hotstate.rpc.errors import (
    ConnectionLost,
    HandshakeError,
    NotConnected,
    RemoteError,
    RpcTimeout,
    UnknownPeer,
)
from hotstate.rpc.frames import DEFAULT_MAX_FRAME_BYTES, Frame, FrameKind, encode_cancel, encode_frame
from hotstate.rpc.handshake import ClientHandshake, HandshakeRefused, normalize_secret
from hotstate.rpc.schema import TypeRegistry
from hotstate.tls import describe_tls_error

logger = logging.getLogger(__name__)


def bootstrap_peer_id(index: int) -> int:
    """The pool id of a client's `index`-th bootstrap address (0-based). Negative, so it never collides
    with a node id and the handshake accepts whichever member listens there: a client may be given any
    subset of the servers, in any order (a Kafka bootstrap list), not every server in node-id order."""
    return -(index + 1)


def bootstrap_peers(servers: Sequence[tuple[str, int]]) -> dict[int, tuple[str, int]]:
    """`servers` under their `bootstrap_peer_id`s, for `PeerPool.update`."""
    return {bootstrap_peer_id(i): address for i, address in enumerate(servers)}


class _ClientChannel(Channel):
    def __init__(self, connection: Connection) -> None:
        super().__init__(connection.max_frame_bytes)
        self._connection = connection
        # A peer id <= 0 is a bootstrap address whose server is not known yet: any member may answer.
        peer = connection.peer_node_id
        expected = peer if peer is not None and peer > 0 else None
        self._handshake = ClientHandshake(
            connection.cluster_id, connection._secret, connection.node_id, expected
        )
        # Resolved when the handshake ends: None on success, else the error (a result, not an exception,
        # so a handshake nobody waits for any more cannot leave an unretrieved exception behind).
        self.ready: asyncio.Future[ConnectionLost | None] = self._loop.create_future()
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._next_id = 1

    @property
    def peer_node_id(self) -> int | None:
        return self._handshake.peer_node_id

    def _describe_closing(self) -> str:
        return f"closed connection to {self._connection}"

    def _resolve_ready(self, error: ConnectionLost | None) -> None:
        if not self.ready.done():
            self.ready.set_result(error)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        kind, payload = self._handshake.start()
        self._send(encode_frame(kind, 0, payload))

    def _on_handshake_frame(self, frame: Frame) -> None:
        try:
            reply = self._handshake.step(frame.kind, frame.payload)
        except HandshakeRefused as refusal:
            # Logged by the Connection (once per distinct reason), not here on every attempt.
            self._resolve_ready(HandshakeError(refusal.reason))
            self.shutdown(refusal.reason)
            return
        if reply is not None:
            self._send(encode_frame(reply[0], 0, reply[1]))
            return
        self._authenticated = True
        self._decoder.max_frame_bytes = self._max_frame_bytes
        self._resolve_ready(None)

    def _on_frame(self, frame: Frame) -> None:
        kind = frame.kind
        if kind is FrameKind.RESPONSE:
            future = self._pending.pop(frame.correlation_id, None)
            if future is None:
                logger.debug(
                    "late response %d from %s (timed out or cancelled)",
                    frame.correlation_id,
                    self._connection,
                )
            elif not future.done():
                future.set_result(frame.payload)
        elif kind is FrameKind.ERROR:
            payload = frame.payload
            if type(payload) is not list or len(payload) != 2 or not all(type(p) is str for p in payload):
                self._abort("malformed ERROR frame payload")
                return
            future = self._pending.pop(frame.correlation_id, None)
            if future is not None and not future.done():
                future.set_exception(RemoteError(payload[0], payload[1]))
        else:
            self._abort(f"unexpected {kind.name} frame from a server")

    def _lost(self) -> None:
        reason = self.close_reason or "connection closed"
        if not self._authenticated and self.closed_by_peer and reason == "closed by the peer":
            # A TLS listener drops what fails its handshake without a word (asyncio sends no alert).
            reason += (
                " (a client certificate from the cluster's CA may be required: rpc.tls.client.auth)"
                if self._connection.tls is not None
                else " (if its rpc listener uses TLS, connect with TLS: give the cluster's CA)"
            )
        self._resolve_ready(ConnectionLost(f"connection closed during the handshake: {reason}"))
        pending, self._pending = self._pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(ConnectionLost(f"connection to {self._connection} lost: {reason}"))

    async def call(self, payload: object, deadline: float, what: str, timeout: float) -> Any:
        cid, future, timer = self._start(payload, deadline, what, timeout)
        try:
            if self._write_paused:
                await self.drain()
            return await future
        except asyncio.CancelledError:
            if cid in self._pending:  # given up on, not answered: the server may stop its work
                self._send(encode_cancel(cid))
            raise
        finally:
            timer.cancel()
            self._pending.pop(cid, None)

    def call_soon(self, payload: object, deadline: float, what: str, timeout: float) -> asyncio.Future[Any]:
        """`call` without a coroutine: the request is written now, and the future takes its answer (or
        the timeout, or the connection's loss). Only while the peer reads (not `_write_paused`)."""
        try:
            cid, future, timer = self._start(payload, deadline, what, timeout)
        except ConnectionLost as lost:
            failed: asyncio.Future[Any] = self._loop.create_future()
            failed.set_exception(lost)
            return failed
        pending = self._pending

        def settled(done: asyncio.Future[Any]) -> None:
            timer.cancel()
            if pending.pop(cid, None) is not None and done.cancelled():
                self._send(encode_cancel(cid))  # given up on, not answered: the server may stop its work

        future.add_done_callback(settled)
        return future

    def _start(
        self, payload: object, deadline: float, what: str, timeout: float
    ) -> tuple[int, asyncio.Future[Any], asyncio.TimerHandle]:
        """Write a request: its id, the future its answer goes to, and its timer (the caller cancels the
        timer and forgets the id once the future is done). Raises ConnectionLost when it cannot be written."""
        cid = self._next_id
        self._next_id += 1
        data = encode_frame(FrameKind.REQUEST, cid, payload, self._max_frame_bytes)
        if not self._send(data):
            raise ConnectionLost(f"connection to {self._connection} lost: {self.close_reason}")
        future: asyncio.Future[Any] = self._loop.create_future()
        self._pending[cid] = future
        # A timer per request instead of asyncio.wait_for: no extra task on the hot path.
        timer = self._loop.call_at(deadline, self._expire, cid, what, timeout)
        return cid, future, timer

    def _expire(self, cid: int, what: str, timeout: float) -> None:
        future = self._pending.pop(cid, None)
        if future is not None and not future.done():
            future.set_exception(RpcTimeout(f"{what} to {self._connection} timed out after {timeout:g} s"))

    def oneway(self, payload: object, what: str) -> bool:
        data = encode_frame(FrameKind.ONEWAY, 0, payload, self._max_frame_bytes)
        if self._buffered_bytes > self._max_frame_bytes:
            # The peer is not reading; one-way messages are droppable (Raft retries), memory is not.
            logger.debug("dropped one-way %s to %s: write buffer full", what, self._connection)
            return False
        return self._send(data)


class Connection:
    """A persistent, lazily opened connection to one peer address.

    The first `request`, `send_oneway` or `connect` starts a background task that connects, runs the
    handshake and, whenever the connection is lost or refused, tries again after an exponential backoff
    (`backoff_initial` doubling up to `backoff_max`, each delay jittered down by up to half) until `close`.
    While it is between attempts, requests fail at once with `ConnectionLost` rather than waiting: the
    callers (Raft, query routing) have their own retry and failover logic and want to know now.
    """

    def __init__(
        self,
        host: str,
        port: int,
        *,
        cluster_id: str,
        secret: bytes | str,
        node_id: int,
        registry: TypeRegistry,
        peer_node_id: int | None = None,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
        backoff_initial: float = DEFAULT_BACKOFF_INITIAL,
        backoff_max: float = DEFAULT_BACKOFF_MAX,
        on_lost: Callable[[], None] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        if not cluster_id:
            raise ValueError("cluster_id must not be empty")
        if not 0 < backoff_initial <= backoff_max:
            raise ValueError("need 0 < backoff_initial <= backoff_max")
        if connect_timeout <= 0 or handshake_timeout <= 0:
            raise ValueError("timeouts must be positive")
        if max_frame_bytes < HANDSHAKE_MAX_FRAME_BYTES:
            raise ValueError(f"max_frame_bytes must be at least {HANDSHAKE_MAX_FRAME_BYTES}")
        self.host = host
        self.port = port
        self.cluster_id = cluster_id
        self._secret = normalize_secret(secret)
        self.node_id = node_id
        self.registry = registry
        self.peer_node_id = peer_node_id
        self.max_frame_bytes = max_frame_bytes
        self.connect_timeout = connect_timeout
        self.handshake_timeout = handshake_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        # TLS under the handshake: the context checks the server's certificate and its host name.
        self.tls = tls
        self._channel: _ClientChannel | None = None
        self._task: asyncio.Task[None] | None = None
        # The connection attempt in progress (None or done: between attempts).
        self._attempt: asyncio.Future[None] | None = None
        self._connected = asyncio.Event()
        self._closed = False
        self._last_error = "not connected yet"
        # Requests failing for want of a connection raise this class, so a refusal reads as HandshakeError.
        self._last_error_class: type[ConnectionLost] = ConnectionLost
        self._logged_refusal: str | None = None
        self._retry_at = 0.0
        self._on_lost = on_lost

    def __str__(self) -> str:
        address = format_address(self.host, self.port)
        # A bootstrap address (id <= 0) is known to its user only by the address itself.
        known = self.peer_node_id is not None and self.peer_node_id > 0
        return f"node {self.peer_node_id} at {address}" if known else address

    @property
    def address(self) -> tuple[str, int]:
        return (self.host, self.port)

    @property
    def connected(self) -> bool:
        channel = self._channel
        return channel is not None and channel.usable

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def last_error(self) -> str:
        """Why the last attempt failed or the last connection ended."""
        return self._last_error

    async def connect(self, timeout: float) -> None:
        """Wait until connected (retrying with backoff). Raises `ConnectionLost` after `timeout` s."""
        if self._closed:
            raise ConnectionLost(f"connection to {self} is closed")
        self._ensure_started()
        try:
            async with asyncio.timeout(timeout):
                await self._connected.wait()
        except TimeoutError:
            raise ConnectionLost(
                f"could not connect to {self} within {timeout:g} s: {self._last_error}"
            ) from None

    async def request(self, message: object, timeout: float) -> object:
        """Send `message` and return the decoded response (None if the handler returned None).

        Raises `RpcTimeout`, `RemoteError`, `ConnectionLost` (`HandshakeError` when refused),
        `EncodeError` / `FrameError` for a message that cannot be sent, `DecodeError` for a response
        that does not decode.
        """
        if self._closed:
            raise ConnectionLost(f"connection to {self} is closed")
        if not timeout > 0:
            raise ValueError(f"timeout must be positive, got {timeout!r}")
        payload = self.registry.to_wire(message)
        what = type(message).__name__
        deadline = asyncio.get_running_loop().time() + timeout
        channel = self._channel
        if channel is None or not channel.usable:
            channel = await self._wait_for_channel(deadline, what, timeout)
        result = await channel.call(payload, deadline, what, timeout)
        return None if result is None else self.registry.from_wire(result)

    async def ensure_channel(self, timeout: float) -> None:
        """Return once a `request` would be written at once (connected, or the attempt under way succeeded);
        raise as `request` would for want of a connection. A caller whose requests must leave in order can
        wait here, then start them together: a request that itself waits for the connection may be
        overtaken by one made while it resumes."""
        if self._closed:
            raise ConnectionLost(f"connection to {self} is closed")
        channel = self._channel
        if channel is None or not channel.usable:
            deadline = asyncio.get_running_loop().time() + timeout
            await self._wait_for_channel(deadline, "connecting", timeout)

    def request_soon(self, message: object, timeout: float) -> asyncio.Future[object]:
        """`request` as a future instead of a coroutine: for a caller that waits on it with callbacks and
        timers rather than a task of its own (a forwarded query's hedge). Written at once when connected;
        else `request` runs in a task. Every failure `request` raises ends up in the future."""
        loop = asyncio.get_running_loop()
        channel = self._channel
        if self._closed or channel is None or not channel.usable or channel._write_paused:
            return loop.create_task(self.request(message, timeout))
        answer: asyncio.Future[object] = loop.create_future()
        try:
            if not timeout > 0:
                raise ValueError(f"timeout must be positive, got {timeout!r}")
            payload = self.registry.to_wire(message)
            what = type(message).__name__
            raw = channel.call_soon(payload, loop.time() + timeout, what, timeout)
        except Exception as error:
            answer.set_exception(error)
            return answer
        registry = self.registry

        def decoded(done: asyncio.Future[Any]) -> None:
            if answer.done():
                return
            if done.cancelled():
                answer.cancel()
            elif (failure := done.exception()) is not None:
                answer.set_exception(failure)
            else:
                result = done.result()
                try:
                    answer.set_result(None if result is None else registry.from_wire(result))
                except Exception as error:  # DecodeError, as `request` raises it
                    answer.set_exception(error)

        def abandoned(_: object) -> None:
            if answer.cancelled():
                raw.cancel()  # frees the pending slot and the timer

        raw.add_done_callback(decoded)
        answer.add_done_callback(abandoned)
        return answer

    def send_oneway(self, message: object) -> bool:
        """Send without waiting for an answer. Returns False (and logs at DEBUG) if the message was dropped
        because there is no connection right now; Raft and heartbeats tolerate loss."""
        payload = self.registry.to_wire(message)
        channel = self._channel
        if channel is None or not channel.usable:
            if not self._closed:
                self._ensure_started()
            logger.debug("dropped one-way %s to %s: not connected", type(message).__name__, self)
            return False
        return channel.oneway(payload, type(message).__name__)

    async def close(self) -> None:
        """Close the connection and stop reconnecting; requests in flight fail with `ConnectionLost`."""
        if self._closed:
            return
        self._closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        channel = self._channel
        self._channel = None
        if channel is not None:
            channel.shutdown("closed by this side")
            channel._lost()  # fail waiting requests now, not when the socket is finally gone
        if task is not None:
            await asyncio.gather(task, return_exceptions=True)
        if self._attempt is not None and not self._attempt.done():
            self._attempt.set_result(None)
        self._connected.clear()

    # -- internals ----------------------------------------------------------------------------------

    def _ensure_started(self) -> None:
        if self._task is None and not self._closed:
            loop = asyncio.get_running_loop()
            self._attempt = loop.create_future()
            self._task = loop.create_task(self._run(), name=f"hotstate-rpc-connection {self}")

    async def _wait_for_channel(self, deadline: float, what: str, timeout: float) -> _ClientChannel:
        self._ensure_started()
        loop = asyncio.get_running_loop()
        attempt = self._attempt
        closing = self._channel
        # Every failure here comes before the request is written: NotConnected (or the handshake's
        # refusal) tells callers it was certainly not sent.
        if closing is not None:
            # Connected a moment ago and closing now: that close is the news, not an older failure.
            raise NotConnected(f"connection to {self} lost: {closing.close_reason or 'closing'}")
        if attempt is None or attempt.done():
            wait = max(0.0, self._retry_at - loop.time())
            raise self._not_sent(
                f"not connected to {self}: {self._last_error} (next attempt in {wait:.2f} s)"
            )
        try:
            async with asyncio.timeout_at(deadline):
                await asyncio.shield(attempt)
        except TimeoutError:
            raise NotConnected(f"{what} to {self} timed out after {timeout:g} s while connecting") from None
        channel = self._channel
        if channel is None or not channel.usable:
            raise self._not_sent(f"cannot connect to {self}: {self._last_error}")
        return channel

    def _not_sent(self, message: str) -> ConnectionLost:
        return (
            HandshakeError(message)
            if issubclass(self._last_error_class, HandshakeError)
            else NotConnected(message)
        )

    def _backoff(self, failures: int) -> float:
        ceiling = min(self.backoff_max, self.backoff_initial * (1 << min(failures, 30)))
        # Jitter keeps a cluster's servers from reconnecting to a restarted peer in lockstep.
        return ceiling * random.uniform(0.5, 1.0)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        failures = 0
        while not self._closed:
            attempt = self._attempt
            try:
                channel = await self._open()
            except ConnectionLost as e:
                failures += 1
                self._note_failure(e, failures)
            else:
                failures = 0
                self._channel = channel
                self._logged_refusal = None
                self._connected.set()
                if attempt is not None and not attempt.done():
                    attempt.set_result(None)
                logger.info("connected to %s", self)
                await channel.closed
                self._connected.clear()
                if self._channel is channel:
                    self._channel = None
                self._last_error = channel.close_reason or "connection closed"
                self._last_error_class = ConnectionLost
                if not self._closed:
                    logger.info("lost connection to %s: %s; reconnecting", self, self._last_error)
                    if channel.closed_by_peer and self._on_lost is not None:
                        self._on_lost()
            if attempt is not None and not attempt.done():
                attempt.set_result(None)
            if self.closed:  # close() may have run while we awaited
                return
            delay = self._backoff(failures)
            self._retry_at = loop.time() + delay
            await asyncio.sleep(delay)
            self._attempt = loop.create_future()

    def _note_failure(self, error: ConnectionLost, failures: int) -> None:
        reason = str(error)
        self._last_error = reason
        self._last_error_class = type(error)
        if isinstance(error, HandshakeError):
            # A refusal is a misconfiguration worth a WARNING, but not one per retry.
            level = logging.DEBUG if reason == self._logged_refusal else logging.WARNING
            self._logged_refusal = reason
        else:
            level = logging.INFO if failures == 1 else logging.DEBUG
        logger.log(level, "cannot connect to %s: %s", self, reason)

    async def _open(self) -> _ClientChannel:
        loop = asyncio.get_running_loop()
        channel = _ClientChannel(self)
        try:
            async with asyncio.timeout(self.connect_timeout):
                if self.tls is None:
                    await loop.create_connection(lambda: channel, self.host, self.port)
                else:
                    await loop.create_connection(
                        lambda: channel,
                        self.host,
                        self.port,
                        ssl=self.tls,
                        server_hostname=self.host,
                        ssl_handshake_timeout=self.handshake_timeout,
                    )
        except TimeoutError:
            raise ConnectionLost(f"connecting timed out after {self.connect_timeout:g} s") from None
        except ssl.SSLError as e:
            # A certificate we refuse (or a peer that refuses ours) is a misconfiguration: a refusal, not
            # an outage, so it is logged at WARNING once and callers see HandshakeError.
            address = format_address(self.host, self.port)
            raise HandshakeError(describe_tls_error(e, address) or str(e)) from None
        except ConnectionResetError as e:
            if self.tls is None:
                raise ConnectionLost(e.strerror or "connection reset by the peer") from None
            # Reset in the middle of our TLS hello: a listener without TLS refusing what it read.
            raise HandshakeError(
                f"TLS handshake with {format_address(self.host, self.port)} failed: connection reset "
                "(does its rpc listener use TLS? both ends need rpc.tls.*)"
            ) from None
        except OSError as e:
            raise ConnectionLost(e.strerror or str(e)) from None
        try:
            async with asyncio.timeout(self.handshake_timeout):
                error = await asyncio.shield(channel.ready)
        except TimeoutError:
            channel.shutdown("handshake timed out")
            raise HandshakeError(f"handshake timed out after {self.handshake_timeout:g} s") from None
        except BaseException:
            channel.shutdown("connection attempt cancelled")
            raise
        if error is not None:
            channel.shutdown(str(error))
            raise error
        if self._closed:
            channel.shutdown("closed by this side")
            raise ConnectionLost("closed by this side")
        return channel


class PeerPool:
    """One `Connection` per peer node id, created on first use from the address map given to `update`.

    `on_lost(peer_id)`, when set, hears of every established connection the peer closed or reset."""

    def __init__(
        self,
        node_id: int,
        cluster_id: str,
        secret: bytes | str,
        registry: TypeRegistry,
        *,
        max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES,
        connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
        handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
        backoff_initial: float = DEFAULT_BACKOFF_INITIAL,
        backoff_max: float = DEFAULT_BACKOFF_MAX,
        tls: ssl.SSLContext | None = None,
    ) -> None:
        self.node_id = node_id
        self.cluster_id = cluster_id
        self._secret = normalize_secret(secret)
        self.registry = registry
        self._options: dict[str, Any] = {
            "max_frame_bytes": max_frame_bytes,
            "connect_timeout": connect_timeout,
            "handshake_timeout": handshake_timeout,
            "backoff_initial": backoff_initial,
            "backoff_max": backoff_max,
            "tls": tls,
        }
        self._addresses: dict[int, tuple[str, int]] = {}
        self._connections: dict[int, Connection] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._closed = False
        self.on_lost: Callable[[int], None] | None = None

    @property
    def peers(self) -> dict[int, tuple[str, int]]:
        return dict(self._addresses)

    def update(self, peers: Mapping[int, tuple[str, int]]) -> None:
        """Replace the address map. Connections to removed peers or changed addresses are closed."""
        checked: dict[int, tuple[str, int]] = {}
        for peer_id, address in peers.items():
            if (
                not isinstance(address, tuple)
                or len(address) != 2
                or not isinstance(address[0], str)
                or type(address[1]) is not int
                or not 0 < address[1] < 65536
            ):
                raise ValueError(f"bad address for node {peer_id}: {address!r} (expected (host, port))")
            checked[peer_id] = address
        for peer_id, connection in list(self._connections.items()):
            if checked.get(peer_id) != connection.address:
                del self._connections[peer_id]
                self._close_later(connection)
        self._addresses = checked

    def connection(self, peer_id: int) -> Connection:
        """The connection to `peer_id` (created, not yet connected, on first use). Raises `UnknownPeer`."""
        connection = self._connections.get(peer_id)
        if connection is not None:
            return connection
        if self._closed:
            raise ConnectionLost("peer pool is closed")
        address = self._addresses.get(peer_id)
        if address is None:
            raise UnknownPeer(f"no address for node {peer_id} (known: {sorted(self._addresses)})")
        connection = Connection(
            address[0],
            address[1],
            cluster_id=self.cluster_id,
            secret=self._secret,
            node_id=self.node_id,
            registry=self.registry,
            peer_node_id=peer_id,
            on_lost=lambda: self._peer_lost(peer_id),
            **self._options,
        )
        self._connections[peer_id] = connection
        return connection

    def _peer_lost(self, peer_id: int) -> None:
        if self.on_lost is not None:
            self.on_lost(peer_id)

    def is_connected(self, peer_id: int) -> bool:
        connection = self._connections.get(peer_id)
        return connection is not None and connection.connected

    async def request(self, peer_id: int, message: object, timeout: float) -> object:
        """`Connection.request` to `peer_id`; raises `UnknownPeer` for an id without an address."""
        return await self.connection(peer_id).request(message, timeout)

    def request_soon(self, peer_id: int, message: object, timeout: float) -> asyncio.Future[object]:
        """`Connection.request_soon` to `peer_id`; an unknown id fails the future with `UnknownPeer`."""
        try:
            connection = self.connection(peer_id)
        except Exception as error:
            failed: asyncio.Future[object] = asyncio.get_running_loop().create_future()
            failed.set_exception(error)
            return failed
        return connection.request_soon(message, timeout)

    def send_oneway(self, peer_id: int, message: object) -> bool:
        """`Connection.send_oneway` to `peer_id`; an unknown id drops the message (logged at DEBUG)."""
        try:
            connection = self.connection(peer_id)
        except (UnknownPeer, ConnectionLost) as e:
            logger.debug("dropped one-way %s to node %s: %s", type(message).__name__, peer_id, e)
            # Still refuse what could never be sent, so a bad message is not hidden by a missing peer.
            self.registry.to_wire(message)
            return False
        return connection.send_oneway(message)

    async def close(self) -> None:
        self._closed = True
        connections = list(self._connections.values())
        self._connections.clear()
        await asyncio.gather(*(c.close() for c in connections), return_exceptions=True)
        if self._closing:
            await asyncio.gather(*self._closing, return_exceptions=True)

    def _close_later(self, connection: Connection) -> None:
        if connection._task is None:
            connection._closed = True  # never started: nothing to wait for
            return
        task = asyncio.get_running_loop().create_task(connection.close())
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)

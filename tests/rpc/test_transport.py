"""The transport on real loopback sockets: requests, pipelining, timeouts, reconnects, and refusals that
close one connection while the server keeps serving everyone else."""

from __future__ import annotations

import asyncio
import logging
import random
import struct
import time
from collections.abc import Callable
from typing import Any

import pytest

from hotstate.rpc import (
    Connection,
    ConnectionLost,
    EncodeError,
    FrameDecoder,
    FrameError,
    FrameKind,
    HandshakeError,
    PeerInfo,
    PeerPool,
    RemoteError,
    RpcServer,
    RpcTimeout,
    TypeRegistry,
    UnknownPeer,
    encode_frame,
)
from hotstate.rpc.frames import Frame, encode_cancel
from hotstate.rpc.handshake import ClientHandshake

from .helpers import (
    CLUSTER,
    SECRET,
    Crash,
    Fail,
    Hold,
    Holds,
    Note,
    Ping,
    Pong,
    Stops,
    echo_handler,
    make_server,
    run,
    transport_registry,
    watching,
)

REGISTRY = transport_registry()
LOGGER = "hotstate.rpc"


def connection_to(
    server: RpcServer,
    *,
    node_id: int = 9,
    secret: bytes = SECRET,
    cluster_id: str = CLUSTER,
    registry: TypeRegistry = REGISTRY,
    **options: Any,
) -> Connection:
    options.setdefault("backoff_initial", 0.01)
    options.setdefault("backoff_max", 0.2)
    return Connection(
        "127.0.0.1",
        server.port,
        cluster_id=cluster_id,
        secret=secret,
        node_id=node_id,
        registry=registry,
        **options,
    )


async def assert_serves(server: RpcServer, seq: int = 1) -> None:
    """A fresh, well-configured client still gets answers."""
    good = connection_to(server, node_id=42)
    try:
        assert await good.request(Ping(seq, b"ok"), timeout=5) == Pong(seq, b"ok")
    finally:
        await good.close()


async def read_frames(reader: asyncio.StreamReader, decoder: FrameDecoder, count: int) -> list[Frame]:
    frames: list[Frame] = []
    while len(frames) < count:
        data = await reader.read(65536)
        if not data:
            raise ConnectionError("closed")
        frames += decoder.feed(data)
    return frames


async def raw_session(
    port: int, node_id: int = 5
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter, FrameDecoder]:
    """A hand-driven client that has passed the handshake (to send frames the real client never would)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    decoder = FrameDecoder()
    handshake = ClientHandshake(CLUSTER, SECRET, node_id)
    frame: tuple[FrameKind, object] | None = handshake.start()
    while frame is not None:
        writer.write(encode_frame(frame[0], 0, frame[1]))
        (reply,) = await read_frames(reader, decoder, 1)
        frame = handshake.step(reply.kind, reply.payload)
    return reader, writer, decoder


async def closed_by_peer(reader: asyncio.StreamReader, timeout: float = 5.0) -> bytes:
    """Read until EOF; returns what came before it."""
    async with asyncio.timeout(timeout):
        return await reader.read()


def warnings_of(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]


# -- requests ------------------------------------------------------------------------------------------


def test_request_response_and_peer_identity() -> None:
    seen: list[PeerInfo] = []

    async def handler(peer: PeerInfo, message: object) -> object | None:
        seen.append(peer)
        return await echo_handler(peer, message)

    async def main() -> None:
        async with make_server(REGISTRY, handler=handler) as server:
            client = connection_to(server, node_id=7, peer_node_id=1)
            assert await client.request(Ping(1, b"hello"), timeout=5) == Pong(1, b"hello")
            assert await client.request(Note("no answer"), timeout=5) is None
            assert client.connected
            assert seen[0].node_id == 7 and seen[0].host == "127.0.0.1"
            await client.close()
            with pytest.raises(ConnectionLost, match="closed"):
                await client.request(Ping(2), timeout=1)

    run(main())


def test_remote_errors_carry_code_and_message(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with make_server(REGISTRY) as server:
            client = connection_to(server)
            with pytest.raises(RemoteError) as info:
                await client.request(Fail("not_leader", "node 3 leads"), timeout=5)
            assert (info.value.code, info.value.message) == ("not_leader", "node 3 leads")
            with pytest.raises(RemoteError) as info:
                await client.request(Crash(), timeout=5)
            assert info.value.code == "internal"
            assert info.value.message == "RuntimeError: handler crashed on purpose"
            # The connection survives application errors.
            assert await client.request(Ping(3), timeout=5) == Pong(3)
            await client.close()

    with caplog.at_level(logging.ERROR, logger=LOGGER):
        run(main())
    assert any("handler failed on Crash from node 9" in r.getMessage() for r in caplog.records)


def test_unsendable_messages_fail_locally_and_keep_the_connection() -> None:
    async def main() -> None:
        async with make_server(REGISTRY, max_frame_bytes=64 * 1024) as server:
            client = connection_to(server, max_frame_bytes=64 * 1024)
            with pytest.raises(FrameError, match="exceeds the limit of 65536 bytes"):
                await client.request(Ping(1, b"x" * 100_000), timeout=5)
            with pytest.raises(EncodeError, match="str is not registered"):
                await client.request("hello", timeout=5)
            assert await client.request(Ping(2), timeout=5) == Pong(2)
            await client.close()

    run(main())


def test_unencodable_response_becomes_a_bad_response_error(caplog: pytest.LogCaptureFixture) -> None:
    async def handler(peer: PeerInfo, message: object) -> object | None:
        return "not a registered type"

    async def main() -> None:
        async with make_server(REGISTRY, handler=handler) as server:
            client = connection_to(server)
            with pytest.raises(RemoteError) as info:
                await client.request(Ping(1), timeout=5)
            assert info.value.code == "bad_response"
            await client.close()

    with caplog.at_level(logging.ERROR, logger=LOGGER):
        run(main())


def test_pipelining_1000_requests_on_one_connection_answered_out_of_order() -> None:
    answered: list[int] = []
    rng = random.Random(7)
    turns = [rng.randrange(20) for _ in range(1000)]

    async def handler(peer: PeerInfo, message: object) -> object | None:
        assert isinstance(message, Ping)
        for _ in range(turns[message.seq]):  # each request takes its own number of loop turns
            await asyncio.sleep(0)
        answered.append(message.seq)
        return Pong(message.seq)

    async def main() -> None:
        async with make_server(REGISTRY, handler=handler, max_concurrent_requests=256) as server:
            client = connection_to(server)
            requests = [client.request(Ping(i), timeout=20) for i in range(1000)]
            results = await asyncio.gather(*requests)
            assert results == [Pong(i) for i in range(1000)]
            assert server.connections == 1
            await client.close()

    run(main())
    assert sorted(answered) == list(range(1000))
    assert answered != sorted(answered)  # answered out of order, matched by correlation id


def test_concurrency_limit_per_connection_holds_and_everything_completes() -> None:
    running = 0
    peak = 0

    async def handler(peer: PeerInfo, message: object) -> object | None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        # Loop turns in which requests past the limit, all sent at once, would start too.
        for _ in range(5):
            await asyncio.sleep(0)
        running -= 1
        assert isinstance(message, Ping)
        return Pong(message.seq)

    async def main() -> None:
        async with make_server(REGISTRY, handler=handler, max_concurrent_requests=3) as server:
            client = connection_to(server)
            results = await asyncio.gather(*(client.request(Ping(i), timeout=10) for i in range(60)))
            assert results == [Pong(i) for i in range(60)]
            await client.close()

    run(main())
    assert peak == 3


def test_timeouts_leave_the_connection_usable() -> None:
    holds = Holds()

    async def main() -> None:
        async with make_server(REGISTRY, handler=holds.handler) as server:
            client = connection_to(server, peer_node_id=1)
            await client.connect(timeout=5)
            with watching("hotstate.rpc.client") as log:
                # Held until released: only the request's own timer can end the wait.
                with pytest.raises(
                    RpcTimeout, match=r"Hold to node 1 at 127\.0\.0\.1:\d+ timed out after 0\.1 s"
                ):
                    await client.request(Hold(1), timeout=0.1)
                assert await client.request(Ping(2), timeout=5) == Pong(2)
                holds.release(1)
                await log.wait_for("late response 1 from")  # the late answer arrives and is dropped
            assert await client.request(Ping(3), timeout=5) == Pong(3)
            await client.close()

    run(main())


def test_cancelled_requests_and_close_fail_in_flight_requests() -> None:
    holds = Holds()

    async def main() -> None:
        async with make_server(REGISTRY, handler=holds.handler) as server:
            client = connection_to(server)
            await client.connect(timeout=5)
            task = asyncio.create_task(client.request(Hold(1), timeout=10))
            await holds.arrived(1)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            pending = asyncio.create_task(client.request(Hold(2), timeout=10))
            await holds.arrived(2)
            await client.close()
            with pytest.raises(ConnectionLost):
                await pending

    run(main())


def test_oneway_messages_are_delivered_or_dropped_when_not_connected(
    caplog: pytest.LogCaptureFixture,
) -> None:
    received: list[object] = []

    async def main() -> None:
        async with make_server(REGISTRY, on_oneway=lambda peer, message: received.append(message)) as server:
            client = connection_to(server)
            assert client.send_oneway(Note("early")) is False  # not connected yet: dropped, connecting
            await client.connect(timeout=5)
            for i in range(50):
                assert client.send_oneway(Ping(i)) is True
            assert await client.request(Ping(99), timeout=5) == Pong(99)  # same connection, so in order
            await client.close()

    with caplog.at_level(logging.DEBUG, logger=LOGGER):
        run(main())
    assert received == [Ping(i) for i in range(50)]
    assert any(
        "dropped one-way Note" in r.getMessage() and "not connected" in r.getMessage() for r in caplog.records
    )


def test_async_oneway_handler_through_a_peer_pool() -> None:
    received: list[tuple[int, object]] = []
    done = asyncio.Event()

    async def on_oneway(peer: PeerInfo, message: object) -> None:
        await asyncio.sleep(0)
        received.append((peer.node_id, message))
        if len(received) == 20:
            done.set()

    async def main() -> None:
        async with make_server(REGISTRY, node_id=1, on_oneway=on_oneway) as server:
            pool = PeerPool(4, CLUSTER, SECRET, REGISTRY)
            pool.update({1: ("127.0.0.1", server.port)})
            await pool.connection(1).connect(timeout=5)
            for i in range(20):
                assert pool.send_oneway(1, Note(str(i)))
            async with asyncio.timeout(5):
                await done.wait()
            await pool.close()

    run(main())
    assert received == [(4, Note(str(i))) for i in range(20)]


# -- reconnecting --------------------------------------------------------------------------------------


def test_client_reconnects_after_the_server_restarts() -> None:
    holds = Holds()

    async def main() -> None:
        server = make_server(REGISTRY, handler=holds.handler)
        await server.start()
        port = server.port
        client = connection_to(server)
        assert await client.request(Ping(1), timeout=5) == Pong(1)
        in_flight = asyncio.create_task(client.request(Hold(2), timeout=10))
        await holds.arrived(2)
        await server.close()
        with pytest.raises(ConnectionLost, match="lost"):
            await in_flight
        # While the server is down, requests fail fast instead of hanging until their timeout.
        started = time.monotonic()
        with pytest.raises(ConnectionLost):
            await client.request(Ping(3), timeout=5)
        assert time.monotonic() - started < 2
        restarted = make_server(REGISTRY, port=port)
        await restarted.start()
        await client.connect(timeout=5)
        assert await client.request(Ping(4), timeout=5) == Pong(4)
        await client.close()
        await restarted.close()

    run(main())


def test_unreachable_peer_fails_fast_and_backs_off() -> None:
    async def main() -> None:
        server = make_server(REGISTRY)
        await server.start()
        port = server.port
        await server.close()
        client = Connection(
            "127.0.0.1",
            port,
            cluster_id=CLUSTER,
            secret=SECRET,
            node_id=1,
            registry=REGISTRY,
            backoff_initial=0.05,
            backoff_max=0.1,
        )
        with pytest.raises(ConnectionLost, match=r"cannot connect to 127\.0\.0\.1"):
            await client.request(Ping(1), timeout=5)
        with pytest.raises(ConnectionLost, match=r"not connected to .*next attempt in"):
            await client.request(Ping(1), timeout=5)
        with pytest.raises(ConnectionLost, match=r"could not connect to .* within 0\.3 s"):
            await client.connect(timeout=0.3)
        await client.close()

    run(main())


# -- refusals: one connection closed, logged once, the server keeps serving ----------------------------


def test_wrong_secret_is_refused_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with make_server(REGISTRY) as server:
            intruder = connection_to(server, node_id=13, secret=b"wrong")
            with pytest.raises(HandshakeError, match="authentication failed"):
                await intruder.request(Ping(1), timeout=5)
            assert not intruder.connected
            await intruder.close()
            await assert_serves(server)

    with caplog.at_level(logging.INFO, logger=LOGGER):
        run(main())
    warnings = warnings_of(caplog)
    assert any(
        w.startswith("refused connection from 127.0.0.1:")
        and "(claims node 13): HMAC mismatch: wrong cluster.secret" in w
        for w in warnings
    ), warnings
    assert any(
        "cannot connect to 127.0.0.1" in w and "refused by the peer: authentication failed" in w
        for w in warnings
    )


def test_other_cluster_is_refused_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with make_server(REGISTRY) as server:
            stranger = connection_to(server, node_id=14, cluster_id="other")
            with pytest.raises(
                HandshakeError, match="cluster id mismatch: this server is in cluster 'test-cluster'"
            ):
                await stranger.request(Ping(1), timeout=5)
            await stranger.close()
            await assert_serves(server)

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        run(main())
    assert any(
        "(claims node 14): cluster id 'other' != ours 'test-cluster'" in w for w in warnings_of(caplog)
    )


def test_repeated_refusals_are_logged_once_by_the_client(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with make_server(REGISTRY) as server:
            intruder = connection_to(server, secret=b"wrong", backoff_initial=0.01, backoff_max=0.02)
            with watching(LOGGER, logging.WARNING) as log:
                intruder.send_oneway(Note("x"))
                await log.wait_for("refused connection", count=3)  # several attempts
            await intruder.close()

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        run(main())
    client_lines = [w for w in warnings_of(caplog) if w.startswith("cannot connect")]
    server_lines = [w for w in warnings_of(caplog) if w.startswith("refused connection")]
    assert len(client_lines) == 1 and len(server_lines) >= 3


def test_peer_pool_refuses_the_wrong_node_at_an_address() -> None:
    async def main() -> None:
        async with make_server(REGISTRY, node_id=1) as server:
            pool = PeerPool(9, CLUSTER, SECRET, REGISTRY, backoff_initial=0.01, backoff_max=0.1)
            pool.update({3: ("127.0.0.1", server.port)})
            with pytest.raises(HandshakeError, match="expected node 3 at this address, found node 1"):
                await pool.request(3, Ping(1), timeout=5)
            await pool.close()

    run(main())


def test_garbage_bytes_close_that_connection_only(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with make_server(REGISTRY) as server:
            bystander = connection_to(server, node_id=2)
            assert await bystander.request(Ping(1), timeout=5) == Pong(1)
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            await closed_by_peer(reader)
            writer.close()
            assert await bystander.request(Ping(2), timeout=5) == Pong(2)
            assert bystander.connected
            await bystander.close()
            await assert_serves(server)

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        run(main())
    (line,) = [w for w in warnings_of(caplog) if "bad frame" in w]
    assert line.startswith("refused connection from 127.0.0.1:")
    assert "exceeds the limit of 4096 bytes (not a hotstate peer?)" in line


def test_oversized_frame_after_the_handshake_closes_that_connection_only(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def main() -> None:
        async with make_server(REGISTRY, max_frame_bytes=64 * 1024) as server:
            bystander = connection_to(server, node_id=2)
            assert await bystander.request(Ping(1), timeout=5) == Pong(1)
            # A real client whose own limit is larger sends a frame over the server's limit.
            big = connection_to(server, node_id=6, max_frame_bytes=1 << 20)
            with pytest.raises(ConnectionLost):
                await big.request(Ping(1, b"x" * 100_000), timeout=5)
            await big.close()
            # A hand-made header announcing 17 MiB is refused before any body is buffered.
            reader, writer, _ = await raw_session(server.port, node_id=5)
            writer.write(struct.pack(">I", 17 * 1024 * 1024))
            await closed_by_peer(reader)
            writer.close()
            assert await bystander.request(Ping(2), timeout=5) == Pong(2)
            await bystander.close()
            await assert_serves(server)

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        run(main())
    lines = [w for w in warnings_of(caplog) if "bad frame" in w]
    assert len(lines) == 2, lines
    assert lines[0].startswith("closed connection from node 6 at 127.0.0.1:")
    assert "exceeds the limit of 65536 bytes" in lines[0]
    assert lines[1].startswith("closed connection from node 5 at 127.0.0.1:")
    assert "frame length 17825792 exceeds the limit of 65536 bytes" in lines[1]


def test_slow_handshake_times_out(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with make_server(REGISTRY, handshake_timeout=0.3) as server:
            silent_reader, silent_writer = await asyncio.open_connection("127.0.0.1", server.port)
            # A slowloris: a valid HELLO dribbled out one byte at a time, too slowly.
            hello = encode_frame(FrameKind.HELLO, 0, [CLUSTER, 8, b"n" * 32])
            slow_reader, slow_writer = await asyncio.open_connection("127.0.0.1", server.port)
            started = time.monotonic()
            for byte in hello[:5]:
                slow_writer.write(bytes([byte]))
                # The one sleep for time here: the stimulus is bytes spread over the server's real
                # handshake timer (no clock to fake in RpcServer), so that a timer restarted by each
                # byte would not fire.
                await asyncio.sleep(0.05)
            refusal = await closed_by_peer(slow_reader)
            await closed_by_peer(silent_reader)
            assert 0.25 < time.monotonic() - started < 2
            # The refusal is sent as an ERROR frame before the close.
            (frame,) = FrameDecoder().feed(refusal)
            assert frame.kind is FrameKind.ERROR and "handshake timed out" in str(frame.payload)
            silent_writer.close()
            slow_writer.close()
            await assert_serves(server)

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        run(main())
    lines = [w for w in warnings_of(caplog) if "handshake timed out after 0.3 s" in w]
    assert len(lines) == 2
    assert all(w.startswith("refused connection from 127.0.0.1:") for w in lines)


def test_request_before_the_handshake_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    handled: list[object] = []

    async def handler(peer: PeerInfo, message: object) -> object | None:
        handled.append(message)
        return await echo_handler(peer, message)

    async def main() -> None:
        async with make_server(REGISTRY, handler=handler) as server:
            reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
            writer.write(encode_frame(FrameKind.REQUEST, 1, REGISTRY.to_wire(Ping(1))))
            await closed_by_peer(reader)
            writer.close()
            await assert_serves(server)

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        run(main())
    assert handled == [Ping(1, b"ok")]  # only the good client's request reached the handler
    assert any("REQUEST frame before the handshake completed" in w for w in warnings_of(caplog))


def test_undecodable_request_gets_an_error_and_the_connection_stays(caplog: pytest.LogCaptureFixture) -> None:
    async def main() -> None:
        async with make_server(REGISTRY) as server:
            reader, writer, decoder = await raw_session(server.port)
            writer.write(encode_frame(FrameKind.REQUEST, 11, [100, 1, ["not an int", b""]]))
            writer.write(encode_frame(FrameKind.REQUEST, 12, [999, 1, []]))
            writer.write(encode_frame(FrameKind.REQUEST, 13, REGISTRY.to_wire(Ping(5))))
            frames = await read_frames(reader, decoder, 3)
            by_id = {f.correlation_id: f for f in frames}
            assert by_id[11].kind is FrameKind.ERROR and by_id[12].kind is FrameKind.ERROR
            assert by_id[11].payload == [
                "bad_message",
                "cannot decode Ping.seq: expected int, got str 'not an int'",
            ]
            assert by_id[12].payload == [
                "bad_message",
                "cannot decode message: unknown type id 999 in transport-test",
            ]
            assert by_id[13].kind is FrameKind.RESPONSE and REGISTRY.from_wire(by_id[13].payload) == Pong(5)
            # Frames only a server sends close the connection.
            writer.write(encode_frame(FrameKind.RESPONSE, 1, None))
            await closed_by_peer(reader)
            writer.close()

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        run(main())
    warnings = warnings_of(caplog)
    assert sum("undecodable REQUEST" in w for w in warnings) == 1  # once per connection
    assert any("unexpected RESPONSE frame from a client" in w for w in warnings)


def test_a_garbage_speaking_server_closes_the_client_connection(caplog: pytest.LogCaptureFixture) -> None:
    served = asyncio.Event()

    async def bad_server(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"\x00\x00\x00\x03abc")
        await reader.read()  # until the client hangs up
        writer.close()
        served.set()

    async def main() -> None:
        listener = await asyncio.start_server(bad_server, "127.0.0.1", 0)
        port = listener.sockets[0].getsockname()[1]
        client = Connection(
            "127.0.0.1", port, cluster_id=CLUSTER, secret=SECRET, node_id=1, registry=REGISTRY
        )
        with pytest.raises(ConnectionLost, match="bad msgpack"):
            await client.request(Ping(1), timeout=5)
        await client.close()
        await served.wait()
        listener.close()
        await listener.wait_closed()

    with caplog.at_level(logging.WARNING, logger=LOGGER):
        run(main())
    assert any(
        w.startswith("closed connection to 127.0.0.1:") and "bad frame" in w for w in warnings_of(caplog)
    )


# -- peer pool -----------------------------------------------------------------------------------------


def test_peer_pool_routes_by_node_id_and_follows_address_changes() -> None:
    async def main() -> None:
        async with make_server(REGISTRY, node_id=1) as one, make_server(REGISTRY, node_id=2) as two:
            two_lost: asyncio.Future[PeerInfo] = asyncio.get_running_loop().create_future()
            two.on_peer_lost = two_lost.set_result
            pool = PeerPool(9, CLUSTER, SECRET, REGISTRY, backoff_initial=0.01, backoff_max=0.1)
            pool.update({1: ("127.0.0.1", one.port), 2: ("127.0.0.1", two.port)})
            assert await pool.request(1, Ping(1), timeout=5) == Pong(1)
            assert await pool.request(2, Ping(2), timeout=5) == Pong(2)
            assert pool.is_connected(1) and pool.is_connected(2)
            with pytest.raises(UnknownPeer, match="no address for node 3"):
                await pool.request(3, Ping(3), timeout=5)
            assert pool.send_oneway(3, Note("dropped")) is False
            old = pool.connection(2)
            pool.update({1: ("127.0.0.1", one.port)})  # node 2 removed
            async with asyncio.timeout(5):
                assert (await two_lost).node_id == 9  # node 2 saw the pool close its connection
            assert old.closed and not pool.is_connected(2)
            with pytest.raises(UnknownPeer):
                await pool.request(2, Ping(2), timeout=5)
            with pytest.raises(ValueError, match="bad address for node 4"):
                pool.update({4: ("127.0.0.1", "80")})  # type: ignore[dict-item]
            await pool.close()
            with pytest.raises(ConnectionLost):
                await pool.request(1, Ping(1), timeout=5)

    run(main())


def test_lost_connection_hooks_fire_for_the_side_whose_peer_went_away() -> None:
    """A connection the other end closed is a hint that its process died (server/suspects.py); one this
    side closed is not."""

    async def main() -> None:
        server = make_server(REGISTRY)
        server_heard: list[int] = []
        pool_heard: list[int] = []
        heard = asyncio.Event()

        def hears(into: list[int]) -> Callable[[int], None]:
            def hear(node_id: int) -> None:
                into.append(node_id)
                heard.set()

            return hear

        server.on_peer_lost = lambda peer: hears(server_heard)(peer.node_id)
        await server.start()
        pool = PeerPool(7, CLUSTER, SECRET, REGISTRY, backoff_initial=0.01, backoff_max=0.2)
        pool.on_lost = hears(pool_heard)
        pool.update({1: ("127.0.0.1", server.port)})
        assert await pool.request(1, Ping(1), timeout=5) == Pong(1)
        # The client goes away: the server hears of node 7; the client, which closed, hears nothing.
        await pool.close()
        async with asyncio.timeout(5):
            await heard.wait()
        heard.clear()
        assert server_heard == [7] and pool_heard == []
        # The server goes away: the client hears of node 1; the server, which closed, hears nothing more.
        pool = PeerPool(8, CLUSTER, SECRET, REGISTRY, backoff_initial=0.01, backoff_max=0.2)
        pool.on_lost = hears(pool_heard)
        pool.update({1: ("127.0.0.1", server.port)})
        assert await pool.request(1, Ping(2), timeout=5) == Pong(2)
        await server.close()
        async with asyncio.timeout(5):
            await heard.wait()
        assert pool_heard == [1] and server_heard == [7]
        await pool.close()

    run(main())


def test_request_soon_gives_what_request_gives_as_a_future() -> None:
    """The forwarded query's way to wait without a task: the same answers, errors, timeouts and losses as
    `request`; a cancelled future frees its request's slot; before the connection is up, `request` runs."""

    holds = Holds()

    async def main() -> None:
        async with make_server(REGISTRY, handler=holds.handler) as server:
            client = connection_to(server, peer_node_id=1)
            connecting = client.request_soon(Ping(1, b"early"), timeout=5)  # not connected yet
            assert await connecting == Pong(1, b"early")
            assert await client.request_soon(Ping(2, b"x"), timeout=5) == Pong(2, b"x")
            assert await client.request_soon(Note("no answer"), timeout=5) is None
            with pytest.raises(RemoteError) as info:
                await client.request_soon(Fail("not_leader", "node 3 leads"), timeout=5)
            assert info.value.code == "not_leader"
            with pytest.raises(RpcTimeout, match=r"Hold to node 1 .* timed out after 0\.1 s"):
                await client.request_soon(Hold(3), timeout=0.1)
            with pytest.raises(ValueError, match="timeout must be positive"):
                await client.request_soon(Ping(4), timeout=0)
            abandoned = client.request_soon(Hold(5), timeout=10)
            await holds.arrived(5)
            channel = client._channel
            assert channel is not None and len(channel._pending) == 1
            abandoned.cancel()
            for _ in range(3):  # its done callbacks run (the future's, then the request's)
                await asyncio.sleep(0)
            assert not channel._pending  # the slot and its timer are gone
            in_flight = client.request_soon(Hold(6), timeout=10)
            await holds.arrived(6)
            await client.close()
            with pytest.raises(ConnectionLost):
                await in_flight
            pool = PeerPool(9, CLUSTER, SECRET, REGISTRY)
            with pytest.raises(UnknownPeer):
                await pool.request_soon(42, Ping(7), timeout=1)
            await pool.close()

    run(main())


def test_a_request_given_up_on_is_cancelled_at_the_server() -> None:
    """A scan whose HTTP client went away must stop on every server: a request the client cancels (a
    task's await, or `request_soon`'s future) cancels its handler at the server."""
    stops = Stops()

    async def main() -> None:
        async with make_server(REGISTRY, handler=stops.handler) as server:
            client = connection_to(server)
            await client.connect(timeout=5)
            task = asyncio.create_task(client.request(Hold(1), timeout=10))
            await stops.arrived(1)
            task.cancel()
            await stops.stopped(1)
            soon = client.request_soon(Hold(2), timeout=10)
            await stops.arrived(2)
            soon.cancel()
            await stops.stopped(2)
            assert await client.request(Ping(3), timeout=5) == Pong(3)  # the connection serves on
            await client.close()

    run(main())


def test_a_cancel_for_no_running_request_is_ignored() -> None:
    async def main() -> None:
        async with make_server(REGISTRY) as server:
            reader, writer, decoder = await raw_session(server.port)
            writer.write(encode_cancel(999))
            writer.write(encode_frame(FrameKind.REQUEST, 7, REGISTRY.to_wire(Ping(7))))
            [frame] = await read_frames(reader, decoder, 1)
            assert frame.kind is FrameKind.RESPONSE and frame.correlation_id == 7
            writer.close()

    run(main())

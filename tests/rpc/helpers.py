"""Shared pieces of the rpc tests: message types, registries, a hypothesis strategy per annotation."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import enum
import logging
import types
import typing
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeVar

from hypothesis import strategies as st

from hotstate.raft import messages as raft
from hotstate.rpc import PeerInfo, RemoteError, RpcServer, TypeRegistry
from hotstate.rpc.schema import MAX_WIRE_INT, MIN_WIRE_INT

T = TypeVar("T")

CLUSTER = "test-cluster"
SECRET = b"s3cret-for-tests"

RAFT_TYPES: list[type] = [
    raft.Vote,
    raft.VoteResponse,
    raft.BeginQuorumEpoch,
    raft.BeginQuorumEpochResponse,
    raft.Fetch,
    raft.FetchResponse,
    raft.FetchSnapshot,
    raft.FetchSnapshotResponse,
]


def raft_registry() -> TypeRegistry:
    registry = TypeRegistry("raft-test")
    for type_id, cls in enumerate(RAFT_TYPES, start=1):
        registry.register(type_id, cls)
    return registry


@dataclass(frozen=True, slots=True)
class Ping:
    seq: int
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class Pong:
    seq: int
    body: bytes = b""


@dataclass(frozen=True, slots=True)
class Hold:
    """Answered (Pong(seq)) when the test releases it: a request in flight for as long as a test needs."""

    seq: int


@dataclass(frozen=True, slots=True)
class Fail:
    code: str
    message: str


@dataclass(frozen=True, slots=True)
class Crash:
    pass


@dataclass(frozen=True, slots=True)
class Note:
    text: str


def transport_registry() -> TypeRegistry:
    registry = TypeRegistry("transport-test")
    for type_id, cls in enumerate([Ping, Pong, Hold, Fail, Crash, Note], start=100):
        registry.register(type_id, cls)
    return registry


async def echo_handler(peer: PeerInfo, message: object) -> object | None:
    if isinstance(message, Ping):
        return Pong(message.seq, message.body)
    if isinstance(message, Fail):
        raise RemoteError(message.code, message.message)
    if isinstance(message, Crash):
        raise RuntimeError("handler crashed on purpose")
    return None


class Holds:
    """A handler that holds each Hold request until the test releases it, and answers the rest as
    echo_handler does: the test waits for a request to reach the server instead of for time to pass."""

    def __init__(self) -> None:
        self._arrived: dict[int, asyncio.Future[None]] = {}
        self._released: dict[int, asyncio.Future[None]] = {}

    @staticmethod
    def _future(table: dict[int, asyncio.Future[None]], seq: int) -> asyncio.Future[None]:
        if seq not in table:
            table[seq] = asyncio.get_running_loop().create_future()
        return table[seq]

    async def handler(self, peer: PeerInfo, message: object) -> object | None:
        if not isinstance(message, Hold):
            return await echo_handler(peer, message)
        self._future(self._arrived, message.seq).set_result(None)
        await self._future(self._released, message.seq)
        return Pong(message.seq)

    async def arrived(self, seq: int, timeout: float = 5.0) -> None:
        """Wait until the server's handler holds Hold(seq)."""
        async with asyncio.timeout(timeout):
            await asyncio.shield(self._future(self._arrived, seq))

    def release(self, seq: int) -> None:
        self._future(self._released, seq).set_result(None)


class Stops:
    """A handler that holds each Hold request until it is cancelled, and tells the test when it was."""

    def __init__(self) -> None:
        self._arrived: dict[int, asyncio.Future[None]] = {}
        self._stopped: dict[int, asyncio.Future[None]] = {}

    async def handler(self, peer: PeerInfo, message: object) -> object | None:
        if not isinstance(message, Hold):
            return await echo_handler(peer, message)
        Holds._future(self._arrived, message.seq).set_result(None)
        try:
            await asyncio.get_running_loop().create_future()  # until cancelled
        finally:
            Holds._future(self._stopped, message.seq).set_result(None)
        return None

    async def arrived(self, seq: int) -> None:
        await asyncio.shield(Holds._future(self._arrived, seq))

    async def stopped(self, seq: int) -> None:
        await asyncio.shield(Holds._future(self._stopped, seq))


class LogWatch(logging.Handler):
    """A logger's lines as they are logged, and a wait for them: for what only shows in the log."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []
        self._changed: asyncio.Event | None = None

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())
        if self._changed is not None:
            self._changed.set()

    async def wait_for(self, text: str, count: int = 1, timeout: float = 5.0) -> list[str]:
        """The lines containing `text`, once there are `count` of them."""
        async with asyncio.timeout(timeout):
            while True:
                found = [line for line in self.lines if text in line]
                if len(found) >= count:
                    return found
                self._changed = asyncio.Event()
                await self._changed.wait()


@contextlib.contextmanager
def watching(name: str, level: int = logging.DEBUG) -> Iterator[LogWatch]:
    """Watch logger `name` with its level lowered to at least `level` while the block runs."""
    log = logging.getLogger(name)
    watch = LogWatch()
    old = log.level
    log.setLevel(min(level, log.getEffectiveLevel()))
    log.addHandler(watch)
    try:
        yield watch
    finally:
        log.removeHandler(watch)
        log.setLevel(old)


def make_server(
    registry: TypeRegistry,
    *,
    node_id: int = 1,
    cluster_id: str = CLUSTER,
    secret: bytes = SECRET,
    port: int = 0,
    handler: Callable[[PeerInfo, object], Awaitable[object | None]] = echo_handler,
    **options: Any,
) -> RpcServer:
    return RpcServer("127.0.0.1", port, cluster_id, secret, node_id, handler, registry, **options)


def run(coroutine: Awaitable[T], timeout: float = 20.0) -> T:
    """Run a test coroutine on a fresh loop with a hard time limit (pytest-asyncio is not a dependency)."""

    async def bounded() -> T:
        async with asyncio.timeout(timeout):
            return await coroutine

    return asyncio.run(bounded())


# -- hypothesis strategies from annotations ------------------------------------------------------------

wire_ints = st.integers(min_value=MIN_WIRE_INT, max_value=MAX_WIRE_INT)


def strategy_for(tp: Any) -> st.SearchStrategy[Any]:
    """Values of an annotated type as the registry supports them (ints that fit msgpack, finite floats)."""
    if tp is int:
        return wire_ints
    if tp is float:
        return st.floats(allow_nan=False)
    if tp is bool:
        return st.booleans()
    if tp is str:
        return st.text(max_size=20)
    if tp is bytes:
        return st.binary(max_size=40)
    if tp is None or tp is type(None):
        return st.none()
    if isinstance(tp, type) and issubclass(tp, enum.IntEnum):
        return st.sampled_from(list(tp))
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return st.builds(tp, **{f.name: strategy_for(hints[f.name]) for f in dataclasses.fields(tp)})
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Union or origin is types.UnionType:
        return st.one_of(*(strategy_for(a) for a in args))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return st.lists(strategy_for(args[0]), max_size=5).map(tuple)
        return st.tuples(*(strategy_for(a) for a in args))
    if origin is frozenset:
        return st.frozensets(strategy_for(args[0]), max_size=5)
    if origin is dict:
        return st.dictionaries(st.text(max_size=8), strategy_for(args[1]), max_size=4)
    raise TypeError(f"no strategy for {tp!r}")

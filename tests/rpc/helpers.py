"""Shared pieces of the rpc tests: message types, registries, a hypothesis strategy per annotation."""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import types
import typing
from collections.abc import Awaitable, Callable
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
class Sleep:
    """Answered after `seconds` (pipelining, timeouts)."""

    seq: int
    seconds: float


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
    for type_id, cls in enumerate([Ping, Pong, Sleep, Fail, Crash, Note], start=100):
        registry.register(type_id, cls)
    return registry


async def echo_handler(peer: PeerInfo, message: object) -> object | None:
    if isinstance(message, Ping):
        return Pong(message.seq, message.body)
    if isinstance(message, Sleep):
        await asyncio.sleep(message.seconds)
        return Pong(message.seq)
    if isinstance(message, Fail):
        raise RemoteError(message.code, message.message)
    if isinstance(message, Crash):
        raise RuntimeError("handler crashed on purpose")
    return None


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

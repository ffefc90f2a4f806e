"""hotstate.rpc: the one codec and the one asyncio transport for server-to-server messages.

- `TypeRegistry` (schema.py): registered frozen dataclasses <-> msgpack, strict on decode.
- Frames (frames.py): 4-byte length + msgpack `[protocol_version, kind, correlation_id, payload]`.
- Handshake (handshake.py): cluster id check and mutual HMAC proof of `cluster.secret`, inside TLS when
  the ends are given `ssl.SSLContext`s (`tls=`, built by hotstate.tls).
- The transport: `RpcServer` (server.py), `Connection` and `PeerPool` (client.py), over what both ends
  share (channel.py): authenticated, pipelined, reconnecting connections.
"""

from hotstate.rpc.channel import (
    ERROR_BAD_MESSAGE,
    ERROR_BAD_RESPONSE,
    ERROR_INTERNAL,
    Handler,
    OnewayHandler,
    PeerInfo,
)
from hotstate.rpc.client import Connection, PeerPool, bootstrap_peer_id, bootstrap_peers
from hotstate.rpc.errors import (
    NOT_SENT,
    ConnectionLost,
    FrameError,
    HandshakeError,
    NotConnected,
    RemoteError,
    RpcError,
    RpcTimeout,
    UnknownPeer,
)
from hotstate.rpc.frames import (
    DEFAULT_MAX_FRAME_BYTES,
    PROTOCOL_VERSION,
    Frame,
    FrameDecoder,
    FrameKind,
    encode_frame,
)
from hotstate.rpc.schema import CodecError, DecodeError, EncodeError, SchemaError, TypeRegistry
from hotstate.rpc.server import RpcServer

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "ERROR_BAD_MESSAGE",
    "ERROR_BAD_RESPONSE",
    "ERROR_INTERNAL",
    "NOT_SENT",
    "PROTOCOL_VERSION",
    "CodecError",
    "Connection",
    "ConnectionLost",
    "DecodeError",
    "EncodeError",
    "Frame",
    "FrameDecoder",
    "FrameError",
    "FrameKind",
    "Handler",
    "HandshakeError",
    "NotConnected",
    "OnewayHandler",
    "PeerInfo",
    "PeerPool",
    "RemoteError",
    "RpcError",
    "RpcServer",
    "RpcTimeout",
    "SchemaError",
    "TypeRegistry",
    "UnknownPeer",
    "bootstrap_peer_id",
    "bootstrap_peers",
    "encode_frame",
]

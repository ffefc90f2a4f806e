"""Errors of the transport; every one is an `RpcError` so a caller can catch the family.

The codec's own errors (`DecodeError`, `EncodeError`, `SchemaError`) live in `hotstate.rpc.schema`: the
record codec reuses that module and has nothing to do with connections.
"""

from __future__ import annotations


class RpcError(Exception):
    """Something went wrong between this server and a peer."""


class FrameError(RpcError, ValueError):
    """Bytes that are not a valid frame (bad length, bad msgpack, wrong shape), or a frame too large to send.

    Received, it closes the connection it came on and nothing else.
    """


class ConnectionLost(RpcError, ConnectionError):
    """No usable connection to the peer: it could not be reached, refused us, or went away mid-request.

    A request that fails with this may or may not have been processed by the peer.
    """


class NotConnected(ConnectionLost):
    """No connection could be had for the request, so it was certainly not sent (unlike a plain
    `ConnectionLost`, which may come after the peer received it). Safe to retry elsewhere."""


class HandshakeError(ConnectionLost):
    """The peer is not (or could not prove to be) a member of our cluster, or the handshake broke down."""


# What a caller may treat as "certainly not sent": a refusal happens before any request goes out.
NOT_SENT = (NotConnected, HandshakeError)


class RpcTimeout(RpcError, TimeoutError):
    """No answer within the request's timeout (the request may still be processed by the peer)."""


class RemoteError(RpcError):
    """The peer received the request and answered with an error instead of a result.

    A request handler may raise it itself to choose the `code` the caller sees; any other exception in a
    handler reaches the caller as code "internal".
    """

    def __init__(self, code: str, message: str) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message

    def __reduce__(self) -> tuple[type[RemoteError], tuple[str, str]]:
        # Exceptions with extra __init__ arguments need this to survive copy/pickle in test runners.
        return (RemoteError, (self.code, self.message))


class UnknownPeer(RpcError, KeyError):
    """A `PeerPool` was asked to reach a node id it has no address for."""

    def __str__(self) -> str:
        # KeyError would print the repr of the message with quotes around it.
        return str(self.args[0]) if self.args else "unknown peer"

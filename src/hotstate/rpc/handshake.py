"""Mutual challenge-response that admits only members of our cluster, before any other frame.

    client                                           server
    HELLO     [cluster_id, client_id, client_nonce] ->       refuses another cluster id
          <-  CHALLENGE [cluster_id, server_id, server_nonce]
    AUTH      [client_proof]                       ->       refuses a wrong proof (wrong secret)
          <-  READY [server_proof]                          client refuses a wrong proof
    ... REQUEST / RESPONSE / ONEWAY / ERROR ...

proof = HMAC-SHA256(cluster.secret, msgpack([label, direction, cluster_id, client_id, server_id,
client_nonce, server_nonce])). Both fresh 32-byte nonces make every proof single-use (no replay), the
direction label stops a proof from being reflected back as the other side's, and the node ids bind it to
who claims to be talking. The client proves itself first so the *server* can say "wrong cluster.secret"
in its log; the server's proof only goes to a client it has already authenticated.

What this does not do: encrypt or sign the frames that follow. It keeps strangers and misconfigured
servers out; against an attacker who can read or rewrite TCP streams, TLS underneath it does
(`rpc.tls.*`, hotstate.tls, docs/security.md).

This module is sans-IO: the transport feeds frames in and sends what comes out.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import Any

import msgpack

from hotstate.rpc.frames import FrameKind

__all__ = [
    "NONCE_BYTES",
    "ClientHandshake",
    "HandshakeRefused",
    "ServerHandshake",
    "normalize_secret",
]

NONCE_BYTES = 32
_MAC_BYTES = 32
_LABEL = "hotstate-rpc-v1"
_CLIENT_TO_SERVER = "client->server"
_SERVER_TO_CLIENT = "server->client"
_MAX_CLUSTER_ID_CHARS = 256

# Codes carried in the ERROR frame that tells the peer why it was refused.
CODE_CLUSTER_MISMATCH = "cluster_mismatch"
CODE_AUTH_FAILED = "auth_failed"
CODE_PROTOCOL = "protocol_error"


class HandshakeRefused(Exception):
    """This side refuses the peer. `reason` is for our log; `code` and `peer_message` go to the peer."""

    def __init__(self, reason: str, code: str = CODE_PROTOCOL, peer_message: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code
        self.peer_message = peer_message if peer_message is not None else reason


def normalize_secret(secret: bytes | str) -> bytes:
    key = secret.encode() if isinstance(secret, str) else bytes(secret)
    if not key:
        raise ValueError("cluster.secret must not be empty")
    return key


def _proof(
    secret: bytes,
    direction: str,
    cluster_id: str,
    client_id: int,
    server_id: int,
    client_nonce: bytes,
    server_nonce: bytes,
) -> bytes:
    # msgpack is an unambiguous encoding of the tuple (every element is typed and length-prefixed).
    message = msgpack.packb(
        [_LABEL, direction, cluster_id, client_id, server_id, client_nonce, server_nonce], use_bin_type=True
    )
    return hmac.new(secret, message, hashlib.sha256).digest()


def _fields(kind: FrameKind, payload: object, count: int) -> list[Any]:
    if type(payload) is not list or len(payload) != count:
        raise HandshakeRefused(f"malformed {kind.name} payload")
    return payload


def _cluster_id(kind: FrameKind, value: object) -> str:
    if type(value) is not str or not value or len(value) > _MAX_CLUSTER_ID_CHARS:
        raise HandshakeRefused(f"malformed cluster id in {kind.name}")
    return value


def _node_id(kind: FrameKind, value: object) -> int:
    if type(value) is not int:
        raise HandshakeRefused(f"malformed node id in {kind.name}")
    return value


def _blob(kind: FrameKind, value: object, size: int, what: str) -> bytes:
    if type(value) is not bytes or len(value) != size:
        raise HandshakeRefused(f"malformed {what} in {kind.name}")
    return value


def _proof_matches(kind: FrameKind, payload: object, expected: bytes) -> bool:
    """Whether the proof frame (AUTH or READY) carries `expected`; both sides check the other's this way,
    in constant time so the comparison tells an attacker nothing. A malformed frame raises instead."""
    (mac,) = _fields(kind, payload, 1)
    return hmac.compare_digest(_blob(kind, mac, _MAC_BYTES, "proof"), expected)


def _unexpected(kind: FrameKind, payload: object, expected: FrameKind) -> HandshakeRefused:
    if kind is FrameKind.ERROR:
        # The peer refused us and says why (an unauthenticated claim, but it is what the operator needs).
        message = payload[1] if type(payload) is list and len(payload) == 2 else payload
        text = str(message)[:300]
        return HandshakeRefused(f"refused by the peer: {text}", peer_message="")
    if kind in (FrameKind.REQUEST, FrameKind.RESPONSE, FrameKind.ONEWAY):
        return HandshakeRefused(f"{kind.name} frame before the handshake completed")
    return HandshakeRefused(f"unexpected {kind.name} frame in the handshake (expected {expected.name})")


class ServerHandshake:
    """The accepting side: HELLO in -> CHALLENGE out, AUTH in -> READY out."""

    def __init__(self, cluster_id: str, secret: bytes, node_id: int, nonce: bytes | None = None) -> None:
        self._cluster_id = cluster_id
        self._secret = secret
        self._node_id = node_id
        self._nonce = nonce if nonce is not None else secrets.token_bytes(NONCE_BYTES)
        self._expected = FrameKind.HELLO
        self._client_nonce = b""
        self.peer_node_id: int | None = None  # claimed until `done`, proven after
        self.done = False

    def step(self, kind: FrameKind, payload: object) -> tuple[FrameKind, list[Any]]:
        """One frame from the client -> the frame to answer with. Raises `HandshakeRefused`."""
        if self.done:
            raise HandshakeRefused(f"{kind.name} frame after the handshake completed")
        if kind is not self._expected:
            raise _unexpected(kind, payload, self._expected)
        if kind is FrameKind.HELLO:
            cluster, node, nonce = _fields(kind, payload, 3)
            node_id = _node_id(kind, node)
            self.peer_node_id = node_id
            claimed = _cluster_id(kind, cluster)
            if claimed != self._cluster_id:
                raise HandshakeRefused(
                    f"cluster id {claimed!r} != ours {self._cluster_id!r}",
                    CODE_CLUSTER_MISMATCH,
                    f"cluster id mismatch: this server is in cluster {self._cluster_id!r}, "
                    f"you are in {claimed!r}",
                )
            self._client_nonce = _blob(kind, nonce, NONCE_BYTES, "nonce")
            self._expected = FrameKind.AUTH
            return FrameKind.CHALLENGE, [self._cluster_id, self._node_id, self._nonce]
        assert self.peer_node_id is not None
        expected = _proof(
            self._secret,
            _CLIENT_TO_SERVER,
            self._cluster_id,
            self.peer_node_id,
            self._node_id,
            self._client_nonce,
            self._nonce,
        )
        if not _proof_matches(kind, payload, expected):
            raise HandshakeRefused(
                "HMAC mismatch: wrong cluster.secret",
                CODE_AUTH_FAILED,
                "authentication failed: HMAC mismatch (wrong cluster.secret?)",
            )
        self.done = True
        ours = _proof(
            self._secret,
            _SERVER_TO_CLIENT,
            self._cluster_id,
            self.peer_node_id,
            self._node_id,
            self._client_nonce,
            self._nonce,
        )
        return FrameKind.READY, [ours]


class ClientHandshake:
    """The connecting side: `start()` -> HELLO, CHALLENGE in -> AUTH out, READY in -> done."""

    def __init__(
        self,
        cluster_id: str,
        secret: bytes,
        node_id: int,
        expected_peer_id: int | None = None,
        nonce: bytes | None = None,
    ) -> None:
        self._cluster_id = cluster_id
        self._secret = secret
        self._node_id = node_id
        self._expected_peer_id = expected_peer_id
        self._nonce = nonce if nonce is not None else secrets.token_bytes(NONCE_BYTES)
        self._expected = FrameKind.CHALLENGE
        self._server_nonce = b""
        self.peer_node_id: int | None = None
        self.done = False

    def start(self) -> tuple[FrameKind, list[Any]]:
        return FrameKind.HELLO, [self._cluster_id, self._node_id, self._nonce]

    def step(self, kind: FrameKind, payload: object) -> tuple[FrameKind, list[Any]] | None:
        """One frame from the server -> the frame to answer with, or None when done."""
        if self.done:
            raise HandshakeRefused(f"{kind.name} frame after the handshake completed")
        if kind is not self._expected:
            raise _unexpected(kind, payload, self._expected)
        if kind is FrameKind.CHALLENGE:
            cluster, node, nonce = _fields(kind, payload, 3)
            claimed = _cluster_id(kind, cluster)
            node_id = _node_id(kind, node)
            self.peer_node_id = node_id
            if claimed != self._cluster_id:
                raise HandshakeRefused(f"cluster id {claimed!r} != ours {self._cluster_id!r}")
            if self._expected_peer_id is not None and node_id != self._expected_peer_id:
                raise HandshakeRefused(
                    f"expected node {self._expected_peer_id} at this address, found node {node_id}"
                )
            self._server_nonce = _blob(kind, nonce, NONCE_BYTES, "nonce")
            self._expected = FrameKind.READY
            proof = _proof(
                self._secret,
                _CLIENT_TO_SERVER,
                self._cluster_id,
                self._node_id,
                node_id,
                self._nonce,
                self._server_nonce,
            )
            return FrameKind.AUTH, [proof]
        assert self.peer_node_id is not None
        expected = _proof(
            self._secret,
            _SERVER_TO_CLIENT,
            self._cluster_id,
            self._node_id,
            self.peer_node_id,
            self._nonce,
            self._server_nonce,
        )
        if not _proof_matches(kind, payload, expected):
            raise HandshakeRefused("HMAC mismatch: the server's proof is wrong (wrong cluster.secret?)")
        self.done = True
        return None

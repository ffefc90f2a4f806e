"""The handshake state machines, without sockets: who gets in, who is refused and why."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotstate.rpc import FrameKind
from hotstate.rpc.handshake import ClientHandshake, HandshakeRefused, ServerHandshake, normalize_secret

CLUSTER = "prod"
SECRET = b"k" * 32


def client(secret: bytes = SECRET, cluster: str = CLUSTER, expected: int | None = 2) -> ClientHandshake:
    return ClientHandshake(cluster, secret, node_id=1, expected_peer_id=expected)


def server(secret: bytes = SECRET, cluster: str = CLUSTER) -> ServerHandshake:
    return ServerHandshake(cluster, secret, node_id=2)


def run_handshake(c: ClientHandshake, s: ServerHandshake) -> None:
    challenge = s.step(*c.start())
    auth = c.step(*challenge)
    assert auth is not None
    ready = s.step(*auth)
    assert c.step(*ready) is None


def test_matching_cluster_and_secret_authenticate_both_ways() -> None:
    c, s = client(), server()
    run_handshake(c, s)
    assert c.done and s.done
    assert c.peer_node_id == 2 and s.peer_node_id == 1


def test_wrong_secret_is_refused_by_the_server_with_a_clear_reason() -> None:
    c, s = client(secret=b"other"), server()
    auth = c.step(*s.step(*c.start()))
    assert auth is not None
    with pytest.raises(HandshakeRefused) as info:
        s.step(*auth)
    assert info.value.reason == "HMAC mismatch: wrong cluster.secret"
    assert info.value.code == "auth_failed"
    assert not s.done


def test_other_cluster_is_refused_at_hello() -> None:
    c, s = client(cluster="staging"), server()
    with pytest.raises(HandshakeRefused) as info:
        s.step(*c.start())
    assert info.value.reason == "cluster id 'staging' != ours 'prod'"
    assert info.value.code == "cluster_mismatch"
    assert "this server is in cluster 'prod'" in info.value.peer_message
    assert s.peer_node_id == 1  # the claimed id is known, for the log line


def test_client_refuses_a_server_that_cannot_prove_the_secret() -> None:
    c, s = client(), server()
    challenge = s.step(*c.start())
    auth = c.step(*challenge)
    assert auth is not None
    s.step(*auth)
    with pytest.raises(HandshakeRefused, match="server's proof is wrong"):
        c.step(FrameKind.READY, [b"\x00" * 32])


def test_client_refuses_an_unexpected_node_at_the_address() -> None:
    c, s = client(expected=3), server()
    with pytest.raises(HandshakeRefused, match="expected node 3 at this address, found node 2"):
        c.step(*s.step(*c.start()))


def test_a_recorded_proof_does_not_work_in_a_new_session() -> None:
    c1, s1 = client(), server()
    auth = c1.step(*s1.step(*c1.start()))
    assert auth is not None
    s2 = server()
    c2 = client()
    s2.step(*c2.start())
    with pytest.raises(HandshakeRefused, match="HMAC mismatch"):
        s2.step(*auth)  # replay: the new server nonce differs


def test_the_servers_proof_cannot_be_reflected_as_a_client_proof() -> None:
    # Same nonces and node ids in both sessions, so only the direction label tells the two proofs apart.
    c = ClientHandshake(CLUSTER, SECRET, 1, nonce=b"c" * 32)
    s = ServerHandshake(CLUSTER, SECRET, 2, nonce=b"s" * 32)
    auth = c.step(*s.step(*c.start()))
    assert auth is not None
    _, server_proof = s.step(*auth)
    victim = ServerHandshake(CLUSTER, SECRET, 2, nonce=b"s" * 32)
    victim.step(*ClientHandshake(CLUSTER, SECRET, 1, nonce=b"c" * 32).start())
    with pytest.raises(HandshakeRefused, match="HMAC mismatch"):
        victim.step(FrameKind.AUTH, server_proof)
    assert victim.step(*auth)[0] is FrameKind.READY  # while the real client proof is accepted


@pytest.mark.parametrize("kind", [FrameKind.REQUEST, FrameKind.ONEWAY, FrameKind.RESPONSE])
def test_application_frames_before_the_handshake_are_refused(kind: FrameKind) -> None:
    with pytest.raises(HandshakeRefused, match=f"{kind.name} frame before the handshake completed"):
        server().step(kind, [100, 1, [1, b""]])


def test_out_of_order_handshake_frames_are_refused() -> None:
    with pytest.raises(HandshakeRefused, match="unexpected AUTH frame in the handshake"):
        server().step(FrameKind.AUTH, [b"x" * 32])
    c, s = client(), server()
    s.step(*c.start())
    with pytest.raises(HandshakeRefused, match="unexpected HELLO frame"):
        s.step(*client().start())


def test_a_refusal_from_the_peer_is_reported_with_its_text() -> None:
    c = client()
    c.start()
    with pytest.raises(HandshakeRefused, match="refused by the peer: authentication failed"):
        c.step(FrameKind.ERROR, ["auth_failed", "authentication failed: HMAC mismatch"])


def test_empty_secret_is_refused() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        normalize_secret("")
    assert normalize_secret("abc") == b"abc"


payloads = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(max_size=5) | st.binary(max_size=40),
    lambda children: st.lists(children, max_size=4),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(list(FrameKind)), payloads, st.sampled_from(list(FrameKind)), payloads)
def test_garbage_payloads_are_refused_never_crash(
    k1: FrameKind, p1: object, k2: FrameKind, p2: object
) -> None:
    s = server()
    try:
        s.step(k1, p1)
        s.step(k2, p2)
    except HandshakeRefused:
        pass
    assert not s.done
    c = client()
    c.start()
    try:
        c.step(k1, p1)
        c.step(k2, p2)
    except HandshakeRefused:
        pass
    assert not c.done

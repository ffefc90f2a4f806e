"""Frame codec: round trips over any chunking, and a fuzzed decoder that only ever yields frames or
raises FrameError."""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotstate.rpc import DEFAULT_MAX_FRAME_BYTES, PROTOCOL_VERSION, Frame, FrameDecoder, FrameError, FrameKind
from hotstate.rpc.frames import MAX_CORRELATION_ID, encode_frame

from .helpers import Ping, transport_registry

REGISTRY = transport_registry()

frames_strategy = st.builds(
    Frame,
    kind=st.sampled_from(list(FrameKind)),
    correlation_id=st.integers(0, MAX_CORRELATION_ID),
    payload=st.builds(
        lambda seq, body: REGISTRY.to_wire(Ping(seq, body)), st.integers(0, 2**40), st.binary(max_size=300)
    ),
)


def stream_of(frames: list[Frame]) -> bytes:
    return b"".join(encode_frame(f.kind, f.correlation_id, f.payload) for f in frames)


def feed_in_chunks(decoder: FrameDecoder, data: bytes, cuts: list[int]) -> list[Frame]:
    out: list[Frame] = []
    start = 0
    for cut in [*sorted(set(cuts)), len(data)]:
        out += decoder.feed(data[start:cut])
        start = cut
    return out


@settings(max_examples=200, deadline=None)
@given(st.lists(frames_strategy, max_size=8), st.lists(st.integers(0, 3000), max_size=10))
def test_frames_survive_any_chunking(frames: list[Frame], cuts: list[int]) -> None:
    data = stream_of(frames)
    decoder = FrameDecoder()
    assert feed_in_chunks(decoder, data, [c for c in cuts if c <= len(data)]) == frames
    assert decoder.buffered == 0


def test_frame_layout_is_length_then_msgpack_body() -> None:
    data = encode_frame(FrameKind.REQUEST, 7, [100, 1, [1, b""]])
    (length,) = struct.unpack(">I", data[:4])
    assert length == len(data) - 4
    assert msgpack.unpackb(data[4:]) == [PROTOCOL_VERSION, 0, 7, [100, 1, [1, b""]]]


def body_frame(value: object) -> bytes:
    body = msgpack.packb(value, use_bin_type=True)
    return struct.pack(">I", len(body)) + body


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (struct.pack(">I", DEFAULT_MAX_FRAME_BYTES + 1), "exceeds the limit"),
        (b"\xff\xff\xff\xff", "frame length 4294967295 exceeds the limit"),
        (struct.pack(">I", 0), "empty frame"),
        (struct.pack(">I", 1) + b"\xc1", "bad msgpack"),
        (struct.pack(">I", 3) + b"\x93\x01\x02", "bad msgpack"),  # array header claims more than the body
        (
            struct.pack(">I", 6) + msgpack.packb([1, 0, 1, None]) + b"\xc0",
            "bad msgpack in frame body: ExtraData",
        ),
        (
            struct.pack(">I", 7) + b"\x94\x01\x00\x01\xa2\xff\xfe",
            "bad msgpack in frame body: UnicodeDecodeError",
        ),
        (body_frame({"a": 1}), "frame body is not [protocol_version"),
        (body_frame([1, 0, 1]), "frame body is not [protocol_version"),
        (body_frame([2, 0, 1, None]), "unsupported protocol version 2"),
        (body_frame([True, 0, 1, None]), "unsupported protocol version True"),
        (body_frame([1, 42, 1, None]), "unknown frame kind 42"),
        (body_frame([1, "REQUEST", 1, None]), "unknown frame kind 'REQUEST'"),
        (body_frame([1, 0, -1, None]), "bad correlation id -1"),
        (body_frame([1, 0, False, None]), "bad correlation id False"),
        (b"GET / HTTP/1.1\r\n\r\n", "exceeds the limit"),
    ],
)
def test_bad_frames_raise_frame_error(data: bytes, message: str) -> None:
    decoder = FrameDecoder()
    with pytest.raises(FrameError) as info:
        decoder.feed(data)
    assert message in str(info.value)
    # Poisoned: the framing is lost, so the stream stays failed.
    with pytest.raises(FrameError, match="stream already failed"):
        decoder.feed(encode_frame(FrameKind.ONEWAY, 0, None))


def test_oversized_length_is_refused_before_its_body_arrives() -> None:
    decoder = FrameDecoder(max_frame_bytes=1024)
    with pytest.raises(FrameError, match="frame length 1025 exceeds the limit of 1024 bytes"):
        decoder.feed(struct.pack(">I", 1025))


def test_encode_refuses_frames_over_the_limit() -> None:
    with pytest.raises(FrameError, match="exceeds the limit of 100 bytes"):
        encode_frame(FrameKind.REQUEST, 1, b"x" * 200, max_frame_bytes=100)


def test_deeply_nested_msgpack_is_a_frame_error() -> None:
    body = b"\x91" * 100_000 + b"\xc0"  # 100,000 nested one-element arrays
    with pytest.raises(FrameError, match="bad msgpack"):
        FrameDecoder().feed(struct.pack(">I", len(body)) + body)


def decode_all_or_frame_error(
    data: bytes, cuts: list[int], limit: int = DEFAULT_MAX_FRAME_BYTES
) -> list[Frame]:
    decoder = FrameDecoder(limit)
    try:
        frames = feed_in_chunks(decoder, data, [c for c in cuts if c <= len(data)])
    except FrameError:
        return []
    for frame in frames:
        assert isinstance(frame, Frame) and isinstance(frame.kind, FrameKind)
    return frames


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=400), st.lists(st.integers(0, 400), max_size=5))
def test_random_bytes_give_frames_or_frame_error(data: bytes, cuts: list[int]) -> None:
    decode_all_or_frame_error(data, cuts)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 2**32 - 1))
def test_random_bodies_behind_a_valid_length(body: bytes, huge: int) -> None:
    decode_all_or_frame_error(struct.pack(">I", len(body)) + body, [])
    decode_all_or_frame_error(struct.pack(">I", huge) + body, [], limit=1 << 20)


@settings(max_examples=300, deadline=None)
@given(st.lists(frames_strategy, min_size=1, max_size=4), st.data())
def test_truncated_and_bit_flipped_streams(frames: list[Frame], data: st.DataObject) -> None:
    stream = stream_of(frames)
    # Truncated: the whole frames before the cut come out, the partial one waits for more bytes.
    cut = data.draw(st.integers(0, len(stream)))
    decoder = FrameDecoder()
    got = decoder.feed(stream[:cut])
    assert got == frames[: len(got)]
    # Bit flips anywhere (length, msgpack structure, payload): frames or FrameError, nothing else.
    flipped = bytearray(stream)
    for position in data.draw(st.lists(st.integers(0, len(stream) - 1), min_size=1, max_size=4)):
        flipped[position] ^= 1 << data.draw(st.integers(0, 7))
    decode_all_or_frame_error(bytes(flipped), data.draw(st.lists(st.integers(0, len(stream)), max_size=3)))

"""Frames: a 4-byte big-endian body length, then a msgpack body `[protocol_version, kind, correlation_id,
payload]`.

`payload` is a registry's wire form for REQUEST / RESPONSE / ONEWAY (RESPONSE may carry nil: the handler
returned None), `[code, message]` for ERROR, and a fixed list per handshake kind (see handshake.py).
A cancel is a ONEWAY frame with a nil payload whose correlation id names a request the client has given up
on (`encode_cancel`): the server stops its handler (a scan on every server a disconnected HTTP client's
query reached). It is a ONEWAY rather than a kind of its own so that a server of an older version drops it
as an undecodable one-way message instead of closing the connection.
The decoder is incremental and distrustful: an oversized length is refused before anything is buffered
for it, and every malformed input ends in `FrameError`, which closes that one connection.
"""

from __future__ import annotations

import dataclasses
import enum
import struct
from typing import Any

import msgpack

from hotstate.rpc.errors import FrameError
from hotstate.rpc.schema import EncodeError, unpack_strict

__all__ = [
    "DEFAULT_MAX_FRAME_BYTES",
    "MAX_CORRELATION_ID",
    "PROTOCOL_VERSION",
    "Frame",
    "FrameDecoder",
    "FrameKind",
    "encode_cancel",
    "encode_frame",
    "is_cancel",
]

PROTOCOL_VERSION = 1
DEFAULT_MAX_FRAME_BYTES = 16 * 1024 * 1024
MAX_CORRELATION_ID = 2**64 - 1
_HEADER = struct.Struct(">I")
_HEADER_BYTES = _HEADER.size


class FrameKind(enum.IntEnum):
    REQUEST = 0
    RESPONSE = 1
    ONEWAY = 2
    ERROR = 3
    # The handshake (handshake.py): client HELLO, server CHALLENGE, client AUTH, server READY.
    HELLO = 4
    CHALLENGE = 5
    AUTH = 6
    READY = 7


_KINDS = {int(k): k for k in FrameKind}


@dataclasses.dataclass(frozen=True, slots=True)
class Frame:
    kind: FrameKind
    correlation_id: int
    payload: object


def encode_frame(
    kind: FrameKind, correlation_id: int, payload: object, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
) -> bytes:
    """The bytes of one frame. Raises `FrameError` if it would exceed `max_frame_bytes` (the peer would
    close the connection on it) and `EncodeError` if the payload is not msgpack-able."""
    try:
        body = msgpack.packb([PROTOCOL_VERSION, kind, correlation_id, payload], use_bin_type=True)
    except OverflowError:
        raise EncodeError(f"cannot encode {kind.name} frame: an int does not fit in 64 bits") from None
    except (TypeError, ValueError) as e:
        raise EncodeError(f"cannot encode {kind.name} frame: {e}") from None
    if len(body) > max_frame_bytes:
        raise FrameError(
            f"{kind.name} frame of {len(body)} bytes exceeds the limit of {max_frame_bytes} bytes"
        )
    return _HEADER.pack(len(body)) + body


def encode_cancel(correlation_id: int) -> bytes:
    """The frame asking the server to stop handling request `correlation_id` (see the module's docstring)."""
    return encode_frame(FrameKind.ONEWAY, correlation_id, None)


def is_cancel(frame: Frame) -> bool:
    return frame.kind is FrameKind.ONEWAY and frame.payload is None and frame.correlation_id != 0


def parse_body(body: bytes) -> Frame:
    """One frame body -> Frame, or `FrameError` naming what is wrong with it."""
    try:
        value: Any = unpack_strict(body)
    except Exception as e:
        # The C unpacker raises a family of ValueError subclasses and a few others (StackError for deep
        # nesting, UnicodeDecodeError, TypeError for unhashable keys); all mean the same to us: bad bytes.
        raise FrameError(f"bad msgpack in frame body: {type(e).__name__}: {e}") from None
    if type(value) is not list or len(value) != 4:
        raise FrameError("frame body is not [protocol_version, kind, correlation_id, payload]")
    version, kind, correlation_id, payload = value
    if type(version) is not int or version != PROTOCOL_VERSION:
        raise FrameError(f"unsupported protocol version {version!r} (this server speaks {PROTOCOL_VERSION})")
    frame_kind = _KINDS.get(kind) if type(kind) is int else None
    if frame_kind is None:
        raise FrameError(f"unknown frame kind {kind!r}")
    if type(correlation_id) is not int or not 0 <= correlation_id <= MAX_CORRELATION_ID:
        raise FrameError(f"bad correlation id {correlation_id!r}")
    return Frame(frame_kind, correlation_id, payload)


class FrameDecoder:
    """Bytes in, whole frames out. Once it has raised `FrameError` it is poisoned: the stream has lost
    its framing and nothing after the bad frame can be trusted."""

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        if max_frame_bytes < 1:
            raise ValueError(f"max_frame_bytes must be positive, got {max_frame_bytes}")
        self.max_frame_bytes = max_frame_bytes
        self._buffer = bytearray()
        self._failed: str | None = None

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a whole frame."""
        return len(self._buffer)

    def feed(self, data: bytes | bytearray | memoryview) -> list[Frame]:
        if self._failed is not None:
            raise FrameError(f"stream already failed: {self._failed}")
        buffer = self._buffer
        buffer += data
        frames: list[Frame] = []
        position = 0
        end = len(buffer)
        try:
            while end - position >= _HEADER_BYTES:
                (length,) = _HEADER.unpack_from(buffer, position)
                if length > self.max_frame_bytes:
                    raise FrameError(
                        f"frame length {length} exceeds the limit of {self.max_frame_bytes} bytes"
                    )
                if length == 0:
                    raise FrameError("empty frame")
                if end - position - _HEADER_BYTES < length:
                    break
                start = position + _HEADER_BYTES
                frames.append(parse_body(bytes(buffer[start : start + length])))
                position = start + length
        except FrameError as e:
            self._failed = str(e)
            buffer.clear()
            raise
        # One cut per feed, not one per frame: many small frames in a chunk stay linear.
        if position:
            del buffer[:position]
        return frames

"""Consistency tokens: where a reader has been, so that its next read is served from at least there.

A token maps (table id, partition) to a *position*: the offset after the last record a write was
committed at (from `TableWriter.upsert`), or the store position a query read at (from a query's answer).
Offsets of committed records never change across leader changes (a new active is always an in-sync replica
holding every committed record, and truncation only ever removes records above the HW), so a position
means the same on every replica, before and after any failover. A query given a token is served, per
partition, only by a replica whose store is at least at the token's position (`server/serving.py`).

On the wire and to users it is one opaque, compact, versioned string: `hs1.` + base64url (no padding) of
msgpack `[cluster tag, [[table id, [partition, position, partition, position, ...]], ...]]`. The cluster tag
(4 bytes of the SHA-256 of the cluster id) refuses a token from another cluster, whose table ids and
offsets would mean nothing here. Tokens merge by taking the larger position per partition, so passing each
answer's token to the next query gives monotonic reads, and passing a writer's gives read-your-writes.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping

import msgpack

__all__ = [
    "MAX_TOKEN_CHARS",
    "PREFIX",
    "Positions",
    "TokenError",
    "cluster_tag",
    "decode",
    "encode",
    "merge",
    "tag_of",
]

PREFIX = "hs1."
_pack = msgpack.Packer().pack
# A token for a few tables of 10,000 partitions each stays well under this; anything longer is not ours.
MAX_TOKEN_CHARS = 1 << 20
MAX_POSITION = 2**63 - 1

# (table id, partition) -> position
Positions = dict[tuple[int, int], int]


class TokenError(ValueError):
    """A token that cannot be used: `kind` is "malformed" (not a token of ours, or damaged) or "foreign"
    (a valid token of another cluster)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def cluster_tag(cluster_id: str) -> bytes:
    return hashlib.sha256(cluster_id.encode()).digest()[:4]


# The tokens of single partitions at a position: every point lookup's answer carries one, and while a
# partition takes no writes its lookups all carry the same.
_SINGLE: dict[tuple[int, int, int, bytes], str] = {}


def encode(positions: Mapping[tuple[int, int], int], tag: bytes) -> str:
    if len(positions) == 1:  # a point lookup without a token given
        [((table_id, partition), position)] = positions.items()
        key = (table_id, partition, position, tag)
        token = _SINGLE.get(key)
        if token is None:
            if len(_SINGLE) >= 4096:
                _SINGLE.clear()
            token = _SINGLE[key] = _text(_pack([tag, [[table_id, [partition, position]]]]))
        return token
    tables: dict[int, list[int]] = {}
    for (table_id, partition), position in sorted(positions.items()):
        tables.setdefault(table_id, []).extend((partition, position))
    return _text(_pack([tag, [[table_id, flat] for table_id, flat in tables.items()]]))


def _text(packed: bytes) -> str:
    """A packed token as it travels: the prefix, then unpadded URL-safe base64."""
    return PREFIX + base64.urlsafe_b64encode(packed).rstrip(b"=").decode("ascii")


def decode(token: str, tag: bytes | None) -> Positions:
    """The positions of a token issued by the cluster with this `tag` (None: by any cluster, for a reader
    that only compares tokens it was given); raises TokenError."""
    if not isinstance(token, str) or not token.startswith(PREFIX):
        raise TokenError("malformed", f"not a consistency token (they start with {PREFIX!r})")
    if len(token) > MAX_TOKEN_CHARS:
        raise TokenError("malformed", f"consistency token of {len(token):,} characters: too long to be ours")
    body = token[len(PREFIX) :]
    try:
        raw = base64.urlsafe_b64decode(body + "=" * (-len(body) % 4))
        value = msgpack.unpackb(raw, strict_map_key=True, use_list=True)
    except (binascii.Error, ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as error:
        raise TokenError("malformed", f"damaged consistency token: {error}") from None
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], bytes)):
        raise TokenError("malformed", "damaged consistency token: unexpected shape")
    token_tag, tables = value
    if tag is not None and token_tag != tag:
        raise TokenError("foreign", "the consistency token was issued by another cluster")
    positions: Positions = {}
    if not isinstance(tables, list):
        raise TokenError("malformed", "damaged consistency token: unexpected shape")
    for entry in tables:
        if not (
            isinstance(entry, list) and len(entry) == 2 and _count(entry[0]) and isinstance(entry[1], list)
        ):
            raise TokenError("malformed", "damaged consistency token: unexpected shape")
        table_id, flat = entry
        if len(flat) % 2 or not all(_count(n) for n in flat):
            raise TokenError("malformed", "damaged consistency token: positions must be pairs of counts")
        for partition, position in zip(flat[::2], flat[1::2], strict=True):
            positions[(table_id, partition)] = max(position, positions.get((table_id, partition), 0))
    return positions


def tag_of(token: str) -> bytes:
    """The cluster tag of a token (a client re-encoding the positions it reached, to resume a feed);
    raises TokenError."""
    if not isinstance(token, str) or not token.startswith(PREFIX) or len(token) > MAX_TOKEN_CHARS:
        raise TokenError("malformed", f"not a consistency token (they start with {PREFIX!r})")
    body = token[len(PREFIX) :]
    try:
        value = msgpack.unpackb(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
    except (binascii.Error, ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as error:
        raise TokenError("malformed", f"damaged consistency token: {error}") from None
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], bytes)):
        raise TokenError("malformed", "damaged consistency token: unexpected shape")
    return value[0]


def merge(*many: Mapping[tuple[int, int], int]) -> Positions:
    """The larger position per partition: a token that is at least where each of `many` is."""
    given = [m for m in many if m]
    if len(given) == 1:
        return dict(given[0])
    out: Positions = {}
    for positions in many:
        for key, position in positions.items():
            if position > out.get(key, -1):
                out[key] = position
    return out


def _count(value: object) -> bool:
    return type(value) is int and 0 <= value <= MAX_POSITION

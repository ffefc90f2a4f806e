"""Expiry of a partition's rows: a windowed table's retention and a plain table's TTL, one mechanism.

A windowed table with a retention (`TableWindow.retention_us`) keeps a window while it ended no more than
the retention before the newest window end seen in its partition. A plain table with a TTL
(`TableTtl`) keeps a row while its time (its timestamp column's value, or when it was last written) is no
more than the TTL before now. The active sweeps its store a page of keys at a time (`RetentionSweep`,
driven by server.replicas), and deletes the expired keys it finds with tombstones written through its own
log, so every replica drops them as it drops any deleted key.

Pure: a page of keys and each key's time in, expired keys and the next cursor out; `expiry_times` reads
the times from the page's keys and rows (and write times) for each kind of rule. A window's end is the
key's last component (protocol.keys: a TIMESTAMP, 0x33 and 8 bytes of sign-flipped microseconds), read
without decoding the rest. The newest end only grows, and before a first full sweep it is the newest seen
so far, which can only make fewer windows expire, never more. A key without a time (a row whose TTL
column is null or missing) never expires.
"""

from __future__ import annotations

import datetime as dt
import struct
from collections.abc import Sequence
from dataclasses import dataclass

import msgspec

from hotstate.controller.records import KeyColumn, TableTtl, TableWindow
from hotstate.protocol.keys import WINDOW_BOUND_BYTES, KeyDecodeError, datetime_micros, decode_key
from hotstate.protocol.rows import RowDecodeError, decode_row

__all__ = [
    "ExpiryRule",
    "RetentionSweep",
    "expiry_rule",
    "expiry_times",
    "pack_written",
    "unpack_written",
    "window_end_us",
]

_SIGN = 1 << 63
_TIMESTAMP = 0x33
_WRITTEN = struct.Struct(">q")


def window_end_us(key: bytes) -> int | None:
    """A windowed key's WINDOWEND in microseconds since the epoch; None for bytes that do not end in one."""
    if len(key) < 2 * WINDOW_BOUND_BYTES or key[-WINDOW_BOUND_BYTES] != _TIMESTAMP:
        return None
    return int.from_bytes(key[-8:], "big") - _SIGN


def pack_written(micros: int) -> bytes:
    """A write time as the store's write-time index holds it (8 bytes, big-endian microseconds)."""
    return _WRITTEN.pack(micros)


def unpack_written(data: bytes | None) -> int | None:
    return None if data is None or len(data) != _WRITTEN.size else int(_WRITTEN.unpack(data)[0])


@dataclass(frozen=True, slots=True)
class ExpiryRule:
    """What a table's expiry goes by: `source` says where a key's time is read ("window": its WINDOWEND,
    "key": key component `key_index`, "value": row column `column`, "written": the write-time index), and
    `limit_us` how old it may get; `from_newest`: measured from the newest time seen (windows) rather
    than from now (TTL)."""

    source: str
    limit_us: int
    from_newest: bool = False
    key_index: int = -1
    column: str = ""

    @property
    def reads_rows(self) -> bool:
        return self.source == "value"


def expiry_rule(
    key_columns: Sequence[KeyColumn], window: TableWindow | None, ttl: TableTtl | None
) -> ExpiryRule | None:
    """The expiry of a table, None when its rows are kept until deleted."""
    if window is not None:
        if window.retention_us is None:
            return None
        return ExpiryRule("window", window.retention_us, from_newest=True)
    if ttl is None:
        return None
    if ttl.column is None:
        return ExpiryRule("written", ttl.ttl_us)
    for index, column in enumerate(key_columns):
        if column.name == ttl.column:
            return ExpiryRule("key", ttl.ttl_us, key_index=index)
    return ExpiryRule("value", ttl.ttl_us, column=ttl.column)


def _micros(value: object) -> int | None:
    return datetime_micros(value) if isinstance(value, dt.datetime) else None


def _row_time(row: bytes, column: str) -> int | None:
    try:
        return _micros(decode_row(row).get(column))
    except (RowDecodeError, msgspec.DecodeError, ValueError):
        return None  # a row this rule cannot read is kept, never deleted on a guess


def _key_time(key: bytes, index: int) -> int | None:
    try:
        values = decode_key(key)
    except KeyDecodeError:
        return None
    return _micros(values[index]) if index < len(values) else None


def expiry_times(
    rule: ExpiryRule, keys: Sequence[bytes], rows: Sequence[bytes] | None, written: Sequence[int | None]
) -> list[int | None]:
    """Each key's time under `rule`: from the key, its row (`rows`, when the rule reads rows) or the write
    times (`written`, when the rule goes by write time)."""
    if rule.source == "window":
        return [window_end_us(key) for key in keys]
    if rule.source == "key":
        return [_key_time(key, rule.key_index) for key in keys]
    if rule.source == "value":
        assert rows is not None
        return [_row_time(row, rule.column) for row in rows]
    return list(written)


@dataclass
class RetentionSweep:
    """One partition's sweep: where the next page starts, and the newest time seen."""

    rule: ExpiryRule
    cursor: bytes | None = None  # the last key of the previous page; None: from the first key
    newest_us: int | None = None

    def saw(self, newest_us: int | None) -> None:
        """A newest time learnt elsewhere (the window ends the replica applied since it opened): windows
        start expiring as soon as a newer one is written, not once the sweep's page reaches it."""
        if newest_us is not None and (self.newest_us is None or newest_us > self.newest_us):
            self.newest_us = newest_us

    def start(self) -> bytes | None:
        """The first key the next page may hold (keys above the cursor)."""
        return None if self.cursor is None else self.cursor + b"\x00"

    def page(
        self, keys: Sequence[bytes], times: Sequence[int | None], limit: int, now_us: int
    ) -> list[bytes]:
        """The expired keys of a page of at most `limit` keys read from `start()`, with each key's time;
        the cursor moves past it (back to the first key once a page comes back short: the sweep starts
        over)."""
        self.cursor = keys[-1] if len(keys) >= limit and keys else None
        if self.rule.from_newest:
            self.saw(max((t for t in times if t is not None), default=None))
            if self.newest_us is None:
                return []
            oldest_kept = self.newest_us - self.rule.limit_us
        else:
            oldest_kept = now_us - self.rule.limit_us
        return [key for key, t in zip(keys, times, strict=True) if t is not None and t < oldest_kept]

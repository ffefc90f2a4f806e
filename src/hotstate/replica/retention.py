"""Retention of a windowed table's windows: which keys of a page of a partition's keys have expired.

A windowed table with a retention (`TableWindow.retention_us`) keeps a window while it ended no more than
the retention before the newest window end seen in its partition. The active sweeps its store a page of
keys at a time (`RetentionSweep`, driven by server.replicas), and deletes the expired keys it finds with
tombstones written through its own log, so every replica drops them as it drops any deleted key.

Pure: pages of encoded keys in, expired keys and the next cursor out. A window's end is the key's last
component (protocol.keys: a TIMESTAMP, 0x33 and 8 bytes of sign-flipped microseconds), read without
decoding the rest. The newest end only grows, and before a first full sweep it is the newest seen so far,
which can only make fewer windows expire, never more.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hotstate.protocol.keys import WINDOW_BOUND_BYTES

__all__ = ["RetentionSweep", "window_end_us"]

_SIGN = 1 << 63
_TIMESTAMP = 0x33


def window_end_us(key: bytes) -> int | None:
    """A windowed key's WINDOWEND in microseconds since the epoch; None for bytes that do not end in one."""
    if len(key) < 2 * WINDOW_BOUND_BYTES or key[-WINDOW_BOUND_BYTES] != _TIMESTAMP:
        return None
    return int.from_bytes(key[-8:], "big") - _SIGN


@dataclass
class RetentionSweep:
    """One partition's sweep: where the next page starts, and the newest window end seen."""

    retention_us: int
    cursor: bytes | None = None  # the last key of the previous page; None: from the first key
    newest_end_us: int | None = None

    def start(self) -> bytes | None:
        """The first key the next page may hold (keys above the cursor)."""
        return None if self.cursor is None else self.cursor + b"\x00"

    def page(self, keys: Sequence[bytes], limit: int) -> list[bytes]:
        """The expired keys of a page of at most `limit` keys read from `start()`; the cursor moves past
        it (back to the first key once a page comes back short: the sweep starts over)."""
        ends = [window_end_us(key) for key in keys]
        seen = max((end for end in ends if end is not None), default=None)
        if seen is not None and (self.newest_end_us is None or seen > self.newest_end_us):
            self.newest_end_us = seen
        self.cursor = keys[-1] if len(keys) >= limit and keys else None
        if self.newest_end_us is None:
            return []
        oldest_kept = self.newest_end_us - self.retention_us
        return [key for key, end in zip(keys, ends, strict=True) if end is not None and end < oldest_kept]

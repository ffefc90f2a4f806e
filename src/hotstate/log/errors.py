"""Errors the log raises; every one is a `LogError` so a caller can catch the family."""

from __future__ import annotations

from pathlib import Path


class LogError(Exception):
    """A request the log refuses (bad offset, stale epoch, closed log) or a failure of the log itself."""


class OffsetOutOfRangeError(LogError):
    """An offset outside the readable range [start_offset, end_offset]."""

    def __init__(self, offset: int, start_offset: int, end_offset: int) -> None:
        super().__init__(f"offset {offset} is outside the log range [{start_offset}, {end_offset}]")
        self.offset = offset
        self.start_offset = start_offset
        self.end_offset = end_offset


class CorruptLogError(LogError):
    """Damaged bytes with valid data after them: not a torn tail, so the log refuses to guess.

    A torn or corrupt *tail* is cut off silently on open; this error means the damage sits in the middle
    of the log, where cutting would throw away records other replicas may depend on.
    """

    def __init__(self, path: Path, position: int, reason: str) -> None:
        super().__init__(f"corrupt log data in {path} at byte {position}: {reason}")
        self.path = path
        self.position = position
        self.reason = reason

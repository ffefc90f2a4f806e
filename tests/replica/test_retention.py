"""Retention of windowed tables (replica/retention.py): which keys of a sweep's pages have expired."""

from __future__ import annotations

import datetime as dt

from hotstate.protocol.keys import encode_key
from hotstate.replica.retention import RetentionSweep, window_end_us

MINUTE = 60_000_000
T0 = dt.datetime(2026, 1, 1)


def key(user: str, start: int, end: int) -> bytes:
    return encode_key((user, T0 + dt.timedelta(minutes=start), T0 + dt.timedelta(minutes=end)))


def test_a_windowed_keys_end_is_read_from_its_last_bytes() -> None:
    epoch = dt.datetime(1970, 1, 1)
    assert window_end_us(key("a", 0, 5)) == (T0 + dt.timedelta(minutes=5) - epoch) // dt.timedelta(
        microseconds=1
    )
    assert window_end_us(encode_key(("a",))) is None
    assert window_end_us(encode_key(("a", 1, 2))) is None  # INT bounds are no window


def test_windows_that_ended_more_than_the_retention_before_the_newest_expire() -> None:
    sweep = RetentionSweep(10 * MINUTE)
    keys = sorted(key(user, m, m + 5) for user in ("a", "b") for m in range(0, 60, 5))
    expired = sweep.page(keys, limit=1000)
    # Newest end 60: ends below 50 expire, 50, 55 and 60 stay.
    assert sorted(expired) == sorted(key(u, m, m + 5) for u in ("a", "b") for m in range(0, 45, 5))
    assert sweep.cursor is None  # a short page: the next sweep starts over


def test_a_sweep_pages_through_the_keys_and_never_forgets_the_newest_end() -> None:
    sweep = RetentionSweep(10 * MINUTE)
    keys = sorted(key(user, m, m + 5) for user in ("a", "b") for m in range(0, 60, 5))
    first = sweep.page(keys[:12], limit=12)  # a's windows: newest end 60 already
    assert sweep.cursor == keys[11] and sweep.start() == keys[11] + b"\x00"
    assert len(first) == 9
    # b's page alone holds nothing newer: still judged by the newest end seen, 60.
    assert len(sweep.page(keys[12:], limit=12)) == 9
    # Old windows met before any newer one are kept: the newest end so far can only delete fewer.
    fresh = RetentionSweep(10 * MINUTE)
    assert fresh.page([key("a", 0, 5)], limit=1) == []

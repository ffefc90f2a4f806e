"""Expiry (replica/retention.py): which keys of a sweep's pages have expired, for windows and TTLs."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

import pytest

from hotstate.controller.records import KeyColumn, KeyType, TableTtl, TableWindow, ValueColumn
from hotstate.protocol.keys import datetime_micros, encode_key
from hotstate.protocol.rows import encode_row
from hotstate.protocol.ttl import (
    checked_ttl,
    format_duration,
    invalid_ttl,
    invalid_ttl_value_columns,
    parse_duration,
)
from hotstate.replica.retention import (
    ExpiryRule,
    RetentionSweep,
    expiry_rule,
    expiry_times,
    pack_written,
    unpack_written,
    window_end_us,
)

MINUTE = 60_000_000
T0 = dt.datetime(2026, 1, 1)
NOW = datetime_micros(T0)
WINDOWS = ExpiryRule("window", 10 * MINUTE, from_newest=True)


def key(user: str, start: int, end: int) -> bytes:
    return encode_key((user, T0 + dt.timedelta(minutes=start), T0 + dt.timedelta(minutes=end)))


def window_page(sweep: RetentionSweep, keys: Sequence[bytes], limit: int) -> list[bytes]:
    return sweep.page(keys, expiry_times(sweep.rule, keys, None, []), limit, NOW)


def test_a_windowed_keys_end_is_read_from_its_last_bytes() -> None:
    epoch = dt.datetime(1970, 1, 1)
    assert window_end_us(key("a", 0, 5)) == (T0 + dt.timedelta(minutes=5) - epoch) // dt.timedelta(
        microseconds=1
    )
    assert window_end_us(encode_key(("a",))) is None
    assert window_end_us(encode_key(("a", 1, 2))) is None  # INT bounds are no window


def test_windows_that_ended_more_than_the_retention_before_the_newest_expire() -> None:
    sweep = RetentionSweep(WINDOWS)
    keys = sorted(key(user, m, m + 5) for user in ("a", "b") for m in range(0, 60, 5))
    expired = window_page(sweep, keys, limit=1000)
    # Newest end 60: ends below 50 expire, 50, 55 and 60 stay.
    assert sorted(expired) == sorted(key(u, m, m + 5) for u in ("a", "b") for m in range(0, 45, 5))
    assert sweep.cursor is None  # a short page: the next sweep starts over


def test_a_sweep_pages_through_the_keys_and_never_forgets_the_newest_end() -> None:
    sweep = RetentionSweep(WINDOWS)
    keys = sorted(key(user, m, m + 5) for user in ("a", "b") for m in range(0, 60, 5))
    first = window_page(sweep, keys[:12], limit=12)  # a's windows: newest end 60 already
    assert sweep.cursor == keys[11] and sweep.start() == keys[11] + b"\x00"
    assert len(first) == 9
    # b's page alone holds nothing newer: still judged by the newest end seen, 60.
    assert len(window_page(sweep, keys[12:], limit=12)) == 9
    # Old windows met before any newer one are kept: the newest end so far can only delete fewer.
    fresh = RetentionSweep(WINDOWS)
    assert window_page(fresh, [key("a", 0, 5)], limit=1) == []


# ---------------------------------------------------------------------------------------------- TTL
KEYS = (KeyColumn("user", KeyType.STRING), KeyColumn("seen", KeyType.TIMESTAMP))


def test_a_tables_rule_follows_its_window_or_ttl() -> None:
    assert expiry_rule(KEYS, None, None) is None
    assert expiry_rule(KEYS, TableWindow("w", "TUMBLING"), None) is None  # no retention: kept
    assert expiry_rule(KEYS, None, TableTtl(5, None)) == ExpiryRule("written", 5)
    assert expiry_rule(KEYS, None, TableTtl(5, "seen")) == ExpiryRule("key", 5, key_index=1)
    assert expiry_rule(KEYS, None, TableTtl(5, "at")) == ExpiryRule("value", 5, column="at")


def test_rows_older_than_the_ttl_by_their_column_expire_against_now() -> None:
    rule = expiry_rule(KEYS, None, TableTtl(10 * MINUTE, "at"))
    assert rule is not None and rule.reads_rows
    ages = {"old": 11, "edge": 10, "young": 1}
    keys = [encode_key((name, T0)) for name in ages]
    rows = [encode_row({"at": T0 - dt.timedelta(minutes=age), "v": 1}) for age in ages.values()]
    keys.append(encode_key(("null", T0)))
    rows.append(encode_row({"at": None}))  # no time: kept
    keys.append(encode_key(("naive-text", T0)))
    rows.append(encode_row({"at": "2020-01-01"}))  # not a timestamp: kept, never deleted on a guess
    sweep = RetentionSweep(rule)
    assert sweep.page(keys, expiry_times(rule, keys, rows, []), 1000, NOW) == [keys[0]]


def test_a_ttl_key_column_is_read_from_the_key() -> None:
    rule = expiry_rule(KEYS, None, TableTtl(10 * MINUTE, "seen"))
    assert rule is not None and not rule.reads_rows
    keys = [encode_key(("a", T0 - dt.timedelta(minutes=m))) for m in (30, 5)]
    assert RetentionSweep(rule).page(keys, expiry_times(rule, keys, None, []), 1000, NOW) == [keys[0]]


def test_ttl_by_write_time_reads_the_write_times() -> None:
    rule = ExpiryRule("written", 10 * MINUTE)
    keys = [b"a", b"b", b"c"]
    written = [unpack_written(pack_written(NOW - 20 * MINUTE)), NOW, None]
    assert RetentionSweep(rule).page(keys, expiry_times(rule, keys, None, written), 1000, NOW) == [b"a"]
    assert unpack_written(None) is None and unpack_written(b"xx") is None


@pytest.mark.parametrize(
    ("text", "micros"),
    [
        ("7d", 7 * 86_400_000_000),
        ("12h", 12 * 3_600_000_000),
        ("30 minutes", 30 * MINUTE),
        ("500ms", 500_000),
        ("2 hours", 2 * 3_600_000_000),
        ("1 day", 86_400_000_000),
        ("45s", 45_000_000),
        ("1w", 604_800_000_000),
    ],
)
def test_durations_parse_and_format_back(text: str, micros: int) -> None:
    assert parse_duration(text) == micros
    assert parse_duration(format_duration(micros)) == micros


@pytest.mark.parametrize("text", ["", "7", "0d", "-1d", "7 fortnights", "1.5h", "d7"])
def test_bad_durations_say_what_is_accepted(text: str) -> None:
    with pytest.raises(ValueError, match="positive whole number and a unit"):
        parse_duration(text)


def test_ttl_refusals_name_the_problem() -> None:
    window = TableWindow("w", "TUMBLING")
    assert "retention" in (invalid_ttl(KEYS, window, TableTtl(1, None)) or "")
    assert "not a TIMESTAMP" in (invalid_ttl(KEYS, None, TableTtl(1, "user")) or "")
    assert "positive" in (invalid_ttl(KEYS, None, TableTtl(0, None)) or "")
    assert invalid_ttl(KEYS, None, TableTtl(1, "seen")) is None
    assert invalid_ttl(KEYS, None, TableTtl(1, "at")) is None  # a value column: its writer declares it
    values = (ValueColumn("at", "timestamp"), ValueColumn("n", "bigint"))
    assert invalid_ttl_value_columns(TableTtl(1, "at"), KEYS, values) is None
    assert "not a timestamp" in (invalid_ttl_value_columns(TableTtl(1, "n"), KEYS, values) or "")
    assert "no such column" in (invalid_ttl_value_columns(TableTtl(1, "gone"), KEYS, values) or "")
    assert checked_ttl("7d", "at", KEYS, None, values) == TableTtl(7 * 86_400_000_000, "at")
    assert checked_ttl(None, None, KEYS, None, values) is None
    with pytest.raises(ValueError, match="without a ttl"):
        checked_ttl(None, "at", KEYS, None, values)
    with pytest.raises(ValueError, match="no such column"):
        checked_ttl("1h", "gone", KEYS, None, values)


def test_a_newest_end_learnt_from_writes_expires_windows_before_the_sweep_reaches_it() -> None:
    sweep = RetentionSweep(WINDOWS)
    keys = [key("a", m, m + 5) for m in range(0, 30, 5)]
    assert window_page(sweep, keys, limit=1000) == keys[:3]  # newest end 30: ends below 20 expire
    sweep.saw(window_end_us(key("z", 100, 105)))  # a newer window applied, in a page not read yet
    assert window_page(sweep, keys, limit=1000) == keys
    sweep.saw(None)
    sweep.saw(0)  # never backwards
    assert sweep.newest_us == window_end_us(key("z", 100, 105))

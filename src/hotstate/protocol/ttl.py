"""A plain table's time to live (records.TableTtl): its duration as users write it, and what the controller
and writers refuse. Pure: every caller (HTTP create, `hotstate table create --ttl`, the Spark writer's
`ttl` option, materialize) parses and checks through here, so they accept and refuse alike.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from hotstate.controller.records import KeyColumn, KeyType, TableTtl, TableWindow, ValueColumn

__all__ = [
    "TIMESTAMP_VALUE_TYPES",
    "checked_ttl",
    "format_duration",
    "invalid_ttl",
    "invalid_ttl_value_columns",
    "parse_duration",
]

_UNITS_US = {
    "us": 1,
    "ms": 1_000,
    "s": 1_000_000,
    "m": 60_000_000,
    "h": 3_600_000_000,
    "d": 86_400_000_000,
    "w": 7 * 86_400_000_000,
}
_UNIT_NAMES = {
    "microsecond": "us",
    "millisecond": "ms",
    "sec": "s",
    "second": "s",
    "min": "m",
    "minute": "m",
    "hour": "h",
    "day": "d",
    "week": "w",
}
# Spark's names (DataType.simpleString()) of the value types a TTL column may have.
TIMESTAMP_VALUE_TYPES = ("timestamp", "timestamp_ntz")


def parse_duration(text: str) -> int:
    """Microseconds of a duration such as "7d", "12h", "30 minutes", "500ms", "2 hours"; ValueError (saying
    what is accepted) for anything else, zero or negative included."""
    match = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]+)\s*", text)
    if match is not None:
        unit = match.group(2).lower()
        if unit not in _UNITS_US:
            singular = unit[:-1] if unit.endswith("s") and unit[:-1] in _UNIT_NAMES else unit
            unit = _UNIT_NAMES.get(singular, unit)
        factor = _UNITS_US.get(unit)
        if factor is not None and int(match.group(1)) > 0:
            return int(match.group(1)) * factor
    raise ValueError(
        f"duration {text!r}: give a positive whole number and a unit, e.g. 7d, 12h, 30m, 45s, 500ms, "
        "'2 hours' (units: us, ms, s, m, h, d, w, or their names)"
    )


def format_duration(micros: int) -> str:
    """The shortest exact form parse_duration reads back in units up to days, e.g. 7d, 90m, 1500ms."""
    for unit in ("d", "h", "m", "s", "ms"):
        factor = _UNITS_US[unit]
        if micros % factor == 0:
            return f"{micros // factor}{unit}"
    return f"{micros}us"


def invalid_ttl(
    key_columns: Sequence[KeyColumn], window: TableWindow | None, ttl: TableTtl | None
) -> str | None:
    """Why a table cannot have this TTL: a windowed table (its windows expire by their retention), a TTL
    that is not positive, or a key column named as its column that is not a TIMESTAMP. A column that is no
    key column is a value column, which writers declare later: invalid_ttl_value_columns checks it then."""
    if ttl is None:
        return None
    if window is not None:
        return (
            "ttl: a windowed table's windows expire by its retention (materialize's `retention`), not a ttl"
        )
    if ttl.ttl_us <= 0:
        return f"ttl {ttl.ttl_us} us: must be positive"
    if ttl.column is None:
        return None
    if not ttl.column:
        return "ttl column: give a column name, or none to expire rows by write time"
    for column in key_columns:
        if column.name == ttl.column:
            if column.type is not KeyType.TIMESTAMP:
                return f"ttl column {ttl.column!r}: a key column of type {column.type.name}, not a TIMESTAMP"
            return None
    return None


def invalid_ttl_value_columns(
    ttl: TableTtl | None, key_columns: Sequence[KeyColumn], value_columns: Sequence[ValueColumn]
) -> str | None:
    """Why a writer's value columns do not fit the table's TTL column: it is neither a key column nor one
    of them, or it is one of another type than timestamp."""
    if ttl is None or ttl.column is None or any(c.name == ttl.column for c in key_columns):
        return None
    for column in value_columns:
        if column.name == ttl.column:
            if column.type.lower() not in TIMESTAMP_VALUE_TYPES:
                return f"ttl column {ttl.column!r}: of type {column.type}, not a timestamp"
            return None
    names = [c.name for c in key_columns] + [c.name for c in value_columns]
    return f"ttl column {ttl.column!r}: no such column (the table has {', '.join(names)})"


def checked_ttl(
    ttl: str | None,
    column: str | None,
    key_columns: Sequence[KeyColumn],
    window: TableWindow | None,
    value_columns: Sequence[ValueColumn],
) -> TableTtl | None:
    """A writer's `ttl` and `ttl column` options as the table's TTL, checked against the columns it
    writes; ValueError saying what is wrong (a bad duration, a windowed table, a column that is missing or
    no timestamp)."""
    if ttl is None:
        if column is not None:
            raise ValueError(f"ttl column {column!r} without a ttl: give the ttl too, e.g. 7d")
        return None
    table_ttl = TableTtl(parse_duration(ttl), column)
    problem = invalid_ttl(key_columns, window, table_ttl) or invalid_ttl_value_columns(
        table_ttl, key_columns, value_columns
    )
    if problem is not None:
        raise ValueError(problem)
    return table_ttl

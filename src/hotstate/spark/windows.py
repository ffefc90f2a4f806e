"""Windowed tables from Spark: a `window(...)` or `session_window(...)` struct key column becomes two key
columns, the window's bounds, after the other keys (docs/architecture.md, "Windowed tables").

Spark gives a windowed aggregation's key as a struct<start: timestamp, end: timestamp> column (named
`window` or `session_window` unless aliased), marked in its field metadata (`spark.timeWindow`,
`spark.sessionWindow`). The table stores it as `WINDOWSTART` and `WINDOWEND` (ksqlDB's names) of key types
WINDOW_START and WINDOW_END: the store orders a key's windows by start, and the partition hash leaves them
out, so a key's windows share a partition. The window's kind and size come from the query's logical plan
where it shows one `window(ts, size, slide, start)` call (the DataFrame API and SQL both put it there);
otherwise the table records a window of kind TIME, size unknown.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql.types import StructField, StructType, TimestampNTZType, TimestampType

from hotstate.controller.records import KeyColumn, KeyType, TableWindow, ValueColumn
from hotstate.spark.table import TableDefinitionError, key_columns_for, value_columns_for

__all__ = [
    "WINDOW_END",
    "WINDOW_START",
    "WindowKeyError",
    "split_window",
    "stored_key",
    "table_columns",
    "table_window",
    "window_column",
    "windowed_key_columns",
]

WINDOW_START = "WINDOWSTART"
WINDOW_END = "WINDOWEND"

_TIME_WINDOW = "spark.timeWindow"
_SESSION_WINDOW = "spark.sessionWindow"

# `'window('ts, 10 minutes, 5 minutes, 0 second)` / `'session_window('ts, 5 minutes)` in the logical plan.
_WINDOW_CALL = re.compile(r"(?<![\w])'?window\([^,()]+, ([^,()]+), ([^,()]+), ([^,()]+)\)")
_SESSION_CALL = re.compile(r"session_window\(")
_UNIT_US = {
    "microsecond": 1,
    "millisecond": 1_000,
    "second": 1_000_000,
    "minute": 60_000_000,
    "hour": 3_600_000_000,
    "day": 86_400_000_000,
    "week": 7 * 86_400_000_000,
}
_INTERVAL_PART = re.compile(r"(-?\d+(?:\.\d+)?)\s*(microsecond|millisecond|second|minute|hour|day|week)s?")


log = logging.getLogger(__name__)


class WindowKeyError(TableDefinitionError):
    """A struct key column that is not a window, or several window columns in one key."""


def _is_window_struct(field: StructField) -> bool:
    kind = field.dataType
    if not isinstance(kind, StructType) or [f.name for f in kind.fields] != ["start", "end"]:
        return False
    return all(isinstance(f.dataType, TimestampType | TimestampNTZType) for f in kind.fields)


def window_column(schema: StructType, key: str | Sequence[str]) -> str | None:
    """The key column that holds Spark's window struct, None when no key column is a struct;
    WindowKeyError naming a struct key column that is not a window, or the second window column."""
    names = [key] if isinstance(key, str) else list(key)
    fields = {f.name: f for f in schema.fields}
    found: str | None = None
    for name in names:
        field = fields.get(name)
        if field is None or not isinstance(field.dataType, StructType):
            continue
        if not _is_window_struct(field):
            raise WindowKeyError(
                f"key column {name!r} has type {field.dataType.simpleString()}: a struct key column must "
                "be a window (window(...) or session_window(...), struct<start:timestamp,end:timestamp>); "
                "select its fields as key columns of their own instead"
            )
        if found is not None:
            raise WindowKeyError(
                f"key columns {found!r} and {name!r} are both windows: a table has one window"
            )
        found = name
    return found


def _interval_us(text: str) -> int | None:
    parts = _INTERVAL_PART.findall(text)
    if not parts or _INTERVAL_PART.sub("", text).strip(" ,"):
        return None
    total = sum(float(number) * _UNIT_US[unit] for number, unit in parts)
    return int(total) if total > 0 else None


def table_window(df: DataFrame | None, column: str, schema: StructType) -> TableWindow:
    """The TableWindow of window column `column`: its kind and size read from `df`'s logical plan when it
    shows exactly one window call, else kind TIME (SESSION for a session window)."""
    field = next(f for f in schema.fields if f.name == column)
    if field.metadata.get(_SESSION_WINDOW):
        return TableWindow(column, "SESSION")
    plan = _logical_plan(df)
    calls = {match.groups() for match in _WINDOW_CALL.finditer(plan)}
    if len(calls) != 1 or _SESSION_CALL.search(plan):
        return TableWindow(column, "TIME")
    size_text, slide_text, _ = calls.pop()
    size = _interval_us(size_text)
    slide = _interval_us(slide_text)
    if size is None or slide is None:
        return TableWindow(column, "TIME")
    if size == slide:
        return TableWindow(column, "TUMBLING", size, size)
    return TableWindow(column, "HOPPING", size, slide)


def _has_watermark(df: DataFrame) -> bool:
    plan = _logical_plan(df)
    return not plan or "EventTimeWatermark" in plan  # no plan to read: nothing to warn about


def _logical_plan(df: DataFrame | None) -> str:
    """The unresolved logical plan's text: it still names window(...) calls the analyzer rewrites. "" when
    there is none to read (Spark Connect has no JVM handle here)."""
    if df is None:
        return ""
    try:
        return str(df._jdf.queryExecution().logical().toString())
    except Exception:
        return ""


def split_window(schema: StructType, column: str) -> StructType:
    """The schema of what the table stores: the window struct replaced by its bounds at the end."""
    window = next(f for f in schema.fields if f.name == column)
    bound = window.dataType.fields[0].dataType  # type: ignore[attr-defined]
    taken = {f.name for f in schema.fields}
    for name in (WINDOW_START, WINDOW_END):
        if name in taken:
            raise WindowKeyError(
                f"column {name!r}: a windowed table stores its window's bounds under that name; rename it"
            )
    others = [f for f in schema.fields if f.name != column]
    return StructType(
        [*others, StructField(WINDOW_START, bound, False), StructField(WINDOW_END, bound, False)]
    )


def stored_key(key: str | Sequence[str], column: str) -> list[str]:
    """The table's key column names: the key without the window, then the window's bounds."""
    names = [key] if isinstance(key, str) else list(key)
    return [*(name for name in names if name != column), WINDOW_START, WINDOW_END]


def windowed_key_columns(columns: Sequence[KeyColumn]) -> tuple[KeyColumn, ...]:
    """`columns` (ending in the bounds, typed TIMESTAMP from the schema) with the bounds' window key types."""
    *others, start, end = columns
    return (*others, KeyColumn(start.name, KeyType.WINDOW_START), KeyColumn(end.name, KeyType.WINDOW_END))


def windowed_table(
    df: DataFrame | None, schema: StructType, key: str | Sequence[str]
) -> tuple[StructType, list[str], TableWindow | None]:
    """What a writer of `schema` keyed by `key` stores: (its schema, its key column names, its window),
    the window struct split into its bounds when a key column is one; unchanged otherwise."""
    column = window_column(schema, key)
    names = [key] if isinstance(key, str) else list(key)
    if column is None:
        return schema, names, None
    return split_window(schema, column), stored_key(names, column), table_window(df, column, schema)


def table_columns(
    df: DataFrame | None, schema: StructType, key: str | Sequence[str], retention: str | None = None
) -> tuple[tuple[KeyColumn, ...], tuple[ValueColumn, ...], TableWindow | None]:
    """The key columns, value columns and window of the table a writer of `schema` (the delete column left
    out) keyed by `key` writes: a window struct key column stored as its bounds, last in the key.
    `retention`: an interval such as "2 hours" (windows that ended longer than that before the newest
    window end are deleted); only for a windowed table."""
    stored, names, window = windowed_table(df, schema, key)
    keys = key_columns_for(stored, names)
    if window is not None:
        keys = windowed_key_columns(keys)
    if window is not None and df is not None and not _has_watermark(df):
        log.warning(
            "window key column %r without a watermark (withWatermark): Spark keeps every window in its state "
            "and updates any window a late row falls in; the table keeps every window%s",
            window.column,
            "" if retention is None else f" that ended less than {retention} before the newest",
        )
    if retention is not None:
        if window is None:
            raise TableDefinitionError(
                f"retention {retention!r}: only a windowed table (a window(...) key column) has a retention"
            )
        micros = _interval_us(retention)
        if micros is None:
            raise TableDefinitionError(
                f"retention {retention!r}: give an interval such as '2 hours' or '30 minutes'"
            )
        window = dataclasses.replace(window, retention_us=micros)
    return keys, value_columns_for(stored, names), window

"""Pull queries on windowed tables: ksqlDB's WINDOWSTART / WINDOWEND predicates, and Spark's names for them.

A windowed table's key ends in WINDOWSTART and WINDOWEND (key types WINDOW_START, WINDOW_END; see
docs/architecture.md, "Windowed tables"): in each partition a key's windows sit together in start order,
and the partition hash leaves the bounds out, so one key's windows are all in one partition.

Before the key planner (plan.py) sees a query on such a table, `windowed_query` rewrites it:
- names: `window.start` / `window.end` (Spark's struct fields; `session_window.end` likewise) are
  WINDOWSTART / WINDOWEND; selecting the struct column (`SELECT window`) selects both bounds.
- values: a bound compares with a TIMESTAMP, an ISO-8601 string, or an integer of epoch milliseconds
  (ksqlDB's WINDOWSTART is a BIGINT of those).
- WINDOWEND on a window of fixed size (TUMBLING, HOPPING) is WINDOWSTART shifted by the size, so it plans to
  the same key range as the WINDOWSTART predicate it stands for.
- what the key order cannot answer becomes a filter on the bounds of each scanned key (`WindowFilter`, on the
  encoded key's last bytes, before any row is decoded): WINDOWEND of a session window, and WINDOWSTART when
  the other key columns are not each pinned to one value (ksqlDB requires the key; here a query over every
  key's windows in a time range is a scan of every partition, limited like any scan).
On a table that is not windowed these names are an error that says so.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Sequence
from dataclasses import dataclass

from hotstate.controller.image import TableInfo
from hotstate.controller.records import KeyColumn
from hotstate.protocol.keys import (
    WINDOW_BOUND_BYTES,
    InvalidKeyError,
    KeyEncodeError,
    KeyValue,
    encode_component,
    partition_for,
    short_repr,
    window_suffix,
)
from hotstate.query.pull_query import Condition, Op, Predicate, PullQuery, QueryError, TupleIn
from hotstate.query.sql import parse_timestamp

__all__ = [
    "WINDOW_END",
    "WINDOW_START",
    "NotWindowedError",
    "WindowFilter",
    "range_partition",
    "windowed_query",
]

WINDOW_START = "WINDOWSTART"
WINDOW_END = "WINDOWEND"
_BOUNDS = {WINDOW_START.casefold(): WINDOW_START, WINDOW_END.casefold(): WINDOW_END}
_FIELDS = {"start": WINDOW_START, "end": WINDOW_END}
_EPOCH = dt.datetime(1970, 1, 1)


class NotWindowedError(QueryError):
    """WINDOWSTART / WINDOWEND (or window.start / window.end) on a table that is not windowed."""


class WindowValueError(QueryError):
    """A value a window bound cannot be compared with."""


@dataclass(frozen=True, slots=True)
class WindowFilter:
    """What the key order cannot answer, checked on each scanned key's encoded bounds (the key's last 18
    bytes: WINDOWSTART's 9, then WINDOWEND's 9). Each test is (op, encoded values): one value for the
    comparisons, the set for = and IN (as a tuple)."""

    start: tuple[tuple[Op, tuple[bytes, ...]], ...] = ()
    end: tuple[tuple[Op, tuple[bytes, ...]], ...] = ()

    def keep(self, key: bytes) -> bool:
        size = WINDOW_BOUND_BYTES
        return _holds(self.start, key[-2 * size : -size]) and _holds(self.end, key[-size:])


def _holds(tests: tuple[tuple[Op, tuple[bytes, ...]], ...], encoded: bytes) -> bool:
    for op, values in tests:
        if op is Op.EQ or op is Op.IN:
            if encoded not in values:
                return False
        elif op is Op.LT:
            if not encoded < values[0]:
                return False
        elif op is Op.LE:
            if not encoded <= values[0]:
                return False
        elif op is Op.GT:
            if not encoded > values[0]:
                return False
        elif not encoded >= values[0]:  # GE
            return False
    return True


def _bound_name(name: str, table: TableInfo) -> str | None:
    """WINDOWSTART / WINDOWEND when `name` names a window bound (whatever the table), else None."""
    found = _BOUNDS.get(name.casefold())
    if found is not None:
        return found
    struct, dot, field = name.rpartition(".")
    if dot and field.casefold() in _FIELDS:
        window = table.window
        if window is None or struct.casefold() != window.column.casefold():
            if window is None:
                raise NotWindowedError(_not_windowed(table, name))
            raise QueryError(
                f"{name} does not name a column of table {table.name!r}: its window is "
                f"{window.column}.start / {window.column}.end (WINDOWSTART / WINDOWEND)"
            )
        return _FIELDS[field.casefold()]
    return None


def _not_windowed(table: TableInfo, name: str) -> str:
    keys = ", ".join(column.name for column in table.key_columns)
    return (
        f"{name}: table {table.name!r} is not windowed (key columns: {keys}); WINDOWSTART and WINDOWEND "
        "exist on tables materialized from a window(...) or session_window(...) key"
    )


def _is_key_column(name: str, table: TableInfo) -> bool:
    folded = name.casefold()
    return any(column.name.casefold() == folded for column in table.key_columns)


def windowed_query(query: PullQuery, table: TableInfo) -> tuple[PullQuery, WindowFilter | None]:
    """`query` as the key planner takes it on `table` (see the module docstring), and the filter of what
    it leaves to the scanned keys (None: nothing)."""
    if table.window is None:
        if _may_name_bounds(query):
            _refuse_bounds(query, table)
        return query, None
    columns = None if query.columns is None else _columns(query.columns, table)
    bounds: list[Condition] = []
    others: list[Predicate] = []
    for predicate in query.conditions:
        if isinstance(predicate, Condition):
            name = _bound_name(predicate.column, table)
            if name is not None:
                bounds.append(dataclasses.replace(predicate, column=name))
                continue
        elif any(_bound_name(column, table) is not None for column in predicate.columns):
            raise QueryError(
                "a window bound in a row IN list is not supported: compare WINDOWSTART on its own"
            )
        others.append(predicate)
    if not bounds:
        if columns == query.columns:
            return query, None
        return dataclasses.replace(query, columns=columns), None
    start_column, end_column = table.key_columns[-2:]
    size = _fixed_size(table)
    planned: list[Condition] = []
    start_tests: list[tuple[Op, tuple[bytes, ...]]] = []
    end_tests: list[tuple[Op, tuple[bytes, ...]]] = []
    pinned = _key_pinned(others, table)
    # With the key and WINDOWSTART pinned, WINDOWEND = t pins the last key column: a point lookup.
    start_pinned = pinned and any(c.column == WINDOW_START and c.op is Op.EQ for c in bounds)
    for condition in bounds:
        values = tuple(_instant(value, condition.column) for value in condition.values)
        if condition.column == WINDOW_END and size is not None:
            # A fixed-size window's end is its start plus the size: the same predicate on WINDOWSTART.
            shifted = tuple(None if v is None else v - size for v in values)
            condition = Condition(WINDOW_START, condition.op, shifted)
        else:
            condition = Condition(condition.column, condition.op, values)
        # The planner reads one key range: several WINDOWSTART values filter the key's windows instead.
        several = condition.op is Op.IN and len(set(values)) > 1
        if (condition.column == WINDOW_START and pinned and not several) or (
            condition.column == WINDOW_END and start_pinned and condition.op is Op.EQ
        ):
            planned.append(condition)
            continue
        column = start_column if condition.column == WINDOW_START else end_column
        tests = start_tests if condition.column == WINDOW_START else end_tests
        tests.extend(_tests(condition, column))
    rewritten = dataclasses.replace(query, columns=columns, conditions=(*others, *planned))
    if not start_tests and not end_tests:
        return rewritten, None
    return rewritten, WindowFilter(tuple(start_tests), tuple(end_tests))


_BOUND_LENGTHS = frozenset(len(name) for name in _BOUNDS)


def _may_name_bounds(query: PullQuery) -> bool:
    """Whether a name of the query might be a window bound: cheap, as every query on every table asks."""
    for predicate in query.conditions:
        for name in (predicate.column,) if type(predicate) is Condition else predicate.columns:  # type: ignore[union-attr]
            if len(name) in _BOUND_LENGTHS or "." in name:
                return True
    if not query.columns:  # SELECT *: no generator
        return False
    return any(len(name) in _BOUND_LENGTHS or "." in name for name in query.columns)


def _refuse_bounds(query: PullQuery, table: TableInfo) -> None:
    names: list[str] = []
    for predicate in query.conditions:
        names.extend([predicate.column] if isinstance(predicate, Condition) else predicate.columns)
    for name in names:
        if not _is_key_column(name, table) and _bound_name(name, table) is not None:
            raise NotWindowedError(_not_windowed(table, name))
    declared = {column.name.casefold() for column in table.value_columns}
    for name in query.columns or ():
        known = _is_key_column(name, table) or name.casefold() in declared
        if not known and _bound_name(name, table) is not None:
            raise NotWindowedError(_not_windowed(table, name))


def _columns(columns: Sequence[str], table: TableInfo) -> tuple[str, ...]:
    window = table.window
    assert window is not None
    out: list[str] = []
    for name in columns:
        if name.casefold() == window.column.casefold():
            out.extend((WINDOW_START, WINDOW_END))
        else:
            out.append(_bound_name(name, table) or name)
    return tuple(out)


def _fixed_size(table: TableInfo) -> dt.timedelta | None:
    window = table.window
    if window is None or window.kind not in ("TUMBLING", "HOPPING") or window.size_us is None:
        return None
    return dt.timedelta(microseconds=window.size_us)


def _key_pinned(others: Sequence[Predicate], table: TableInfo) -> bool:
    """Whether every key column before the window's is pinned to one value: then WINDOWSTART bounds the
    one key range the planner reads; otherwise they filter the scanned keys."""
    wanted = {column.name.casefold() for column in table.key_columns[:-2]}
    for predicate in others:
        if isinstance(predicate, Condition):
            if predicate.op is Op.EQ or (predicate.op is Op.IN and len(set(predicate.values)) == 1):
                wanted.discard(predicate.column.casefold())
        elif isinstance(predicate, TupleIn) and len(predicate.rows) == 1:
            wanted.difference_update(column.casefold() for column in predicate.columns)
    return not wanted


def _instant(value: KeyValue, column: str) -> dt.datetime | None:
    """A bound's value as a datetime: epoch milliseconds (ksqlDB's BIGINT), ISO-8601 text, a TIMESTAMP."""
    if value is None or isinstance(value, dt.datetime):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        try:
            return _EPOCH + dt.timedelta(milliseconds=value)
        except OverflowError:
            raise WindowValueError(f"{column}: {value} ms since the epoch is out of range") from None
    if isinstance(value, str):
        try:
            return parse_timestamp(value)
        except ValueError:
            pass
    raise WindowValueError(
        f"{column} must be compared with a TIMESTAMP such as TIMESTAMP '2026-01-02 03:04:05', an ISO-8601 "
        f"string or epoch milliseconds, got {short_repr(value)} ({type(value).__name__})"
    )


def _encoded(column: KeyColumn, value: KeyValue) -> bytes:
    try:
        return encode_component(column, value)
    except (InvalidKeyError, KeyEncodeError) as error:
        raise WindowValueError(f"{column.name}: {error}") from None


def _tests(condition: Condition, column: KeyColumn) -> list[tuple[Op, tuple[bytes, ...]]]:
    values = condition.values
    if condition.op in (Op.EQ, Op.IN):
        return [(Op.IN, tuple(_encoded(column, v) for v in values if v is not None))]
    if any(v is None for v in values):  # a comparison with NULL holds for no window
        return [(Op.IN, ())]
    if condition.op is Op.BETWEEN:
        if len(values) != 2:
            raise QueryError(f"BETWEEN needs two values, got {len(values)}")
        low, high = values
        return [(Op.GE, (_encoded(column, low),)), (Op.LE, (_encoded(column, high),))]
    if len(values) != 1:
        raise QueryError(f"{condition.op} needs one value, got {len(values)}")
    return [(condition.op, (_encoded(column, values[0]),))]


def range_partition(table: TableInfo, assignment: dict[int, bytes], prefix_length: int) -> int | None:
    """The one partition a key range of a windowed table lies in: when its prefix pins every key column
    before the window's (the partition hash leaves the window out); None otherwise (read every partition)."""
    key = table.key_columns
    if not window_suffix(key) or prefix_length < len(key) - 2:
        return None
    hashed = b"".join(assignment[index] for index in range(len(key) - 2))
    return partition_for(hashed, table.partitions)

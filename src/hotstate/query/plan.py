"""Planning a pull query against a table's key: which encoded keys, or which one key range, to read.

A table's rows sit in the partition picked by the hash of their encoded key, and each partition keeps
them in encoded-key order (protocol/keys.py). So a WHERE that pins every key column is a set of point
lookups, each on one partition; a WHERE that pins the leading key columns to one value each, and maybe
bounds the next one, is one byte range, read on every partition and merged; no WHERE reads everything.
Any other WHERE would need a filter over scanned rows, which pull queries do not do (nor does ksqlDB),
so it is an error that says which column breaks the rule.

Values are compared as the store compares them, by their encodings, after coercion to the column's type:
so -0.0 = 0.0, and '2026-01-02T00:30:00+01:00' = TIMESTAMP '2026-01-01 23:30:00'. Key columns are never
null, so a comparison with NULL matches nothing, as in SQL. A WHERE that nothing can satisfy (k > 5 AND
k < 3, k = 1 AND k = 2) plans to an empty KeyLookup rather than an error.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeAlias

from hotstate.controller.image import TableInfo
from hotstate.controller.records import TIMESTAMP_KEY_TYPES, KeyColumn, KeyType
from hotstate.protocol.keys import (
    InvalidKeyError,
    KeyEncodeError,
    KeyValue,
    encode_component,
    partitions_of,
    short_repr,
    str_components,
    window_suffix,
)
from hotstate.query.scan import ScanSpec, spec_of_conditions
from hotstate.query.sql import (
    Condition,
    Op,
    Predicate,
    PullQuery,
    QueryError,
    TupleIn,
    UnsupportedQueryError,
    parse_timestamp,
)
from hotstate.query.windows import WindowFilter, range_partition, windowed_query

__all__ = [
    "Access",
    "FullScan",
    "InvalidKeyValueError",
    "KeyLookup",
    "KeyRange",
    "QueryPlan",
    "TableMismatchError",
    "TooManyKeysError",
    "UnknownTableError",
    "find_table",
    "plan",
    "scan_access",
]


class InvalidKeyValueError(QueryError):
    """A value that does not fit the type of the key column it is compared with."""

    def __init__(self, column: str, value: object, expected: str) -> None:
        super().__init__(
            f"key column {column!r} must be {expected}, got {short_repr(value)} ({type(value).__name__})"
        )
        self.column = column
        self.value = value
        self.expected = expected


class TooManyKeysError(UnsupportedQueryError):
    """IN lists whose combinations are more keys than one query may look up."""


class UnknownTableError(QueryError):
    """No table, or more than one, has the name the query gives."""


class TableMismatchError(QueryError):
    """A query planned against a table other than the one it names (a caller's mistake)."""


@dataclass(frozen=True, slots=True)
class KeyLookup:
    """Point lookups: `keys` encoded, distinct and ascending; `partitions[i]` is the partition of keys[i]."""

    keys: tuple[bytes, ...]
    partitions: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class KeyRange:
    """Every key in [start, end), None meaning unbounded: read on every partition, merged in key order."""

    start: bytes | None
    end: bytes | None
    # The one partition holding the range (a windowed table's key: query.windows); None: every partition.
    partition: int | None = None


@dataclass(frozen=True, slots=True)
class FullScan:
    """Every row of the table (no WHERE)."""


Access: TypeAlias = KeyLookup | KeyRange | FullScan


@dataclass(frozen=True, slots=True)
class QueryPlan:
    access: Access
    columns: tuple[str, ...] | None  # as written in the query; None: every column
    limit: int | None
    # A scan (query/scan.py): what the replicas evaluate over the rows `access` reads; None: plain reads.
    scan: ScanSpec | None = None
    # A windowed table's bounds the key order cannot answer, checked on the scanned keys (query.windows).
    window_filter: WindowFilter | None = None


NOTHING = KeyLookup((), ())

# Appended to an encoded key prefix, gives bytes above every key that starts with that prefix's components
# and below every key whose last such component is greater. Not prefix_end(): a STRING or BYTES component
# 'a' encodes as a byte prefix of 'a\x00' (02 61 00 | 02 61 00 FF 00), so prefix_end(02 61 00) = 02 61 01
# would take in 'a\x00', which is greater than 'a'. The byte after a whole component is the next
# component's type code or an escape's 0xFF, so prefix + 0xFF ends exactly the keys equal to the prefix.
_PAST = b"\xff"

_EXPECTED = {
    KeyType.STRING: "a string (STRING)",
    KeyType.INT: "a signed 64-bit integer (INT)",
    KeyType.FLOAT: "a number (FLOAT)",
    KeyType.BOOL: "TRUE or FALSE (BOOL)",
    KeyType.BYTES: "a hex literal such as X'0aff' (BYTES)",
    KeyType.TIMESTAMP: "a TIMESTAMP such as TIMESTAMP '2026-01-02 03:04:05' or an ISO-8601 string",
}


def find_table(tables: Mapping[str, TableInfo], name: str) -> TableInfo:
    """The table a query names: its exact name, else the one name equal but for case."""
    exact = tables.get(name)
    if exact is not None:
        return exact
    folded = name.casefold()
    matches = [info for key, info in tables.items() if key.casefold() == folded]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        raise UnknownTableError(f"table {name!r} does not exist")
    names = ", ".join(sorted(repr(info.name) for info in matches))
    raise UnknownTableError(f"table name {name!r} matches several tables ({names}): use its exact name")


def plan(query: PullQuery, table: TableInfo, *, max_keys: int = 10_000) -> QueryPlan:
    """How to read `query`'s rows from `table` (looked up by the caller, e.g. with find_table)."""
    if query.table.casefold() != table.name.casefold():
        raise TableMismatchError(f"the query reads table {query.table!r}, not {table.name!r}")
    query, window_filter = windowed_query(query, table)
    spec = query.scan
    if spec is None:
        try:
            access = _access(query.conditions, table, max_keys)
            return QueryPlan(access, query.columns, query.limit, window_filter=window_filter)
        except TooManyKeysError:
            raise
        except UnsupportedQueryError:
            # A WHERE the key alone cannot answer (a non-key column, a key column out of order): a scan
            # whose replicas evaluate all of it.
            spec = spec_of_conditions(query.conditions, query.columns)
    access = scan_access(query.conditions, table, max_keys)
    return QueryPlan(access, None, query.limit, spec, window_filter)


def scan_access(conditions: Sequence[Predicate], table: TableInfo, max_keys: int) -> Access:
    """The rows a scan must read: what its predicates on the leading key columns narrow them to (the most
    leading columns whose predicates make a lookup or a range), at worst every row. The replicas evaluate
    the whole WHERE, so reading more than needed is never wrong."""
    positions = {column.name.casefold(): index for index, column in enumerate(table.key_columns)}

    def last_column(predicate: Predicate) -> int:
        # A predicate kind other than these two (none yet) would be left to the replicas.
        names = getattr(predicate, "columns", None) or (getattr(predicate, "column", ""),)
        return max(positions.get(name.casefold(), len(positions)) for name in names)

    for width in range(len(positions), 0, -1):
        usable = [predicate for predicate in conditions if last_column(predicate) < width]
        if not usable:
            continue
        try:
            return _access(usable, table, max_keys)
        except TooManyKeysError:
            continue
        except UnsupportedQueryError:
            continue
    return FullScan()


# --- planning -------------------------------------------------------------------------------------------

# A key column's value by column index, as its one-component encoding.
_Assignment: TypeAlias = dict[int, bytes]


@dataclass(frozen=True, slots=True)
class _Bound:
    op: Op  # LT, LE, GT or GE
    encoded: bytes

    def holds(self, encoded: bytes) -> bool:
        if self.op is Op.LT:
            return encoded < self.encoded
        if self.op is Op.LE:
            return encoded <= self.encoded
        if self.op is Op.GT:
            return encoded > self.encoded
        return encoded >= self.encoded


@dataclass(frozen=True, slots=True)
class _Pin:
    """Key columns that an = or IN (or a row IN) restricts to the listed rows of values."""

    columns: tuple[int, ...]
    rows: list[_Assignment]


def _access(conditions: Sequence[Predicate], table: TableInfo, max_keys: int) -> Access:
    if not conditions:
        return FullScan()
    lookup = one_column_lookup(conditions, table, max_keys)
    return lookup if lookup is not None else general_access(conditions, table, max_keys)


def one_column_lookup(conditions: Sequence[Predicate], table: TableInfo, max_keys: int) -> Access | None:
    """The most common plan, made directly: one = or IN on a table keyed by one column. The same result
    and errors as general_access (a property test holds them to it), at a third of its cost; None for
    anything else, including a column that is not the key (the general path words that error)."""
    key = table.key_columns
    if len(conditions) != 1 or len(key) != 1:
        return None
    [predicate] = conditions
    column = key[0]
    if type(predicate) is not Condition or predicate.op not in (Op.EQ, Op.IN):
        return None
    if predicate.column != column.name and predicate.column.casefold() != column.name.casefold():
        return None
    values = predicate.values
    if None in values:  # NULL matches no key
        values = tuple(value for value in values if value is not None)
    components = str_components(values) if column.type is KeyType.STRING else None
    if components is None:
        components = {key_component(column, value) for value in values}
    encoded = sorted(components)
    if len(encoded) > max_keys:
        raise _too_many(len(encoded), max_keys)
    return KeyLookup(tuple(encoded), partitions_of(encoded, table.partitions))


def general_access(conditions: Sequence[Predicate], table: TableInfo, max_keys: int) -> Access:
    key = table.key_columns
    resolve = _resolver(key)
    pins: list[_Pin] = []
    bounds: list[list[_Bound]] = [[] for _ in key]
    matches_nothing = False
    for predicate in conditions:
        if isinstance(predicate, TupleIn):
            indexes = tuple(resolve(column) for column in predicate.columns)
            pins.append(_Pin(indexes, _rows(indexes, predicate.rows, key)))
        elif predicate.op in (Op.EQ, Op.IN):
            index = resolve(predicate.column)
            pins.append(_Pin((index,), _column_rows(index, predicate.values, key[index])))
        else:
            index = resolve(predicate.column)
            for op, value in _bounds(predicate):
                if value is None:
                    matches_nothing = True
                else:
                    bounds[index].append(_Bound(op, key_component(key[index], value)))

    pinned = {index for pin in pins for index in pin.columns}
    prefix_length = next((index for index in range(len(key)) if index not in pinned), len(key))
    _check_prefix_shape(key, pinned, bounds, prefix_length)
    if matches_nothing:
        return NOTHING

    # Bounds on a pinned column filter its listed values before they multiply with the other lists.
    if any(bounds):
        pins = [_Pin(pin.columns, [row for row in pin.rows if _within(row, bounds)]) for pin in pins]
    assignments = _combine(pins, max_keys)
    if prefix_length == len(key):
        if len(key) == 1:
            encoded = sorted({row[0] for row in assignments})
        else:
            encoded = sorted({b"".join(row[index] for index in range(len(key))) for row in assignments})
        return KeyLookup(tuple(encoded), partitions_of(encoded, table.partitions, window_suffix(key)))
    if not assignments:
        return NOTHING
    if len(assignments) > 1:
        varying = next(i for i in range(prefix_length) if len({row[i] for row in assignments}) > 1)
        raise UnsupportedQueryError(
            f"several values for key column {key[varying].name!r} need equality on every key column "
            f"({_names(key)}); on only the leading key columns, give each one value"
        )
    prefix = b"".join(assignments[0][index] for index in range(prefix_length))
    access = _range(prefix, bounds[prefix_length])
    partition = range_partition(table, assignments[0], prefix_length)
    if isinstance(access, KeyRange) and partition is not None:
        return KeyRange(access.start, access.end, partition)
    return access


def _check_prefix_shape(
    key: Sequence[KeyColumn], pinned: set[int], bounds: Sequence[list[_Bound]], prefix_length: int
) -> None:
    """Only the leading key columns may have = / IN, and a range only the column right after them."""
    for index in range(prefix_length + 1, len(key)):
        what = "equality on" if index in pinned else "a range on" if bounds[index] else None
        if what is not None:
            missing = key[prefix_length].name
            rule = f"rows are found by equality on the leading key columns ({_names(key)}) and a range on "
            rule += "the next"
            raise UnsupportedQueryError(
                f"{what} key column {key[index].name!r} needs equality on key column {missing!r} too: {rule}"
            )


def _range(prefix: bytes, bounds: Iterable[_Bound]) -> Access:
    lower: _Bound | None = None
    upper: _Bound | None = None
    for bound in bounds:
        # On equal values the exclusive bound is the tighter one.
        if bound.op in (Op.GT, Op.GE):
            if lower is None or (bound.encoded, bound.op is Op.GT) > (lower.encoded, lower.op is Op.GT):
                lower = bound
        elif upper is None or (bound.encoded, bound.op is Op.LE) < (upper.encoded, upper.op is Op.LE):
            upper = bound
    if lower is None:
        start = prefix or None
    else:
        start = prefix + lower.encoded + (_PAST if lower.op is Op.GT else b"")
    if upper is None:
        end = prefix + _PAST if prefix else None
    else:
        end = prefix + upper.encoded + (_PAST if upper.op is Op.LE else b"")
    if start is not None and end is not None and start >= end:
        return NOTHING
    return KeyRange(start, end)


def _combine(pins: Sequence[_Pin], max_keys: int) -> list[_Assignment]:
    """Every assignment of the pinned columns that all pins allow: a join on the columns pins share."""
    if len(pins) == 1:  # one = or IN: its rows as they are
        rows = pins[0].rows
        if len(rows) > max_keys:
            raise _too_many(len(rows), max_keys)
        return rows
    assignments: list[_Assignment] = [{}]
    assigned: set[int] = set()
    for pin in pins:
        shared = tuple(index for index in dict.fromkeys(pin.columns) if index in assigned)
        by_shared: dict[tuple[bytes, ...], list[_Assignment]] = {}
        for row in pin.rows:
            by_shared.setdefault(tuple(row[index] for index in shared), []).append(row)
        matched = [by_shared.get(tuple(a[index] for index in shared), []) for a in assignments]
        count = sum(len(rows) for rows in matched)
        if count > max_keys:
            raise _too_many(count, max_keys)
        assignments = [a | row for a, rows in zip(assignments, matched, strict=True) for row in rows]
        assigned.update(pin.columns)
    return assignments


def _too_many(count: int, max_keys: int) -> TooManyKeysError:
    return TooManyKeysError(
        f"the WHERE clause expands to {count:,} keys, more than the limit of {max_keys:,}"
    )


def _within(row: _Assignment, bounds: Sequence[list[_Bound]]) -> bool:
    return all(bound.holds(encoded) for index, encoded in row.items() for bound in bounds[index])


def _rows(
    indexes: tuple[int, ...], rows: Iterable[Sequence[KeyValue]], key: Sequence[KeyColumn]
) -> list[_Assignment]:
    """The distinct listed rows that can match: none with a NULL, none giving one column two values."""
    found: dict[tuple[tuple[int, bytes], ...], _Assignment] = {}
    for values in rows:
        if len(values) != len(indexes):
            raise UnsupportedQueryError(f"each row of the IN list needs {len(indexes)} values")
        row: _Assignment = {}
        consistent = True
        for index, value in zip(indexes, values, strict=True):
            if value is None:
                consistent = False  # still check the rest for type errors
                continue
            encoded = key_component(key[index], value)
            consistent = consistent and row.setdefault(index, encoded) == encoded
        if consistent:
            found.setdefault(tuple(sorted(row.items())), row)
    return list(found.values())


def _column_rows(index: int, values: Iterable[KeyValue], column: KeyColumn) -> list[_Assignment]:
    """`_rows` for one column's = or IN list (the common case, kept cheap): its distinct non-NULL values."""
    found: dict[bytes, _Assignment] = {}
    for value in values:
        if value is not None:
            encoded = key_component(column, value)
            if encoded not in found:
                found[encoded] = {index: encoded}
    return list(found.values())


def _bounds(condition: Condition) -> list[tuple[Op, KeyValue]]:
    if condition.op is Op.BETWEEN:
        if len(condition.values) != 2:
            raise UnsupportedQueryError(f"BETWEEN needs two values, got {len(condition.values)}")
        low, high = condition.values
        return [(Op.GE, low), (Op.LE, high)]
    if len(condition.values) != 1:
        raise UnsupportedQueryError(f"{condition.op} needs one value, got {len(condition.values)}")
    return [(condition.op, condition.values[0])]


def key_component(column: KeyColumn, value: KeyValue) -> bytes:
    """The value coerced to the column's type, encoded as one key component."""
    if column.type in TIMESTAMP_KEY_TYPES and isinstance(value, str):
        try:
            value = parse_timestamp(value)
        except ValueError:
            raise InvalidKeyValueError(column.name, value, _expected(column)) from None
    try:
        return encode_component(column, value)
    except (InvalidKeyError, KeyEncodeError):
        raise InvalidKeyValueError(column.name, value, _expected(column)) from None


def _expected(column: KeyColumn) -> str:
    return _EXPECTED.get(
        KeyType.TIMESTAMP if column.type in TIMESTAMP_KEY_TYPES else column.type, column.type.name
    )


def _resolver(key: Sequence[KeyColumn]) -> Callable[[str], int]:
    exact = {column.name: index for index, column in enumerate(key)}
    folded: dict[str, int] = {}
    for index, column in enumerate(key):
        folded.setdefault(column.name.casefold(), index)

    def resolve(name: str) -> int:
        index = exact.get(name)
        if index is None:
            index = folded.get(name.casefold())
        if index is None:
            raise UnsupportedQueryError(
                f"WHERE on non-key column {name!r} is not supported (key columns: {_names(key)})"
            )
        return index

    return resolve


def _names(key: Sequence[KeyColumn]) -> str:
    return ", ".join(column.name for column in key)

"""Reading a hotstate table into Spark: its schema, key filters as a WHERE, each partition in pages.

One Spark partition per hotstate partition. A task reads its partition through the HTTP API (`/v1/query`
with `partitions=[p]`), a page at a time: `SELECT * ... LIMIT page`, then the same with `after` = the
answer's cursor until an answer has none. Any server answers (it routes the partition to the freshest
live replica within `max_lag`), so a server that dies mid-read costs a retry on another, not the read.

The table's key columns and their types come from the cluster, and so do its value columns' when the
table's writer declared them (materialize() and the write format do: the DataFrame's schema). A table
written otherwise (TableWriter, the HTTP API) has none declared, so without a user schema they are
inferred from a sample of rows as JSON shows them: a value column of timestamps, bytes or decimals then
reads as strings unless `.schema(...)` says otherwise. Either way each JSON value is turned back into its
column's type (ISO-8601 text, base64, decimal text).
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import functools
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from pyspark.sql.datasource import (
    DataSourceReader,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    InputPartition,
    LessThan,
    LessThanOrEqual,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DecimalType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    ShortType,
    StringType,
    StructField,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from hotstate.client.query import Client, ClusterUnreachable, QueryFailed, QueryResult, Unavailable
from hotstate.controller.records import KeyType, key_type_named
from hotstate.query.tokens import TokenError, decode

__all__ = [
    "ReadSettings",
    "TableReader",
    "TableShape",
    "infer_schema",
    "key_where",
    "table_shape",
]

# Rows whose JSON values give the value columns' types when the reader is given no schema.
SAMPLE_ROWS = 1000
# Between two attempts at a page when no server could serve it (a server just died, a replica took over).
RETRY_PAUSE_S = 0.2

# The table's key types as Spark types.
_KEY_TYPES: dict[KeyType, DataType] = {
    KeyType.STRING: StringType(),
    KeyType.INT: LongType(),
    KeyType.FLOAT: DoubleType(),
    KeyType.BOOL: BooleanType(),
    KeyType.BYTES: BinaryType(),
    KeyType.TIMESTAMP: TimestampType(),
}
_INTEGRAL = (LongType, IntegerType, ShortType, ByteType)


@dataclass(frozen=True, slots=True)
class ReadSettings:
    servers: tuple[str, ...]
    table: str
    max_lag: int | None
    standby_reads: bool
    page_size: int
    timeout_s: float


@dataclass(frozen=True, slots=True)
class TableShape:
    """What the cluster says about a table: its exact name, partition count and key columns."""

    name: str
    partitions: int
    key_columns: tuple[tuple[str, KeyType | None], ...]  # None: a type this client does not know
    # Spark's names for the value columns' types, as the table's writer declared them (): none did).
    value_columns: tuple[tuple[str, str], ...] = ()
    # The table's generation (its id, which an overwrite changes) when the read was planned; None: the
    # server does not say.
    generation: int | None = None
    # A windowed table's window struct column (its key's last two columns, WINDOWSTART and WINDOWEND, are
    # read back as that struct, as the writer's DataFrame had it); None: not windowed.
    window: str | None = None

    @property
    def plain_keys(self) -> tuple[tuple[str, KeyType | None], ...]:
        """The key columns a Spark row shows as they are (a window's bounds are its struct)."""
        return self.key_columns[:-2] if self.window is not None else self.key_columns


_WINDOW_TYPE = "struct<start:timestamp,end:timestamp>"


class HotstateReadError(Exception):
    """A table that does not exist, a cluster that cannot be reached, a value that does not fit the schema."""


def table_shape(settings: ReadSettings) -> TableShape:
    """The table as the cluster describes it; a clear error for an unknown table or an unreachable cluster."""
    with Client(list(settings.servers), timeout_s=settings.timeout_s) as client:
        tables = _call(settings, lambda: client.tables())
    found = [t for t in tables if t.get("name") == settings.table]
    if not found:
        found = [t for t in tables if str(t.get("name", "")).casefold() == settings.table.casefold()]
    if len(found) != 1:
        names = ", ".join(sorted(str(t.get("name")) for t in tables)) or "none"
        raise HotstateReadError(f"hotstate table {settings.table!r} does not exist (tables: {names})")
    [table] = found
    keys = tuple((str(c["name"]), key_type_named(str(c["type"]))) for c in table["key_columns"])
    values = tuple((str(c["name"]), str(c["type"])) for c in table.get("value_columns", ()))
    generation = table.get("generation")
    window = table.get("window")
    return TableShape(
        str(table["name"]),
        int(table["partitions"]),
        keys,
        values,
        generation if isinstance(generation, int) else None,
        None if not window else str(window["column"]),
    )


def infer_schema(settings: ReadSettings, shape: TableShape) -> StructType | str:
    """The key columns with their types, then the value columns: as the table's writer declared them
    (a DDL string: Spark parses their type names itself, as this Python worker has no JVM to ask), else
    as a sample of rows shows them."""
    if shape.value_columns:
        return declared_schema(shape)
    with Client(list(settings.servers), timeout_s=settings.timeout_s) as client:
        sample = _call(
            settings, lambda: client.query(_select(shape.name, "", SAMPLE_ROWS), **_query_args(settings))
        )
    fields = [
        StructField(name, StringType() if kind is None else _KEY_TYPES[kind], False)
        for name, kind in shape.plain_keys
    ]
    if shape.window is not None:
        fields.append(StructField(shape.window, _window_struct(), False))
    keys = {name.casefold() for name, _ in shape.key_columns}
    for index, column in enumerate(sample.columns):
        if column.casefold() not in keys:
            kind = merged(row[index] for row in sample.rows)
            fields.append(StructField(column, StringType() if kind is None else kind, True))
    return StructType(fields)


def declared_schema(shape: TableShape) -> str:
    """The table's schema in Spark's DDL: key columns NOT NULL, then the declared value columns."""
    keys = [
        f"{_quoted(name)} {'string' if kind is None else _KEY_TYPES[kind].simpleString()} NOT NULL"
        for name, kind in shape.plain_keys
    ]
    if shape.window is not None:
        keys.append(f"{_quoted(shape.window)} {_WINDOW_TYPE} NOT NULL")
    return ", ".join(keys + [f"{_quoted(name)} {type_name}" for name, type_name in shape.value_columns])


def _window_struct() -> StructType:
    return StructType(
        [StructField("start", TimestampType(), True), StructField("end", TimestampType(), True)]
    )


def _quoted(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


def merged(values: Iterable[object]) -> DataType | None:
    """The Spark type that holds every JSON value given (None: all null)."""
    found: DataType | None = None
    for value in values:
        kind = _json_type(value)
        if kind is not None:
            found = kind if found is None else _wider(found, kind)
    return found


def _json_type(value: object) -> DataType | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return BooleanType()
    if isinstance(value, int):
        return LongType()
    if isinstance(value, float):
        return DoubleType()
    if isinstance(value, list):
        element = merged(value)
        return ArrayType(StringType() if element is None else element, True)
    if isinstance(value, dict):
        inner = merged(value.values())
        return MapType(StringType(), StringType() if inner is None else inner, True)
    return StringType()


def _wider(a: DataType, b: DataType) -> DataType:
    if a == b:
        return a
    numbers = (LongType(), DoubleType())
    if a in numbers and b in numbers:
        return DoubleType()
    # NaN and the infinities travel as strings in a column of numbers.
    if (a == DoubleType() and b == StringType()) or (b == DoubleType() and a == StringType()):
        return StringType()
    if isinstance(a, ArrayType) and isinstance(b, ArrayType):
        return ArrayType(_wider(a.elementType, b.elementType), True)
    if isinstance(a, MapType) and isinstance(b, MapType):
        return MapType(StringType(), _wider(a.valueType, b.valueType), True)
    return StringType()


# --------------------------------------------------------------------------------------- filter pushdown


def key_where(
    filters: Sequence[Filter], key_columns: Sequence[tuple[str, KeyType | None]], schema: StructType
) -> tuple[str, list[Filter]]:
    """The WHERE clause for the filters the planner can read exactly, and the filters left to Spark.

    The server finds rows by equality on the leading key columns and a range on the next one (query/plan.py),
    so that is what is pushed: = and IN on key columns from the first on, then <, <=, >, >= on the first key
    column without equality. Only STRING, BIGINT and BOOLEAN keys whose Spark type matches are pushed (their
    order and equality are Spark's); everything else is left to Spark, which filters the rows read."""
    types = {field.name: field.dataType for field in schema.fields}
    usable: dict[str, list[Filter]] = {}
    for item in filters:
        column = _column(item)
        if column is not None:
            usable.setdefault(column, []).append(item)
    pushed: list[Filter] = []
    conditions: list[str] = []
    for name, kind in key_columns:
        spark_type = types.get(name)
        if spark_type is None or not _pushable(kind, spark_type) or "`" in name:
            break
        mine = [f for f in usable.get(name, []) if _fits(f, kind)]
        equal = [f for f in mine if isinstance(f, EqualTo | In)]
        if equal:
            pushed += equal
            conditions += [_condition(f, name) for f in equal]
            continue
        ranges = [f for f in mine if isinstance(f, _RANGES)]
        pushed += ranges
        conditions += [_condition(f, name) for f in ranges]
        break
    left = [f for f in filters if not any(f is p for p in pushed)]
    return (" WHERE " + " AND ".join(conditions) if conditions else ""), left


_RANGES = (GreaterThan, GreaterThanOrEqual, LessThan, LessThanOrEqual)


def _column(item: Filter) -> str | None:
    """The top-level column an =, IN or range filter compares (None: another kind of filter)."""
    attribute = getattr(item, "attribute", None)
    if isinstance(item, (EqualTo, In, *_RANGES)) and isinstance(attribute, tuple) and len(attribute) == 1:
        return str(attribute[0])
    return None


def _pushable(kind: KeyType | None, spark_type: DataType) -> bool:
    if kind is KeyType.STRING:
        return type(spark_type) is StringType
    if kind is KeyType.INT:
        return isinstance(spark_type, _INTEGRAL)
    return kind is KeyType.BOOL and isinstance(spark_type, BooleanType)


def _fits(item: Filter, kind: KeyType | None) -> bool:
    values = item.value if isinstance(item, In) else (item.value,)  # type: ignore[attr-defined]
    if not values:
        return False
    if kind is KeyType.STRING:
        return all(type(v) is str for v in values)
    if kind is KeyType.INT:
        return all(type(v) is int for v in values)
    return all(type(v) is bool for v in values)


def _condition(item: Filter, name: str) -> str:
    column = f"`{name}`"
    if isinstance(item, In):
        return f"{column} IN ({', '.join(_literal(v) for v in item.value)})"
    op = {EqualTo: "=", GreaterThan: ">", GreaterThanOrEqual: ">=", LessThan: "<", LessThanOrEqual: "<="}
    return f"{column} {op[type(item)]} {_literal(item.value)}"  # type: ignore[attr-defined]


def _literal(value: object) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int):
        return str(value)
    return "'" + str(value).replace("'", "''") + "'"


def _select(table: str, where: str, limit: int) -> str:
    return f"SELECT * FROM `{table}`{where} LIMIT {limit}"


# ------------------------------------------------------------------------------------------ the reader


class PartitionSplit(InputPartition):
    """One hotstate partition, read by one Spark task."""

    def __init__(self, partition: int) -> None:
        super().__init__(partition)
        self.partition = partition


class TableReader(DataSourceReader):
    """Reads every partition of the table; the Spark schema decides how JSON values become Spark values."""

    def __init__(self, settings: ReadSettings, schema: StructType) -> None:
        self.settings = settings
        self.schema = schema
        self.where = ""
        self._shape: TableShape | None = None

    def shape(self) -> TableShape:
        if self._shape is None:
            self._shape = table_shape(self.settings)
        return self._shape

    def partitions(self) -> Sequence[InputPartition]:
        return [PartitionSplit(p) for p in range(self.shape().partitions)]

    def read(self, partition: InputPartition) -> Iterator[tuple[Any, ...]]:
        assert isinstance(partition, PartitionSplit)
        settings = self.settings
        window = self.shape().window
        converters = [
            converter(f.dataType, f.name, settings.table)
            if f.name != window
            else converter(TimestampType(), f.name, settings.table)
            for f in self.schema.fields
        ]
        sql = _select(self.shape().name, self.where, settings.page_size)
        args = {"partitions": [partition.partition], **_query_args(settings)}
        after: str | None = None
        with Client(list(settings.servers), timeout_s=settings.timeout_s) as client:
            while True:
                page = _call(settings, functools.partial(client.query, sql, after=after, **args))
                same_generation(self.shape(), page.consistency_token)
                yield from _project(page, self.schema, converters, window)
                if page.cursor is None:
                    return
                after = page.cursor


class PushingTableReader(TableReader):
    """`TableReader` with key filters pushed to the cluster (spark.sql.python.filterPushdown.enabled)."""

    def pushFilters(self, filters: list[Filter]) -> Iterable[Filter]:
        where, left = key_where(filters, self.shape().key_columns, self.schema)
        self.where = where
        return left


def same_generation(shape: TableShape, token: str) -> None:
    """A read's pages come from the generation of the table it was planned against (each page is a query,
    which reads one generation): HotstateReadError when an overwrite swapped in another meanwhile, rather
    than a DataFrame of rows from both."""
    if shape.generation is None or not token:
        return
    try:
        read = {table_id for table_id, _ in decode(token, None)}
    except TokenError:
        return
    if read - {shape.generation}:
        raise HotstateReadError(
            f"hotstate table {shape.name!r} was overwritten while it was read (generation "
            f"{shape.generation}, now {', '.join(map(str, sorted(read)))}): read it again"
        )


def _query_args(settings: ReadSettings) -> dict[str, Any]:
    return {"max_lag": settings.max_lag, "standby_reads": settings.standby_reads}


def _call(settings: ReadSettings, request: Callable[[], Any]) -> Any:
    """`request`, asked again while no server can serve it, until the read's timeout: a server killed
    mid-read is noticed by the others within a heartbeat or two, and a replica takes its partitions."""
    deadline = time.monotonic() + settings.timeout_s
    while True:
        try:
            return request()
        except (Unavailable, ClusterUnreachable) as error:
            if time.monotonic() + RETRY_PAUSE_S >= deadline:
                raise HotstateReadError(_unavailable(settings, error)) from None
            time.sleep(RETRY_PAUSE_S)
        except QueryFailed as error:
            if error.status == 404:
                raise HotstateReadError(f"hotstate table {settings.table!r}: {error.message}") from None
            raise HotstateReadError(f"hotstate table {settings.table!r}: {error}") from None


def _unavailable(settings: ReadSettings, error: Exception) -> str:
    if isinstance(error, ClusterUnreachable):
        return (
            f"cannot reach the hotstate cluster at {', '.join(settings.servers)} (option 'servers': the "
            f"servers' HTTP addresses) within {settings.timeout_s:g} s: {error}"
        )
    return f"hotstate table {settings.table!r} could not be read within {settings.timeout_s:g} s: {error}"


def _project(
    page: QueryResult,
    schema: StructType,
    converters: list[Callable[[object], object]],
    window: str | None = None,
) -> Iterator[tuple[Any, ...]]:
    exact = {name: index for index, name in enumerate(page.columns)}
    folded: dict[str, int] = {}
    for index, name in enumerate(page.columns):
        folded.setdefault(name.casefold(), index)
    indexes = [exact.get(f.name, folded.get(f.name.casefold())) for f in schema.fields]
    if window is None or window not in schema.names:
        plan = list(zip(indexes, converters, strict=True))
        for row in page.rows:
            yield tuple(None if index is None else convert(row[index]) for index, convert in plan)
        return
    # The window struct is built from the answer's WINDOWSTART and WINDOWEND columns.
    at = schema.names.index(window)
    bounds = (folded.get("windowstart"), folded.get("windowend"))
    for row in page.rows:
        values = [
            None if i is None else convert(row[i]) for i, convert in zip(indexes, converters, strict=True)
        ]
        values[at] = tuple(None if i is None else converters[at](row[i]) for i in bounds)
        yield tuple(values)


# ------------------------------------------------------------------------------- JSON values to Spark


def converter(kind: DataType, column: str, table: str) -> Callable[[object], object]:
    """JSON value (as /v1/query writes it) -> the Python value PySpark takes for `kind`."""
    inner = _plain_converter(kind, column, table)

    def convert(value: object) -> object:
        if value is None:
            return None
        try:
            return inner(value)
        except (TypeError, ValueError, LookupError, ArithmeticError) as error:
            shown = orjson.dumps(value).decode()[:100]
            raise HotstateReadError(
                f"hotstate table {table!r}, column {column!r}: {shown} does not fit "
                f"{kind.simpleString()} ({error})"
            ) from None

    return convert


def _plain_converter(kind: DataType, column: str, table: str) -> Callable[[Any], object]:
    if isinstance(kind, StringType):
        return lambda v: v if isinstance(v, str) else orjson.dumps(v).decode()
    if isinstance(kind, BooleanType):
        return _exactly(bool)
    if isinstance(kind, _INTEGRAL):
        return _exactly(int)
    if isinstance(kind, DoubleType | FloatType):
        return _float
    if isinstance(kind, BinaryType):
        return lambda v: base64.b64decode(_exactly(str)(v), validate=True)
    if isinstance(kind, TimestampType):
        return _instant
    if isinstance(kind, TimestampNTZType):
        return _local_time
    if isinstance(kind, DateType):
        return lambda v: dt.date.fromisoformat(_exactly(str)(v)[:10])
    if isinstance(kind, DecimalType):
        return lambda v: decimal.Decimal(str(v))
    if isinstance(kind, ArrayType):
        element = converter(kind.elementType, column, table)
        return lambda v: [element(e) for e in _exactly(list)(v)]
    if isinstance(kind, MapType):
        key = converter(kind.keyType, column, table)
        value = converter(kind.valueType, column, table)
        return lambda v: {key(k): value(x) for k, x in _exactly(dict)(v).items()}
    if isinstance(kind, StructType):
        fields = [(f.name, converter(f.dataType, f"{column}.{f.name}", table)) for f in kind.fields]
        return lambda v: tuple(convert(_exactly(dict)(v).get(name)) for name, convert in fields)
    return lambda v: v


def _exactly(kind: type) -> Callable[[object], Any]:
    def check(value: object) -> object:
        if type(value) is not kind:
            raise TypeError(f"a {type(value).__name__}, not {kind.__name__}")
        return value

    return check


_NON_FINITE = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


def _float(value: object) -> float:
    if isinstance(value, str):
        return _NON_FINITE[value]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"a {type(value).__name__}, not a number")
    return float(value)


def _instant(value: object) -> dt.datetime:
    parsed = dt.datetime.fromisoformat(_exactly(str)(value))
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=dt.UTC)


def _local_time(value: object) -> dt.datetime:
    parsed = dt.datetime.fromisoformat(_exactly(str)(value))
    return parsed if parsed.tzinfo is None else parsed.astimezone(dt.UTC).replace(tzinfo=None)

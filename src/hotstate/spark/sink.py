"""The foreachBatch sink: every Spark task writes its own rows to the cluster, from the executor.

The batch function runs on the driver and only starts one job over the whole batch (Spark 4 checks that
a foreachBatch consumed its input before it commits the state store), which returns once every task has
succeeded. Each task sends its rows to the hotstate partitions' actives and returns when every partition
has acked (acks=all), the writer retrying NOT_LEADER, FENCED_EPOCH and connection errors with fresh
metadata until the write deadline. So Spark commits a batch only after the cluster holds all of it. A row
that cannot be encoded fails its task, and with it the batch, before anything of that task's rows is sent.

Two ways in, chosen on the driver from the batch's schema:
- flat columns of the common types (strings, bytes, numbers, booleans, timestamps, dates): `mapInArrow`.
  The task gets its rows as Arrow record batches and encodes them a column at a time (`arrow_rows`):
  rows, keys and partitions in bulk, then `TableWriter.upsert_encoded`. Against the Row path this saves
  Spark's pickling of every row and a Python object per value (measured: bench/spark_sink.py).
- anything else (structs, arrays, maps, decimals): `foreachPartition`, each row turned into a dict and
  written with `TableWriter.upsert`. PySpark hands every TIMESTAMP, top-level or nested, to Python as naive
  local time; the dict has each as an aware UTC datetime (`as_dict`), the instant the Arrow path writes.
  An Arrow batch that cannot take the bulk encoding (a null or NaN key) is written this way too, so its
  error names the row and the column just as the Row path's does.

Deletes: with a delete marker (`materialize(delete_column=...)` / `delete_when`, the write format's
`deleteColumn` / `deleteValue`; `DeleteMarker`, checked on the driver by `delete_marker`), a marked row
deletes its key: on the Arrow path its entry becomes a tombstone of the key computed a column at a time
(`arrow_rows.encode_arrow_batch(deletes=...)`), on the Row path a `Delete` in `TableWriter.write`; the
marker column is never stored. In complete mode (`SinkConfig.complete`, the write format only) the commit
deletes the table's keys the batch did not write (`delete_absent`).

Racks: on a cluster each executor may run on another rack. A task writes with its executor's rack (env
HOTSTATE_RACK where the executor runs, which a Spark standalone worker passes to the executors it
launches; else the driver's rack) and returns it with its token; the driver registers each rack it has
not registered yet with the table's writer racks before it commits the batch, so the assignor places
actives near every rack the job writes from, not only near the driver's.

Only `SinkConfig` (plain, picklable values) travels to the executors. Each Python worker keeps one event
loop and one writer per config, so the table metadata and connections outlive a task (Spark reuses its
Python workers); any failure throws both away, so nothing of a failed write keeps running in the
background of a later task.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime as dt
import functools
import logging
import os
import re
import ssl
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias, TypeVar

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, Row
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DateType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    MapType,
    NullType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from hotstate.client.admin import AdminClient
from hotstate.client.writer import Delete, TableWriter, WriteError, WriteResult
from hotstate.controller.requests import ControllerError
from hotstate.protocol.keys import encode_key, key_from_row
from hotstate.protocol.rows import encode_tombstone
from hotstate.query.tokens import cluster_tag, decode, merge
from hotstate.spark.arrow_rows import NotEncodable, encode_arrow_batch
from hotstate.spark.windows import WINDOW_END, WINDOW_START
from hotstate.tls import PemTexts

__all__ = [
    "ENV_RACK",
    "AfterWrite",
    "BatchWriteError",
    "DeleteColumnError",
    "DeleteMarker",
    "SinkConfig",
    "batch_function",
    "commit_batch",
    "config_for_schema",
    "delete_absent",
    "delete_marker",
    "executor_rack",
    "split_marker",
    "upsert_arrow",
    "upsert_rows",
    "without_column",
    "write_arrow",
    "write_rows",
]

# Called on the executor after a task's rows are acked: (batch id, Spark partition id, rows written).
# A test hook (slow or failing sinks); None in production.
AfterWrite = Callable[[int, int, int], None]


_T = TypeVar("_T")

log = logging.getLogger(__name__)

ENV_RACK = "HOTSTATE_RACK"

# What a task that had no rows wrote.
NOTHING = WriteResult(0, 0, 0, "")

_WRITE_ERROR = re.compile(r"^hotstate\.client\.writer\.WriteError: (.*)$", re.MULTILINE)


class BatchWriteError(Exception):
    """A batch not written: a row that cannot be encoded, or a partition not acked within the deadline.
    The message names the table, the batch and, for a bad row, the column and the value."""


@dataclass(frozen=True, slots=True)
class DeleteMarker:
    """Which rows of a batch are deletes: those whose `column` equals `value` (True for a boolean delete
    column such as `_deleted`; "d" for a CDC `op` column). A null is no delete."""

    column: str
    value: bool | int | str = True


class DeleteColumnError(ValueError):
    """A delete column the sink cannot use (missing, a key column, or of a type its value cannot be)."""


# Spark types a delete marker's value may be compared with, by the value's Python type.
_MARKER_TYPES: dict[type, tuple[type[DataType], ...]] = {
    bool: (BooleanType,),
    int: (ByteType, ShortType, IntegerType, LongType),
    str: (StringType,),
}


def delete_marker(
    schema: StructType,
    key: str | Sequence[str],
    delete_column: str | None = None,
    delete_when: tuple[str, object] | None = None,
) -> DeleteMarker | None:
    """The sink's delete marker for `delete_column` (a boolean column: true deletes) or `delete_when`
    ((column, value): rows whose column equals value delete), checked against the DataFrame's schema on
    the driver, before the table is created or anything written: DeleteColumnError naming the column and
    its type."""
    if delete_column is not None and delete_when is not None:
        raise DeleteColumnError("give delete_column or delete_when, not both")
    if delete_column is None and delete_when is None:
        return None
    column: object = delete_column
    value: object = True
    if delete_when is not None:
        if not (isinstance(delete_when, tuple | list) and len(delete_when) == 2):
            raise DeleteColumnError(f"delete_when: a (column, value) pair, got {delete_when!r}")
        column, value = delete_when[0], delete_when[1]
    if not isinstance(column, str) or not column:
        raise DeleteColumnError(f"the delete column must be a column name, got {column!r}")
    if not isinstance(value, bool | int | str) or type(value) not in _MARKER_TYPES:
        raise DeleteColumnError(
            f"delete_when: the value marking a delete must be a bool, int or str, got {value!r}"
        )
    fields = {f.name: f for f in schema.fields}
    found = fields.get(column)
    if found is None:
        raise DeleteColumnError(
            f"delete column {column!r} is not a column of the DataFrame (columns: {', '.join(fields)})"
        )
    keys = {key} if isinstance(key, str) else set(key)
    if column in keys:
        raise DeleteColumnError(f"delete column {column!r} is a key column: name another column")
    wanted = _MARKER_TYPES[type(value)]
    if not isinstance(found.dataType, wanted):
        kinds = " or ".join(t.typeName() for t in wanted)
        raise DeleteColumnError(
            f"delete column {column!r} has type {found.dataType.simpleString()}: it must be {kinds} "
            f"(rows whose {column!r} is {value!r} are deleted)"
        )
    return DeleteMarker(column, value)


def without_column(schema: StructType, marker: DeleteMarker | None) -> StructType:
    """The schema of what the sink stores: the delete column left out."""
    if marker is None:
        return schema
    return StructType([f for f in schema.fields if f.name != marker.column])


# Where TimestampType values sit inside a column's type: "instant" is one; ("array", element),
# ("map", key or None, value or None) and ("struct", ((field, shape), ...)) hold some below. Plain tuples:
# SinkConfig travels to the executors and keys each worker's writers, so it is hashable.
InstantShape: TypeAlias = (
    Literal["instant"]
    | tuple[Literal["array"], "InstantShape"]
    | tuple[Literal["map"], "InstantShape | None", "InstantShape | None"]
    | tuple[Literal["struct"], tuple[tuple[str, "InstantShape"], ...]]
)


def instant_shape(kind: DataType) -> InstantShape | None:
    """Where `kind` holds TimestampType values, None where it holds none (TimestampNTZType is wall time)."""
    if isinstance(kind, TimestampType):
        return "instant"
    if isinstance(kind, ArrayType):
        element = instant_shape(kind.elementType)
        return None if element is None else ("array", element)
    if isinstance(kind, MapType):
        key, value = instant_shape(kind.keyType), instant_shape(kind.valueType)
        return None if key is None and value is None else ("map", key, value)
    if isinstance(kind, StructType):
        fields = tuple(
            (f.name, shape) for f in kind.fields if (shape := instant_shape(f.dataType)) is not None
        )
        return ("struct", fields) if fields else None
    return None


def as_instants(value: object, shape: InstantShape) -> object:
    """`value` (as `Row.asDict(recursive=True)` gives it: structs as dicts) with every naive datetime
    where `shape` has an instant read as local time and made an aware UTC datetime."""
    if value is None:
        return None
    if shape == "instant":
        if isinstance(value, dt.datetime) and value.tzinfo is None:
            return value.astimezone(dt.UTC)  # a naive datetime's astimezone reads it as local time
        return value
    if shape[0] == "array":
        element = shape[1]
        return [as_instants(v, element) for v in value] if isinstance(value, list) else value
    if shape[0] == "map":
        key, inner = shape[1], shape[2]
        if not isinstance(value, dict):
            return value
        return {
            (k if key is None else as_instants(k, key)): (v if inner is None else as_instants(v, inner))
            for k, v in value.items()
        }
    if not isinstance(value, dict):
        return value
    out = dict(value)
    for name, field_shape in shape[1]:
        if name in out:
            out[name] = as_instants(out[name], field_shape)
    return out


@dataclass(frozen=True, slots=True)
class SinkConfig:
    servers: tuple[tuple[str, int], ...]
    table: str
    cluster_id: str
    secret: str = field(repr=False)
    rack: str | None
    deadline_s: float
    columns: tuple[str, ...]
    # Top-level TimestampType columns: Spark hands them to Python as naive local time; they are written
    # as aware UTC datetimes so the key encodes the right instant whatever the executor's time zone.
    instant_columns: tuple[str, ...]
    # True when some column holds structs, arrays or maps (rows need the recursive conversion).
    nested: bool
    # The columns with TimestampType values inside structs, arrays or maps, and where: PySpark hands those
    # to Python as naive local time too, and they are written as the same UTC instants as top-level ones.
    nested_instants: tuple[tuple[str, InstantShape], ...] = ()
    # True when every column has a type arrow_rows encodes: the batch goes through mapInArrow.
    arrow: bool = False
    # The CA certificate, and a client certificate and key where the servers require one, as PEM text
    # (executors need not have the driver's files) when the servers' RPC port uses TLS.
    tls: PemTexts = field(default_factory=PemTexts, repr=False)
    # Rows whose `deletes.column` equals `deletes.value` delete their key; the column is never stored.
    deletes: DeleteMarker | None = None
    # Spark's complete output mode: the batch is the whole result table, so every key of the table absent
    # from it is deleted at the batch's commit (`delete_absent`). Tasks then return the keys they wrote.
    complete: bool = False
    # A windowed table's window struct column (spark.windows): each row's struct is stored as its bounds,
    # key columns WINDOWSTART and WINDOWEND.
    window: str | None = None


# Spark types whose Arrow columns arrow_rows encodes (the same bytes as the Row path's dicts).
_ARROW_TYPES = (
    StringType,
    BinaryType,
    ByteType,
    ShortType,
    IntegerType,
    LongType,
    FloatType,
    DoubleType,
    BooleanType,
    TimestampType,
    TimestampNTZType,
    DateType,
    NullType,
)


def _arrow_type(kind: DataType) -> bool:
    # Exact types: CharType and VarcharType subclass StringType and take the Row path.
    return type(kind) in _ARROW_TYPES


def config_for_schema(
    schema: StructType,
    *,
    servers: tuple[tuple[str, int], ...],
    table: str,
    cluster_id: str,
    secret: str,
    rack: str | None,
    deadline_s: float,
    tls: PemTexts | None = None,
    deletes: DeleteMarker | None = None,
    complete: bool = False,
    window: str | None = None,
) -> SinkConfig:
    complex_types = (StructType, ArrayType, MapType)
    flat = [f for f in schema.fields if f.name != window]
    return SinkConfig(
        window=window,
        deletes=deletes,
        complete=complete,
        tls=tls or PemTexts(),
        servers=servers,
        table=table,
        cluster_id=cluster_id,
        secret=secret,
        rack=rack,
        deadline_s=deadline_s,
        columns=tuple(f.name for f in schema.fields),
        instant_columns=tuple(f.name for f in schema.fields if isinstance(f.dataType, TimestampType)),
        nested=any(isinstance(f.dataType, complex_types) for f in flat),
        nested_instants=tuple(
            (f.name, shape)
            for f in flat
            if isinstance(f.dataType, complex_types) and (shape := instant_shape(f.dataType)) is not None
        ),
        arrow=all(_arrow_type(f.dataType) for f in flat),
    )


def batch_function(
    config: SinkConfig, after_write: AfterWrite | None = None
) -> Callable[[DataFrame, int], None]:
    """The foreachBatch function: returns once every task of the batch has written and been acked."""

    def write_batch(batch_df: DataFrame, batch_id: int) -> None:
        try:
            if config.arrow:
                task = functools.partial(_write_arrow_task, config, batch_id, after_write)
                rows = batch_df.mapInArrow(task, "token string, rack string").collect()
                tasks = [(row["token"], row["rack"]) for row in rows]
            else:
                row_task = functools.partial(_write_task, config, batch_id, after_write)
                tasks = batch_df.rdd.mapPartitions(row_task).collect()
        except Exception as error:
            # Spark wraps the executor's WriteError in pages of JVM and worker traceback: raise its text.
            found = _WRITE_ERROR.findall(str(error))
            if not found:
                raise
            raise BatchWriteError(found[-1].strip()) from None
        commit_batch(config, batch_id, [token for token, _ in tasks], [rack for _, rack in tasks if rack])

    return write_batch


def executor_rack(config: SinkConfig) -> str | None:
    """The rack this process writes from: env HOTSTATE_RACK here (on a cluster, the executor's machine),
    else the driver's (`config.rack`: spark.hotstate.rack / HOTSTATE_RACK on the driver)."""
    return os.environ.get(ENV_RACK, "").strip() or config.rack


# The writer racks this driver registered: (servers, cluster id, table, rack). A rack is registered once
# per driver process, not once per batch (each registration is a controller request).
_registered: set[tuple[tuple[tuple[str, int], ...], str, str, str]] = set()


def commit_batch(config: SinkConfig, batch_id: int, tokens: Sequence[str], racks: Iterable[str] = ()) -> None:
    """On the driver, once every task of the batch was acked: register the executors' `racks` not
    registered yet with the table's writer racks (the driver's own rack was, by ensure_table), then record
    the batch in the cluster with every partition's position (the tasks' consistency tokens merged), so a
    query can ask for `min_batch`."""
    tag = cluster_tag(config.cluster_id)
    positions = merge(*(decode(token, tag) for token in tokens if token))
    table_ids = {table_id for table_id, _ in positions}
    if len(table_ids) > 1:
        raise BatchWriteError(f"hotstate sink, table {config.table}, batch {batch_id}: the table changed ids")
    table_id = table_ids.pop() if table_ids else -1
    pairs = tuple(sorted((partition, at) for (_, partition), at in positions.items()))
    where = (config.servers, config.cluster_id, config.table)
    new_racks = sorted({rack for rack in racks if rack != config.rack and (*where, rack) not in _registered})

    async def commit() -> None:
        async with AdminClient(
            config.servers, cluster_id=config.cluster_id, secret=config.secret, tls=rpc_tls(config)
        ) as admin:
            for rack in new_racks:
                await _register_rack(admin, config, rack)
            reply = await admin.commit_batch(config.table, table_id, batch_id, pairs)
        if reply.error is not ControllerError.NONE:
            raise BatchWriteError(
                f"hotstate sink, table {config.table}, batch {batch_id} written but not recorded: "
                f"{reply.error.name}: {reply.message}"
            )

    asyncio.run(commit())


def delete_absent(config: SinkConfig, batch_id: int, present: Iterable[bytes], tokens: Sequence[str]) -> str:
    """Complete mode, on the driver, once every task of the batch was acked: delete every key the table holds
    that the batch (the whole result table) did not write; the consistency token of the deletes ("" when
    there were none).

    `present`: the encoded keys the tasks wrote (or deleted); `tokens`: theirs. Each partition is read
    from its active's store once that store holds this batch's writes (`TableWriter.partition_keys`), so
    a key is kept exactly when the batch wrote it. Cost: a read of every key of the table per batch, and
    the batch's keys held on the driver: the size of what complete mode writes each batch anyway. Run
    again with the batch when Spark re-runs it (deletes are idempotent)."""
    written = set(present)
    tag = cluster_tag(config.cluster_id)
    positions = merge(*(decode(token, tag) for token in tokens if token))

    async def run() -> str:
        async with TableWriter(
            list(config.servers),
            config.table,
            cluster_id=config.cluster_id,
            secret=config.secret,
            tls=rpc_tls(config),
        ) as writer:
            meta = await writer.metadata(deadline_s=config.deadline_s)
            held = await asyncio.gather(
                *(
                    writer.partition_keys(
                        partition,
                        at_least=positions.get((meta.table_id, partition), 0),
                        deadline_s=config.deadline_s,
                    )
                    for partition in range(len(meta.partitions))
                )
            )
            absent = {
                partition: [encode_tombstone(key) for key in keys if key not in written]
                for partition, keys in enumerate(held)
            }
            absent = {partition: tombstones for partition, tombstones in absent.items() if tombstones}
            if not absent:
                return ""
            result = await writer.upsert_encoded(absent, deadline_s=config.deadline_s)
            log.info(
                "table %r, batch %d (complete mode): deleted %d keys absent from the result",
                config.table,
                batch_id,
                result.rows,
            )
            return result.consistency_token

    try:
        return asyncio.run(run())
    except WriteError as error:
        raise BatchWriteError(
            f"hotstate sink, table {config.table}, batch {batch_id}: the keys absent from the complete "
            f"result were not deleted: {error}"
        ) from None


async def _register_rack(admin: AdminClient, config: SinkConfig, rack: str) -> None:
    """The rack only steers placement: a batch whose executors' rack cannot be registered still commits
    (and the next batch tries again)."""
    try:
        reply = await admin.register_writer(config.table, rack)
    except Exception as error:
        log.warning("table %r: executors' rack %r not registered: %s", config.table, rack, error)
        return
    if reply.error is not ControllerError.NONE:
        log.warning(
            "table %r: executors' rack %r not registered: %s: %s",
            config.table,
            rack,
            reply.error.name,
            reply.message,
        )
        return
    _registered.add((config.servers, config.cluster_id, config.table, rack))


def _write_task(
    config: SinkConfig, batch_id: int, after_write: AfterWrite | None, rows: Iterator[Row]
) -> Iterator[tuple[str, str | None]]:
    """One Spark task, on the executor: yields the consistency token of what it wrote, and its rack."""
    from pyspark import TaskContext

    result = upsert_rows(config, rows, batch_id=batch_id)
    if after_write is not None:
        context = TaskContext.get()
        after_write(batch_id, context.partitionId() if context is not None else -1, result.rows)
    yield result.consistency_token, executor_rack(config)


def _write_arrow_task(
    config: SinkConfig, batch_id: int, after_write: AfterWrite | None, batches: Iterator[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """One Spark task of mapInArrow, on the executor: yields the consistency token of what it wrote, and its
    rack."""
    from pyspark import TaskContext

    result = upsert_arrow(config, list(batches), batch_id=batch_id)
    if after_write is not None:
        context = TaskContext.get()
        after_write(batch_id, context.partitionId() if context is not None else -1, result.rows)
    yield pa.RecordBatch.from_arrays(
        [pa.array([result.consistency_token], pa.string()), pa.array([executor_rack(config)], pa.string())],
        names=["token", "rack"],
    )


def write_arrow(config: SinkConfig, batches: list[pa.RecordBatch], *, batch_id: int = -1) -> int:
    """Upsert the rows of Arrow record batches (columns named as `config.columns`); the number written.

    Every batch is encoded before anything is sent; a batch the bulk encoding refuses sends the whole
    task's rows through `write_rows`, whose error names the bad row."""
    return upsert_arrow(config, batches, batch_id=batch_id).rows


def upsert_arrow(
    config: SinkConfig,
    batches: list[pa.RecordBatch],
    *,
    batch_id: int,
    keys_out: list[bytes] | None = None,
) -> WriteResult:
    """One task's rows as Arrow batches upserted (and, with a delete marker, the marked ones deleted, in
    their place): what it wrote (both entry points, foreachBatch and the data source's stream writer, call
    this on the executor). `keys_out`: extended with the encoded key of every row written or deleted."""
    if not any(batch.num_rows for batch in batches):
        return NOTHING
    try:
        meta = _run(config, lambda writer: writer.metadata())
    except WriteError as error:
        raise _in_batch(config, batch_id, error) from None
    by_partition: dict[int, list[bytes]] = {}
    keys: list[bytes] = []
    try:
        for batch in batches:
            stored, deletes = split_marker(config, window_bounds(config, batch))
            for partition, encoded in encode_arrow_batch(
                stored, meta.key_columns, len(meta.partitions), deletes=deletes, keys_out=keys
            ).items():
                by_partition.setdefault(partition, []).extend(encoded)
    except NotEncodable:
        return upsert_rows(config, _arrow_rows(batches), batch_id=batch_id, keys_out=keys_out)
    if keys_out is not None:
        keys_out.extend(keys)
    try:
        return _run(config, lambda writer: writer.upsert_encoded(by_partition, deadline_s=config.deadline_s))
    except WriteError as error:
        raise _in_batch(config, batch_id, error) from None


def window_bounds(config: SinkConfig, batch: pa.RecordBatch) -> pa.RecordBatch:
    """The batch with its window struct column replaced by the window's bounds (WINDOWSTART, WINDOWEND)."""
    if config.window is None:
        return batch
    window = batch.column(config.window)
    if window.null_count:
        raise NotEncodable(f"window column {config.window!r} holds a null")
    names = [name for name in batch.schema.names if name != config.window]
    columns = [batch.column(name) for name in names]
    start, end = window.field("start"), window.field("end")
    return pa.RecordBatch.from_arrays([*columns, start, end], names=[*names, WINDOW_START, WINDOW_END])


def split_marker(config: SinkConfig, batch: pa.RecordBatch) -> tuple[pa.RecordBatch, pa.Array | None]:
    """The batch without its delete column, and which of its rows are deletes (None: no delete marker)."""
    marker = config.deletes
    if marker is None:
        return batch, None
    column = batch.column(marker.column)
    deletes = pc.fill_null(pc.equal(column, pa.scalar(marker.value, column.type)), False)
    return batch.drop_columns([marker.column]), deletes


def _arrow_rows(batches: list[pa.RecordBatch]) -> Iterator[tuple[object, ...]]:
    """The rows as tuples for `write_rows` (instants as aware datetimes in UTC, which `as_dict` keeps)."""
    for batch in batches:
        columns = []
        for column in batch.columns:
            values = column.to_pylist()
            if pa.types.is_timestamp(column.type) and column.type.tz is not None:
                values = [v if v is None else v.astimezone(dt.UTC) for v in values]
            columns.append(values)
        yield from zip(*columns, strict=True)


def write_rows(config: SinkConfig, rows: Iterable[Row | tuple[object, ...]], *, batch_id: int = -1) -> int:
    """Upsert `rows` (Spark rows in `config.columns` order) into the table; the number written."""
    return upsert_rows(config, rows, batch_id=batch_id).rows


def upsert_rows(
    config: SinkConfig,
    rows: Iterable[Row | tuple[object, ...]],
    *,
    batch_id: int,
    keys_out: list[bytes] | None = None,
) -> WriteResult:
    """One task's rows upserted one by one (nested types), and with a delete marker the marked ones
    deleted in their place: what it wrote. `keys_out`: extended with the encoded key of every row."""
    dicts = [as_dict(config, row) for row in rows]
    if not dicts:
        return NOTHING
    changes: list[dict[str, object] | Delete] = dicts  # type: ignore[assignment]
    marker = config.deletes
    if marker is not None:
        changes = []
        for row in dicts:
            flag = row.pop(marker.column, None)
            # The value's exact type too: a boolean column's True must not match an int column's 1.
            deleted = flag is not None and type(flag) is type(marker.value) and flag == marker.value
            changes.append(Delete(row) if deleted else row)
    try:
        result = _run(config, lambda writer: writer.write(changes, deadline_s=config.deadline_s))
        if keys_out is not None:
            key_columns = _run(config, lambda writer: writer.metadata()).key_columns
            keys_out.extend(encode_key(key_from_row(row, key_columns)) for row in dicts)
        return result
    except WriteError as error:
        raise _in_batch(config, batch_id, error) from None


def _in_batch(config: SinkConfig, batch_id: int, error: WriteError) -> WriteError:
    return WriteError(error.error, f"hotstate sink, table {config.table}, batch {batch_id}: {error}")


def as_dict(config: SinkConfig, row: Row | tuple[object, ...]) -> dict[str, object]:
    if config.nested and isinstance(row, Row):
        out = row.asDict(recursive=True)
    else:
        out = dict(zip(config.columns, row, strict=True))
    for name in config.instant_columns:
        value = out.get(name)
        if isinstance(value, dt.datetime) and value.tzinfo is None:
            out[name] = value.astimezone(dt.UTC)  # a naive datetime's astimezone reads it as local time
    for name, shape in config.nested_instants:
        if name in out:
            out[name] = as_instants(out[name], shape)
    if config.window is not None:
        window = out.pop(config.window, None)
        if window is not None:  # a null window is left for the key check to name
            for bound, name in (("start", WINDOW_START), ("end", WINDOW_END)):
                value = window[bound]
                if isinstance(value, dt.datetime) and value.tzinfo is None:
                    value = value.astimezone(dt.UTC)  # Spark's TimestampType: naive local time
                out[name] = value
    return out


# ---------------------------------------------------------------------------- the worker's writer


@dataclass
class _Worker:
    pid: int
    loop: asyncio.AbstractEventLoop
    writers: dict[SinkConfig, TableWriter]


_worker: _Worker | None = None


def _run(config: SinkConfig, call: Callable[[TableWriter], Awaitable[_T]]) -> _T:
    """`call` with this worker's writer for `config`, on the worker's loop."""
    global _worker
    if _worker is None or _worker.pid != os.getpid():  # none yet, or inherited through a fork
        _worker = _Worker(os.getpid(), asyncio.new_event_loop(), {})
    worker = _worker
    writer = worker.writers.get(config)
    if writer is None:
        writer = worker.writers[config] = _new_writer(config, worker.loop)
    try:
        return worker.loop.run_until_complete(call(writer))
    except BaseException:
        _worker = None
        _discard(worker)
        raise


def _new_writer(config: SinkConfig, loop: asyncio.AbstractEventLoop) -> TableWriter:
    async def build() -> TableWriter:  # created inside the loop it will run on
        return TableWriter(
            list(config.servers),
            config.table,
            cluster_id=config.cluster_id,
            secret=config.secret,
            rack=executor_rack(config),
            tls=rpc_tls(config),
        )

    return loop.run_until_complete(build())


def rpc_tls(config: SinkConfig) -> ssl.SSLContext | None:
    """The writers' TLS context: trusts the CA the driver read (hostnames checked), and shows the client
    certificate the driver read where the servers require one."""
    return config.tls.context()


def _discard(worker: _Worker) -> None:
    """Stop everything a failed write left running (sends to other partitions), then close."""
    loop = worker.loop
    with contextlib.suppress(Exception):
        pending = asyncio.all_tasks(loop)
        for task in pending:
            task.cancel()
        loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        for writer in worker.writers.values():
            loop.run_until_complete(writer.close())
    with contextlib.suppress(Exception):
        loop.close()

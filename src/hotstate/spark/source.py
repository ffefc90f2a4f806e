"""`format("hotstate")`: a hotstate table as a Spark data source (PySpark 4's Python Data Source API).

    spark.read.format("hotstate").option("table", "clicks").option("servers", "h1:8088,h2:8088").load()
    df.writeStream.format("hotstate").outputMode("complete").option("table", "clicks").option("key", "user")
      .option("partitions", 8).option("checkpointLocation", "chk/clicks").start()

Reading is `reading.py`: one Spark partition per hotstate partition, read in pages over the HTTP API
(key filters pushed down with `register(spark, push_filters=True)`).
Writing is the sink of `materialize()` behind Spark's streaming writer: each task upserts its rows from the
executor with the same code (`sink.upsert_arrow` / `sink.upsert_rows`) and returns the consistency token
of what it wrote; `commit(messages, batchId)` on the driver records the batch in the cluster
(`sink.commit_batch`). Spark commits a micro-batch to its checkpoint only after that, and a batch re-run
from the checkpoint upserts the same rows again: exactly-once, as with `materialize()`.

Spark 4's Python streaming sinks take the append and complete output modes, not update (complete rewrites
every row of the result each batch; `materialize()` writes only the changed ones). In complete mode the
batch is the whole result table, so the keys it did not write have left it: each task returns the keys it
wrote, and the commit deletes every other key of the table (`sink.delete_absent`: a read of every key of
the table per batch, the order of what complete mode writes anyway) before it records the batch.
`deleteColumn` (and `deleteValue`) mark rows that delete their key, as `materialize()`'s `delete_column`
(and `delete_when`).

Batch writes (`df.write.format("hotstate").mode("append" | "overwrite").save()`) run the same task code
without a batch id. Append upserts into the table (created or checked as the stream writer does; a task
Spark retries upserts the same rows again). Overwrite stages a new generation of the table on the driver
before any task runs, the tasks load it, and the job's commit swaps it in atomically, or its abort drops
it (`overwrite.py`). Spark refuses the errorifexists and ignore save modes for Python data sources.

Options arrive with their names lower-cased (Spark's options are case-insensitive); an unknown one is an
error naming the known ones.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql import Row, SparkSession
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import StructType

from hotstate.client.writer import WriteResult
from hotstate.protocol.ttl import checked_ttl
from hotstate.spark.api import ENV_CLUSTER, ENV_CLUSTER_ID, ENV_SECRET, parse_cluster, tls_texts
from hotstate.spark.overwrite import Cluster, Overwrite, abandon_overwrite, begin_overwrite, finish_overwrite
from hotstate.spark.reading import PushingTableReader, ReadSettings, TableReader, infer_schema, table_shape
from hotstate.spark.sink import (
    ENV_RACK,
    DeleteColumnError,
    SinkConfig,
    commit_batch,
    config_for_schema,
    delete_absent,
    delete_marker,
    executor_rack,
    upsert_arrow,
    upsert_rows,
    without_column,
)
from hotstate.spark.table import TableDefinition, ensure_table
from hotstate.spark.windows import table_columns
from hotstate.tls import PemTexts

__all__ = [
    "NAME",
    "READ_OPTIONS",
    "WRITE_OPTIONS",
    "HotstateDataSource",
    "KeyFilterDataSource",
    "OptionError",
    "read_settings",
    "register",
]

log = logging.getLogger(__name__)

NAME = "hotstate"
ENV_SERVERS = "HOTSTATE_SERVERS"
PUSHDOWN_CONF = "spark.sql.python.filterPushdown.enabled"

# Spark sets these itself (`checkpointLocation` from the writer, `path` from load(path) / start(path)).
_SPARKS_OWN = ("checkpointLocation", "path")
READ_OPTIONS = ("table", "servers", "maxLag", "standbyReads", "pageSize", "timeoutMs")
WRITE_OPTIONS = (
    "table",
    "key",
    "partitions",
    "standbyReplicas",
    "acceptableLag",
    "cluster",
    "clusterId",
    "secret",
    "rack",
    "writeTimeoutMs",
    "tlsCa",
    "tlsCert",
    "tlsKey",
    "deleteColumn",
    "deleteValue",
    "retention",
    "ttl",
    "ttlColumn",
)
DEFAULT_PAGE_SIZE = 10_000
MAX_PAGE_SIZE = 100_000  # what one query returns at most (query.execute.MAX_ROWS)
DEFAULT_READ_TIMEOUT_MS = 30_000


class OptionError(ValueError):
    """An option the source does not know, or a value it cannot take."""


def _options(options: Mapping[str, str], known: tuple[str, ...], what: str) -> dict[str, str]:
    """The options by their documented names; an unknown one is an error naming the known ones."""
    by_folded = {name.casefold(): name for name in (*known, *_SPARKS_OWN)}
    out: dict[str, str] = {}
    for name, value in options.items():
        canonical = by_folded.get(name.casefold())
        if canonical is None:
            raise OptionError(
                f"unknown option {name!r} for {what} a hotstate table; known: {', '.join(known)}"
            )
        out[canonical] = value
    return out


def _table(options: Mapping[str, str]) -> str:
    table = (options.get("table") or "").strip()
    path = (options.get("path") or "").strip()
    if table and path and table != path:
        raise OptionError(f"option 'table' is {table!r} but the path given is {path!r}: name the table once")
    if not (table or path):
        raise OptionError("option 'table': name the hotstate table (or pass it to load() / start())")
    return table or path


def _integer(options: Mapping[str, str], name: str, least: int, most: int | None = None) -> int | None:
    text = options.get(name)
    if text is None:
        return None
    try:
        value = int(str(text).strip())
    except ValueError:
        value = None
    if value is None or value < least or (most is not None and value > most):
        limits = f"from {least} to {most}" if most is not None else f">= {least}"
        raise OptionError(f"option {name!r}: must be an integer {limits}, got {text!r}")
    return value


def _boolean(options: Mapping[str, str], name: str, default: bool) -> bool:
    text = options.get(name)
    if text is None:
        return default
    folded = str(text).strip().lower()
    if folded in ("true", "false"):
        return folded == "true"
    raise OptionError(f"option {name!r}: must be true or false, got {text!r}")


def read_settings(options: Mapping[str, str]) -> ReadSettings:
    given = _options(options, READ_OPTIONS, "reading")
    servers_text = given.get("servers") or os.environ.get(ENV_SERVERS) or ""
    servers = tuple(s.strip() for s in servers_text.split(",") if s.strip())
    if not servers:
        raise OptionError(
            f"option 'servers': give the servers' HTTP addresses (\"host:port,...\") or set {ENV_SERVERS}"
        )
    timeout_ms = _integer(given, "timeoutMs", 1) or DEFAULT_READ_TIMEOUT_MS
    return ReadSettings(
        servers=servers,
        table=_table(given),
        max_lag=_integer(given, "maxLag", 0),
        standby_reads=_boolean(given, "standbyReads", True),
        page_size=_integer(given, "pageSize", 1, MAX_PAGE_SIZE) or DEFAULT_PAGE_SIZE,
        timeout_s=timeout_ms / 1000,
    )


@dataclass(frozen=True, slots=True)
class WriteSettings:
    servers: tuple[tuple[str, int], ...]
    cluster_id: str
    secret: str
    table: str
    key: tuple[str, ...]
    partitions: int
    standby_replicas: int
    acceptable_lag: int | None
    rack: str | None
    deadline_s: float
    # TLS of the servers' RPC port: the CA (and a client certificate) read on the driver, as text.
    tls: PemTexts = field(default_factory=PemTexts)
    # deleteColumn (a boolean column: true deletes), or with deleteValue the string marking a delete.
    delete_column: str | None = None
    delete_value: str | None = None
    # A windowed table's retention, an interval such as "2 hours" (materialize's `retention`).
    retention: str | None = None
    # A plain table's time to live ("7d") and the timestamp column it counts from (materialize's `ttl`,
    # `ttl_column`); no column: from each row's last write.
    ttl: str | None = None
    ttl_column: str | None = None


def write_settings(options: Mapping[str, str]) -> WriteSettings:
    given = _options(options, WRITE_OPTIONS, "writing")
    cluster_id = given.get("clusterId") or os.environ.get(ENV_CLUSTER_ID)
    secret = given.get("secret") or os.environ.get(ENV_SECRET)
    if not cluster_id or not secret:
        raise OptionError(
            f"options 'clusterId' and 'secret': the cluster's id and secret are needed (or set "
            f"{ENV_CLUSTER_ID} and {ENV_SECRET})"
        )
    key = tuple(k.strip() for k in (given.get("key") or "").split(",") if k.strip())
    if not key:
        raise OptionError("option 'key': name the key column, or several as \"a,b\"")
    partitions = _integer(given, "partitions", 1)
    if partitions is None:
        raise OptionError("option 'partitions': how many partitions the table has (created if missing)")
    try:
        servers = parse_cluster(given.get("cluster") or os.environ.get(ENV_CLUSTER))
    except ValueError as error:
        raise OptionError(f"option {error}") from None
    if given.get("deleteValue") is not None and not (given.get("deleteColumn") or "").strip():
        raise OptionError("option 'deleteValue': name the column it is compared with in 'deleteColumn'")
    rack = (given.get("rack") or os.environ.get(ENV_RACK) or "").strip() or None
    standby = _integer(given, "standbyReplicas", 0)
    try:
        tls = tls_texts(given.get("tlsCa"), given.get("tlsCert"), given.get("tlsKey"))
    except ValueError as error:
        raise OptionError(f"options 'tlsCa', 'tlsCert', 'tlsKey': {error}") from None
    return WriteSettings(
        servers=servers,
        cluster_id=cluster_id,
        secret=secret,
        table=_table(given),
        key=key,
        partitions=partitions,
        standby_replicas=1 if standby is None else standby,
        acceptable_lag=_integer(given, "acceptableLag", 0),
        rack=rack,
        deadline_s=(_integer(given, "writeTimeoutMs", 1) or 60_000) / 1000,
        tls=tls,
        delete_column=(given.get("deleteColumn") or "").strip() or None,
        delete_value=given.get("deleteValue"),
        retention=(given.get("retention") or "").strip() or None,
        ttl=(given.get("ttl") or "").strip() or None,
        ttl_column=(given.get("ttlColumn") or "").strip() or None,
    )


# The tables this Python worker has created or checked: Spark creates the stream writer again for every
# batch's commit, and the table's definition need not be checked each time (workers are reused).
_ensured: set[tuple[WriteSettings, TableDefinition]] = set()


def _sink_config(
    settings: WriteSettings, schema: StructType, *, complete: bool = False, overwrite: bool = False
) -> tuple[SinkConfig, Overwrite | None]:
    """The tasks' config, once the table exists with this definition (created if missing); with
    `overwrite`, once a new generation of it is staged, which the tasks write to instead."""
    column, value = settings.delete_column, settings.delete_value
    try:
        if column is not None and value is not None:
            marker = delete_marker(schema, settings.key, delete_when=(column, value))
        else:
            marker = delete_marker(schema, settings.key, column)
    except DeleteColumnError as error:
        raise OptionError(f"option 'deleteColumn': {error}") from None
    stored = without_column(schema, marker)
    # No DataFrame here, only its schema: a window's kind is TIME (SESSION for a session window).
    key_columns, value_columns, window = table_columns(None, stored, settings.key, settings.retention)
    try:
        ttl = checked_ttl(settings.ttl, settings.ttl_column, key_columns, window, value_columns)
    except ValueError as error:
        raise OptionError(f"options 'ttl', 'ttlColumn': {error}") from None
    definition = TableDefinition(
        settings.table,
        settings.partitions,
        settings.standby_replicas,
        key_columns,
        settings.acceptable_lag,
        window,
        ttl,
    )
    staged = None
    if overwrite:
        staged = begin_overwrite(
            _cluster(settings),
            definition,
            rack=settings.rack,
            values=value_columns,
            tls=settings.tls.context(),
        )
    elif (settings, definition) not in _ensured:
        ensure_table(
            settings.servers,
            settings.cluster_id,
            settings.secret,
            definition,
            rack=settings.rack,
            values=value_columns,
            tls=settings.tls.context(),
        )
        _ensured.add((settings, definition))
    config = config_for_schema(
        schema,
        servers=settings.servers,
        table=settings.table if staged is None else staged.staging_name,
        cluster_id=settings.cluster_id,
        secret=settings.secret,
        rack=settings.rack,
        deadline_s=settings.deadline_s,
        tls=settings.tls,
        deletes=marker,
        complete=complete,
        window=None if window is None else window.column,
    )
    return config, staged


def _cluster(settings: WriteSettings) -> Cluster:
    return Cluster(settings.servers, settings.cluster_id, settings.secret)


# ------------------------------------------------------------------------------------------ writing


class Written(WriterCommitMessage):
    """What one task wrote: the consistency token of its upserts (the batch's commit merges them), and the
    rack of the executor that wrote them (the commit registers it with the table's writer racks)."""

    def __init__(self, token: str, rows: int, rack: str | None, keys: tuple[bytes, ...] = ()) -> None:
        self.token = token
        self.rows = rows
        self.rack = rack
        # Complete mode: the encoded keys the task wrote (the commit deletes every other key of the table).
        self.keys = keys


def _batch_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    batch = context.getLocalProperty("streaming.sql.batchId") if context is not None else None
    return int(batch) if batch is not None and batch.lstrip("-").isdigit() else -1


def _written(config: SinkConfig, result: WriteResult, keys: list[bytes] | None) -> Written:
    return Written(result.consistency_token, result.rows, executor_rack(config), tuple(keys or ()))


class _Commit:
    config: SinkConfig

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        written = [m for m in messages if isinstance(m, Written)]
        racks = [m.rack for m in written if m.rack]
        tokens = [m.token for m in written]
        if self.config.complete:
            # The batch is the whole result table: what it did not write is gone from it. Before the batch is
            # recorded, so min_batch covers the deletes too.
            present = (key for m in written for key in m.keys)
            tokens.append(delete_absent(self.config, batchId, present, tokens))
        commit_batch(self.config, batchId, tokens, racks)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        # The rows some tasks wrote stay: full upserts, which the batch's re-run writes again.
        pass


class ArrowStreamWriter(_Commit, DataSourceStreamArrowWriter):
    """Flat columns of the common types: Arrow batches encoded a column at a time (as materialize())."""

    def __init__(self, config: SinkConfig) -> None:
        self.config = config

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        keys: list[bytes] | None = [] if self.config.complete else None
        result = upsert_arrow(self.config, list(iterator), batch_id=_batch_id(), keys_out=keys)
        return _written(self.config, result, keys)


class RowStreamWriter(_Commit, DataSourceStreamWriter):
    """Structs, arrays, maps, decimals: rows as dicts (as materialize())."""

    def __init__(self, config: SinkConfig) -> None:
        self.config = config

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        keys: list[bytes] | None = [] if self.config.complete else None
        result = upsert_rows(self.config, iterator, batch_id=_batch_id(), keys_out=keys)
        return _written(self.config, result, keys)


class _BatchCommit:
    """A batch write's end, on the driver. Append: nothing to do, every task's rows were acked (a task
    Spark retries upserts the same rows again, which changes nothing). Overwrite: the staged generation is
    swapped in once every task succeeded, and dropped when the job failed."""

    config: SinkConfig
    settings: WriteSettings
    overwrite: Overwrite | None

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        written = [m for m in messages if isinstance(m, Written)]
        if self.overwrite is not None:
            tokens = [m.token for m in written]
            finish_overwrite(_cluster(self.settings), self.overwrite, self.settings.tls.context(), tokens)
        log.info(
            "batch write of table %r: %d rows from %d tasks",
            self.settings.table,
            sum(m.rows for m in written),
            len(written),
        )

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        if self.overwrite is not None:
            abandon_overwrite(_cluster(self.settings), self.overwrite, self.settings.tls.context())


class ArrowBatchWriter(_BatchCommit, DataSourceArrowWriter):
    """A batch write of flat columns of the common types: Arrow batches, as the stream writer."""

    def __init__(self, config: SinkConfig, settings: WriteSettings, overwrite: Overwrite | None) -> None:
        self.config, self.settings, self.overwrite = config, settings, overwrite

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriterCommitMessage:
        return _written(self.config, upsert_arrow(self.config, list(iterator), batch_id=-1), None)


class RowBatchWriter(_BatchCommit, DataSourceWriter):
    """A batch write of structs, arrays, maps, decimals: rows as dicts, as the stream writer."""

    def __init__(self, config: SinkConfig, settings: WriteSettings, overwrite: Overwrite | None) -> None:
        self.config, self.settings, self.overwrite = config, settings, overwrite

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        return _written(self.config, upsert_rows(self.config, iterator, batch_id=-1), None)


# ------------------------------------------------------------------------------------------ the source


class HotstateDataSource(DataSource):
    """`format("hotstate")`: read a table, or write a stream into one."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def schema(self) -> StructType | str:
        settings = read_settings(self.options)
        return infer_schema(settings, table_shape(settings))

    def reader(self, schema: StructType) -> DataSourceReader:
        return TableReader(read_settings(self.options), schema)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        # `overwrite`: Spark's complete output mode (it truncates the sink's table each batch), the only mode
        # besides append that Spark 4 offers Python sinks.
        config, _ = _sink_config(write_settings(self.options), schema, complete=overwrite)
        return ArrowStreamWriter(config) if config.arrow else RowStreamWriter(config)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        # Spark 4 offers Python data sources the append and overwrite save modes only: it refuses
        # errorifexists and ignore itself (UNSUPPORTED_DATA_SOURCE_SAVE_MODE) before asking for a writer.
        settings = write_settings(self.options)
        config, staged = _sink_config(settings, schema, overwrite=overwrite)
        if config.arrow:
            return ArrowBatchWriter(config, settings, staged)
        return RowBatchWriter(config, settings, staged)


class KeyFilterDataSource(HotstateDataSource):
    """The source with key filters pushed to the cluster (`register(spark, push_filters=True)`)."""

    def reader(self, schema: StructType) -> DataSourceReader:
        return PushingTableReader(read_settings(self.options), schema)


def register(spark: SparkSession | None = None, *, push_filters: bool = False) -> None:
    """Make `format("hotstate")` work in `spark` (default: the active session); `import hotstate.spark`
    calls it when a session is active.

    `push_filters=True` sends key filters (=, IN, ranges on the key) to the cluster instead of reading
    every row for Spark to filter, and turns on the session's spark.sql.python.filterPushdown.enabled
    (off by default in Spark 4). Off by default because Spark 4.3 keeps a pushed-down read on the
    DataFrame it was planned for: a DataFrame scanned once with a key filter and scanned again with no
    filter at all reads the filtered rows again. With it on, load() a new DataFrame for each filtered
    read."""
    session = spark if spark is not None else SparkSession.getActiveSession()
    if session is None:
        raise RuntimeError("no active SparkSession: create one, then call hotstate.spark.register(spark)")
    if push_filters:
        session.conf.set(PUSHDOWN_CONF, "true")
    session.dataSource.register(KeyFilterDataSource if push_filters else HotstateDataSource)

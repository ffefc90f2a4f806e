"""Run a pipeline script (`hotstate.spark.sqlfront`) on Spark: each CREATE SOURCE becomes a streaming temp
view, each CREATE TABLE's SELECT runs as Spark SQL over those views and is kept in a hotstate table by
`materialize`.

Every statement is checked before any query starts: the sources are loaded, every SELECT is analyzed and
its key found, and only then the materializations start (the tables in script order); if one fails to
start, the ones already started are stopped. Errors from Spark (AnalysisException, ParseException,
StreamingQueryException, Py4JJavaError) become PipelineErrors carrying the statement, its line and the
first line of Spark's message, never the Java stack. Each SELECT is handed to Spark preceded by as many
line breaks and spaces as precede it in the script, so the "line N, pos M" of Spark's messages is the
script's.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from hotstate.spark.api import Cluster, materialize
from hotstate.spark.sqlfront import Pipeline, PipelineError, Source, Statement, Table

__all__ = [
    "DEFAULT_MASTER",
    "DEFAULT_SHUFFLE_PARTITIONS",
    "Materialization",
    "analyze",
    "build_session",
    "quiet_python_logs",
    "register_source",
    "session_conf",
    "spark_message",
    "start_pipeline",
    "stop_all",
    "wait_pipeline",
]

DEFAULT_MASTER = "local[2]"
# Measured on 2 cores: 200 shuffle partitions cost 7-16 s per tiny batch, 8 about 0.8 s,
# 2 about 0.5 s. The number is frozen into a query's checkpoint when the checkpoint is created.
DEFAULT_SHUFFLE_PARTITIONS = 4
STREAM_THREAD_STACK = "16m"
# How long stop_all waits for a running micro-batch to end before it interrupts it.
STOP_GRACE_S = 10.0

# Errors only; the loggers that would print a failed query's or task's Java stack beside the one-line
# error this module reports are off.
LOG4J2 = """\
rootLogger.level = error
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = %d{HH:mm:ss} %p %c{1}: %m%n
logger.gateway.name = org.apache.spark.api.python.PythonGatewayServer
logger.gateway.level = error
logger.submit.name = org.apache.spark.deploy.SparkSubmit
logger.submit.level = error
logger.streaming.name = org.apache.spark.sql.execution.streaming
logger.streaming.level = off
logger.executor.name = org.apache.spark.executor.Executor
logger.executor.level = off
logger.tasks.name = org.apache.spark.scheduler.TaskSetManager
logger.tasks.level = off
"""


@dataclass(slots=True)
class Materialization:
    """A CREATE TABLE whose streaming query runs (or ran)."""

    table: Table
    key: tuple[str, ...]
    checkpoint: str
    query: StreamingQuery
    finished: bool = False
    input_rows: int = 0
    batches: int = 0
    _seen: set[int] = field(default_factory=set)

    def record_progress(self) -> None:
        """Add the query's recent progress reports not counted yet (Spark keeps the last 100)."""
        for progress in self.query.recentProgress:
            if progress.batchId not in self._seen:
                self._seen.add(progress.batchId)
                self.batches += 1
                self.input_rows += int(progress.numInputRows or 0)


def quiet_python_logs() -> None:
    """PySpark logs every AnalysisException it raises, Java stack included, as JSON on stderr: not here."""
    for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger"):
        logging.getLogger(name).disabled = True
    # py4j logs the traceback of an exception raised in a Python callback (the foreachBatch function)
    # that the failed query reports anyway.
    logging.getLogger("py4j.clientserver").setLevel(logging.CRITICAL)


def build_session(
    master: str = DEFAULT_MASTER,
    shuffle_partitions: int = DEFAULT_SHUFFLE_PARTITIONS,
    *,
    app_name: str = "hotstate-sql",
    conf: Mapping[str, str] | None = None,
    java_options: str = "",
) -> tuple[SparkSession, bool]:
    """A SparkSession for running pipelines, and whether this call created it (the caller then stops it).

    An active session of this process is reused as it is. A new one logs errors only (no progress bars,
    no UI) and uses `shuffle_partitions`; `conf` adds Spark settings and `java_options` JVM flags (both
    driver and executors)."""
    from pyspark import SparkContext

    quiet_python_logs()
    if SparkContext._active_spark_context is not None:
        return SparkSession.builder.getOrCreate(), False
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    log4j = Path(tempfile.gettempdir()) / f"hotstate-log4j2-{os.getuid()}.properties"
    log4j.write_text(LOG4J2)
    builder = SparkSession.builder.master(master).appName(app_name)
    for key, value in session_conf(shuffle_partitions, log4j, conf, java_options).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session, True


def session_conf(
    shuffle_partitions: int, log4j: Path, conf: Mapping[str, str] | None = None, java_options: str = ""
) -> dict[str, str]:
    """The Spark settings of a new session: `log4j` is a file on the driver's machine, so only the driver's
    JVM is pointed at it; executors (on a cluster, other machines) get `java_options` and log as their
    cluster is set up to."""
    # -Xss: a query stopped while its foreachBatch runs fails with a long Python traceback, which Spark
    # 4.3 matches against a backtracking regex (StreamExecution.isInterruptionException) on the driver's
    # stream thread; with the default 1 MB thread stacks that overflows into a StackOverflowError.
    driver_jvm = f"-Dlog4j2.configurationFile=file:{log4j} -Xss{STREAM_THREAD_STACK} {java_options}".strip()
    out = {
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": driver_jvm,
    }
    if java_options.strip():
        out["spark.executor.extraJavaOptions"] = java_options.strip()
    out.update(conf or {})
    return out


def register_source(spark: SparkSession, source: Source) -> DataFrame:
    """Load the source as a streaming DataFrame and register it as the temp view `source.name`."""
    reader = spark.readStream.format(source.format).options(**source.options)
    try:
        df = reader.load() if source.path is None else reader.schema(source.schema()).load(source.path)
        df.createOrReplaceTempView(source.name)
    except Exception as error:
        raise _error(source.statement, error) from None
    return df


def analyze(spark: SparkSession, table: Table) -> tuple[DataFrame, tuple[str, ...]]:
    """The table's SELECT as a streaming DataFrame, and its key as the DataFrame names the columns."""
    padding = "\n" * (table.select_line - 1) + " " * table.select_column
    try:
        df = spark.sql(padding + table.select)
    except Exception as error:
        raise _error(table.statement, error) from None
    if not df.isStreaming:
        raise table.statement.error("the SELECT reads no source: it must read a CREATE SOURCE")
    key = table.require_key()
    columns = {name.lower(): name for name in df.columns}
    resolved = []
    for name in key:
        if name.lower() not in columns:
            raise table.statement.error(
                f"key column {name!r} is not a column of the SELECT's output "
                f"(columns: {', '.join(df.columns)})"
            )
        resolved.append(columns[name.lower()])
    return df, tuple(resolved)


def start_pipeline(
    spark: SparkSession,
    pipeline: Pipeline,
    *,
    cluster: Cluster | None,
    cluster_id: str | None,
    secret: str | None,
    checkpoints: str | Path,
    available_now: bool = False,
    on_start: Callable[[Materialization], None] | None = None,
) -> list[Materialization]:
    """Register the sources, analyze every table, then start each table's materialization.

    A table's checkpoint is its checkpoint= option, else `checkpoints/<table>`. `available_now`: every
    query processes what its input holds now, then stops (the availableNow trigger), whatever the
    tables' trigger= options say."""
    for source in pipeline.sources:
        register_source(spark, source)
    analyzed = [(table, *analyze(spark, table)) for table in pipeline.tables]
    started: list[Materialization] = []
    try:
        for table, df, key in analyzed:
            trigger: str | dict[str, bool] | None = table.trigger
            if available_now or trigger == "availableNow":
                trigger = {"availableNow": True}
            checkpoint = table.checkpoint or str(Path(checkpoints) / table.name)
            try:
                query = materialize(
                    df,
                    table.name,
                    key,
                    table.partitions,
                    table.standby_replicas,
                    table.acceptable_lag,
                    cluster=cluster,
                    checkpoint=checkpoint,
                    trigger=trigger,
                    cluster_id=cluster_id,
                    secret=secret,
                    query_name=f"hotstate_{table.name}",
                )
            except Exception as error:
                raise _error(table.statement, error) from None
            started.append(Materialization(table, key, checkpoint, query))
            if on_start is not None:
                on_start(started[-1])
    except BaseException:
        stop_all(started)
        raise
    return started


def wait_pipeline(
    running: Sequence[Materialization],
    *,
    until_finished: bool,
    timeout_s: float | None = None,
    poll_s: float = 0.2,
) -> None:
    """Watch the queries. A query that fails stops every other one and raises its PipelineError.

    `until_finished` (availableNow): return once every query has processed its input and stopped; past
    `timeout_s` stop them all and raise. Otherwise run until `timeout_s` (None: until interrupted; the
    caller stops the queries on KeyboardInterrupt), then stop them all and return."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        for item in running:
            if item.finished or item.query.isActive:
                continue
            item.finished = True
            item.record_progress()
            failure = item.query.exception()
            if failure is not None:
                stop_all(running)
                raise item.table.statement.error("the streaming query failed: " + spark_message(failure))
            if not until_finished:
                stop_all(running)
                raise item.table.statement.error("the streaming query stopped")
        if until_finished and all(item.finished for item in running):
            return
        if deadline is not None and time.monotonic() >= deadline:
            busy = [item for item in running if not item.finished]
            stop_all(running)
            if until_finished and busy:
                raise busy[0].table.statement.error(
                    f"still running after {timeout_s:g} s: its input was not all processed"
                )
            return
        time.sleep(poll_s)


def stop_all(running: Sequence[Materialization], *, grace_s: float = STOP_GRACE_S) -> None:
    """Stop every query that still runs: each at the end of its running micro-batch if that ends within
    `grace_s`, else by interrupting it (the batch then runs again from the checkpoint on the next start;
    its upserts are idempotent, so nothing is counted twice)."""
    deadline = time.monotonic() + grace_s
    for item in running:
        try:
            try:
                while item.query.isActive and time.monotonic() < deadline and _in_batch(item.query):
                    time.sleep(0.02)
            except KeyboardInterrupt:
                deadline = 0.0  # interrupted again: stop the rest at once
            if item.query.isActive:
                item.query.stop()
            item.record_progress()
        except Exception:
            pass
        item.finished = True


def _in_batch(query: StreamingQuery) -> bool:
    return bool(query.status.get("isTriggerActive"))


# ---------------------------------------------------------------------------------------------- errors

_CUT = ("\nJVM stacktrace:", "\n== SQL", "\n=== Streaming Query ===", "\n\tat ", "\nCaused by:")
_JAVA_CLASS = re.compile(r"^:?\s*(?:[a-z_][\w$]*\.)+[A-Z][\w$]*(?:Exception|Error)(?::\s*|$)")
_PYTHON_ERROR = re.compile(
    r"^(?:[A-Za-z_]\w*\.)*([A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt)\w*(?::.*)?)$"
)
_STREAM_FAILED = re.compile(r"\[STREAM_FAILED\] Query \[[^\]]*\] terminated with exception: ")
_LOCATION = re.compile(r";?\s*\(?line (\d+),? pos(?:ition)? (\d+)\)?")
_SQLSTATE = re.compile(r"\s*SQLSTATE: \w+")


def _error(statement: Statement, error: BaseException) -> PipelineError:
    if isinstance(error, PipelineError):
        return error
    return statement.error(spark_message(error))


def spark_message(error: BaseException | str) -> str:
    """The first line of an error from Spark (or from the code it runs), without the Java stack, the
    query plan or the Python traceback: e.g. "[UNRESOLVED_COLUMN.WITH_SUGGESTION] A column ... with name
    `nope` cannot be resolved. ... (line 4, pos 7)"."""
    text = str(error).strip()
    if not text:
        return type(error).__name__ if isinstance(error, BaseException) else "unknown error"
    traceback_at = text.find("Traceback (most recent call last):")
    if traceback_at >= 0:
        # A Python exception in code Spark ran (the sink): its last line says what went wrong.
        lines = _cut(text[traceback_at:]).splitlines()
        raised = [m.group(1) for line in lines if (m := _PYTHON_ERROR.match(line.rstrip()))]
        if raised:
            return _short(_SQLSTATE.sub("", raised[-1]))
    lines = [
        line.strip()
        for line in _cut(text).splitlines()
        if line.strip()
        and not line.lstrip().startswith("at ")
        and not line.startswith("An error occurred while calling")
    ]
    first = lines[0] if lines else text.splitlines()[0]
    first = _JAVA_CLASS.sub("", first)
    first = _STREAM_FAILED.sub("", first)
    first = _SQLSTATE.sub("", first).rstrip(" ;")
    location = _LOCATION.search(first) or _LOCATION.search(text)
    if location is not None:
        first = _LOCATION.sub("", first).rstrip(" ;")
        first += f" (line {location.group(1)}, pos {location.group(2)})"
    return _short(first or type(error).__name__)


def _cut(text: str) -> str:
    ends = [i for marker in _CUT if (i := text.find(marker)) >= 0]
    return text[: min(ends)] if ends else text


def _short(text: str, limit: int = 600) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."

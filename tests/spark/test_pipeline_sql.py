"""`hotstate sql` with real Spark (the shared local[2] session) and a real local cluster: a pipeline file
runs with availableNow and the table read back equals a batch recomputation, a rerun resumes from the
checkpoint; every kind of bad statement and a query failing mid-stream come back as one line naming the
statement's line, without a Java stack or a traceback."""

from __future__ import annotations

import datetime as dt
import time
from pathlib import Path
from typing import Any

import pytest
from pyspark.sql import SparkSession
from typer.testing import CliRunner, Result

import hotstate
from cluster.conftest import StartCluster
from hotstate.cli.main import app
from hotstate.spark.pipeline import register_source, session_conf, spark_message
from hotstate.spark.sqlfront import parse_script
from spark.streams import drop_file

pytestmark = pytest.mark.xdist_group("spark")

PIPELINE = """\
-- clicks per user
CREATE SOURCE clicks (user STRING, url STRING, ts TIMESTAMP)
  WITH (format='json', path='{path}', maxFilesPerTrigger=2);
CREATE TABLE clicks_per_user WITH (partitions=4, standby_replicas=1, acceptable_lag=1000) AS
  SELECT user, count(*) AS clicks, max(ts) AS last_seen
  FROM clicks
  GROUP BY user;
"""
BATCH = (
    "SELECT user, count(*) AS clicks, CAST(max(ts) AS BIGINT) AS last_seen FROM clicks_batch GROUP BY user"
)
NO_CLUSTER = ["--cluster", "127.0.0.1:1", "--cluster-id", "nowhere", "--secret", "nothing"]
STACK_SIGNS = ("at org.apache", "\tat ", "Traceback", "JVM stacktrace", "py4j", "== SQL ==", "Logical Plan")


def _clicks(source: Path, round_: int, size: int = 120) -> None:
    start = dt.datetime(2026, 11, 1, tzinfo=dt.UTC) + dt.timedelta(hours=round_)
    events = [
        {
            "user": f"u{(i * 7 + round_) % 25}",
            "url": f"/page/{i % 6}",
            "ts": (start + dt.timedelta(seconds=i)).isoformat().replace("+00:00", "Z"),
        }
        for i in range(size)
    ]
    half = size // 2
    drop_file(source, events[:half])
    drop_file(source, events[half:])


def _recompute(spark: Any, source: Path) -> dict[str, tuple[int, int]]:
    spark.read.schema("user STRING, url STRING, ts TIMESTAMP").json(str(source)).createOrReplaceTempView(
        "clicks_batch"
    )
    return {row["user"]: (row["clicks"], row["last_seen"]) for row in spark.sql(BATCH).collect()}


def _table(running: Any) -> dict[str, tuple[int, int]] | None:
    servers = [f"127.0.0.1:{s.http_port}" for s in running.cluster.servers]
    with hotstate.Client(servers, timeout_s=10.0) as client:
        result = client.query("SELECT * FROM clicks_per_user", max_lag=0)
    return {
        row["user"]: (row["clicks"], int(dt.datetime.fromisoformat(row["last_seen"]).timestamp()))
        for row in result.dicts()
    }


def _wait_equal(running: Any, expected: dict[str, tuple[int, int]], timeout_s: float = 15.0) -> Any:
    """The table once it equals `expected` (replicas apply up to the HW a moment after the ack)."""
    end = time.monotonic() + timeout_s
    while True:
        got: dict[str, tuple[int, int]] | Exception | None
        try:
            got = _table(running)
        except Exception as error:
            got = error
        if got == expected or time.monotonic() > end:
            return got
        time.sleep(0.2)


def _sql(*args: str) -> Result:
    return CliRunner().invoke(app, ["sql", *args])


def _one_red_line(result: Result) -> str:
    assert result.exit_code == 1, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for sign in STACK_SIGNS:
        assert sign not in result.stderr, result.stderr
    return lines[0]


def test_a_pipeline_file_materializes_a_table_equal_to_a_batch_recomputation(
    spark: SparkSession, start_cluster: StartCluster, tmp_path: Path
) -> None:
    running = start_cluster(3)
    root = running.cluster.root
    source = tmp_path / "clicks"
    _clicks(source, 0)
    script = tmp_path / "pipeline.sql"
    script.write_text(PIPELINE.format(path=source))

    first = _sql("-f", str(script), "--dir", str(root), "--available-now", "--timeout-s", "120")
    assert first.exit_code == 0, (first.stdout, first.stderr)
    assert (
        "materializing clicks_per_user (line 4): key user; 4 partitions, 1 standby replicas, " in first.stdout
    )
    assert "clicks_per_user: all input processed, 120 input rows in 1 batches" in first.stdout
    expected = _recompute(spark, source)
    assert len(expected) == 25
    assert _wait_equal(running, expected) == expected
    assert (root / "checkpoints" / "clicks_per_user" / "commits").is_dir()

    # More input, the same command again: it resumes from the checkpoint (nothing counted twice).
    _clicks(source, 1)
    _clicks(source, 2)
    again = _sql("-f", str(script), "--dir", str(root), "--available-now", "--timeout-s", "120")
    assert again.exit_code == 0, (again.stdout, again.stderr)
    assert "240 input rows in 2 batches" in again.stdout  # 4 new files, maxFilesPerTrigger=2
    expected = _recompute(spark, source)
    assert sum(clicks for clicks, _ in expected.values()) == 360
    assert _wait_equal(running, expected) == expected
    assert not spark.streams.active

    # A query failing mid-stream (a null key cannot be written) is one line naming its statement.
    drop_file(tmp_path / "bad", [{"user": "u1", "n": 1}, {"n": 2}])
    failing = _sql(
        "-e",
        f"CREATE SOURCE events (user STRING, n BIGINT) WITH (format='json', path='{tmp_path / 'bad'}');\n"
        "CREATE TABLE per_user WITH (partitions=2, standby_replicas=0) AS\n"
        "  SELECT user, sum(n) AS total FROM events GROUP BY user",
        "--dir",
        str(root),
        "--available-now",
    )
    line = _one_red_line(failing)
    assert line.startswith(
        "line 2: CREATE TABLE per_user ...: the streaming query failed: BatchWriteError: "
    ), line
    assert "key column 'user' is null" in line, line
    assert not spark.streams.active

    # A SELECT Spark analyzes but cannot stream fails when its query starts: one line too.
    unsupported = _sql(
        "-e",
        PIPELINE.format(path=source).replace("count(*)", "count(DISTINCT url)"),
        "--dir",
        str(root),
        "--checkpoints",
        str(tmp_path / "chk"),
    )
    line = _one_red_line(unsupported)
    assert line.startswith(
        "line 4: CREATE TABLE clicks_per_user ...: Distinct aggregations are not supported"
    ), line


BAD = [
    # (the statement that replaces the table, the line of the message, what it says)
    (
        "CREATE TABLE clicks_per_user WITH (partitions=4) AS\n"
        "  SELECT user, count(nope) AS n FROM clicks GROUP BY user",
        "line 4: CREATE TABLE clicks_per_user ...: [UNRESOLVED_COLUMN.WITH_SUGGESTION] A column, variable, "
        "or function parameter with name `nope` cannot be resolved.",
        "(line 5, pos 21)",
    ),
    (
        "CREATE TABLE clicks_per_user WITH (partitions=4) AS\n  SELECT user, count(*) AS n FROM clicks\n"
        "  GROUP user",
        "line 4: CREATE TABLE clicks_per_user ...: [PARSE_SYNTAX_ERROR] Syntax error at or near 'user'",
        "(line 6, pos 8)",
    ),
    (
        "CREATE TABLE clicks_per_user WITH (partitions=4) AS "
        "SELECT user, count(*) AS n FROM clickz GROUP BY user",
        "line 4: CREATE TABLE clicks_per_user ...: [TABLE_OR_VIEW_NOT_FOUND] The table or view `clickz` "
        "cannot be found.",
        "(line 4, pos 84)",
    ),
    (
        "CREATE TABLE clicks_per_user WITH (partitons=4) AS "
        "SELECT user, count(*) AS n FROM clicks GROUP BY user",
        "line 4: CREATE TABLE clicks_per_user ...: unknown option 'partitons' (known: partitions, "
        "standby_replicas, acceptable_lag, key, checkpoint, trigger); did you mean 'partitions'?",
        "",
    ),
    (
        "CREATE TABLE clicks_per_user WITH (partitions=4) AS SELECT user, url FROM clicks",
        "line 4: CREATE TABLE clicks_per_user ...: the SELECT has no GROUP BY, so the table's key is not "
        "known: name the key with key='column, ...' in WITH",
        "",
    ),
    (
        "CREATE TABLE clicks_per_user WITH (partitions=4, key='who') AS SELECT user, url FROM clicks",
        "line 4: CREATE TABLE clicks_per_user ...: key column 'who' is not a column of the SELECT's output "
        "(columns: user, url)",
        "",
    ),
]


@pytest.mark.parametrize(("table", "message", "location"), BAD)
def test_a_bad_table_is_one_line_with_its_line_number(
    spark: SparkSession, tmp_path: Path, table: str, message: str, location: str
) -> None:
    (tmp_path / "clicks").mkdir()
    script = PIPELINE.format(path=tmp_path / "clicks").split("CREATE TABLE")[0] + table
    line = _one_red_line(_sql("-e", script, *NO_CLUSTER))
    assert line.startswith(message), line
    assert line.endswith(location), line
    assert not spark.streams.active


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ("format='jsonl', path='{path}'", "unknown format 'jsonl' (known: json, csv, parquet, rate)"),
        ("format='json'", "format 'json' needs path='...' (the folder the source watches)"),
        ("format='json', path='{path}/nowhere'", "[PATH_NOT_FOUND] Path does not exist: "),
    ],
)
def test_a_bad_source_is_one_line_with_its_line_number(
    spark: SparkSession, tmp_path: Path, options: str, message: str
) -> None:
    path = tmp_path / "clicks"
    path.mkdir()
    script = PIPELINE.format(path=path).replace(f"format='json', path='{path}'", options.format(path=path))
    file = tmp_path / "pipeline.sql"
    file.write_text(script)
    line = _one_red_line(_sql("-f", str(file), *NO_CLUSTER))
    assert line.startswith(f"{file}: line 2: CREATE SOURCE clicks ...: {message}"), line


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    script = tmp_path / "p.sql"
    script.write_text("CREATE SOURCE r WITH (format='rate'); CREATE TABLE t WITH (partitions=1) AS SELECT 1")
    neither = _sql()
    assert neither.exit_code == 2 and "-f FILE or -e" in neither.stderr
    both = _sql("-f", str(script), "-e", "x")
    assert both.exit_code == 2 and "-f FILE or -e" in both.stderr
    missing = _sql("-f", str(tmp_path / "nope.sql"))
    assert missing.exit_code == 2 and "nope.sql" in missing.stderr
    no_cluster = _sql("-f", str(script), "--dir", str(tmp_path / "none"))
    assert no_cluster.exit_code == 2 and "--cluster HOST:PORT" in no_cluster.stderr
    bad_address = _sql("-f", str(script), "--cluster", "localhost")
    assert bad_address.exit_code == 2 and "--cluster: 'localhost' is not host:port" in bad_address.stderr
    for result in (neither, both, missing, no_cluster, bad_address):
        assert "Traceback" not in result.stderr and len(result.stderr.strip().splitlines()) == 1


def test_rate_and_csv_sources_become_streaming_views(spark: SparkSession, tmp_path: Path) -> None:
    (tmp_path / "csv").mkdir()
    pipeline = parse_script(
        "CREATE SOURCE ticks WITH (format='rate', rowsPerSecond=10);\n"
        f"CREATE SOURCE rows (a INT, b DOUBLE, c DATE) WITH (format='csv', path='{tmp_path / 'csv'}', "
        "header=true);\n"
        "CREATE TABLE t WITH (partitions=1) AS SELECT value, count(*) AS n FROM ticks GROUP BY value"
    )
    ticks, rows = (register_source(spark, source) for source in pipeline.sources)
    assert ticks.isStreaming and [f.simpleString() for f in ticks.schema.fields] == [
        "timestamp:timestamp",
        "value:bigint",
    ]
    assert rows.isStreaming and rows.schema.simpleString() == "struct<a:int,b:double,c:date>"
    assert spark.sql("SELECT * FROM rows").isStreaming


def test_spark_messages_lose_the_java_stack_and_keep_the_line() -> None:
    py4j = (
        "An error occurred while calling o82.load.\n: org.apache.spark.SparkClassNotFoundException: "
        "[DATA_SOURCE_NOT_FOUND] Failed to find the data source: jsn. SQLSTATE: 42K02\n"
        "\tat org.apache.spark.sql.errors.QueryExecutionErrors$.dataSourceNotFoundError(Errors.scala)"
    )
    assert spark_message(py4j) == "[DATA_SOURCE_NOT_FOUND] Failed to find the data source: jsn."
    analysis = (
        "[TABLE_OR_VIEW_NOT_FOUND] The table or view `missing` cannot be found. Verify the spelling.\n"
        "Search path: [`system`.`builtin`].\nSQLSTATE: 42P01; line 1 pos 17;\n'Project ['user]\n"
        "+- 'UnresolvedRelation [missing], [], false\n"
    )
    assert spark_message(analysis) == (
        "[TABLE_OR_VIEW_NOT_FOUND] The table or view `missing` cannot be found. Verify the spelling. "
        "(line 1, pos 17)"
    )
    parse = (
        "\n[PARSE_SYNTAX_ERROR] Syntax error at or near 'FRM'. SQLSTATE: 42601 (line 5, pos 14)\n\n== SQL =="
    )
    assert spark_message(parse) == "[PARSE_SYNTAX_ERROR] Syntax error at or near 'FRM'. (line 5, pos 14)"
    stream = (
        "[STREAM_FAILED] Query [id = 1, runId = 2] terminated with exception: "
        "[FOREACH_BATCH_USER_FUNCTION_ERROR] An error occurred. Return Message: "
        "Traceback (most recent call last):\n"
        '  File "x.py", line 3, in call\n    raise e\n'
        "hotstate.spark.sink.BatchWriteError: hotstate sink, table t, batch 0: key column 'user' is null\n"
        " SQLSTATE: 39000 SQLSTATE: XXKST\n=== Streaming Query ===\nIdentifier: [id = 1]\n"
    )
    assert spark_message(stream) == (
        "BatchWriteError: hotstate sink, table t, batch 0: key column 'user' is null"
    )
    assert spark_message(RuntimeError()) == "RuntimeError"
    assert len(spark_message("x" * 5000)) == 600


def test_only_the_driver_is_pointed_at_the_drivers_log_file() -> None:
    """On a cluster the executors run on other machines: a path in the driver's temp folder means
    nothing there (a regression: it was passed to the executors' JVMs too)."""
    conf = session_conf(2, Path("/tmp/driver-only.properties"), {"spark.cores.max": "2"}, "-XX:+UseSerialGC")
    assert "file:/tmp/driver-only.properties" in conf["spark.driver.extraJavaOptions"]
    assert "-XX:+UseSerialGC" in conf["spark.driver.extraJavaOptions"]
    assert conf["spark.executor.extraJavaOptions"] == "-XX:+UseSerialGC"
    assert conf["spark.cores.max"] == "2" and conf["spark.sql.shuffle.partitions"] == "2"
    assert "spark.executor.extraJavaOptions" not in session_conf(2, Path("/tmp/x.properties"))

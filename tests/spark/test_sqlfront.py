"""The pipeline script parser (hotstate.spark.sqlfront): statements and their lines, every option, the key
from the GROUP BY, and the message of each kind of bad statement. Pure text: no Spark."""

from __future__ import annotations

import pytest

from hotstate.spark.sqlfront import (
    Column,
    PipelineError,
    Source,
    Statement,
    Table,
    group_by_key,
    parse_script,
    parse_statement,
    split_statements,
)

GOOD = """\
-- clickstream; a comment with a semicolon
CREATE SOURCE clicks (user STRING, url STRING, ts TIMESTAMP)
  WITH (format='json', path='data/clicks/');                 -- also csv, parquet, rate
CREATE TABLE clicks_per_user WITH (partitions=8, standby_replicas=1, acceptable_lag=1000) AS
  SELECT user, count(*) AS clicks, max(ts) AS last_seen FROM clicks GROUP BY user;
"""


def _source(text: str) -> Source:
    parsed = parse_statement(Statement(text, 1))
    assert isinstance(parsed, Source)
    return parsed


def _table(text: str) -> Table:
    parsed = parse_statement(Statement(text, 1))
    assert isinstance(parsed, Table)
    return parsed


def _error(script: str) -> str:
    with pytest.raises(PipelineError) as caught:
        parse_script(script)
    return str(caught.value)


# ---------------------------------------------------------------------------------------------- splitting


def test_the_issue_example_parses() -> None:
    pipeline = parse_script(GOOD)
    (source,) = pipeline.sources
    (table,) = pipeline.tables
    assert source.name == "clicks" and source.format == "json" and source.path == "data/clicks/"
    assert source.columns == (Column("user", "STRING"), Column("url", "STRING"), Column("ts", "TIMESTAMP"))
    assert source.schema() == "`user` STRING, `url` STRING, `ts` TIMESTAMP"
    assert source.options == {}
    assert source.statement.line == 2
    assert table.name == "clicks_per_user" and table.statement.line == 4
    assert (table.partitions, table.standby_replicas, table.acceptable_lag) == (8, 1, 1000)
    assert table.key == ("user",) and table.key_problem is None and table.require_key() == ("user",)
    assert table.select == "SELECT user, count(*) AS clicks, max(ts) AS last_seen FROM clicks GROUP BY user"
    assert (table.select_line, table.select_column) == (5, 2)
    assert table.checkpoint is None and table.trigger is None


def test_statements_split_on_semicolons_outside_quotes_and_comments() -> None:
    script = (
        "\n"
        "  CREATE SOURCE a WITH (x=';', y=\"--;\") ;  CREATE SOURCE `b;` -- c; d\n"
        "/* e;\n f; */ WITH (z='it\\'s; fine');\n"
        ";;\n"
        "-- only a comment;\n"
        "/* and another */\n"
        "SELECT `we``ird;` FROM t  -- no semicolon at the end"
    )
    statements = split_statements(script)
    assert [(s.line, s.column) for s in statements] == [(2, 2), (2, 43), (8, 0)]
    assert statements[0].text == "CREATE SOURCE a WITH (x=';', y=\"--;\")"
    assert statements[1].text == "CREATE SOURCE `b;` -- c; d\n/* e;\n f; */ WITH (z='it\\'s; fine')"
    assert statements[2].text == "SELECT `we``ird;` FROM t  -- no semicolon at the end"


def test_a_script_of_comments_has_no_statements() -> None:
    assert split_statements("-- nothing\n/* at all; */\n;\n") == []
    assert _error("-- nothing\n") == "line 1: the script has no statements: " + (
        "expected CREATE SOURCE name (column TYPE, ...) WITH (format='...', ...) "
        "or CREATE TABLE name WITH (partitions=N, ...) AS SELECT ..."
    )


@pytest.mark.parametrize(
    ("script", "message"),
    [
        (
            "CREATE SOURCE a;\n\nCREATE TABLE t WITH (path='x\n;\n",
            "line 3: CREATE TABLE t ...: unterminated string starting on line 3",
        ),
        (
            "CREATE SOURCE a;\nCREATE TABLE `t\n",
            "line 2: CREATE TABLE `t: unterminated identifier starting on line 2",
        ),
        ("CREATE SOURCE a;\n\n/* never\nclosed", "line 3: unterminated /* comment starting on line 3"),
    ],
)
def test_unterminated_quotes_and_comments(script: str, message: str) -> None:
    assert _error(script) == message


# ---------------------------------------------------------------------------------------------- sources


def test_every_column_type() -> None:
    source = _source(
        "CREATE SOURCE s (a STRING, b int, c INTEGER, d BIGINT, e DOUBLE, f FLOAT, g BOOLEAN, "
        "h TIMESTAMP, i DATE, `we ird` string) WITH (format='parquet', path='/data/s')"
    )
    assert [c.type for c in source.columns] == [
        "STRING", "INT", "INT", "BIGINT", "DOUBLE", "FLOAT", "BOOLEAN", "TIMESTAMP", "DATE", "STRING",
    ]  # fmt: skip
    assert source.schema().endswith("`i` DATE, `we ird` STRING")
    assert source.format == "parquet" and source.path == "/data/s"


def test_source_options_pass_through_as_strings() -> None:
    source = _source(
        "CREATE SOURCE s (a STRING) WITH (FORMAT='CSV', Path=\"in/\", header=TRUE, maxFilesPerTrigger=10, "
        "sep=';', latestFirst=false, spark.x.y=1.5)"
    )
    assert source.format == "csv" and source.path == "in/"
    assert source.options == {
        "header": "true",
        "maxFilesPerTrigger": "10",
        "sep": ";",
        "latestFirst": "false",
        "spark.x.y": "1.5",
    }


def test_the_rate_source_needs_no_columns() -> None:
    source = _source(
        "CREATE SOURCE r WITH (format='rate', rowsPerSecond=1000, rampUpTime='5s', numPartitions=2)"
    )
    assert source.path is None and source.columns == ()
    assert source.options == {"rowsPerSecond": "1000", "rampUpTime": "5s", "numPartitions": "2"}
    assert source.schema() == "timestamp TIMESTAMP, value BIGINT"
    assert _source("CREATE SOURCE r WITH (format='rate')").options == {}


# ---------------------------------------------------------------------------------------------- tables


def test_every_table_option() -> None:
    table = _table(
        "CREATE TABLE t WITH (PARTITIONS=3, standby_replicas=0, acceptable_lag=0, key='a, b', "
        "checkpoint='/chk/t', trigger='5 seconds') AS SELECT a, b, c FROM s"
    )
    assert (table.partitions, table.standby_replicas, table.acceptable_lag) == (3, 0, 0)
    assert table.key == ("a", "b") and table.checkpoint == "/chk/t" and table.trigger == "5 seconds"
    assert table.select == "SELECT a, b, c FROM s"
    defaults = _table("CREATE TABLE t WITH (partitions=1) AS SELECT a, count(*) AS n FROM s GROUP BY a")
    assert (defaults.standby_replicas, defaults.acceptable_lag, defaults.checkpoint, defaults.trigger) == (
        1,
        None,
        None,
        None,
    )


@pytest.mark.parametrize(
    "trigger", ["5 seconds", "1 second", "500 milliseconds", "2 minutes", "interval 10 seconds", "1 hour"]
)
def test_trigger_intervals(trigger: str) -> None:
    assert _table(
        f"CREATE TABLE t WITH (partitions=1, key='a', trigger='{trigger}') AS SELECT a"
    ).trigger == (trigger)


def test_trigger_available_now() -> None:
    table = _table("CREATE TABLE t WITH (partitions=1, key='a', trigger='availablenow') AS SELECT a FROM s")
    assert table.trigger == "availableNow"


def test_key_option_wins_over_the_group_by() -> None:
    table = _table(
        "CREATE TABLE t WITH (partitions=1, key='start,user') AS "
        "SELECT window.start AS start, user, count(*) AS n FROM s GROUP BY window(ts, '1 minute'), user"
    )
    assert table.key == ("start", "user") and table.require_key() == ("start", "user")


def test_the_select_position_is_kept_for_spark_messages() -> None:
    (table,) = parse_script("\n\nCREATE TABLE t WITH (partitions=1)\nAS   SELECT a FROM s GROUP BY a").tables
    assert (table.statement.line, table.select_line, table.select_column) == (3, 4, 5)
    (table,) = parse_script(
        "CREATE SOURCE s WITH (format='rate'); CREATE TABLE t WITH (partitions=1) AS "
        "SELECT value FROM s GROUP BY value"
    ).tables
    assert (table.select_line, table.select_column) == (1, 76)


# ---------------------------------------------------------------------------------------------- the key


@pytest.mark.parametrize(
    ("select", "key"),
    [
        ("SELECT user, count(*) AS n FROM s GROUP BY user", ("user",)),
        ("SELECT user AS who, count(*) AS n FROM s GROUP BY user", ("who",)),
        ("SELECT c.user, count(*) AS n FROM s c GROUP BY c.user", ("user",)),
        ("SELECT `user`, count(*) AS n FROM s GROUP BY `user`", ("user",)),
        ("SELECT user, url, count(*) AS n FROM s GROUP BY url, user, url", ("url", "user")),
        ("SELECT user, url, count(*) AS n FROM s GROUP BY 2, 1", ("url", "user")),
        ("SELECT lower(url) AS site, count(*) AS n FROM s GROUP BY lower(url)", ("site",)),
        ("SELECT lower(url) AS site, count(*) AS n FROM s GROUP BY site", ("site",)),
        ("WITH x AS (SELECT * FROM s) SELECT user, count(*) AS n FROM x GROUP BY user", ("user",)),
        ("SELECT User, count(*) AS n FROM s GROUP BY user", ("User",)),
    ],
)
def test_the_key_is_the_group_by_columns(select: str, key: tuple[str, ...]) -> None:
    assert group_by_key(select) == (key, None)


@pytest.mark.parametrize(
    ("select", "problem"),
    [
        ("SELECT user FROM s", "the SELECT has no GROUP BY, so the table's key is not known"),
        ("SELECT user FROM s UNION SELECT user FROM t", "the SELECT has no GROUP BY"),
        ("SELECT user, count(*) FROM s GROUP BY ALL", "GROUP BY ALL"),
        (
            "SELECT user, count(*) FROM s GROUP BY ROLLUP(user)",
            "ROLLUP, CUBE or GROUPING SETS gives null keys",
        ),
        (
            "SELECT lower(url), count(*) FROM s GROUP BY lower(url)",
            "GROUP BY LOWER(url): select it with an alias",
        ),
        ("SELECT count(*) AS n FROM s GROUP BY user", "GROUP BY user is not a column of the SELECT's output"),
        ("SELECT count(*), user FROM s GROUP BY 1", "GROUP BY 1: select that column with an alias"),
        ("SELECT user FROM s GROUP BY 3", "GROUP BY 3: the SELECT has 1 columns"),
        (
            "SELECT window, user, count(*) AS n FROM s GROUP BY window(ts, '1 minute'), user",
            "cannot find the GROUP BY columns of this SELECT (sqlglot cannot parse it",
        ),
    ],
)
def test_a_key_that_cannot_be_found_says_why_and_asks_for_key(select: str, problem: str) -> None:
    key, why = group_by_key(select)
    assert key is None and why is not None
    assert problem in why and "name the key with key='column, ...' in WITH" in why


def test_without_a_key_require_key_raises_with_the_statement_line() -> None:
    (table,) = parse_script("\n-- x\nCREATE TABLE t WITH (partitions=2)\n  AS SELECT a FROM s").tables
    with pytest.raises(PipelineError) as caught:
        table.require_key()
    assert caught.value.line == 3
    assert str(caught.value) == (
        "line 3: CREATE TABLE t ...: the SELECT has no GROUP BY, so the table's key is not known: "
        "name the key with key='column, ...' in WITH"
    )


# ---------------------------------------------------------------------------------------------- errors

S = "CREATE SOURCE s (a STRING) WITH "
T = "CREATE TABLE t WITH "
SELECT = " AS SELECT a, count(*) AS n FROM s GROUP BY a"


@pytest.mark.parametrize(
    ("statement", "message"),
    [
        # tables
        (
            "CREATE TABLE clicks_per_user WITH (partitons=8, standby_replicas=1)" + SELECT,
            "CREATE TABLE clicks_per_user ...: unknown option 'partitons' (known: partitions, "
            "standby_replicas, acceptable_lag, key, checkpoint, trigger); did you mean 'partitions'?",
        ),
        (T + "(partitions=2, colour='red')" + SELECT, "unknown option 'colour' (known: partitions, "),
        (T + "(standby_replicas=1)" + SELECT, "WITH needs partitions=N"),
        (T + "(partitions=0)" + SELECT, "partitions must be a whole number of at least 1, not 0"),
        (T + "(partitions='eight')" + SELECT, "partitions must be a whole number of at least 1, not 'eight'"),
        (T + "(partitions=2.5)" + SELECT, "partitions must be a whole number of at least 1, not 2.5"),
        (T + "(partitions=TRUE)" + SELECT, "partitions must be a whole number of at least 1, not TRUE"),
        (
            T + "(partitions=2, standby_replicas=-1)" + SELECT,
            "standby_replicas must be a whole number of at least 0, not -1",
        ),
        (T + "(partitions=2, acceptable_lag=1.5)" + SELECT, "acceptable_lag must be a whole number"),
        (T + "(partitions=2, key='a,,b')" + SELECT, "key 'a,,b': name the key columns, separated by commas"),
        (T + "(partitions=2, key='a, A')" + SELECT, "key 'a, A' names a column twice"),
        (T + "(partitions=2, key=3)" + SELECT, "key must be a non-empty 'string', not 3"),
        (T + "(partitions=2, checkpoint='')" + SELECT, "checkpoint must be a non-empty 'string', not ''"),
        (
            T + "(partitions=2, trigger='soon')" + SELECT,
            "trigger 'soon': give a processing-time interval such",
        ),
        (T + "(partitions=2, Partitions=3)" + SELECT, "option 'Partitions' is given twice"),
        (
            T + "(partitions=2 standby_replicas=1)" + SELECT,
            "expected ')' after the WITH options, found 'standby_replicas'",
        ),
        (T + "(partitions)" + SELECT, "expected '=' after option 'partitions', found ')'"),
        (
            T + "(partitions=SOME)" + SELECT,
            "option 'partitions': expected a 'string', a number, TRUE or FALSE, found 'SOME'",
        ),
        ("CREATE TABLE t" + SELECT, "CREATE TABLE needs WITH (partitions=N, ...) before AS"),
        (
            T + "(partitions=2)",
            "expected AS SELECT ... after the WITH options, found the end of the statement",
        ),
        (T + "(partitions=2) AS", "AS needs a SELECT"),
        ("CREATE TABLE `my-table` WITH (partitions=2)" + SELECT, "table name 'my-table': must match"),
        # sources
        (
            "CREATE SOURCE clicks (user STRNG) WITH (format='json', path='x')",
            "CREATE SOURCE clicks ...: column 'user': unknown type 'STRNG' (known: STRING, INT, INTEGER, "
            "BIGINT, DOUBLE, FLOAT, BOOLEAN, TIMESTAMP, DATE)",
        ),
        (S + "(format='avro', path='x')", "unknown format 'avro' (known: json, csv, parquet, rate)"),
        (S + "(path='x')", "WITH needs format='...' (one of json, csv, parquet, rate)"),
        (S + "(format='json')", "format 'json' needs path='...' (the folder the source watches)"),
        (S + "(format='csv', path='')", "format 'csv' needs path='...'"),
        (
            "CREATE SOURCE s WITH (format='json', path='x')",
            "a json source needs its columns: CREATE SOURCE s (column TYPE, ...) WITH (...)",
        ),
        (
            S + "(format='json', path='x', maxFilesPerTrigger=0)",
            "maxFilesPerTrigger must be a whole number of at least 1, not 0",
        ),
        (
            S + "(format='rate')",
            "the rate source has a fixed schema (timestamp TIMESTAMP, value BIGINT): drop the column list",
        ),
        ("CREATE SOURCE r WITH (format='rate', path='x')", "the rate source reads no files: drop path="),
        (
            "CREATE SOURCE r WITH (format='rate', rowsPerSecnd=5)",
            "unknown option of the rate source "
            "'rowsPerSecnd' (known: rowsPerSecond, rampUpTime, numPartitions); did you mean 'rowsPerSecond'?",
        ),
        ("CREATE SOURCE s (a STRING, A INT) WITH (format='json', path='x')", "column 'A' is named twice"),
        ("CREATE SOURCE s (a STRING,) WITH (format='json', path='x')", "expected a column name, found ')'"),
        ("CREATE SOURCE s (a) WITH (format='json', path='x')", "expected the type of column 'a', found ')'"),
        ("CREATE SOURCE s (a DECIMAL(10, 2)) WITH (format='json', path='x')", "unknown type 'DECIMAL'"),
        (
            "CREATE SOURCE s (a STRING) (format='json', path='x')",
            "expected WITH (format='...', ...) after CREATE SOURCE s, found '('",
        ),
        (S + "(format='json', path='x') AS SELECT 1", "unexpected 'AS' after the WITH options"),
        ("CREATE SOURCE `a.b` WITH (format='rate')", "source name 'a.b': must match"),
        # neither
        (
            "SELECT 1",
            "SELECT 1: expected CREATE SOURCE name (column TYPE, ...) WITH (format='...', ...) or "
            "CREATE TABLE name WITH (partitions=N, ...) AS SELECT ...",
        ),
        ("CREATE VIEW v AS SELECT 1", "CREATE VIEW v ...: expected CREATE SOURCE name"),
        ("CREATE", "expected CREATE SOURCE name"),
        ("CREATE TABLE", "expected the table's name after CREATE TABLE, found the end of the statement"),
    ],
)
def test_bad_statements_name_their_line_and_what_is_wrong(statement: str, message: str) -> None:
    script = f"CREATE SOURCE other WITH (format='rate');\n\n-- the bad one:\n{statement};\n"
    script += f"{T}(partitions=1){SELECT};"
    text = _error(script)
    assert text.startswith("line 4: "), text
    assert message in text, text


def test_duplicates_and_nothing_to_materialize() -> None:
    rate = "CREATE SOURCE s WITH (format='rate');\n"
    table = f"{T}(partitions=1) AS SELECT value FROM s GROUP BY value;\n"
    assert _error(rate + rate.upper() + table) == "line 2: CREATE SOURCE S ...: source 'S' is defined twice"
    assert _error(rate + table + table) == "line 3: CREATE TABLE t ...: table 't' is defined twice"
    assert _error(rate + "\n" + rate.replace(" s ", " s2 ")) == (
        "line 3: the script has no CREATE TABLE ... AS SELECT: nothing to materialize"
    )


def test_the_error_keeps_its_parts() -> None:
    error = PipelineError("CREATE TABLE clicks_per_user WITH (x=1) AS SELECT 1", 3, "unknown option 'x'")
    assert (error.line, error.message) == (3, "unknown option 'x'")
    assert error.statement.startswith("CREATE TABLE clicks_per_user")
    assert error.head == "CREATE TABLE clicks_per_user ..."
    assert str(error) == "line 3: CREATE TABLE clicks_per_user ...: unknown option 'x'"
    assert str(PipelineError("SELECT 1", 1, "m")) == "line 1: SELECT 1: m"
    assert str(PipelineError("", 7, "m")) == "line 7: m"

from __future__ import annotations

import datetime as dt
import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hotstate.controller.image import TableInfo
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.protocol.keys import KeyValue
from hotstate.query import fast
from hotstate.query.plan import plan
from hotstate.query.sql import (
    MAX_ANDS,
    MAX_LIMIT,
    MAX_NESTING,
    MAX_STATEMENT_CHARS,
    SLOW_PARSE_CHARS,
    Condition,
    InvalidSqlError,
    Op,
    PullQuery,
    QueryError,
    TupleIn,
    UnsupportedQueryError,
    parse,
    parse_cached,
    parse_fast,
    parse_timestamp,
)


def where(sql_where: str) -> tuple[Condition | TupleIn, ...]:
    return parse(f"SELECT * FROM t WHERE {sql_where}").conditions


def eq(column: str, value: KeyValue) -> Condition:
    return Condition(column, Op.EQ, (value,))


# --- the supported forms -------------------------------------------------------------------------------


def test_select_star() -> None:
    assert parse("SELECT * FROM pageviews") == PullQuery("pageviews", None, (), None)


def test_columns_limit_and_semicolon_keep_names_as_written() -> None:
    query = parse('select Id, `Page Url`, "views" from PageViews where ID = 5 limit 10;')
    assert query == PullQuery("PageViews", ("Id", "Page Url", "views"), (eq("ID", 5),), 10)


def test_limit_zero_and_columns_qualified_by_the_table() -> None:
    query = parse("SELECT t.a, T.b FROM t LIMIT 0")
    assert query.columns == ("a", "b")
    assert query.limit == 0
    assert parse("SELECT t.* FROM t").columns is None


def test_comments_and_whitespace() -> None:
    assert parse("/* hi */\n  SELECT *\n\tFROM t -- trailing\n ;\n").table == "t"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("k = 1", (eq("k", 1),)),
        ("1 = k", (eq("k", 1),)),
        ("k IN (1, 2, 2)", (Condition("k", Op.IN, (1, 2, 2)),)),
        ("k IN (5)", (Condition("k", Op.IN, (5,)),)),
        ("k < 3", (Condition("k", Op.LT, (3,)),)),
        ("k <= 3", (Condition("k", Op.LE, (3,)),)),
        ("k > 3", (Condition("k", Op.GT, (3,)),)),
        ("k >= 3", (Condition("k", Op.GE, (3,)),)),
        ("3 < k", (Condition("k", Op.GT, (3,)),)),
        ("3 >= k", (Condition("k", Op.LE, (3,)),)),
        ("k BETWEEN 1 AND 9", (Condition("k", Op.BETWEEN, (1, 9)),)),
        ("k >= 3 AND k < 10", (Condition("k", Op.GE, (3,)), Condition("k", Op.LT, (10,)))),
        ("a = 'x' AND b = 2", (eq("a", "x"), eq("b", 2))),
        ("(a = 'x') AND ((b = 2 AND c > 1))", (eq("a", "x"), eq("b", 2), Condition("c", Op.GT, (1,)))),
        ("a BETWEEN 1 AND 2 AND b = 3", (Condition("a", Op.BETWEEN, (1, 2)), eq("b", 3))),
        ("(a, b) IN ((1, 'x'), (2, 'y'))", (TupleIn(("a", "b"), ((1, "x"), (2, "y"))),)),
        ("(a, b) IN ((1, 'x'))", (TupleIn(("a", "b"), ((1, "x"),)),)),
        ("(a, b) = (1, 'x')", (TupleIn(("a", "b"), ((1, "x"),)),)),
        ("(1, 'x') = (a, b)", (TupleIn(("a", "b"), ((1, "x"),)),)),
        ("t.k = 1", (eq("k", 1),)),
        ("`my key` = 1", (eq("my key", 1),)),
    ],
)
def test_predicates(text: str, expected: tuple[Condition | TupleIn, ...]) -> None:
    assert where(text) == expected


@pytest.mark.parametrize(
    ("literal", "value"),
    [
        ("'it''s'", "it's"),
        ("''", ""),
        ("'back\\slash'", "back\\slash"),
        ("N'x'", "x"),
        ("42", 42),
        ("-7", -7),
        ("- -7", 7),
        ("+7", 7),
        ("(-(7))", -7),
        ("1.5", 1.5),
        ("-2.5e-3", -0.0025),
        (".5", 0.5),
        ("99999999999999999999", 99999999999999999999),
        ("TRUE", True),
        ("false", False),
        ("NULL", None),
        ("X'0aFF'", b"\x0a\xff"),
        ("x''", b""),
        ("0x00ff", b"\x00\xff"),
        ("TIMESTAMP '2026-01-02 03:04:05'", dt.datetime(2026, 1, 2, 3, 4, 5)),
        ("TIMESTAMP '2026-01-02T03:04:05.250Z'", dt.datetime(2026, 1, 2, 3, 4, 5, 250000, tzinfo=dt.UTC)),
        ("TIMESTAMP '2026-01-02'", dt.datetime(2026, 1, 2)),
        ("CAST('2026-01-02 03:04:05+02:00' AS TIMESTAMP)", dt.datetime(2026, 1, 2, 1, 4, 5, tzinfo=dt.UTC)),
        ("'2026-01-02 03:04:05'", "2026-01-02 03:04:05"),  # a plain string: the planner coerces it
    ],
)
def test_literals(literal: str, value: KeyValue) -> None:
    (condition,) = where(f"k = {literal}")
    assert isinstance(condition, Condition)
    (parsed,) = condition.values
    assert parsed == value
    assert type(parsed) is type(value)


def test_huge_float_literal_is_infinity() -> None:
    (condition,) = where("k = 1e400")
    assert isinstance(condition, Condition)
    assert condition.values == (math.inf,)


def test_parse_timestamp() -> None:
    assert parse_timestamp(" 2026-01-02 03:04:05 ") == dt.datetime(2026, 1, 2, 3, 4, 5)
    with pytest.raises(ValueError):
        parse_timestamp("yesterday")


# --- errors ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT * FROM a JOIN b ON a.k = b.k", "joins are not supported in pull queries"),
        ("SELECT * FROM a, b", "joins are not supported in pull queries"),
        ("SELECT * FROM t HAVING k > 1", "HAVING needs GROUP BY or an aggregate function"),
        ("SELECT DISTINCT k FROM t", "DISTINCT is not supported in pull queries"),
        ("SELECT * FROM t LIMIT 5 OFFSET 2", "OFFSET is not supported in pull queries"),
        ("SELECT * FROM t LIMIT 2, 5", "OFFSET is not supported in pull queries"),
        ("WITH a AS (SELECT 1) SELECT * FROM a", "WITH (common table expressions) is not supported"),
        ("SELECT * FROM t UNION SELECT * FROM u", "UNION is not supported in pull queries"),
        ("INSERT INTO t VALUES (1)", "only SELECT statements are pull queries"),
        ("DELETE FROM t", "only SELECT statements are pull queries"),
        ("SHOW TABLES", "only SELECT statements are pull queries"),
        ("CREATE TABLE t (k INT)", "only SELECT statements are pull queries"),
        ("SELECT 1", "a pull query needs FROM <table>"),
        ("SELECT *, k FROM t", "SELECT * cannot be combined with other columns"),
        ("SELECT * FROM db.t", "qualified table names are not supported: db.t"),
        ("SELECT * FROM t AS x", "table aliases are not supported: t AS x"),
        ("SELECT * FROM (SELECT * FROM t)", "subqueries are not supported in pull queries"),
        ("SELECT * FROM t WHERE k IN (SELECT k FROM u)", "subqueries are not supported in pull queries"),
        ("SELECT * FROM t WHERE k = ?", "query parameters are not supported: ?"),
        ("SELECT * FROM t WHERE k = -'a'", "unary - needs a number, got string in -'a'"),
        ("SELECT * FROM t WHERE k IN ()", "IN needs a list of values"),
        ("SELECT * FROM t WHERE (a, b) IN ((1, 2, 3))", "each row needs 2 values"),
        ("SELECT * FROM t WHERE (a, b) < (1, 2)", "row values are supported only with = and IN"),
        ("SELECT * FROM t LIMIT -1", "LIMIT must be a non-negative integer, got -1"),
        ("SELECT * FROM t LIMIT 1.5", "LIMIT must be a non-negative integer, got 1.5"),
        ("SELECT * FROM t LIMIT 'x'", "LIMIT must be a non-negative integer, got 'x'"),
        ("SELECT * FROM t LIMIT ALL", "LIMIT must be a non-negative integer, got ALL"),
        ("SELECT * FROM t FETCH FIRST 5 ROWS ONLY", "is not supported: use LIMIT n"),
        ("SELECT * FROM t; SELECT * FROM u", "one statement per query, got 2"),
        ("SELECT * FROM t EMIT CHANGES", "push queries (EMIT CHANGES / EMIT FINAL) are not supported"),
        ("SELECT * FROM t WHERE k = 1 EMIT CHANGES;", "push queries (EMIT CHANGES / EMIT FINAL)"),
    ],
)
def test_unsupported(sql: str, message: str) -> None:
    with pytest.raises(UnsupportedQueryError) as caught:
        parse(sql)
    assert message in str(caught.value)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM t WHERE k = 1 OR k = 2",
        "SELECT k FROM t GROUP BY k",
        "SELECT * FROM t ORDER BY k",
        "SELECT COUNT(*) FROM t",
        "SELECT UPPER(k) AS u FROM t",
        "SELECT k AS x FROM t",
        "SELECT k + 1 FROM t",
        "SELECT u.k FROM t",
        "SELECT * FROM t WHERE NOT k = 1",
        "SELECT * FROM t WHERE k NOT IN (1)",
        "SELECT * FROM t WHERE k NOT BETWEEN 1 AND 2",
        "SELECT * FROM t WHERE k != 1",
        "SELECT * FROM t WHERE k <> 1",
        "SELECT * FROM t WHERE k IS NULL",
        "SELECT * FROM t WHERE k IS NOT NULL",
        "SELECT * FROM t WHERE k LIKE 'a%'",
        "SELECT * FROM t WHERE UPPER(k) = 'A'",
        "SELECT * FROM t WHERE k = UPPER('a')",
        "SELECT * FROM t WHERE a = b",
        'SELECT * FROM t WHERE k = "x"',
        "SELECT * FROM t WHERE 1 = 1",
        "SELECT * FROM t WHERE k = 1 + 2",
        "SELECT * FROM t WHERE k IN (1, x)",
        "SELECT * FROM t WHERE k",
        "SELECT * FROM t WHERE k = DATE '2026-01-01'",
        "SELECT * FROM t WHERE (a, 1) IN ((1, 2))",
        "SELECT * FROM t WHERE 1 IN (1, 2)",
    ],
)
def test_beyond_key_predicates_is_a_scan(sql: str) -> None:
    # Once refused; now the replicas evaluate it (query/scan.py, tests/query/test_scan.py).
    assert parse(sql).scan is not None


def test_a_scan_keeps_its_plain_key_predicates_for_the_planner() -> None:
    query = parse("SELECT * FROM t WHERE k = 1 AND (v = 2 OR v = 3) AND k2 BETWEEN 1 AND 5")
    assert query.scan is not None
    assert query.conditions == (eq("k", 1), Condition("k2", Op.BETWEEN, (1, 5)))


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("", "the query is empty"),
        ("  ;  ", "the query is empty"),
        ("-- nothing", "the query is empty"),
        ("SELECT * FORM t", "invalid SQL"),
        (
            "SELECT * FROM t WHERE",
            "invalid SQL: Required keyword: 'this' missing for Where at line 1, column 21",
        ),
        ("SELECT k FROM", "Expected table name but got the end of the query at line 1, column 13"),
        ("SELECT * FROM t WHERE k = 'abc", "invalid SQL"),
        ("SELECT * FROM t WHERE k = X'1'", "invalid hex literal X'1'"),
        ("SELECT * FROM t WHERE k = TIMESTAMP 'noon'", "invalid TIMESTAMP literal 'noon'"),
        ("SELECT * FROM t WHERE k = TIMESTAMP 5", "invalid TIMESTAMP literal '5'"),
        ("SELECT * FROM t WHERE k = " + "9" * 5000, "invalid number 999"),
        ("SELECT * FROM t WHERE k = " + "(" * 5000 + "1" + ")" * 5000, "invalid SQL"),
    ],
)
def test_invalid(sql: str, message: str) -> None:
    with pytest.raises(InvalidSqlError) as caught:
        parse(sql)
    text = str(caught.value)
    assert message in text
    assert "\n" not in text and "\x1b" not in text and len(text) < 300


def test_error_kinds_are_value_errors() -> None:
    assert issubclass(InvalidSqlError, QueryError)
    assert issubclass(UnsupportedQueryError, QueryError)
    assert issubclass(QueryError, ValueError)


def test_long_chains_do_not_hit_the_recursion_limit() -> None:
    query = parse("SELECT * FROM t WHERE " + " AND ".join(["k = TIMESTAMP '2026-01-02'"] * 1001))
    assert len(query.conditions) == 1001
    assert where("k = " + "- " * 100 + "5") == (eq("k", 5),)
    with pytest.raises(InvalidSqlError, match="the query is nested too deeply"):
        parse("SELECT * FROM t WHERE k = " + "- " * 3000 + "5")


# --- limits: what would crash or stall the server later is refused up front, with a message ----------------


def test_a_statement_longer_than_the_limit_is_refused_before_parsing() -> None:
    padded = "SELECT * FROM t"
    assert parse(padded + " " * (MAX_STATEMENT_CHARS - len(padded))).table == "t"
    for sql in (padded + " " * (MAX_STATEMENT_CHARS + 1 - len(padded)), "(" * (MAX_STATEMENT_CHARS + 1)):
        with pytest.raises(UnsupportedQueryError) as caught:
            parse(sql)
        assert str(caught.value) == (
            f"the statement is {MAX_STATEMENT_CHARS + 1:,} characters long; at most "
            f"{MAX_STATEMENT_CHARS:,} are allowed"
        )


def test_the_planners_key_limit_fits_and_takes_the_fast_path() -> None:
    keys = [f"{i:020d}" for i in range(10_000)]  # 20-character string keys
    sql = "SELECT * FROM t WHERE k IN (" + ", ".join(f"'{key}'" for key in keys) + ");"
    assert len(sql) <= MAX_STATEMENT_CHARS
    assert parse_fast(sql) == PullQuery("t", None, (Condition("k", Op.IN, tuple(keys)),), None)
    assert len(sql) > SLOW_PARSE_CHARS


@pytest.mark.parametrize(
    ("sql", "where"),
    [
        ("SELECT * FROM t WHERE k = '\ud800'", "U+D800 at line 1, column 28"),
        ("SELECT *\nFROM t\nWHERE k = 'é\udfff'", "U+DFFF at line 3, column 13"),
        ("SELECT * FROM t -- \ud83d", "U+D83D at line 1, column 20"),
        ("SELECT * FROM t WHERE k = TIMESTAMP '\ud800'", "U+D800 at line 1, column 38"),
    ],
)
def test_a_lone_surrogate_is_an_error_naming_its_position(sql: str, where: str) -> None:
    with pytest.raises(InvalidSqlError) as caught:
        parse(sql)
    message = str(caught.value)
    assert where in message
    message.encode("utf-8")  # the message itself can be sent back


def test_a_limit_beyond_64_bits_is_refused_by_both_paths() -> None:
    assert parse(f"SELECT * FROM t LIMIT {MAX_LIMIT}").limit == MAX_LIMIT
    assert parse(f"SELECT * FROM t LIMIT 000{MAX_LIMIT}").limit == MAX_LIMIT
    for count in (str(MAX_LIMIT + 1), "9" * 5000):
        for sql in (f"SELECT * FROM t LIMIT {count}", f"SELECT * FROM t /* slow path */ LIMIT {count}"):
            with pytest.raises(UnsupportedQueryError, match=f"^LIMIT must be at most {MAX_LIMIT}, got"):
                parse(sql)
    with pytest.raises(UnsupportedQueryError, match="LIMIT must be at most"):
        fast.recognize(f"SELECT * FROM t LIMIT {MAX_LIMIT + 1}")


def test_deep_nesting_is_refused_before_sqlglot() -> None:
    def nested(depth: int) -> str:
        return "SELECT * FROM t WHERE " + "(" * depth + "k = 1" + ")" * depth

    assert where(f"k = {'(' * 20}1{')' * 20} AND k IN ('((((((((((((((((((((((((((((((((((((((')") == (
        eq("k", 1),
        Condition("k", Op.IN, ("(" * 38,)),
    )
    with pytest.raises(
        InvalidSqlError, match=f"nested too deeply \\(33 levels of parentheses; at most {MAX_NESTING}"
    ):
        parse(nested(MAX_NESTING + 1))
    started = time.monotonic()
    with pytest.raises(InvalidSqlError, match="nested too deeply"):
        parse(nested(200_000))
    assert time.monotonic() - started < 1


def test_too_many_ands_are_refused_by_both_paths() -> None:
    fast_shape = "SELECT * FROM t WHERE " + " AND ".join(["k = 1"] * (MAX_ANDS + 1))
    assert len(parse(fast_shape).conditions) == MAX_ANDS + 1
    between = "SELECT * FROM t WHERE " + " AND ".join(["k = 1"] * MAX_ANDS) + " AND k BETWEEN 1 AND 2"
    slow_shape = "SELECT * FROM t WHERE " + " AND ".join(["k = TIMESTAMP '2026-01-02'"] * (MAX_ANDS + 2))
    started = time.monotonic()
    for sql in (
        fast_shape + " AND k = 1",
        between,
        slow_shape,
        "SELECT * FROM t WHERE " + "k=1 AND " * 20_000,
    ):
        assert fast.recognize(sql) is None
        with pytest.raises(UnsupportedQueryError, match=f"ANDs; at most {MAX_ANDS:,} are allowed"):
            parse(sql)
    assert time.monotonic() - started < 1
    in_strings = "SELECT * FROM t /* slow path */ WHERE " + " AND ".join(["k = 'a AND b'"] * MAX_ANDS)
    assert len(parse(in_strings).conditions) == MAX_ANDS  # ANDs in strings do not count


def test_the_full_parser_caches_short_statements() -> None:
    sql = "SELECT * FROM t WHERE k = TIMESTAMP '2026-01-02' -- cached"
    assert parse_fast(sql) is None
    first = parse(sql)
    hits = parse_cached.cache_info().hits
    assert parse(sql) is first
    assert parse_cached.cache_info().hits == hits + 1


# --- round trip: every PullQuery the parser can produce, rendered as SQL, parses back to itself ----------

NAMES = st.text(alphabet="abcXYZ_ 0é", min_size=1, max_size=6)
FINITE = st.floats(allow_nan=False, allow_infinity=False)
LITERALS: st.SearchStrategy[KeyValue] = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    FINITE,
    st.text(alphabet=st.sampled_from("\x00\x01a'\"`\\\n é中😀") | st.characters(codec="utf-8"), max_size=8),
    st.binary(max_size=6),
    st.datetimes(),
)


def quoted(name: str) -> str:
    return "`" + name + "`"


def render(value: KeyValue) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, bytes):
        return "X'" + value.hex() + "'"
    assert isinstance(value, dt.datetime)
    return f"TIMESTAMP '{value.isoformat(sep=' ')}'"


_REVERSED = {Op.EQ: "=", Op.LT: ">", Op.LE: ">=", Op.GT: "<", Op.GE: "<="}


@st.composite
def conditions(draw: st.DrawFn) -> tuple[Condition | TupleIn, str]:
    kind = draw(st.sampled_from(["cmp", "reversed", "in", "between", "tuple"]))
    if kind == "tuple":
        columns = tuple(draw(st.lists(NAMES, min_size=2, max_size=3)))
        rows = draw(st.lists(st.tuples(*[LITERALS] * len(columns)), min_size=1, max_size=3))
        text = ", ".join("(" + ", ".join(render(v) for v in row) + ")" for row in rows)
        return TupleIn(columns, tuple(rows)), f"({', '.join(map(quoted, columns))}) IN ({text})"
    column = draw(NAMES)
    if kind == "in":
        values = tuple(draw(st.lists(LITERALS, min_size=1, max_size=4)))
        return Condition(column, Op.IN, values), f"{quoted(column)} IN ({', '.join(map(render, values))})"
    if kind == "between":
        low, high = draw(LITERALS), draw(LITERALS)
        text = f"{quoted(column)} BETWEEN {render(low)} AND {render(high)}"
        return Condition(column, Op.BETWEEN, (low, high)), text
    op = draw(st.sampled_from([Op.EQ, Op.LT, Op.LE, Op.GT, Op.GE]))
    value = draw(LITERALS)
    if kind == "reversed":
        return Condition(column, op, (value,)), f"{render(value)} {_REVERSED[op]} {quoted(column)}"
    return Condition(column, op, (value,)), f"{quoted(column)} {op.value} {render(value)}"


@settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    NAMES,
    st.none() | st.lists(NAMES, min_size=1, max_size=3),
    st.lists(conditions(), max_size=4),
    st.none() | st.integers(0, MAX_LIMIT),
)
def test_round_trip(
    table: str,
    columns: list[str] | None,
    predicates: list[tuple[Condition | TupleIn, str]],
    limit: int | None,
) -> None:
    sql = f"SELECT {'*' if columns is None else ', '.join(map(quoted, columns))} FROM {quoted(table)}"
    if predicates:
        sql += " WHERE " + " AND ".join(text for _, text in predicates)
    if limit is not None:
        sql += f" LIMIT {limit}"
    expected = PullQuery(
        table, None if columns is None else tuple(columns), tuple(p for p, _ in predicates), limit
    )
    assert parse(sql) == expected


# --- fuzzing: whatever the text, only the two error types come out --------------------------------------

VALID = [
    "SELECT * FROM t WHERE k = 1;",
    "SELECT a, `b c` FROM t WHERE k IN (1, 2, 3) LIMIT 5",
    "SELECT * FROM t WHERE a = 'x' AND b BETWEEN -1.5 AND 2e3",
    "SELECT * FROM t WHERE (a, b) IN ((1, 'x'), (2, 'y'))",
    "SELECT * FROM t WHERE ts >= TIMESTAMP '2026-01-02 03:04:05' AND ts < '2026-02-01'",
    "SELECT * FROM t WHERE b = X'00ff' AND c = TRUE AND d = NULL",
    "SELECT t.k FROM t WHERE 3 < k AND k <= 10 LIMIT 0",
]
FRAGMENTS = [
    *" ()',;`\"*=<>!-+.0123456789akKxX_\n\\é",
    "AND",
    "OR",
    "NOT",
    "SELECT",
    "FROM",
    "WHERE",
    "IN",
    "NULL",
    "TIMESTAMP",
    "LIMIT",
    "BETWEEN",
    "JOIN",
    "(SELECT 1)",
    "X'",
    "EMIT CHANGES",
    "CAST(",
    "AS",
    "GROUP BY",
    "$",
    "?",
    "@",
    ":",
    "[",
    "{",
    "--",
    "/*",
]


@st.composite
def mutated(draw: st.DrawFn) -> str:
    text = draw(st.sampled_from(VALID))
    for _ in range(draw(st.integers(1, 6))):
        at = draw(st.integers(0, len(text)))
        action = draw(st.sampled_from(["insert", "delete", "replace", "swap_words"]))
        fragment = draw(st.sampled_from(FRAGMENTS))
        if action == "insert":
            text = text[:at] + fragment + text[at:]
        elif action == "delete":
            text = text[:at] + text[at + draw(st.integers(1, 8)) :]
        elif action == "replace":
            text = text[:at] + fragment + text[at + len(fragment) :]
        else:
            words = text.split(" ")
            i, j = draw(st.integers(0, len(words) - 1)), draw(st.integers(0, len(words) - 1))
            words[i], words[j] = words[j], words[i]
            text = " ".join(words)
    return text


FUZZ_TABLE = TableInfo(
    "t",
    1,
    3,
    1,
    (KeyColumn("a", KeyType.INT), KeyColumn("b", KeyType.STRING), KeyColumn("k", KeyType.TIMESTAMP)),
    None,
)


def parse_and_plan(sql: str) -> None:
    try:
        query = parse(sql)
    except (InvalidSqlError, UnsupportedQueryError) as e:
        assert str(e)
        return
    try:
        plan(query, FUZZ_TABLE)
    except QueryError as e:
        assert str(e)


@settings(deadline=None, max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(mutated())
def test_fuzz_mutations_of_valid_queries(sql: str) -> None:
    parse_and_plan(sql)


@settings(deadline=None, max_examples=200)
@given(st.text(max_size=80) | st.lists(st.sampled_from(FRAGMENTS), max_size=20).map(" ".join))
def test_fuzz_random_text(sql: str) -> None:
    parse_and_plan(sql)

"""The expression module: compile errors, SQL semantics (NULL, types, LIKE) and sqlite3 as an oracle."""

from __future__ import annotations

import datetime as dt
import re
import sqlite3
from decimal import Decimal

import pytest
import sqlglot
from hypothesis import given, settings
from hypothesis import strategies as st

from hotstate.protocol.rows import Projection
from hotstate.query.dialect import PullDialect
from hotstate.query.expressions import (
    MAX_DEPTH,
    Call,
    Col,
    EvalError,
    ExpressionError,
    Lit,
    batch_evaluator,
    compile_expression,
    decode_node,
    encode_node,
    evaluator,
    like_matcher,
)
from hotstate.query.pull_query import QueryError


def where(sql: str) -> object:
    statement = sqlglot.parse_one(f"SELECT * FROM t WHERE {sql}", read=PullDialect)
    return compile_expression(statement.args["where"].this, "t")


def value(sql: str, row: dict[str, object] | None = None) -> object:
    node = where(sql)
    assert not isinstance(node, str)
    return evaluator(node)(row or {})  # type: ignore[arg-type]


# --- compile errors -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("'abc' > 5", "cannot compare string with number: 'abc' > 5 at line 1, column"),
        ("x + 'a' > 1", "+ needs a number, got string"),
        ("foo(x) = 1", "unknown function FOO"),
        ("x LIKE y", "LIKE takes a string literal as its pattern"),
        ("x LIKE 'a\\'", "ends with its escape character"),
        ("COUNT(*) > 1", "aggregate functions are not allowed here"),
        ("x IN (SELECT 1)", "subqueries are not supported"),
        ("CAST(x AS MAP<STRING, INT>) = 1", "CAST to"),
        ("NOT 5", "NOT needs a boolean, got number"),
        ("TIMESTAMP 'noon' > x", "invalid TIMESTAMP literal 'noon'"),
        ("5 LIKE 'a'", "LIKE needs a string, got number"),
    ],
)
def test_compile_errors(sql: str, message: str) -> None:
    with pytest.raises(QueryError) as caught:
        where(sql)
    assert message in str(caught.value)


def test_deep_nesting_is_refused_without_recursing() -> None:
    sql = " + ".join(["x"] * (MAX_DEPTH + 5)) + " > 1"
    with pytest.raises(ExpressionError, match="nested too deeply"):
        where(sql)
    where(" + ".join(["x"] * (MAX_DEPTH - 5)) + " > 1")


def test_a_window_function_is_named() -> None:
    statement = sqlglot.parse_one("SELECT ROW_NUMBER() OVER (ORDER BY x) FROM t", read=PullDialect)
    with pytest.raises(ExpressionError, match="window functions are not supported"):
        compile_expression(statement.expressions[0], "t")


# --- semantics ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("sql", "row", "expected"),
    [
        ("x = 1 AND y = 1", {"x": 1, "y": None}, None),
        ("x = 2 AND y = 1", {"x": 1, "y": None}, False),
        ("x = 1 OR y = 1", {"x": 1, "y": None}, True),
        ("x = 2 OR y = 1", {"x": 1, "y": None}, None),
        ("NOT y = 1", {"y": None}, None),
        ("y IS NULL", {"y": None}, True),
        ("y IS NOT NULL", {}, False),
        ("x IN (1, NULL)", {"x": 2}, None),
        ("x IN (2, NULL)", {"x": 2}, True),
        ("x NOT IN (1, 3)", {"x": 2}, True),
        ("x BETWEEN 1 AND 3", {"x": 3}, True),
        ("x NOT BETWEEN 1 AND 3", {"x": 4}, True),
        ("X = 1", {"x": 1}, True),  # names match whatever their case
        ("s.a.b = 1", {"s": {"a": {"b": 1}}}, True),
        ("t.x = 1", {"x": 1}, True),  # the table as qualifier
        ("x = 1.0", {"x": 1}, True),
        ("d = 1.5", {"d": Decimal("1.5")}, True),
        ("ts > '2026-01-01'", {"ts": dt.datetime(2026, 1, 2, tzinfo=dt.UTC)}, True),
        ("ts = TIMESTAMP '2026-01-02 01:00:00+01:00'", {"ts": dt.datetime(2026, 1, 2)}, True),
        ("day < '2026-01-01'", {"day": dt.date(2025, 12, 31)}, True),
        ("b = TRUE", {"b": True}, True),
        ("x % 3 = -1", {"x": -7}, True),
        ("x / 2 = 0.5", {"x": 1}, True),
        ("CAST(s AS INT) + 1 = 4", {"s": "3"}, True),
        ("CAST(s AS INT) IS NULL", {"s": "three"}, True),
        ("CASE WHEN x > 1 THEN 'big' ELSE 'small' END = 'big'", {"x": 2}, True),
        ("CASE x WHEN 1 THEN 'one' END IS NULL", {"x": 2}, True),
        ("LOWER(s) || 'x' = 'abx'", {"s": "AB"}, True),
        ("SUBSTRING(s, 2, 2) = 'bc'", {"s": "abcd"}, True),
        ("LENGTH(TRIM(s)) = 2", {"s": " ab "}, True),
        ("COALESCE(y, x) = 1", {"x": 1, "y": None}, True),
        ("ROUND(f, 1) = 2.3", {"f": 2.25}, True),
        ("YEAR(ts) = 2026 AND HOUR(ts) = 3", {"ts": dt.datetime(2026, 1, 2, 3)}, True),
        ("ABS(x) = 2 AND -x = 2", {"x": -2}, True),
    ],
)
def test_semantics(sql: str, row: dict[str, object], expected: object) -> None:
    assert value(sql, row) is expected


@pytest.mark.parametrize(
    ("sql", "row", "message"),
    [
        ("x > 5", {"x": "abc"}, "cannot compare string 'abc' with number 5"),
        ("x / 0 = 1", {"x": 1}, "division by zero"),
        ("x % 0 = 1", {"x": 1}, "division by zero"),
        ("x + 1 = 2", {"x": "a"}, "+ needs a number, got string"),
        ("x AND TRUE", {"x": 1}, "AND needs a boolean"),
        ("LOWER(x) = 'a'", {"x": 1}, "LOWER needs a string"),
    ],
)
def test_errors_on_a_row(sql: str, row: dict[str, object], message: str) -> None:
    with pytest.raises(EvalError, match=re.escape(message)):
        value(sql, row)


# --- LIKE -----------------------------------------------------------------------------------------------


def _like_reference(pattern: str, text: str) -> bool:
    regex = "".join(".*" if c == "%" else "." if c == "_" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, text, re.DOTALL) is not None


@given(st.text(alphabet="ab%_", max_size=8), st.text(alphabet="ab", max_size=10))
@settings(max_examples=400, deadline=None)
def test_like_matches_the_regex_reference(pattern: str, text: str) -> None:
    assert like_matcher(pattern, "\\", fold=False)(text) is _like_reference(pattern, text)


def test_like_escapes_and_ilike() -> None:
    assert value(r"s LIKE '100\%'", {"s": "100%"}) is True
    assert value(r"s LIKE '100\%'", {"s": "1000"}) is False
    assert value("s LIKE 'a!_b' ESCAPE '!'", {"s": "a_b"}) is True
    assert value("s ILIKE 'AB%'", {"s": "abc"}) is True
    assert value("s NOT LIKE 'a%'", {"s": "abc"}) is False


def test_like_on_a_pattern_that_makes_regex_engines_backtrack_is_linear() -> None:
    # `(a%)*b` style: a backtracking matcher tries every split of the a's between the %s.
    match = like_matcher("%a%a%a%a%a%a%a%a%a%a%b", "\\", fold=False)
    assert not match("a" * 20_000)
    assert match("a" * 20_000 + "b")


# --- the wire -------------------------------------------------------------------------------------------


def test_nodes_travel_as_a_flat_list() -> None:
    node = where("ts > TIMESTAMP '2026-01-02 03:04:05' AND (d = 1.5 OR s LIKE 'a%') AND x IN (1, 2)")
    assert decode_node(encode_node(node)) == node  # type: ignore[arg-type]
    deep: object = Col("x")
    for _ in range(150):
        deep = Call("neg", (deep,))  # type: ignore[arg-type]
    assert decode_node(encode_node(deep)) == deep  # type: ignore[arg-type]


@pytest.mark.parametrize("items", [[], [["l", 1], ["l", 2]], [["nope", 0]], [["and", 2]], "x"])
def test_bad_node_lists_are_refused(items: list[object]) -> None:
    with pytest.raises(ValueError):
        decode_node(items)


def test_lit_and_col_are_plain_values() -> None:
    assert Lit(1) == Lit(1) and Col("a") != Col("a", ("b",))


# --- sqlite3 as the oracle ------------------------------------------------------------------------------

_values = st.one_of(st.none(), st.integers(-3, 3))


def _expressions() -> st.SearchStrategy[str]:
    leaves = st.one_of(st.sampled_from(["a", "b", "c"]), st.integers(-3, 3).map(str))
    arithmetic = st.recursive(
        leaves,
        lambda inner: st.tuples(inner, st.sampled_from(["+", "-", "*"]), inner).map(
            lambda t: f"({t[0]} {t[1]} {t[2]})"
        ),
        max_leaves=3,
    )
    comparisons = st.one_of(
        st.tuples(arithmetic, st.sampled_from(["=", "<>", "<", "<=", ">", ">="]), arithmetic).map(" ".join),
        st.tuples(arithmetic, st.lists(arithmetic, min_size=1, max_size=3)).map(
            lambda t: f"{t[0]} IN ({', '.join(t[1])})"
        ),
        st.tuples(arithmetic, arithmetic, arithmetic).map(lambda t: f"{t[0]} BETWEEN {t[1]} AND {t[2]}"),
        arithmetic.map(lambda e: f"{e} IS NULL"),
        arithmetic.map(lambda e: f"{e} IS NOT NULL"),
    )
    return st.recursive(
        comparisons,
        lambda inner: st.one_of(
            st.tuples(inner, st.sampled_from(["AND", "OR"]), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
            inner.map(lambda e: f"NOT ({e})"),
        ),
        max_leaves=4,
    )


@given(_expressions(), st.lists(st.tuples(_values, _values, _values), max_size=12))
@settings(max_examples=300, deadline=None)
def test_where_agrees_with_sqlite(sql: str, rows: list[tuple[object, object, object]]) -> None:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (id INTEGER, a INTEGER, b INTEGER, c INTEGER)")
    db.executemany("INSERT INTO t VALUES (?, ?, ?, ?)", [(i, *row) for i, row in enumerate(rows)])
    expected = [i for (i,) in db.execute(f"SELECT id FROM t WHERE {sql} ORDER BY id")]
    test = evaluator(where(sql))  # type: ignore[arg-type]
    got = [i for i, (a, b, c) in enumerate(rows) if test({"a": a, "b": b, "c": c}) is True]
    assert got == expected, sql


# --- the batch form of simple conditions ------------------------------------------------------------------

_batch_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.floats(-5, 5),
    st.just(float("nan")),
    st.sampled_from(["a", "b", "5", ""]),
    st.sampled_from([Decimal("1.5"), Decimal(3)]),
)
_batch_constants = st.one_of(st.integers(-5, 5), st.floats(-5, 5), st.sampled_from(["a", "b", "5"]))
_comparisons = st.builds(
    lambda op, column, constant: Call(op, (Col(column), Lit(constant))),
    st.sampled_from(["=", "!=", "<", "<=", ">", ">="]),
    st.sampled_from(["x", "y"]),
    _batch_constants,
)
_conditions = st.one_of(_comparisons, st.builds(lambda a, b: Call("and", (a, b)), _comparisons, _comparisons))


@settings(max_examples=300)
@given(
    _conditions,
    st.one_of(
        # whole lists of one kind, which the batch form takes, and mixed ones, which it gives back
        st.lists(st.tuples(st.integers(-5, 5), st.integers(-5, 5)), max_size=8),
        st.lists(
            st.tuples(st.one_of(st.floats(-5, 5), st.just(float("nan"))), st.integers(-5, 5)), max_size=8
        ),
        st.lists(st.tuples(st.sampled_from(["a", "b", "5"]), st.sampled_from(["a", "b"])), max_size=8),
        st.lists(st.tuples(_batch_values, _batch_values), max_size=8),
    ),
)
def test_the_batch_form_answers_as_the_row_evaluator_does(
    condition: Call, pairs: list[tuple[object, object]]
) -> None:
    projection = Projection(["x", "y"])
    rows = [projection.of_row(pair) for pair in pairs]
    batch = batch_evaluator(condition, projection.readers)
    assert batch is not None
    answer = batch(rows)
    if answer is None:
        return  # a list the batch form does not take: the scan evaluates it row by row
    one = evaluator(condition, projection.readers)
    assert list(answer) == [one(row) for row in rows]


def test_the_batch_form_takes_lists_of_the_constants_type_and_no_other_conditions() -> None:
    projection = Projection(["x", "y"])
    readers = projection.readers
    rows = [projection.of_row((value, "s")) for value in (1, 7, 7, 3)]
    equal = batch_evaluator(Call("=", (Col("x"), Lit(7))), readers)
    assert equal is not None
    assert list(equal(rows) or ()) == [False, True, True, False]
    less = batch_evaluator(Call("<", (Col("x"), Lit(2.5))), readers)
    assert less is not None
    assert list(less(rows) or ()) == [True, False, False, False]  # ints against a float constant
    # A NULL, a bool or a string among the values: given back, so NULL and coercion keep their rules.
    for odd in (None, True, "7"):
        assert equal([*rows, projection.of_row((odd, "s"))]) is None
    # Anything but a top-level column against a number or string constant has no batch form.
    for node in (
        Call("or", (Call("=", (Col("x"), Lit(7))), Call("=", (Col("y"), Lit("s"))))),
        Call("=", (Col("x"), Col("y"))),
        Call("=", (Col("x", ("f",)), Lit(1))),
        Call("=", (Col("x"), Lit(None))),
        Call("=", (Col("x"), Lit(dt.date(2026, 1, 1)))),
        Call("and", (Call("=", (Col("x"), Lit(7))), Call("in", (Col("y"), Lit("s"))))),
    ):
        assert batch_evaluator(node, readers) is None

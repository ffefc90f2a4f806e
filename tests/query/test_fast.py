"""The fast path (fast.py) against the full sqlglot parser: same PullQuery, or it stays out of the way."""

from __future__ import annotations

import inspect
import itertools
import re
import time
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlglot import parser as sqlglot_parser
from sqlglot import tokens as sqlglot_tokens

from hotstate.query import fast
from hotstate.query import sql as sql_module
from hotstate.query.sql import MAX_STATEMENT_CHARS, Condition, Op, PullQuery, QueryError, parse, parse_fast


def full(sql: str) -> PullQuery | type[QueryError]:
    """What the sqlglot parser makes of `sql` (no fast path, no cache): the query or the error class."""
    try:
        return sql_module._parse_full(sql)
    except QueryError as error:
        return type(error)


def fast_path(sql: str) -> PullQuery | type[QueryError] | None:
    try:
        return fast.recognize(sql)
    except QueryError as error:
        return type(error)


def assert_agrees(sql: str) -> PullQuery | None:
    """The fast path's answer (None: left to the full parser) after checking it against the full one."""
    got, expected = fast_path(sql), full(sql)
    if isinstance(got, type):
        assert got is expected, sql
        return None
    if got is not None:
        # repr as well as ==: 1 == 1.0 == True, and -0.0 == 0.0, but the parsers must agree on types too.
        assert got == expected, sql
        assert repr(got) == repr(expected), sql
    assert repr(parse(sql) if isinstance(expected, PullQuery) else expected) == repr(expected)
    return got


# --- the shapes the fast path must take ------------------------------------------------------------------

CANONICAL = {
    "SELECT * FROM bench WHERE user = 'user-000123';": PullQuery(
        "bench", None, (Condition("user", Op.EQ, ("user-000123",)),), None
    ),
    "SELECT * FROM t WHERE k IN ('a', 'b', 'a')": PullQuery(
        "t", None, (Condition("k", Op.IN, ("a", "b", "a")),), None
    ),
    'select a, `B c`, "d" from T where x = 1 and y = -2.5 and z = TRUE limit 10;': PullQuery(
        "T",
        ("a", "B c", "d"),
        (Condition("x", Op.EQ, (1,)), Condition("y", Op.EQ, (-2.5,)), Condition("z", Op.EQ, (True,))),
        10,
    ),
    "SELECT * FROM t LIMIT 0": PullQuery("t", None, (), 0),
    "SELECT *\n\tFROM t\r\nWHERE k >= 3 AND k < 10 AND j BETWEEN 'a' AND 'b'": PullQuery(
        "t",
        None,
        (Condition("k", Op.GE, (3,)), Condition("k", Op.LT, (10,)), Condition("j", Op.BETWEEN, ("a", "b"))),
        None,
    ),
    "SELECT * FROM t WHERE k IN (-7, .5, 2e-3, 1., 'it''s', NULL, false)": PullQuery(
        "t", None, (Condition("k", Op.IN, (-7, 0.5, 0.002, 1.0, "it's", None, False)),), None
    ),
}


@pytest.mark.parametrize("sql", CANONICAL)
def test_the_common_shapes_take_the_fast_path(sql: str) -> None:
    assert fast.recognize(sql) == CANONICAL[sql]
    assert assert_agrees(sql) is not None


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM t WHERE k = TIMESTAMP '2026-01-02'",
        "SELECT * FROM t WHERE k = X'0a'",
        "SELECT * FROM t WHERE k = 0x0a",
        "SELECT * FROM t WHERE (a, b) IN ((1, 2))",
        "SELECT * FROM t WHERE (k = 1)",
        "SELECT * FROM t WHERE 1 = k",
        "SELECT * FROM t WHERE k = - -1",
        "SELECT * FROM t WHERE k = --1\n",
        "SELECT * FROM t /* c */ WHERE k = 1",
        "SELECT date FROM t",
        "SELECT * FROM t WHERE k = 1AND j = 2",
        "SELECT * FROM t WHERE k\u00a0= 1",
        "SELECT * FROM t WHERE k = 1;;",
        "SELECT `` FROM t",
        "SELECT * FROM t WHERE k IN ()",
        "SELECT * FROM t WHERE k = 1 EMIT CHANGES",
        "SELECT * FROM t LIMIT 1.5",
        "SELECT * FROM t WHERE k = " + "9" * 5000,
    ],
)
def test_anything_else_is_left_to_the_full_parser(sql: str) -> None:
    assert fast.recognize(sql) is None
    assert_agrees(sql)


def test_a_long_in_list_is_fast_and_exact() -> None:
    keys = [f"user-{i:015d}" for i in range(10_000)]
    sql = "SELECT * FROM t WHERE k IN (" + ", ".join(f"'{key}'" for key in keys) + ")"
    assert fast.recognize(sql) == PullQuery("t", None, (Condition("k", Op.IN, tuple(keys)),), None)


# --- every word sqlglot might treat specially, in every place a name can stand ----------------------------

_SOURCES = inspect.getsource(sqlglot_parser) + inspect.getsource(sqlglot_tokens)
SPECIAL_WORDS = sorted(
    {
        *re.findall(r"\"([A-Za-z_][A-Za-z0-9_]*)\"", _SOURCES),
        *sqlglot_parser.Parser.FUNCTIONS,
        *sqlglot_tokens.Tokenizer.KEYWORDS,
    }
)
PLACES = [
    "SELECT {w} FROM t",
    "SELECT a, {w} FROM t",
    "SELECT * FROM {w}",
    "SELECT * FROM {w} WHERE k = 1",
    "SELECT * FROM {w} LIMIT 1",
    "SELECT * FROM t WHERE {w} = 1",
    "SELECT * FROM t WHERE {w} IN (1)",
    "SELECT * FROM t WHERE {w} BETWEEN 1 AND 2",
    "SELECT * FROM t WHERE k = 1 AND {w} >= 'x'",
    "SELECT * FROM t WHERE k = {w}",
]


@pytest.mark.parametrize("place", PLACES)
def test_special_words_as_names(place: str) -> None:
    for word in SPECIAL_WORDS:
        assert_agrees(place.format(w=word.lower()))


# --- generated statements, in and slightly outside the fast path's grammar ----------------------------------

# Strategies are built once here: building them inside each draw made every example take milliseconds.
KEYWORDS = ["select", "FROM", "Where", "and", "IN", "between", "LIMIT", "date", "TIMESTAMP", "key", "Any"]
KEYWORDS += ["user", "Order", "group", "null", "TRUE", "next", "IF", "case", "format", "all", "row"]
CASING: st.SearchStrategy[Callable[[str], str]] = st.sampled_from([str, str.lower, str.upper, str.capitalize])
SPACE = st.sampled_from([" ", "  ", "\t", "\n", "\r\n", " \f", "\v "])
GAP = st.sampled_from(["", "", " ", "\n"])
ODD_SPACE = st.sampled_from(["", "\u00a0", " /* c */ ", " -- c\n", "\x1c", "\u2028"])
LETTERS = "abcxyzABCXYZ_"
WORDS = st.builds(
    str.__add__, st.sampled_from(LETTERS), st.text(alphabet=LETTERS + "019", max_size=5)
).filter(lambda word: word.upper() not in fast._RESERVED)
QUOTED = st.builds(
    lambda quote, text: quote + text + quote,
    st.sampled_from('`"'),
    st.text(alphabet="ab Z_'é\n-", min_size=1, max_size=5),
)
# Outside the grammar: keywords as names, empty and escaped quoted names.
ODD_NAMES = st.builds(lambda case, word: case(word), CASING, st.sampled_from(KEYWORDS)) | st.sampled_from(
    ["``", '""', "`a``b`", '"a""b"', "`a\\`", "t.k", "a$", "é"]
)
STRINGS = st.text(alphabet=st.sampled_from("a'\"`\\ %é中😀\n\t()") | st.characters(codec="utf-8"), max_size=8)
INTEGERS = st.integers(0, 10**6) | st.integers(0, 10**40) | st.sampled_from([0, 9, 2**63])
FLOATS = st.sampled_from(
    ["1.5", ".5", "1.", "1e5", "1E+5", "2e-3", "0.0", "00.50", "1.5e400", "3.14159265358979"]
)
NUMBERS = st.builds(str.__add__, st.sampled_from(["", "", "-", "- ", "-\n"]), INTEGERS.map(str) | FLOATS)
WORD_VALUES = st.builds(lambda case, word: case(word), CASING, st.sampled_from(["TRUE", "FALSE", "NULL"]))
VALUES = STRINGS.map(lambda text: "'" + text.replace("'", "''") + "'") | NUMBERS | WORD_VALUES
ODD_VALUES = st.sampled_from(
    ["+7", "- -7", "X'0a'", "0x0a", "TIMESTAMP '2026-01-02'", "N'x'", "1e", "1.5.3", "?", "-'a'", "'open"]
)
ODD_VALUES |= st.sampled_from(
    ["(1)", "k", "1_000", "1d", "--1", ". 5", "-", "1 + 1", "TRUE'x'", "'a' 'b'", "9" * 5000]
)
ODD_TAIL = st.sampled_from([",", ";;", "; SELECT 1", ")", "(", "AND", "*", "LIMIT", "WHERE", "'", "`", "-"])
ODD_COMMA = st.sampled_from([",,", "", ";", " , ,", "AND"])
COMPARISONS = st.sampled_from(["=", "<", "<=", ">", ">="])
ODD_CONDITIONS = st.sampled_from(
    ["1 = k", "k != 1", "k <> 1", "k == 1", "(k = 1)", "(k, b) IN ((1, 2))", "k IN (1,)", "k IN ()"]
)
ODD_CONDITIONS |= st.sampled_from(
    ["k NOT IN (1)", "k = 1 OR k = 2", "k IS NULL", "k = 1 AND", "k BETWEEN 1", "k IN (1"]
)


@st.composite
def statements(draw: st.DrawFn, strict: bool = False) -> str:
    """A statement of the fast path's grammar; unless `strict`, now and then with something just outside."""

    def odd() -> bool:
        return not strict and draw(st.integers(0, 14)) == 0

    def space() -> str:
        return draw(ODD_SPACE if odd() else SPACE)

    def gap() -> str:
        return draw(ODD_SPACE if odd() else GAP)

    def keyword(word: str) -> str:
        return space() + draw(CASING)(word) + space()

    def name() -> str:
        return draw(ODD_NAMES if odd() else WORDS | QUOTED)

    def value() -> str:
        return draw(ODD_VALUES if odd() else VALUES)

    def listed(items: list[str]) -> str:
        text = gap() + items[0] + gap()
        for item in items[1:]:
            text += (draw(ODD_COMMA) if odd() else ",") + gap() + item + gap()
        return text

    def condition() -> str:
        if odd():
            return draw(ODD_CONDITIONS)
        column, kind = name(), draw(st.sampled_from(["cmp", "cmp", "in", "between"]))
        if kind == "cmp":
            return column + gap() + draw(COMPARISONS) + gap() + value()
        if kind == "in":
            pool = [value() for _ in range(draw(st.integers(1, 3)))]
            items = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=5))  # duplicates too
            return column + keyword("IN") + "(" + listed(items) + ")"
        return column + keyword("BETWEEN") + value() + keyword("AND") + value()

    if draw(st.booleans()):
        columns = gap() + "*" + gap()
    else:
        columns = listed([name() for _ in range(draw(st.integers(1, 3)))])
    text = gap() + draw(CASING)("SELECT") + space() + columns + keyword("FROM") + name()
    if draw(st.booleans()):
        text += keyword("WHERE") + keyword("AND").join(condition() for _ in range(draw(st.integers(1, 4))))
    if draw(st.booleans()):
        limit = draw(st.integers(0, 100) | st.sampled_from([2**63 - 1, 2**63, 10**30]))
        count = draw(st.sampled_from([str(limit), "0" + str(limit)]))
        text += keyword("LIMIT") + ("-1" if odd() else count)
    if draw(st.booleans()):
        text += gap() + ";"
    return text + gap() + (draw(ODD_TAIL) if odd() else "")


PROPERTY = settings(deadline=None, max_examples=1000, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(statements())
@example("SELECT * FROM t WHERE k = -0.0")
@example("SELECT * FROM t WHERE k IN (1, 1.0, TRUE)")
@example("SELECT a FROM a LIMIT 9223372036854775808,")  # a syntax error, not the LIMIT, is the error
def test_fast_path_agrees_with_the_full_parser(sql: str) -> None:
    assert_agrees(sql)


@PROPERTY
@given(statements(strict=True))
def test_statements_in_the_grammar_take_the_fast_path(sql: str) -> None:
    assert fast_path(sql) is not None, sql
    assert_agrees(sql)


@PROPERTY
@given(statements(), st.lists(STRINGS, min_size=1, max_size=8))
@example("SELECT * FROM t WHERE k = 'a'", ["b"])
@example("SELECT * FROM t WHERE k IN ('a', 1, 'b')", ["x'y", "é"])
@example("SELECT * FROM t WHERE k = x'ab'", ["cd"])  # never a shape, whatever the literal
@example("SELECT * FROM t WHERE k = 'a' 'b'", ["c", "d"])
@example("SELECT * FROM t WHERE k = 'ab''", ["c"])  # an unterminated literal stays in the text
@example("SELECT * FROM t WHERE k = 'a' AND j = 'b", ["c"])  # an unpaired quote, no '': not split at quotes
@example("SELECT * FROM t WHERE k IN ('a', 'b')", ["", "c"])  # an empty literal is a '' in the text
def test_statements_of_one_shape_with_other_literals_agree_with_the_tokenizer(
    sql: str, others: list[str]
) -> None:
    """The shape cache: after `sql`, the same statement with other string literals is read as the
    tokenizer (and the full parser) reads it."""
    fast._SHAPES.clear()
    assert fast_path(sql) == fast_path_uncached(sql)
    replacements = itertools.cycle(others)  # a statement may hold more literals than `others`
    other = fast._LITERAL.sub(lambda _: "'" + next(replacements).replace("'", "''") + "'", sql)
    assert fast_path(other) == (fast_path_uncached(other)), (sql, other)
    assert_agrees(other)


def fast_path_uncached(sql: str) -> PullQuery | type[QueryError] | None:
    try:
        return fast._recognize(sql)
    except QueryError as error:
        return type(error)


def test_a_statement_of_a_seen_shape_is_cut_not_tokenized() -> None:
    fast._SHAPES.clear()
    first = fast.recognize("SELECT * FROM t WHERE k IN ('a', 'b''c')")
    assert first == PullQuery("t", None, (Condition("k", Op.IN, ("a", "b'c")),), None)
    assert len(fast._SHAPES) == 1
    second = fast.recognize("SELECT * FROM t WHERE k IN ('x', 'y')")
    assert second == PullQuery("t", None, (Condition("k", Op.IN, ("x", "y")),), None)
    assert len(fast._SHAPES) == 1
    assert fast.recognize("SELECT * FROM \"t\" WHERE k = 'a'") is not None  # a quoted name: not cut
    assert len(fast._SHAPES) == 1


# --- linear time: a statement at the size limit is scanned in milliseconds, whatever it holds -------------

_BODY = MAX_STATEMENT_CHARS - 100
ADVERSARIAL = {
    "trailing whitespace": "SELECT * FROM t" + " " * _BODY,
    "digits then a letter": "SELECT * FROM t WHERE k = " + "9" * _BODY + "x",
    "a word then a symbol": "SELECT * FROM t WHERE " + "a" * _BODY + "$",
    "an open string": "SELECT * FROM t WHERE k = '" + "a" * _BODY,
    "open comments": "SELECT * FROM t WHERE k = " + "/*" * (_BODY // 2),
    "a minus then whitespace": "SELECT * FROM t WHERE k = -" + " " * _BODY + "x",
    "whitespace then a symbol": "SELECT * FROM t WHERE k = 1" + " \n" * (_BODY // 2) + "$",
    "empty IN items": "SELECT * FROM t WHERE k IN (" + "," * _BODY + ")",
    "many IN lists": "SELECT * FROM t WHERE k IN (1" + ") AND k IN (1" * (_BODY // 14) + ")",
}


@pytest.mark.parametrize("sql", ADVERSARIAL.values(), ids=ADVERSARIAL.keys())
def test_the_fast_path_and_the_checks_take_linear_time(sql: str) -> None:
    started = time.monotonic()
    try:
        parse_fast(sql)
        sql_module._check_complexity(sql)
    except QueryError:
        pass
    assert time.monotonic() - started < 1  # a quadratic scan of 512 KiB takes minutes

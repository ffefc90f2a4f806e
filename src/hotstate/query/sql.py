"""Pull-query SQL, parsed with sqlglot into a `PullQuery`; anything else is an error that says what.

The language (ksqlDB's pull queries, minus what needs a filter over scanned rows):

    SELECT * | col, ...  FROM table  [WHERE predicate AND ...]  [LIMIT n]  [;]

    predicate:  col = v   col IN (v, ...)   col < v   col <= v   col > v   col >= v
                col BETWEEN lo AND hi (both ends included)   (c1, c2) IN ((a, b), ...)   (c1, c2) = (a, b)
                a literal may stand on the left (`3 < k` is `k > 3`); parentheses may group ANDs
    values:     'string' ('' escapes a quote), 42, -7, 1.5, 2e-3, TRUE, FALSE, NULL,
                TIMESTAMP '2026-01-02 03:04:05' (ISO-8601; naive means UTC), X'0aff' or 0x0aff (BYTES)
    LIMIT:      a non-negative integer literal; LIMIT 0 is allowed

Identifiers may be quoted with `backticks` (as in ksqlDB) or "double quotes"; strings take single
quotes. ksqlDB upper-cases unquoted identifiers and matches quoted ones exactly. We keep every name as
written and match it case-insensitively (the planner against the key columns, the reader against row
columns), so `id`, `ID` and `Id` are one column whether quoted or not: tables are made from PySpark
DataFrames, whose column names are case-insensitive by default.

Which columns are key columns and whether values fit their types is the planner's business (plan.py).

Parsing is fast for the common shapes (fast.py recognizes them without sqlglot in a few microseconds); the
rest goes to sqlglot, behind a cache of recent statements. Before any parsing a statement is refused if it
is longer than MAX_STATEMENT_CHARS or holds a lone surrogate, and before sqlglot if it nests parentheses
deeper than MAX_NESTING or has more than MAX_ANDS ANDs. A server should parse a statement that
`parse_fast` leaves to the full parser in a worker thread when it is longer than SLOW_PARSE_CHARS.
"""

from __future__ import annotations

import datetime as dt
import functools
import itertools
import re
from collections.abc import Sequence
from typing import Any, Final

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from hotstate.protocol.keys import KeyValue
from hotstate.query.dialect import PullDialect
from hotstate.query.fast import recognize
from hotstate.query.pull_query import (
    MAX_ANDS,
    MAX_LIMIT,
    Condition,
    InvalidSqlError,
    Op,
    Predicate,
    PullQuery,
    QueryError,
    TupleIn,
    UnsupportedQueryError,
    limit_count,
    shortened,
)
from hotstate.query.select import SCAN_CLAUSES, and_terms, select_query

__all__ = [
    "MAX_ANDS",
    "MAX_LIMIT",
    "MAX_NESTING",
    "MAX_STATEMENT_CHARS",
    "SLOW_PARSE_CHARS",
    "Condition",
    "InvalidSqlError",
    "Op",
    "Predicate",
    "PullQuery",
    "QueryError",
    "TupleIn",
    "UnsupportedQueryError",
    "limit_count",
    "parse",
    "parse_fast",
    "parse_timestamp",
]

# The planner looks up at most 10,000 keys (plan's max_keys); as an IN list of typical 20-character string
# keys that is 10,000 x len("'<20 chars>', ") = 240,000 characters, so twice that still fits. Longer text
# is refused before any parsing: sqlglot takes 0.4-1.2 us per character.
MAX_STATEMENT_CHARS: Final = 512 * 1024
# At 0.4-1.2 us per character, sqlglot takes at most ~5 ms for a statement this long that the fast path
# leaves to it: about the GIL's switch interval, which is what parsing it in a worker thread would make
# the event loop wait anyway. Longer ones should be parsed in a worker thread.
SLOW_PARSE_CHARS: Final = 4096
# sqlglot recurses ~20 Python frames per parenthesis and fails at about 49 levels with the default
# recursion limit (fewer on a deeper call stack); refusing beyond 32 makes the outcome not depend on
# where parse() is called from.
MAX_NESTING: Final = 32
# Statements the full parser answered, by their exact text; only short ones, so that the cache holds at
# most a few MB (a client sending distinct long statements must not pin 1,024 x 512 KiB).
_CACHE_ENTRIES = 1024
_CACHED_CHARS = SLOW_PARSE_CHARS


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_CLASS_REPR = re.compile(r"<class '(?:[\w.]+\.)?(\w+)'>")
_TOKEN_REPR = re.compile(r"<Token token_type: TokenType\.(\w+), text: (.*?), line: [^>]*>")
_DIGITS = re.compile(r"[0-9]+")
_SURROGATE = re.compile(r"[\ud800-\udfff]")
# What nesting and AND counts are taken from: strings, quoted names and comments are skipped, roughly as
# sqlglot reads them. An unterminated one runs to the end of the text (sqlglot then fails early, or reads
# a comment to the end); stopping it anywhere else would rescan the rest from each such start.
_SKIPPED = re.compile(
    r"""'[^']*+(?:'|\Z)|`[^`]*+(?:`|\Z)|"[^"]*+(?:"|\Z)|--[^\n\r]*+|/\*[\s\S]*?(?:\*/|\Z)"""
)
_AND = re.compile(r"\bAND\b|&&", re.IGNORECASE)
_NOT_PAREN = re.compile(r"[^()]+")
_TIMESTAMP_TYPES = frozenset(
    {
        exp.DataType.Type.TIMESTAMP,
        exp.DataType.Type.TIMESTAMPTZ,
        exp.DataType.Type.TIMESTAMPLTZ,
        exp.DataType.Type.TIMESTAMPNTZ,
        exp.DataType.Type.DATETIME,
    }
)
_COMPARISONS: dict[type[exp.Expression], Op] = {
    exp.EQ: Op.EQ,
    exp.LT: Op.LT,
    exp.LTE: Op.LE,
    exp.GT: Op.GT,
    exp.GTE: Op.GE,
}
_FLIPPED = {Op.EQ: Op.EQ, Op.LT: Op.GT, Op.LE: Op.GE, Op.GT: Op.LT, Op.GE: Op.LE}
_SELECT_ARGS = frozenset({"expressions", "from", "from_", "where", "limit"})
# What each other SELECT clause is called in messages (sqlglot's argument names are not SQL).
_CLAUSES = {
    "with": "WITH (common table expressions) is",
    "with_": "WITH (common table expressions) is",
    "distinct": "DISTINCT is",
    "joins": "joins are",
    "laterals": "LATERAL is",
    "pivots": "PIVOT is",
    "group": "GROUP BY is",
    "having": "HAVING is",
    "qualify": "QUALIFY is",
    "windows": "WINDOW is",
    "order": "ORDER BY is",
    "sort": "SORT BY is",
    "distribute": "DISTRIBUTE BY is",
    "cluster": "CLUSTER BY is",
    "offset": "OFFSET is",
    "sample": "TABLESAMPLE is",
    "into": "SELECT INTO is",
    "locks": "FOR UPDATE is",
    "hint": "query hints are",
    "connect": "CONNECT BY is",
    "prewhere": "PREWHERE is",
    "match": "MATCH_RECOGNIZE is",
}
_PUSH_QUERY = "push queries (EMIT CHANGES / EMIT FINAL) are not supported: only pull queries are"


def parse(sql: str) -> PullQuery:
    """The pull query in `sql`; raises InvalidSqlError or UnsupportedQueryError, never anything else."""
    query = parse_fast(sql)
    if query is not None:
        return query
    return parse_cached(sql) if len(sql) <= _CACHED_CHARS else _parse_full(sql)


def parse_fast(sql: str) -> PullQuery | None:
    """The pull query in `sql` if it has one of the common shapes (a few microseconds), None if it needs
    the full parser: then call `parse`, in a worker thread if `len(sql) > SLOW_PARSE_CHARS`. Raises as
    `parse` does for a statement that is too long, is not valid Unicode or has a LIMIT beyond 64 bits."""
    if len(sql) > MAX_STATEMENT_CHARS:
        raise UnsupportedQueryError(
            f"the statement is {len(sql):,} characters long; at most {MAX_STATEMENT_CHARS:,} are allowed"
        )
    if not sql.isascii():
        _check_surrogates(sql)
    return recognize(sql)


def _check_surrogates(sql: str) -> None:
    # Python strings from JSON may hold lone surrogates ("\ud800"), which cannot be encoded as UTF-8: the
    # statement (echoed in a response) would fail later, far from its cause.
    found = _SURROGATE.search(sql)
    if found is None:
        return
    at = found.start()
    line, column = sql.count("\n", 0, at) + 1, at - sql.rfind("\n", 0, at)
    raise InvalidSqlError(
        f"invalid SQL: a lone surrogate U+{ord(found[0]):04X} at line {line}, column {column} is not a "
        "character (the text must be valid Unicode)"
    )


@functools.lru_cache(maxsize=_CACHE_ENTRIES)
def parse_cached(sql: str) -> PullQuery:
    return _parse_full(sql)  # PullQuery is immutable, so callers can share one


def _parse_full(sql: str) -> PullQuery:
    """The full parser: what `parse` does with a statement after its text checks, if the fast path
    leaves it (uncached)."""
    _check_complexity(sql)
    statements = [statement for statement in _sqlglot_parse(sql) if statement is not None]
    if not statements:
        raise InvalidSqlError("the query is empty")
    if len(statements) > 1:
        raise UnsupportedQueryError(f"one statement per query, got {len(statements)}")
    return _query(statements[0])


def _check_complexity(sql: str) -> None:
    """Refuses what sqlglot would take seconds or its whole recursion limit over."""
    text = _SKIPPED.sub(" ", sql)
    ands = len(_AND.findall(text))
    if ands > MAX_ANDS:
        raise UnsupportedQueryError(f"the query has {ands:,} ANDs; at most {MAX_ANDS:,} are allowed")
    parens = _NOT_PAREN.sub("", text)
    if parens.count("(") > MAX_NESTING:
        depth = max(itertools.accumulate(1 if paren == "(" else -1 for paren in parens))
        if depth > MAX_NESTING:
            raise InvalidSqlError(
                f"invalid SQL: the query is nested too deeply ({depth} levels of parentheses; at most "
                f"{MAX_NESTING} are allowed)"
            )


def parse_timestamp(text: str) -> dt.datetime:
    """An ISO-8601 date or date-time ('2026-01-02', '2026-01-02 03:04:05.5', '...T...Z', '...+02:00');
    naive results mean UTC, as in the key encoding. Raises ValueError."""
    return dt.datetime.fromisoformat(text.strip())


# --- sqlglot -------------------------------------------------------------------------------------------


def _sqlglot_parse(sql: str) -> Sequence[object]:
    try:
        return sqlglot.parse(sql, read=PullDialect)
    except ParseError as e:
        if _is_push_query(sql):
            raise UnsupportedQueryError(_PUSH_QUERY) from None
        raise InvalidSqlError(_parse_error_message(e)) from None
    except TokenError as e:
        raise InvalidSqlError(f"invalid SQL: {_one_line(str(e))}") from None
    except RecursionError:
        raise InvalidSqlError("invalid SQL: the query is nested too deeply") from None
    except Exception as e:  # a third-party parser: whatever it raises, the user gets a message, not a trace
        raise InvalidSqlError(f"invalid SQL: {_one_line(str(e)) or type(e).__name__}") from None


def _is_push_query(sql: str) -> bool:
    try:
        words = [token.text.upper() for token in PullDialect().tokenize(sql)]
    except Exception:  # only refines the message of a query that already failed to parse
        return False
    return any(a == "EMIT" and b in ("CHANGES", "FINAL") for a, b in itertools.pairwise(words))


def _parse_error_message(error: ParseError) -> str:
    details: Sequence[dict[str, Any]] = error.errors
    if not details:
        return f"invalid SQL: {_one_line(str(error))}"
    first = details[0]
    message = f"invalid SQL: {_one_line(str(first.get('description') or 'syntax error'))}"
    line, column = first.get("line"), first.get("col")
    if line is not None and column is not None:
        message += f" at line {line}, column {column}"
    near = _one_line(str(first.get("highlight") or ""))
    return f"{message} near {near!r}" if near else message


def _one_line(text: str) -> str:
    text = _TOKEN_REPR.sub(_token_text, _CLASS_REPR.sub(r"\1", _ANSI.sub("", text)))
    return shortened(" ".join(text.split()))


def _token_text(match: re.Match[str]) -> str:
    return "the end of the query" if match[1] == "SENTINEL" else repr(match[2])


def _show(node: object) -> str:
    """SQL text for a message."""
    if not isinstance(node, exp.Expression):
        return shortened(str(node))
    try:
        return _one_line(node.sql(dialect=PullDialect))
    except Exception:  # rendering is only for the message; never let it replace the real error
        return node.key.upper()


def _present(value: object) -> bool:
    return value is not None and value is not False and not (isinstance(value, list) and not value)


# --- statement ------------------------------------------------------------------------------------------


def _query(statement: object) -> PullQuery:
    if isinstance(statement, exp.SetOperation):
        raise UnsupportedQueryError(f"{statement.key.upper()} is not supported in pull queries")
    if not isinstance(statement, exp.Select):
        raise UnsupportedQueryError("only SELECT statements are pull queries")
    for name, value in statement.args.items():
        if name not in _SELECT_ARGS and name not in SCAN_CLAUSES and _present(value):
            what = _CLAUSES.get(name)
            if what is None:
                raise UnsupportedQueryError(f"{_show(value)} is not supported in pull queries")
            raise UnsupportedQueryError(f"{what} not supported in pull queries")
    table = _table(statement)
    limit = _limit(statement.args.get("limit"))
    if not any(_present(statement.args.get(name)) for name in SCAN_CLAUSES):
        try:
            columns = _columns(statement.expressions, table)
            where = statement.args.get("where")
            conditions = _conditions(where.this, table) if isinstance(where, exp.Where) else ()
            return PullQuery(table, columns, conditions, limit)
        except UnsupportedQueryError:
            pass  # beyond the plain grammar: a scan (query/select.py), or its error
    return select_query(statement, table, limit, _predicate)


def _table(statement: exp.Select) -> str:
    from_ = statement.args.get("from_") or statement.args.get("from")
    if not isinstance(from_, exp.From):
        raise UnsupportedQueryError("a pull query needs FROM <table>")
    source = from_.this
    if isinstance(source, exp.Subquery | exp.Select):
        raise UnsupportedQueryError("subqueries are not supported in pull queries")
    if not isinstance(source, exp.Table) or not isinstance(source.this, exp.Identifier):
        raise UnsupportedQueryError(f"FROM must name a table, got {_show(source)}")
    for name, value in source.args.items():
        if name == "this" or not _present(value):
            continue
        if name in ("db", "catalog"):
            raise UnsupportedQueryError(f"qualified table names are not supported: {_show(source)}")
        if name == "alias":
            raise UnsupportedQueryError(f"table aliases are not supported: {_show(source)}")
        if name == "joins":
            raise UnsupportedQueryError("joins are not supported in pull queries")
        raise UnsupportedQueryError(f"FROM takes only a table name, got {_show(source)}")
    return _identifier(source.this)


def _identifier(node: exp.Identifier) -> str:
    name = node.this
    if not isinstance(name, str) or not name:
        raise InvalidSqlError(f"invalid identifier {_show(node)}")
    return name


def _columns(expressions: list[exp.Expression], table: str) -> tuple[str, ...] | None:
    names: list[str] = []
    stars = 0
    for node in expressions:
        if isinstance(node, exp.Star) or (isinstance(node, exp.Column) and isinstance(node.this, exp.Star)):
            if any(_present(value) for name, value in node.args.items() if name not in ("this", "table")):
                raise UnsupportedQueryError(f"only a plain * is supported, got {_show(node)}")
            if isinstance(node, exp.Column):
                _check_qualifier(node, table)
            stars += 1
        elif isinstance(node, exp.Column):
            names.append(_column_name(node, table))
        elif isinstance(node, exp.Alias):
            if isinstance(node.this, exp.Func):
                raise UnsupportedQueryError(f"functions in SELECT are not supported: {_show(node.this)}")
            raise UnsupportedQueryError(f"column aliases are not supported: {_show(node)}")
        elif isinstance(node, exp.Func):
            raise UnsupportedQueryError(f"functions in SELECT are not supported: {_show(node)}")
        else:
            raise UnsupportedQueryError(f"SELECT takes * or column names, not expressions: {_show(node)}")
    if stars and (names or stars > 1):
        raise UnsupportedQueryError("SELECT * cannot be combined with other columns")
    return None if stars else tuple(names)


def _column_name(node: exp.Column, table: str) -> str:
    if not isinstance(node.this, exp.Identifier) or any(
        _present(value) for name, value in node.args.items() if name not in ("this", "table")
    ):
        raise UnsupportedQueryError(f"column names may have only the table as qualifier: {_show(node)}")
    field = _window_field(node, table)
    if field is not None:
        return field
    _check_qualifier(node, table)
    return _identifier(node.this)


def _window_field(node: exp.Column, table: str) -> str | None:
    """`window.start` / `window.end` (Spark's window struct's fields, any struct name but the table's) as
    that dotted name, which query.windows maps to WINDOWSTART / WINDOWEND of a windowed table."""
    qualifier = node.args.get("table")
    if not isinstance(qualifier, exp.Identifier) or _identifier(qualifier).casefold() == table.casefold():
        return None
    field = _identifier(node.this)
    return f"{_identifier(qualifier)}.{field}" if field.casefold() in ("start", "end") else None


def _check_qualifier(node: exp.Column, table: str) -> None:
    qualifier = node.args.get("table")
    if qualifier is None:
        return
    if not isinstance(qualifier, exp.Identifier) or _identifier(qualifier).casefold() != table.casefold():
        raise UnsupportedQueryError(f"{_show(node)} does not name a column of table {table!r}")


def _limit(node: object) -> int | None:
    if node is None:
        return None
    if not isinstance(node, exp.Limit):
        raise UnsupportedQueryError(f"{_show(node)} is not supported: use LIMIT n")
    if any(_present(value) for name, value in node.args.items() if name != "expression"):
        raise UnsupportedQueryError(f"{_show(node)} is not supported: LIMIT takes one number")
    count = node.args.get("expression")
    if isinstance(count, exp.Literal) and not count.is_string and _DIGITS.fullmatch(str(count.this)):
        return limit_count(str(count.this))
    raise UnsupportedQueryError(f"LIMIT must be a non-negative integer, got {_show(count)}")


# --- WHERE ----------------------------------------------------------------------------------------------


def _conditions(where: exp.Expression, table: str) -> tuple[Predicate, ...]:
    return tuple(_predicate(term, table) for term in and_terms(where))


def _predicate(node: exp.Expression, table: str) -> Predicate:
    comparison = _COMPARISONS.get(type(node))
    if comparison is not None:
        return _comparison(node, comparison, table)
    if isinstance(node, exp.In):
        return _in(node, table)
    if isinstance(node, exp.Between):
        return _between(node, table)
    if isinstance(node, exp.Or):
        raise UnsupportedQueryError("OR is not supported: use IN")
    if isinstance(node, exp.Not):
        inner = _unparen(node.this)
        if isinstance(inner, exp.In):
            raise UnsupportedQueryError("NOT IN is not supported in pull queries")
        if isinstance(inner, exp.Between):
            raise UnsupportedQueryError("NOT BETWEEN is not supported in pull queries")
        if isinstance(inner, exp.Is):
            raise UnsupportedQueryError(
                "IS NOT is not supported in pull queries (key columns are never null)"
            )
        raise UnsupportedQueryError("NOT is not supported in pull queries")
    if isinstance(node, exp.NEQ):
        raise UnsupportedQueryError("!= (<>) is not supported in pull queries")
    if isinstance(node, exp.Is):
        what = "IS NULL" if isinstance(node.args.get("expression"), exp.Null) else "IS"
        raise UnsupportedQueryError(f"{what} is not supported in pull queries (key columns are never null)")
    if isinstance(node, exp.Like | exp.ILike):
        raise UnsupportedQueryError("LIKE is not supported in pull queries")
    raise UnsupportedQueryError(
        f"WHERE takes comparisons of key columns with values joined by AND, got: {_show(node)}"
    )


def _comparison(node: exp.Expression, op: Op, table: str) -> Predicate:
    left, right = _unparen(node.this), _unparen(node.args.get("expression"))
    if isinstance(left, exp.Tuple) or isinstance(right, exp.Tuple):
        if op is Op.EQ and isinstance(left, exp.Tuple) and isinstance(right, exp.Tuple):
            columns, values = (right, left) if _is_column(_unparen(_first(right))) else (left, right)
            names = _tuple_columns(columns, node, table)
            return TupleIn(names, (_row(values, len(names), node),))
        raise UnsupportedQueryError(f"row values are supported only with = and IN: {_show(node)}")
    if _is_column(left) and _is_column(right):
        raise UnsupportedQueryError(
            f"comparing two columns is not supported: {_show(node)} (strings take single quotes)"
        )
    if _is_column(right):
        left, right, op = right, left, _FLIPPED[op]
    if not _is_column(left):
        if isinstance(left, exp.Func):
            raise UnsupportedQueryError(f"functions in WHERE are not supported: {_show(left)}")
        raise UnsupportedQueryError(f"a comparison needs a column on one side: {_show(node)}")
    return Condition(_column_name(left, table), op, (_value(right),))


def _in(node: exp.In, table: str) -> Predicate:
    if _present(node.args.get("query")):
        raise UnsupportedQueryError("subqueries are not supported in pull queries")
    if any(_present(value) for name, value in node.args.items() if name not in ("this", "expressions")):
        raise UnsupportedQueryError(f"IN takes a list of values: {_show(node)}")
    subject = _unparen(node.this)
    items = node.expressions
    if not items:
        raise UnsupportedQueryError(f"IN needs at least one value: {_show(node)}")
    if isinstance(subject, exp.Tuple):
        names = _tuple_columns(subject, node, table)
        return TupleIn(names, tuple(_row(item, len(names), node) for item in items))
    if not _is_column(subject):
        if isinstance(subject, exp.Func):
            raise UnsupportedQueryError(f"functions in WHERE are not supported: {_show(subject)}")
        raise UnsupportedQueryError(f"IN needs a column on its left: {_show(node)}")
    return Condition(_column_name(subject, table), Op.IN, tuple(_value(item) for item in items))


def _between(node: exp.Between, table: str) -> Predicate:
    if _present(node.args.get("symmetric")):
        raise UnsupportedQueryError("BETWEEN SYMMETRIC is not supported in pull queries")
    subject = _unparen(node.this)
    if not _is_column(subject):
        raise UnsupportedQueryError(f"BETWEEN needs a column on its left: {_show(node)}")
    bounds = (_value(node.args.get("low")), _value(node.args.get("high")))
    return Condition(_column_name(subject, table), Op.BETWEEN, bounds)


def _tuple_columns(node: exp.Tuple, predicate: exp.Expression, table: str) -> tuple[str, ...]:
    columns = [_unparen(item) for item in node.expressions]
    if not columns or not all(_is_column(column) for column in columns):
        raise UnsupportedQueryError(f"a row of columns must hold only column names: {_show(predicate)}")
    return tuple(_column_name(column, table) for column in columns)


def _row(node: exp.Expression, width: int, predicate: exp.Expression) -> tuple[KeyValue, ...]:
    row = _unparen(node)
    items = row.expressions if isinstance(row, exp.Tuple) else [row]
    if len(items) != width:
        raise UnsupportedQueryError(f"each row needs {width} values: {_show(predicate)}")
    return tuple(_value(item) for item in items)


def _unparen(node: Any) -> Any:
    while isinstance(node, exp.Paren):
        node = node.this
    return node


def _first(node: exp.Tuple) -> object:
    return node.expressions[0] if node.expressions else None


def _is_column(node: object) -> bool:
    return isinstance(node, exp.Column) and not isinstance(node.this, exp.Star)


# --- literals -------------------------------------------------------------------------------------------


def _value(node: object) -> KeyValue:
    negations = 0
    while isinstance(node, exp.Paren | exp.Neg):
        negations += isinstance(node, exp.Neg)
        node = node.this
    value = _literal(node)
    if not negations:
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise UnsupportedQueryError(f"only numbers can be negated: -{_show(node)}")
    return -value if negations % 2 else value


def _literal(node: object) -> KeyValue:
    if isinstance(node, exp.Literal):
        text = str(node.this)
        return text if node.is_string else _number(text)
    if isinstance(node, exp.National):
        return str(node.this)
    if isinstance(node, exp.Boolean):
        return bool(node.this)
    if isinstance(node, exp.Null):
        return None
    if isinstance(node, exp.HexString):
        return _hex(str(node.this))
    if isinstance(node, exp.Cast):  # before Func: sqlglot makes a cast a function
        return _typed_literal(node)
    if isinstance(node, exp.Placeholder | exp.Parameter):
        raise UnsupportedQueryError(f"query parameters are not supported: {_show(node)}")
    if isinstance(node, exp.Func):
        raise UnsupportedQueryError(f"functions in WHERE are not supported: {_show(node)}")
    if _is_column(node):
        raise UnsupportedQueryError(
            f"expected a value, got column {_show(node)} (strings take single quotes)"
        )
    raise UnsupportedQueryError(f"values must be literals, got: {_show(node)}")


def _number(text: str) -> int | float:
    try:
        return int(text) if _DIGITS.fullmatch(text) else float(text)
    except ValueError:  # float() of a malformed token, or an int of more digits than int() will read
        raise InvalidSqlError(f"invalid number {shortened(text)}") from None


def _hex(digits: str) -> bytes:
    try:
        return bytes.fromhex(digits)
    except ValueError:
        raise InvalidSqlError(
            f"invalid hex literal X'{shortened(digits)}': it needs pairs of hex digits"
        ) from None


def _typed_literal(node: exp.Cast) -> KeyValue:
    target = node.args.get("to")
    text = _unparen(node.this)
    if not (isinstance(target, exp.DataType) and target.this in _TIMESTAMP_TYPES):
        raise UnsupportedQueryError(f"only TIMESTAMP '...' typed literals are supported, got: {_show(node)}")
    if not (isinstance(text, exp.Literal) and text.is_string):
        raise UnsupportedQueryError(f"TIMESTAMP takes a string such as '2026-01-02 03:04:05': {_show(node)}")
    try:
        return parse_timestamp(str(text.this))
    except ValueError:
        raise InvalidSqlError(
            f"invalid TIMESTAMP literal {shortened(str(text.this))!r}: expected ISO-8601 such as "
            "'2026-01-02 03:04:05'"
        ) from None

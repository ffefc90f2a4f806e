"""The common pull-query shapes, recognized without sqlglot: a few microseconds instead of ~100.

`recognize(sql)` returns exactly the `PullQuery` that the full (sqlglot) parser in sql.py returns for the
statement, or None whenever the statement is not one of these shapes or anything in it is unusual; the
caller then uses the full parser, which also words every error. tests/query/test_fast.py checks the two
against each other on generated statements.

    SELECT * | name [, name ...]  FROM name  [WHERE cond [AND cond ...]]  [LIMIT digits]  [;]

    cond:   name op value  (op: = < <= > >=)   name IN (value [, value ...])   name BETWEEN value AND value
    name:   an unquoted word that is not a sqlglot keyword, or a non-empty `backtick` or "double-quoted"
            name without escapes inside
    value:  'string' ('' escapes a quote), an optionally negated number (42, -7, 1.5, .5, 2e-3), TRUE,
            FALSE, NULL

Everything else (comments, parentheses, TIMESTAMP/X'..'/0x.. literals, tuple IN, literals on the left,
keywords used as names, unicode whitespace, ...) is left to the full parser.

A statement's shape is its text with its string literals taken out: `WHERE user = 'u1'` and `'u2'` have one
shape, and a shape is tokenized once (`_Shape`, a bounded cache); then a statement of that shape only has its
literals cut out by one regex split (a third of the tokenizer's time). This is exact because the tokenizer
reads a string literal as the split does, and what it makes of the rest never depends on a literal's
content: the k-th str value of the conditions is the k-th literal, unescaped. Statements that hold `"`, a
backtick or NUL are not cut (a quoted name may hold a `'`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

from hotstate.protocol.keys import KeyValue
from hotstate.query.dialect import PullDialect
from hotstate.query.pull_query import MAX_ANDS, Condition, Op, Predicate, PullQuery, limit_count

__all__ = ["recognize"]

_SPACE: Final = " \t\n\r\f\v"
# One token per match, after optional whitespace. Any other character ends the tokens with "" (the group
# does not take part) and swallows the rest of the text, as the statement is then one for the full parser.
# A number or word must end where sqlglot's token ends too (`1AND`, `N'x'`, `a.b` are not these shapes).
# Swallowing the rest keeps the scan linear: what failed is never rescanned from the next position (a run
# of 500,000 digits then a letter took minutes). Possessive quantifiers (*+, ++) skip backtracking into
# runs that cannot end any other way.
_TOKENS: Final = re.compile(
    r"""[ \t\n\r\f\v]*+(?:(
        '[^']*+(?:''[^']*+)*+'
      | `[^`]*+` | "[^"]*+"
      | -?[ \t\n\r\f\v]*+(?:[0-9]++(?:\.[0-9]*+)?+|\.[0-9]++)(?:[eE][-+]?[0-9]++)?+(?=[ \t\n\r\f\v,);]|\Z)
      | [A-Za-z_][A-Za-z0-9_]*+(?=[ \t\n\r\f\v,();=<>*]|\Z)
      | <= | >= | [=<>(),;*]
    )|[^ \t\n\r\f\v][\s\S]*)""",
    re.VERBOSE,
)
# A word sqlglot tokenizes as a keyword, or parses as a function without parentheses (`ANY`), may mean
# something else than a name: the full parser decides. Multi-word keywords (`ORDER BY`) cannot occur:
# in these shapes a name is never next to a word other than SELECT, FROM, WHERE, AND, IN, BETWEEN, LIMIT.
_RESERVED: Final = frozenset(
    word
    for word in (*PullDialect.tokenizer_class.KEYWORDS, *PullDialect.parser_class.NO_PAREN_FUNCTION_PARSERS)
    if re.fullmatch(r"[A-Z_][A-Z0-9_]*", word)
)
_NAME_START: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")
_NUMBER_START: Final = frozenset("-.0123456789")
_WORD_VALUES: Final[dict[str, KeyValue]] = {"TRUE": True, "FALSE": False, "NULL": None}
_COMPARISONS: Final = {
    "=": Op.EQ,
    "<": Op.LT,
    "<=": Op.LE,
    ">": Op.GT,
    ">=": Op.GE,
}


class _Unrecognized(Exception):
    """Raised inside the recognizer when the statement is not one of its shapes."""


# A string literal (the tokenizer's own alternative for one), its content in the group.
_LITERAL: Final = re.compile(r"'([^']*+(?:''[^']*+)*+)'")
_MAX_SHAPES: Final = 4096


@dataclass(frozen=True, slots=True)
class _Shape:
    """A recognized statement as a template: `query` with each condition's values rebuilt from the
    literals. Per condition, `fills` holds None (no literal in it), a slice (its values are those
    literals), or per value the literal's index, -1 keeping the template's own value."""

    query: PullQuery
    fills: tuple[slice | tuple[int, ...] | None, ...]

    def filled(self, literals: list[str]) -> PullQuery:
        query = self.query
        conditions: list[Predicate] = []
        for condition, fill in zip(query.conditions, self.fills, strict=True):
            if fill is None:
                conditions.append(condition)
                continue
            assert isinstance(condition, Condition)
            values: tuple[KeyValue, ...]
            if type(fill) is slice:
                values = tuple(literals[fill])
            else:
                pairs = zip(fill, condition.values, strict=True)
                values = tuple(literals[i] if i >= 0 else value for i, value in pairs)
            conditions.append(Condition(condition.column, condition.op, values))
        return PullQuery(query.table, query.columns, tuple(conditions), query.limit)


# The shape of each statement template seen (the texts between its literals, joined by NUL): a _Shape, or
# None when no statement of that template is one of the shapes above, whatever its literals.
_SHAPES: dict[str, _Shape | None] = {}
_UNSEEN: Final = object()


def recognize(sql: str) -> PullQuery | None:
    """The pull query in `sql` if it has one of the shapes above, else None. Raises only what the full
    parser would raise for the same text (a LIMIT too large)."""
    if '"' in sql or "`" in sql or "\x00" in sql:
        return _recognize(sql)
    if "''" in sql:
        pieces = _LITERAL.split(sql)
    else:
        # Without '' (an escaped quote or an empty literal), quotes alternate opening and closing, so a
        # split at each quote (in C, no regex) cuts the same pieces when they pair up: an odd number of
        # pieces. An unpaired quote is left to the regex, which treats the text after it as outside.
        pieces = sql.split("'")
        if not len(pieces) & 1:
            pieces = _LITERAL.split(sql)
    template = "\x00".join(pieces[0::2])
    shape = _SHAPES.get(template, _UNSEEN)
    if shape is None:
        return None
    if shape is _UNSEEN:
        query = _recognize(sql)
        shaped = None if query is None else _shape_of(query, pieces[1::2])
        if query is None or shaped is not None:  # else statements of this template are never cut
            if len(_SHAPES) >= _MAX_SHAPES:
                _SHAPES.clear()
            _SHAPES[template] = shaped
        return query
    literals = pieces[1::2]
    if "''" in sql:
        literals = list(map(_unescaped, literals))
    assert isinstance(shape, _Shape)
    return shape.filled(literals)


def _unescaped(literal: str) -> str:
    """A string literal's content as its value ('' is a quote)."""
    return literal.replace("''", "'")


def _shape_of(query: PullQuery, raw_literals: list[str]) -> _Shape | None:
    """`query` as the template of its shape; None if its values do not line up with the literals."""
    literals = list(map(_unescaped, raw_literals))
    fills: list[slice | tuple[int, ...] | None] = []
    at = 0
    for condition in query.conditions:
        if not isinstance(condition, Condition) or not any(type(v) is str for v in condition.values):
            fills.append(None)
            continue
        indexes = []
        for value in condition.values:
            if type(value) is str:
                if at >= len(literals) or literals[at] != value:
                    return None
                indexes.append(at)
                at += 1
            else:
                indexes.append(-1)
        contiguous = -1 not in indexes
        fills.append(slice(indexes[0], indexes[-1] + 1) if contiguous else tuple(indexes))
    return _Shape(query, tuple(fills)) if at == len(literals) else None


def _recognize(sql: str) -> PullQuery | None:
    # Without trailing whitespace, every run of it is followed by a token: else each of its positions
    # would be tried, each scanning to the end.
    tokens: list[str] = _TOKENS.findall(sql.rstrip(_SPACE))
    if not tokens or "" in tokens:
        return None
    if tokens[-1] == ";":
        del tokens[-1]
    # "" marks the end (no token is empty); two of them keep every lookahead below inside the list.
    tokens += ("", "")
    try:
        return _statement(tokens)
    except _Unrecognized:
        return None


def _statement(tokens: list[str]) -> PullQuery:
    if tokens[0].upper() != "SELECT":
        raise _Unrecognized
    columns: tuple[str, ...] | None = None
    at = 2
    if tokens[1] != "*":
        names = [_name(tokens[1])]
        while tokens[at] == ",":
            names.append(_name(tokens[at + 1]))
            at += 2
        columns = tuple(names)
    if tokens[at].upper() != "FROM":
        raise _Unrecognized
    table = _name(tokens[at + 1])
    at += 2
    conditions: list[Predicate] = []
    if tokens[at].upper() == "WHERE":
        at = _conditions(tokens, at + 1, conditions)
    count = None
    if tokens[at].upper() == "LIMIT":
        count = tokens[at + 1]
        if not count.isdigit():
            raise _Unrecognized
        at += 2
    if tokens[at] != "":
        raise _Unrecognized
    # Only now, as the full parser reports a syntax error after the count first.
    limit = None if count is None else limit_count(count)
    return PullQuery(table, columns, tuple(conditions), limit)


def _conditions(tokens: list[str], at: int, found: list[Predicate]) -> int:
    """Reads `cond [AND cond ...]` from `at` into `found`; returns the index after it."""
    ands = 0
    while True:
        column = _name(tokens[at])
        operator = tokens[at + 1]
        if operator in _COMPARISONS:
            found.append(Condition(column, _COMPARISONS[operator], (_value(tokens[at + 2]),)))
            at += 3
        elif operator.upper() == "IN":
            at = _in(tokens, at + 2, column, found)
        elif operator.upper() == "BETWEEN" and tokens[at + 3].upper() == "AND":
            bounds = (_value(tokens[at + 2]), _value(tokens[at + 4]))
            found.append(Condition(column, Op.BETWEEN, bounds))
            ands += 1  # BETWEEN's own AND counts too: the limit is on the AND keywords
            at += 5
        else:
            raise _Unrecognized
        if ands > MAX_ANDS:  # the full parser's checks refuse the statement, with the message
            raise _Unrecognized
        if tokens[at].upper() != "AND":
            return at
        ands += 1
        at += 1


def _in(tokens: list[str], at: int, column: str, found: list[Predicate]) -> int:
    """Reads `(value, ...)` from `at` by slicing, not a step per token: IN lists are the long statements."""
    if tokens[at] != "(":
        raise _Unrecognized
    try:
        end = tokens.index(")", at)
    except ValueError:
        raise _Unrecognized from None
    items = tokens[at + 1 : end : 2]
    commas = tokens[at + 2 : end : 2]
    if not items or len(commas) != len(items) - 1 or commas.count(",") != len(commas):
        raise _Unrecognized
    found.append(Condition(column, Op.IN, tuple(map(_value, items))))
    return end + 1


def _name(token: str) -> str:
    first = token[:1]
    if first == "`" or first == '"':
        if len(token) == 2:  # an empty name: the full parser refuses it, with the message
            raise _Unrecognized
        return token[1:-1]
    if first not in _NAME_START or token.upper() in _RESERVED:
        raise _Unrecognized
    return token


def _value(token: str) -> KeyValue:
    first = token[:1]
    if first == "'":
        return _unescaped(token[1:-1])
    if first in _NUMBER_START:
        negated = first == "-"
        text = token[1:].lstrip(_SPACE) if negated else token
        try:
            number = int(text) if text.isdigit() else float(text)
        except ValueError:  # more digits than int() reads: the full parser words the error
            raise _Unrecognized from None
        return -number if negated else number
    upper = token.upper()
    if upper not in _WORD_VALUES:
        raise _Unrecognized
    return _WORD_VALUES[upper]

"""Push queries (`SELECT ... FROM t [WHERE ...] EMIT CHANGES`): what they say, and which changes they take.

Pure: the statement is the pull query before `EMIT CHANGES`, parsed by the pull-query parser (so both take the
same WHERE); the feed's filter is that query's plan (query/plan.py): the partitions it reads and which keys
of them, and, for a WHERE the key alone cannot answer, the scan's condition (query/expressions.py), which
each change's new row is tested against. The feed itself is query/feed.py, its shell server/feeds.py
(docs/queries.md, "Push queries").
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field

from sqlglot.tokens import TokenType  # type: ignore[attr-defined]

from hotstate.controller.image import TableInfo
from hotstate.protocol.rows import RowDecodeError, decode_row
from hotstate.query.dialect import PullDialect
from hotstate.query.execute import IGNORED_PROPERTIES, QueryError
from hotstate.query.expressions import Col, Eval, EvalError, Node, encode_node, evaluator
from hotstate.query.plan import FullScan, KeyLookup, KeyRange, plan
from hotstate.query.pull_query import PullQuery, UnsupportedQueryError
from hotstate.query.scan import Output, ScanSpec
from hotstate.query.sql import parse
from hotstate.query.tokens import Positions, TokenError, decode

__all__ = [
    "FROM_TOKEN_PROPERTY",
    "PUSH_PROPERTIES",
    "SNAPSHOT_PROPERTY",
    "FeedFilter",
    "PushOptions",
    "feed_filter",
    "feed_outputs",
    "parse_push",
    "push_options",
    "split_emit",
]

FROM_TOKEN_PROPERTY = "from_token"
SNAPSHOT_PROPERTY = "snapshot"
# ksqlDB's: "earliest" starts with the current rows (a table's history is its rows), "latest" with what
# changes next.
OFFSET_RESET_PROPERTIES = ("auto.offset.reset", "ksql.streams.auto.offset.reset")
PUSH_PROPERTIES = frozenset((FROM_TOKEN_PROPERTY, SNAPSHOT_PROPERTY, *OFFSET_RESET_PROPERTIES))


def split_emit(sql: str) -> str | None:
    """The statement before a trailing `EMIT CHANGES` (and `;`), None when `sql` is not a push query.
    `EMIT FINAL` is refused: a table's changes have no final result."""
    if "emit" not in sql.lower():
        return None
    try:
        tokens = PullDialect().tokenize(sql)
    except Exception:  # not SQL: the pull-query parser says what is wrong with it
        return None
    words = [t for t in tokens if t.token_type is not TokenType.SEMICOLON]
    if len(words) < 2 or words[-2].token_type is not TokenType.VAR or words[-2].text.upper() != "EMIT":
        return None
    last = words[-1].text.upper()
    if last == "FINAL":
        raise UnsupportedQueryError(
            "EMIT FINAL is not supported: a table's feed is every change (EMIT CHANGES)"
        )
    if last != "CHANGES":
        return None
    return sql[: words[-2].start]


def parse_push(sql: str) -> PullQuery:
    """The query of a push statement (`split_emit`'s text, parsed as a pull query); raises QueryError."""
    statement = split_emit(sql)
    if statement is None:
        raise UnsupportedQueryError("not a push query: it must end with EMIT CHANGES")
    query = parse(statement)
    if query.limit is not None:
        raise UnsupportedQueryError("LIMIT is not supported on a push query: a feed runs until it is closed")
    return query


@dataclass(frozen=True, slots=True)
class FeedFilter:
    """Which changes of a table a feed takes: those of `partitions` whose encoded key is one of `keys`
    (a lookup), or within [start, end) (a range; None: unbounded); and, with a `where`, whose row it holds
    for (a row that stops matching *leaves* the feed's view: query/feed.py). `where_text` is the condition's
    normalized text: feeds with the same one share each change's verdict."""

    partitions: frozenset[int]
    keys: frozenset[bytes] | None = None
    start: bytes | None = None
    end: bytes | None = None
    where: Node | None = None
    where_text: str | None = None
    _test: Eval | None = field(default=None, compare=False, repr=False)

    def matches(self, key: bytes) -> bool:
        if self.keys is not None:
            return key in self.keys
        return (self.start is None or key >= self.start) and (self.end is None or key < self.end)

    def holds(self, row: bytes) -> bool:
        """Whether the WHERE holds for `row` (True without one). A row it cannot be evaluated on (a value
        of another type, a row that does not decode) does not match: a feed has no one to fail a query to."""
        test = self._test
        if test is None:
            return True
        try:
            return test(decode_row(row)) is True
        except (EvalError, RowDecodeError, TypeError, ValueError):
            return False


def with_where(base: FeedFilter, where: Node | None) -> FeedFilter:
    """`base` that also tests each row against `where`."""
    if where is None:
        return base
    text = json.dumps(encode_node(where), separators=(",", ":"), default=str)
    return FeedFilter(base.partitions, base.keys, base.start, base.end, where, text, evaluator(where))


def feed_filter(query: PullQuery, table: TableInfo) -> FeedFilter:
    """The filter of `query` on `table` (its key conditions planned as a pull query's are; the rest of its
    WHERE tested on each row). Aggregates, GROUP BY and ORDER BY are refused (UnsupportedQueryError)."""
    planned = plan(query, table)
    access = planned.access
    where = _where(planned.scan)
    if isinstance(access, KeyLookup):
        return with_where(FeedFilter(frozenset(access.partitions), keys=frozenset(access.keys)), where)
    every = frozenset(range(table.partitions))
    if isinstance(access, KeyRange):
        return with_where(FeedFilter(every, start=access.start, end=access.end), where)
    assert isinstance(access, FullScan)
    return with_where(FeedFilter(every), where)


def _where(spec: ScanSpec | None) -> Node | None:
    if spec is None:
        return None
    if spec.aggregating:
        raise UnsupportedQueryError(
            "aggregates and GROUP BY are not supported on a push query (EMIT CHANGES): a feed sends rows "
            "as they change; run the aggregate as a pull query (without EMIT CHANGES)"
        )
    if spec.order:
        raise UnsupportedQueryError(
            "ORDER BY is not supported on a push query (EMIT CHANGES): changes come in log order"
        )
    return spec.where


def feed_outputs(query: PullQuery, table: TableInfo) -> tuple[tuple[str, ...] | None, tuple[Output, ...]]:
    """The feed's column names (None: every column) and, when SELECT computes any of them (an expression,
    an alias, a struct field), its outputs to evaluate over each row (else ())."""
    spec = plan(query, table).scan
    if spec is None or spec.outputs is None:
        return query.columns, ()
    names = tuple(output.name for output in spec.outputs)
    plain = all(isinstance(o.node, Col) and not o.node.path and o.node.name == o.name for o in spec.outputs)
    return names, () if plain else spec.outputs


@dataclass(frozen=True, slots=True)
class PushOptions:
    """Where a feed starts: `start` per partition of the table (a token's positions: resume there, with
    every partition the token does not name at 0), or None: now, after the current rows when `snapshot`."""

    start: Mapping[int, int] | None
    snapshot: bool


def push_options(properties: Mapping[str, object], table: TableInfo, tag: bytes) -> PushOptions:
    """A push query's properties: `from_token`, `snapshot` (true/false) and ksqlDB's auto.offset.reset
    (earliest: the current rows first; latest: only what changes next). Raises QueryError."""
    unknown = sorted(n for n in properties if n not in PUSH_PROPERTIES and n not in IGNORED_PROPERTIES)
    if unknown:
        raise QueryError(
            "bad_request",
            f"unknown propert{'y' if len(unknown) == 1 else 'ies'} of a push query "
            f"{', '.join(map(repr, unknown))}; known: {', '.join(sorted(PUSH_PROPERTIES))}",
        )
    snapshot = True
    for name in OFFSET_RESET_PROPERTIES:
        value = properties.get(name)
        if value is None:
            continue
        if value not in ("earliest", "latest"):
            raise QueryError("bad_request", f"{name}={value!r}: must be 'earliest' or 'latest'")
        snapshot = value == "earliest"
    given = properties.get(SNAPSHOT_PROPERTY)
    if given is not None:
        if type(given) is not bool:
            raise QueryError("bad_request", f"{SNAPSHOT_PROPERTY}: must be true or false")
        snapshot = given
    token = properties.get(FROM_TOKEN_PROPERTY)
    if token is None:
        return PushOptions(None, snapshot)
    if not isinstance(token, str):
        raise QueryError("bad_request", f"{FROM_TOKEN_PROPERTY}: must be a string (a token a feed gave)")
    return PushOptions(start_positions(token, table, tag), False)


def start_positions(token: str, table: TableInfo, tag: bytes) -> dict[int, int]:
    """Per partition of `table`, the position `token` resumes from (0 for one it does not name: nothing
    of it was seen). Refuses a token naming nothing of this table (another table's, or one of a table that
    was dropped and created again) or a partition it does not have."""
    try:
        positions: Positions = decode(token, tag)
    except TokenError as error:
        raise QueryError("bad_request", f"{FROM_TOKEN_PROPERTY}: {error}") from None
    mine = {p: position for (table_id, p), position in positions.items() if table_id == table.table_id}
    if not mine:
        raise QueryError(
            "bad_request",
            f"{FROM_TOKEN_PROPERTY}: names no partition of table {table.name!r} (a token of another table, "
            "or of a table dropped and created again)",
        )
    beyond = sorted(p for p in mine if p >= table.partitions)
    if beyond:
        raise QueryError(
            "bad_request",
            f"{FROM_TOKEN_PROPERTY}: names partition {beyond[0]} of {table.name}, which has "
            f"{table.partitions}: not a token of this table",
        )
    return {p: mine.get(p, 0) for p in range(table.partitions)}

"""What both pull-query parsers (sql.py's full one and fast.py's) build, refuse and limit: `PullQuery` and its
parts, the errors, and the limits both enforce.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import TYPE_CHECKING, Final, TypeAlias

from hotstate.protocol.keys import KeyValue

if TYPE_CHECKING:
    from hotstate.query.scan import ScanSpec

__all__ = [
    "MAX_ANDS",
    "MAX_LIMIT",
    "Condition",
    "InvalidSqlError",
    "Op",
    "Predicate",
    "PullQuery",
    "QueryError",
    "TupleIn",
    "UnsupportedQueryError",
    "limit_count",
    "shortened",
]

# sqlglot takes ~40 us per condition (1.2 s for 20,000 ANDs); no pull query needs this many (many keys
# go in one IN list).
MAX_ANDS: Final = 1000
# LIMIT is a signed 64-bit integer wherever it goes next (msgpack between nodes, ksqlDB clients).
MAX_LIMIT: Final = 2**63 - 1
_MAX_SHOWN: Final = 120


class QueryError(ValueError):
    """A query that cannot be answered; the message is written for the person who sent it."""


class InvalidSqlError(QueryError):
    """Text that is not SQL, or a literal that is malformed (an odd-length hex string, a bad timestamp)."""


class UnsupportedQueryError(QueryError):
    """Valid SQL that is not a pull query this server can answer."""


class Op(StrEnum):
    EQ = "="
    IN = "IN"
    LT = "<"
    LE = "<="
    GT = ">"
    GE = ">="
    BETWEEN = "BETWEEN"


@dataclass(frozen=True, slots=True)
class Condition:
    """`column op values`: one value for = < <= > >=, the list for IN, (low, high) for BETWEEN."""

    column: str
    op: Op
    values: tuple[KeyValue, ...]


@dataclass(frozen=True, slots=True)
class TupleIn:
    """`(c1, c2, ...) IN ((a1, a2, ...), ...)`; `(c1, c2) = (a1, a2)` is its one-row case."""

    columns: tuple[str, ...]
    rows: tuple[tuple[KeyValue, ...], ...]


Predicate: TypeAlias = Condition | TupleIn


@dataclass(frozen=True, slots=True)
class PullQuery:
    table: str
    columns: tuple[str, ...] | None  # None: SELECT *
    conditions: tuple[Predicate, ...]  # all must hold; empty without WHERE
    limit: int | None
    # What the query asks beyond its key access (filters on any column, expressions, aggregates, ORDER
    # BY), evaluated where each partition is read (query/scan.py); None: a plain key lookup or range.
    scan: ScanSpec | None = None


def limit_count(digits: str) -> int:
    """LIMIT's count from its digits; both parsers take it, so that both refuse the same counts."""
    significant = digits.lstrip("0") or "0"
    if len(significant) > len(str(MAX_LIMIT)) or int(significant) > MAX_LIMIT:
        raise UnsupportedQueryError(f"LIMIT must be at most {MAX_LIMIT}, got {shortened(digits)}")
    return int(significant)


def shortened(text: str) -> str:
    """`text`, cut to a length a message can quote."""
    return text if len(text) <= _MAX_SHOWN else text[: _MAX_SHOWN - 3] + "..."

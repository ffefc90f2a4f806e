"""Scans: what a pull query asks beyond its key access (a residual WHERE, expressions, aggregates, ORDER BY),
the program a replica runs over a partition for it, and the merge of the partitions' answers. Pure.

A query that is not a plain key lookup or key range carries a `ScanSpec` (made by query/select.py from SQL,
or by `spec_of_conditions` from the WHERE of a plain query on non-key columns). The coordinator sends each
partition a `ScanProgram` (`program_for`) inside its PartitionQueryRequest; the replica reading the
partition feeds its rows through a `ScanRun` a step at a time and answers only the matching rows (in key
order, or its top n) or its partial aggregates. The coordinator merges them (`finish`).

Partial aggregates are maps of group key -> accumulator states, serialised with the row codec (msgpack),
merged by adding counts and sums, keeping minima and maxima, and uniting the sets of COUNT(DISTINCT).
Each of those merges is associative and commutative, so a partition served again by another replica after
a failure is merged once, from the replica that answered.
"""

from __future__ import annotations

import dataclasses
import functools
import heapq
import itertools
import math
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, Final

from hotstate.protocol.rows import Projection, RowEncodeError, decode_row, decode_rows
from hotstate.query.expressions import (
    Call,
    Col,
    EvalError,
    Lit,
    Node,
    batch_evaluator,
    column_condition,
    column_value,
    columns_of,
    compare,
    decode_node,
    encode_node,
    evaluator,
    pack,
    unpack,
)
from hotstate.query.pull_query import Condition, Op, Predicate, QueryError, TupleIn, UnsupportedQueryError

__all__ = [
    "MAX_DISTINCT",
    "MAX_GROUPS",
    "Aggregate",
    "OrderItem",
    "Output",
    "ScanProgram",
    "ScanRun",
    "ScanSpec",
    "finish",
    "program_for",
    "spec_of_conditions",
]

# A GROUP BY answers at most this many groups (the row cap of every answer), and COUNT(DISTINCT ...) keeps
# at most this many values in all (exact, in memory): beyond either the query fails with a 400.
MAX_GROUPS: Final = 100_000
MAX_DISTINCT: Final = 100_000
# Names of the synthetic columns a finished group is evaluated over (HAVING, outputs, ORDER BY).
GROUP_PREFIX: Final = "#g"
AGGREGATE_PREFIX: Final = "#a"
AGGREGATE_FUNCTIONS: Final = ("count_star", "count", "count_distinct", "sum", "min", "max", "avg")
# Those whose partial states a partition's column copy computes (server/column_cache.py).
COPY_AGGREGATES: Final = frozenset({"count_star", "count", "sum", "min", "max", "avg"})

ROWS, TOP, AGGREGATE = "rows", "top", "aggregate"


@dataclass(frozen=True, slots=True)
class Aggregate:
    func: str  # one of AGGREGATE_FUNCTIONS
    arg: Node | None  # None for COUNT(*)


@dataclass(frozen=True, slots=True)
class OrderItem:
    node: Node
    descending: bool = False
    nulls_first: bool | None = None  # None: SQL's default, NULLs last ascending and first descending


@dataclass(frozen=True, slots=True)
class Output:
    name: str
    node: Node


@dataclass(frozen=True, slots=True)
class ScanSpec:
    """What a query asks of the rows its key access reads.

    `outputs` None is SELECT *. With `aggregating`, outputs, `having` and `order` read the columns
    `#g<i>` (the i-th GROUP BY value) and `#a<i>` (the i-th aggregate); without it they read the row."""

    where: Node | None
    outputs: tuple[Output, ...] | None = None
    group: tuple[Node, ...] = ()
    aggregates: tuple[Aggregate, ...] = ()
    having: Node | None = None
    order: tuple[OrderItem, ...] = ()
    aggregating: bool = False

    @property
    def mode(self) -> str:
        return AGGREGATE if self.aggregating else TOP if self.order else ROWS


@dataclass(frozen=True, slots=True)
class ScanProgram:
    """What a replica does with a partition's rows: keep those `where` holds for, then send them in key
    order (at most `keep`), or its top `keep` by `order`, or its partial aggregates."""

    mode: str
    where: Node | None = None
    keep: int = 0
    order: tuple[OrderItem, ...] = ()
    group: tuple[Node, ...] = ()
    aggregates: tuple[Aggregate, ...] = ()
    budget_ms: int = 0  # the query's time budget: the replica stops scanning past it (0: none)

    def encode(self) -> bytes:
        return pack(
            {
                "mode": self.mode,
                "where": None if self.where is None else encode_node(self.where),
                "keep": self.keep,
                "order": [[encode_node(o.node), o.descending, o.nulls_first] for o in self.order],
                "group": [encode_node(g) for g in self.group],
                "aggregates": [
                    [a.func, None if a.arg is None else encode_node(a.arg)] for a in self.aggregates
                ],
                "budget_ms": self.budget_ms,
            }
        )

    @classmethod
    def decode(cls, data: bytes) -> ScanProgram:
        """The program of `encode`'s bytes; ValueError for anything else."""
        try:
            fields = unpack(data)
            mode, where, keep = fields["mode"], fields["where"], fields["keep"]
            if mode not in (ROWS, TOP, AGGREGATE) or type(keep) is not int or keep < 0:
                raise ValueError(f"bad scan program mode {mode!r} or keep {keep!r}")
            order = tuple(
                OrderItem(decode_node(node), bool(descending), None if nulls is None else bool(nulls))
                for node, descending, nulls in _list(fields["order"])
            )
            aggregates = []
            for func, arg in _list(fields["aggregates"]):
                if func not in AGGREGATE_FUNCTIONS:
                    raise ValueError(f"unknown aggregate {func!r}")
                aggregates.append(Aggregate(func, None if arg is None else decode_node(_list(arg))))
            return cls(
                mode,
                None if where is None else decode_node(_list(where)),
                keep,
                order,
                tuple(decode_node(_list(g)) for g in _list(fields["group"])),
                tuple(aggregates),
                _budget(fields.get("budget_ms", 0)),
            )
        except (KeyError, TypeError) as error:
            raise ValueError(f"bad scan program: {error}") from None


def _budget(value: object) -> int:
    if type(value) is not int or value < 0:
        raise ValueError(f"bad scan budget {value!r}")
    return value


def _list(value: object) -> list[Any]:
    if not isinstance(value, list):
        raise ValueError(f"expected a list, got {type(value).__name__}")
    return value


def program_for(spec: ScanSpec, limit: int | None, max_rows: int, budget_ms: int = 0) -> ScanProgram:
    """The program each partition runs for `spec` under the query's LIMIT and time budget."""
    if spec.aggregating:
        return ScanProgram(AGGREGATE, spec.where, 0, (), spec.group, spec.aggregates, budget_ms)
    # One row past the LIMIT tells whether more follow (the cursor; or the row cap's error).
    keep = max_rows + 1 if limit is None else min(limit + 1, max_rows + 1)
    if spec.order:
        return ScanProgram(TOP, spec.where, keep, spec.order, budget_ms=budget_ms)
    return ScanProgram(ROWS, spec.where, keep, budget_ms=budget_ms)


# --- from a plain query's WHERE -------------------------------------------------------------------------

_OPS = {Op.EQ: "=", Op.LT: "<", Op.LE: "<=", Op.GT: ">", Op.GE: ">="}


def spec_of_conditions(conditions: Sequence[Predicate], outputs: Sequence[str] | None) -> ScanSpec:
    """The scan of a plain query (`col op value AND ...`) whose WHERE the key alone cannot answer."""
    nodes = [_condition_node(predicate) for predicate in conditions]
    where = functools.reduce(lambda a, b: Call("and", (a, b)), nodes) if nodes else None
    return ScanSpec(where, None if outputs is None else tuple(Output(name, Col(name)) for name in outputs))


def _condition_node(predicate: Predicate) -> Node:
    if isinstance(predicate, TupleIn):
        width = len(predicate.columns)
        if not width or not predicate.rows or any(len(row) != width for row in predicate.rows):
            raise UnsupportedQueryError(f"each row of the IN list needs {width} values")
        subject = Call("row", tuple(Col(name) for name in predicate.columns))
        rows = tuple(Call("row", tuple(Lit(v) for v in row)) for row in predicate.rows)
        return Call("in", (subject, *rows))
    if not isinstance(predicate, Condition):
        raise UnsupportedQueryError(f"unsupported predicate {predicate!r}")
    column, values = Col(predicate.column), predicate.values
    if predicate.op is Op.IN:
        if not values:
            raise UnsupportedQueryError("IN needs at least one value")
        return Call("in", (column, *(Lit(v) for v in values)))
    if predicate.op is Op.BETWEEN:
        if len(values) != 2:
            raise UnsupportedQueryError(f"BETWEEN needs two values, got {len(values)}")
        return Call("between", (column, Lit(values[0]), Lit(values[1])))
    if len(values) != 1:
        raise UnsupportedQueryError(f"{predicate.op} needs one value, got {len(values)}")
    return Call(_OPS[predicate.op], (column, Lit(values[0])))


# --- sorting --------------------------------------------------------------------------------------------


def _order_compare(order: Sequence[OrderItem]) -> Any:
    """A cmp_to_key key over tuples of the ORDER BY values (then anything that breaks ties after them)."""
    width = len(order)

    def cmp(left: Sequence[object], right: Sequence[object]) -> int:
        for index in range(width):
            item = order[index]
            a, b = left[index], right[index]
            if a is None or b is None:
                if a is None and b is None:
                    continue
                nulls_first = item.descending if item.nulls_first is None else item.nulls_first
                return (-1 if a is None else 1) * (1 if nulls_first else -1)
            result = compare(a, b)
            if result:
                return -result if item.descending else result
        tail_a, tail_b = left[width:], right[width:]
        return -1 if tail_a < tail_b else 1 if tail_a > tail_b else 0  # type: ignore[operator]

    return functools.cmp_to_key(cmp)


# --- the replica's side -----------------------------------------------------------------------------------


class ScanRun:
    """One partition's scan under `program`: fed its (key, row bytes) items in key order, a step at a time.
    Raises EvalError (a row the query's expressions fail on, a cap passed), which the replica answers with,
    and the coordinator turns into a 400."""

    def __init__(
        self,
        program: ScanProgram,
        *,
        max_scanned: int | None = None,
        also_decode: frozenset[str] = frozenset(),
    ) -> None:
        """`also_decode`: columns to decode beside the program's, for `on_decoded` (a column copy of the
        partition that other queries read too)."""
        self.program = program
        self.scanned = 0
        self.max_scanned = max_scanned
        # Only the columns the program names are decoded (protocol.rows.Projection), and its expressions
        # read them from that struct: decoding whole rows was half of a scan's time.
        names: set[str] = set()
        for node in _program_nodes(program):
            names |= columns_of(node)
        self._names = frozenset(names)
        self._projection = Projection(sorted(names | also_decode))
        readers = self._projection.readers
        self._where = None if program.where is None else evaluator(program.where, readers)
        self._where_batch = None if program.where is None else batch_evaluator(program.where, readers)
        self.kept: list[tuple[bytes, bytes]] = []
        self._top: list[tuple[tuple[object, ...], bytes, bytes]] = []
        self._order = [evaluator(item.node, readers) for item in program.order]
        self._order_key = _order_compare(program.order)
        self._group = [evaluator(node, readers) for node in program.group]
        self._args = [None if a.arg is None else evaluator(a.arg, readers) for a in program.aggregates]
        self._groups: dict[tuple[object, ...], list[Any]] = {}
        self._updates = [
            (index, a.func, arg)
            for index, (a, arg) in enumerate(zip(program.aggregates, self._args, strict=True))
        ]
        self._count_only = (
            program.mode == AGGREGATE
            and program.where is None
            and not program.group
            and all(a.func == "count_star" for a in program.aggregates)
        )
        self._counts_matches = (
            program.mode == AGGREGATE
            and not program.group
            and all(a.func == "count_star" for a in program.aggregates)
        )
        self._worst: tuple[object, ...] | None = None  # of the top `keep` so far, once there are that many
        # For a single numeric ORDER BY item: the worst kept row's value as its sort key holds it (negated
        # when descending), so a row that cannot enter is passed over without building its key.
        self._bound: int | float | None = None
        self._distinct = 0
        # Columns the query names that no row has shown yet: a name no row has is not a column.
        self._unseen = {name.casefold(): name for name in names}
        # Told of each chunk the run decodes, with its rows (None: a row lacks one of the columns exactly):
        # how a full scan leaves a column copy of its partition behind (server/column_cache.py).
        # Keys alone (rows empty) for a run that reads no values.
        self.on_decoded: Callable[[Sequence[bytes], list[Any] | None], None] | None = None

    @property
    def column_names(self) -> frozenset[str]:
        """The columns the program reads."""
        return self._names

    @property
    def readers(self) -> dict[str, Callable[[Any], object]]:
        """Each column's value from a decoded row."""
        return dict(self._projection.readers)

    @property
    def counts_matches(self) -> bool:
        """Whether the answer is the number of rows the WHERE keeps (COUNT(*) ... WHERE, no GROUP BY)."""
        return self._counts_matches

    @property
    def answerable_from_columns(self) -> bool:
        """Whether a partition's column copy can answer the run: the rows its WHERE keeps, in key order,
        or their number (COUNT(*), with or without a WHERE), the WHERE of a form decided over columns at
        once (query/columns.py)."""
        program = self.program
        where = program.where
        if where is not None and column_condition(where) is None:
            return False
        if program.mode == TOP:
            return self.order_columns is not None
        if program.mode == AGGREGATE:
            return self._counts_matches or (
                all(isinstance(node, Col) and not node.path for node in program.group)
                and all(
                    a.func in COPY_AGGREGATES
                    and (a.arg is None or (isinstance(a.arg, Col) and not a.arg.path))
                    for a in program.aggregates
                )
            )
        return program.mode == ROWS and where is not None

    def add_matches(self, items: Sequence[tuple[bytes, bytes]], scanned: int) -> None:
        """Rows the WHERE keeps, in key order, found among `scanned` rows read another way (a column copy):
        merged in key order with the rows `feed` kept."""
        self._count(scanned)
        merged = heapq.merge(self.kept, items, key=operator.itemgetter(0))
        self.kept = list(itertools.islice(merged, self.program.keep))

    @property
    def order_columns(self) -> list[tuple[str, bool, bool]] | None:
        """Each ORDER BY item as (column, descending, NULLs first) when every one is a top-level column."""
        out = []
        for item in self.program.order:
            node = item.node
            if not isinstance(node, Col) or node.path:
                return None
            nulls_first = item.descending if item.nulls_first is None else item.nulls_first
            out.append((node.name, item.descending, nulls_first))
        return out

    def add_top(self, candidates: Sequence[tuple[Sequence[object], bytes, bytes]], scanned: int) -> None:
        """Rows that may be in the top n, as (ORDER BY values, key, row), found among `scanned` rows read
        another way (a column copy)."""
        self._count(scanned)
        order = self.program.order
        try:
            self._top.extend((sort_key_of(values, order), key, data) for values, key, data in candidates)
        except TypeError:
            raise EvalError(_unordered(order)) from None
        self._prune()

    def add_groups(self, groups: Mapping[tuple[object, ...], Sequence[Any]], scanned: int) -> None:
        """Partial aggregates by group of `scanned` rows read another way (a column copy), merged into the
        run's."""
        self._count(scanned)
        aggregates = self.program.aggregates
        for key, states in groups.items():
            mine = self._groups.get(key)
            if mine is None:
                mine = self._new_group(key)
            for index, (aggregate, state) in enumerate(zip(aggregates, states, strict=True)):
                mine[index] = merged_state(aggregate.func, mine[index], state)

    def add_match_count(self, matches: int, scanned: int) -> None:
        """`add_matches` of a run that counts them."""
        self._count(scanned)
        states = self._groups.setdefault((), [0] * len(self.program.aggregates))
        for index in range(len(states)):
            states[index] += matches

    def saw_every_column(self) -> None:
        """Rows read another way had every column the program names."""
        self._unseen.clear()

    @property
    def done(self) -> bool:
        """Whether more rows can change the answer (a ROWS scan with all the rows it may send)."""
        return self.program.mode == ROWS and len(self.kept) >= self.program.keep

    @property
    def keys_only(self) -> bool:
        """Whether the run needs only the keys of the rows (COUNT(*) of every row): `feed_keys` then."""
        return self._count_only

    def feed_keys(self, keys: Sequence[bytes]) -> None:
        """`feed` for a `keys_only` run: the keys of the rows, without their values."""
        if not self._count_only:
            raise ValueError("this scan reads the rows' values: feed it the items")
        if self.on_decoded is not None:
            self.on_decoded(keys, [])
        self.add_match_count(len(keys), len(keys))

    def _count(self, rows: int) -> None:
        self.scanned += rows
        if self.max_scanned is not None and self.scanned > self.max_scanned:
            raise EvalError(
                f"the query scanned more than {self.max_scanned:,} rows of one partition (the server's "
                "query.scan.max.rows): narrow the WHERE on key columns"
            )

    def feed(self, items: Sequence[tuple[bytes, bytes]]) -> None:
        if not items or self.done:
            return
        if self._count_only:  # COUNT(*) of every row: no row needs decoding
            self.feed_keys([key for key, _ in items])
            return
        self._count(len(items))
        where = self._where
        mode = self.program.mode
        if mode == ROWS and where is None:  # SELECT ... LIMIT n: the first rows, none decoded
            kept = self.kept
            kept.extend(items[: self.program.keep - len(kept)])
            return
        rows = self._decoded(items)
        if mode == ROWS:
            kept = self.kept
            assert where is not None
            matched = list(itertools.compress(items, self._matching(where, rows)))
            kept.extend(matched[: self.program.keep - len(kept)])
        elif mode == TOP:
            self._feed_top(items, rows)
        elif where is None:
            self._accumulate(rows)
        elif self._counts_matches:
            self.add_match_count(sum(self._matching(where, rows)), 0)
        else:
            self._accumulate(itertools.compress(rows, self._matching(where, rows)))

    def _matching(self, where: Callable[[Any], object], rows: Sequence[Any]) -> Iterator[bool]:
        """Whether the WHERE is TRUE for each row: for the whole list at once when its batch form takes it."""
        batch = self._where_batch
        results = None if batch is None else batch(rows)
        return _holds(where, rows) if results is None else results

    def _decoded(self, items: Sequence[tuple[bytes, bytes]]) -> list[Any]:
        """The rows of `items` as structs of the program's columns (`Projection`)."""
        projection = self._projection
        datas = [data for _, data in items]
        rows = projection.decode_many(datas)
        on_decoded = self.on_decoded
        if on_decoded is not None:
            on_decoded([key for key, _ in items], rows)
        if rows is None:
            return [self._decoded_one(data) for data in datas]
        if self._unseen and rows:  # each row has every name exactly
            self._unseen.clear()
        return rows

    def _decoded_one(self, data: bytes) -> Any:
        """A row that lacks one of the program's columns exactly (or is no row: RowDecodeError, as
        before), as its struct: each column as expressions read it from the whole row (case-insensitively,
        NULL when absent)."""
        projection = self._projection
        row = projection.decode(data)
        if row is not None:
            self._unseen.clear()
            return row
        full = decode_row(data)
        if self._unseen:
            self._see((full,))
        return projection.of_row([column_value(full, name) for name in projection.names])

    def _see(self, rows: Iterable[dict[str, object]]) -> None:
        for row in rows:
            for name in row:
                self._unseen.pop(name.casefold(), None)
            if not self._unseen:
                return

    def _feed_top(self, items: Sequence[tuple[bytes, bytes]], rows: Sequence[Any]) -> None:
        where, order, top, items_order = self._where, self._order, self._top, self.program.order
        pairs: Iterable[tuple[tuple[bytes, bytes], Any]] = zip(items, rows, strict=True)
        if where is not None:
            pairs = itertools.compress(pairs, self._matching(where, rows))
        worst, bound = self._worst, self._bound
        single = order[0] if len(order) == 1 else None
        descending = bool(items_order) and items_order[0].descending
        try:
            for (key, data), row in pairs:
                if single is not None:
                    value = single(row)
                    # Its key would be ((1, value or -value),): not below the worst's, it cannot enter.
                    if (
                        bound is not None
                        and (type(value) is float or type(value) is int)
                        and (-value if descending else value) >= bound
                    ):
                        continue
                    values = [value]
                else:
                    values = [value_of(row) for value_of in order]
                sort_key = sort_key_of(values, items_order)
                # Items come in key order, so a row that only ties the worst kept one loses to it.
                if worst is None or sort_key < worst:
                    top.append((sort_key, key, data))
        except TypeError:
            raise EvalError(_unordered(items_order)) from None
        if len(top) > 2 * self.program.keep + 1024:
            self._prune()

    def _prune(self) -> None:
        keep = self.program.keep
        try:
            self._top = heapq.nsmallest(keep, self._top)
        except TypeError:
            raise EvalError(_unordered(self.program.order)) from None
        if keep and len(self._top) == keep:
            self._worst = worst = self._top[-1][0]
            self._bound = None
            if len(worst) == 1 and isinstance(worst[0], tuple) and len(worst[0]) == 2:
                value = worst[0][1]
                if type(value) is int or type(value) is float:
                    self._bound = value

    def _accumulate(self, rows: Iterable[Any]) -> None:
        group, groups, updates = self._group, self._groups, self._updates
        single = group[0] if len(group) == 1 else None
        for row in rows:
            if single is not None:
                key: tuple[object, ...] = (single(row),)
            elif not group:
                key = ()
            else:
                key = tuple(value(row) for value in group)
            states = groups.get(key)
            if states is None:
                states = self._new_group(key)
            for index, func, arg in updates:
                if arg is None:
                    states[index] += 1
                    continue
                value = arg(row)
                if value is None:
                    continue
                if func == "count":
                    states[index] += 1
                    continue
                state = states[index]
                kind = type(value)
                if (
                    func == "sum"
                    and (kind is int or kind is float)
                    and (state is None or type(state) in _NUMBERS)
                ):
                    states[index] = value if state is None else state + value
                elif func in ("min", "max") and (state is None or type(state) is kind) and kind in _ORDERED:
                    if state is None or (value < state if func == "min" else value > state):  # type: ignore[operator]
                        states[index] = value
                else:
                    states[index] = self._add(func, state, value)

    def _new_group(self, key: tuple[object, ...]) -> list[Any]:
        for value in key:
            if isinstance(value, list | dict):
                raise EvalError("GROUP BY on a list or struct value is not supported")
        if len(self._groups) >= MAX_GROUPS:
            raise EvalError(f"the GROUP BY makes more than {MAX_GROUPS:,} groups (the limit)")
        states = self._groups[key] = [_initial(a.func) for a in self.program.aggregates]
        return states

    def _add(self, func: str, state: Any, value: object) -> Any:
        if func == "count":
            return state + 1
        if func == "count_distinct":
            if isinstance(value, list | dict):
                raise EvalError("COUNT(DISTINCT ...) of a list or struct value is not supported")
            if value not in state:
                self._distinct += 1
                if self._distinct > MAX_DISTINCT:
                    raise EvalError(_too_distinct())
                state.add(value)
            return state
        return _combine(func, state, _checked(func, value))

    def check_columns(self) -> None:
        """EvalError when the query names a column that no row scanned has."""
        if self.scanned and self._unseen:
            names = ", ".join(repr(name) for name in sorted(self._unseen.values()))
            raise EvalError(f"no row has column {names}: not a column of the table")

    def answer(self) -> tuple[tuple[tuple[bytes, bytes], ...], bytes]:
        """The items to send and the partial answer (counts, partial aggregates) as bytes."""
        self.check_columns()
        mode = self.program.mode
        if mode == ROWS:
            return tuple(self.kept[: self.program.keep]), pack({"scanned": self.scanned})
        if mode == TOP:
            self._prune()
            return tuple((key, data) for _, key, data in self._top), pack({"scanned": self.scanned})
        groups = [
            [
                list(key),
                [_wire_state(a.func, s) for a, s in zip(self.program.aggregates, states, strict=True)],
            ]
            for key, states in self._groups.items()
        ]
        try:
            return (), pack({"scanned": self.scanned, "groups": groups})
        except RowEncodeError as error:  # a SUM past the 64-bit ints the row codec carries
            raise EvalError(f"a partition's partial aggregate cannot be sent: {error}") from None


def _holds(where: Callable[[Any], object], rows: Iterable[Any]) -> Iterator[bool]:
    """Whether `where` is TRUE (not NULL, not a non-boolean) for each row: maps in C, a Python frame
    per row only for `where` itself."""
    return map(operator.is_, map(where, rows), itertools.repeat(True))


_NUMBERS: Final = (int, float)
_ORDERED: Final = (int, float, str)


class _Descending:
    """A value that sorts in reverse: how a DESC item of a sort key orders non-numbers."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __lt__(self, other: _Descending) -> bool:
        return bool(other.value < self.value)

    def __gt__(self, other: _Descending) -> bool:
        return bool(other.value > self.value)

    def __le__(self, other: _Descending) -> bool:
        return bool(other.value <= self.value)

    def __ge__(self, other: _Descending) -> bool:
        return bool(other.value >= self.value)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Descending) and bool(self.value == other.value)

    def __hash__(self) -> int:
        return hash(self.value)


def sort_key_of(values: Sequence[object], order: Sequence[OrderItem]) -> tuple[object, ...]:
    """A key that Python orders as ORDER BY orders `values`: compared in C, not through a cmp function
    (values of one item must be of one kind; else TypeError)."""
    out: list[object] = []
    for value, item in zip(values, order, strict=True):
        if value is None:
            nulls_first = item.descending if item.nulls_first is None else item.nulls_first
            out.append((0,) if nulls_first else (2,))
        elif not item.descending:
            out.append((1, value))
        elif type(value) is int or type(value) is float:
            out.append((1, -value))
        else:
            out.append((1, _Descending(value)))
    return tuple(out)


def _unordered(order: Sequence[OrderItem]) -> str:
    return f"ORDER BY values of different types do not compare ({len(order)} sort items)"


def _program_nodes(program: ScanProgram) -> list[Node]:
    nodes = [] if program.where is None else [program.where]
    nodes += [item.node for item in program.order]
    nodes += list(program.group)
    nodes += [a.arg for a in program.aggregates if a.arg is not None]
    return nodes


def _too_distinct() -> str:
    return f"COUNT(DISTINCT ...) counts more than {MAX_DISTINCT:,} distinct values in all (the limit)"


def _initial(func: str) -> Any:
    if func in ("count_star", "count"):
        return 0
    if func == "count_distinct":
        return set()
    if func == "avg":
        return [None, 0]
    return None


def _checked(func: str, value: object) -> object:
    if func in ("sum", "avg") and (isinstance(value, bool) or not isinstance(value, int | float | Decimal)):
        raise EvalError(f"{func.upper()} needs numbers, got {type(value).__name__} {value!r}")
    return value


def _combine(func: str, state: Any, value: Any) -> Any:
    """`state` with one more non-NULL value (or a merged partial state's value) taken in."""
    if func == "sum":
        return value if state is None else _plus(state, value)
    if func == "avg":
        total, count = state
        return [value if total is None else _plus(total, value), count + 1]
    if func in ("min", "max"):
        if state is None:
            return value
        order = compare(value, state)
        return value if (order < 0 if func == "min" else order > 0) else state
    raise EvalError(f"unknown aggregate {func!r}")


def _plus(a: Any, b: Any) -> Any:
    if isinstance(a, Decimal) and isinstance(b, float):
        return float(a) + b
    if isinstance(b, Decimal) and isinstance(a, float):
        return a + float(b)
    return a + b


def _wire_state(func: str, state: Any) -> object:
    return list(state) if func == "count_distinct" else state


# --- the coordinator's side ------------------------------------------------------------------------------


def merge_partials(
    aggregates: Sequence[Aggregate], partials: Iterable[bytes]
) -> dict[tuple[object, ...], list[Any]]:
    """Every partition's partial aggregates merged into one state per group."""
    merged: dict[tuple[object, ...], list[Any]] = {}
    distinct = 0
    for data in partials:
        fields = unpack(data)
        for key_values, states in _list(fields.get("groups", [])):
            key = tuple(key_values)
            mine = merged.get(key)
            if mine is None:
                if len(merged) >= MAX_GROUPS:
                    raise EvalError(f"the GROUP BY makes more than {MAX_GROUPS:,} groups (the limit)")
                mine = merged[key] = [_initial(a.func) for a in aggregates]
            for index, (aggregate, state) in enumerate(zip(aggregates, _list(states), strict=True)):
                func = aggregate.func
                if func == "count_distinct":
                    before = len(mine[index])
                    mine[index].update(state)
                    distinct += len(mine[index]) - before
                    if distinct > MAX_DISTINCT:
                        raise EvalError(_too_distinct())
                else:
                    mine[index] = merged_state(func, mine[index], state)
    return merged


def merged_state(func: str, mine: Any, state: Any) -> Any:
    """Two partial states of an aggregate (not COUNT(DISTINCT)) as one."""
    if func in ("count_star", "count"):
        return mine + state
    if func == "avg":
        total, count = state
        if not count:
            return mine
        mine_total, mine_count = mine
        return [total if mine_total is None else _plus(mine_total, total), mine_count + count]
    return mine if state is None else _combine(func, mine, state)


def _final(func: str, state: Any) -> object:
    if func == "count_distinct":
        return len(state)
    if func == "avg":
        total, count = state
        return None if not count else total / count
    return state


def scanned_of(partials: Iterable[bytes]) -> int:
    return sum(int(unpack(data).get("scanned", 0)) for data in partials if data)  # type: ignore[call-overload]


@dataclass(frozen=True, slots=True)
class Finished:
    columns: list[str]
    rows: list[list[object]]
    last_key: bytes | None
    non_finite: bool


def finish(
    spec: ScanSpec,
    limit: int | None,
    items: Sequence[Sequence[tuple[bytes, bytes]]],
    partials: Sequence[bytes],
    key_columns: Sequence[str],
    max_rows: int,
) -> Finished:
    """The answer of a scan from every partition's items (in key order each) and partial answers."""
    if spec.aggregating:
        return _finish_aggregate(spec, limit, partials, max_rows)
    merged = sorted(itertools.chain.from_iterable(items), key=operator.itemgetter(0))
    decoded = decode_rows([row for _, row in merged])
    last_key = None
    if spec.order:
        order = [evaluator(item.node) for item in spec.order]
        try:
            ranked = sorted(
                zip(decoded, merged, strict=True),
                key=lambda pair: (sort_key_of([value(pair[0]) for value in order], spec.order), pair[1][0]),
            )
        except TypeError:
            raise EvalError(_unordered(spec.order)) from None
        decoded = [row for row, _ in ranked]
        cut = max_rows if limit is None else min(limit, max_rows + 1)
        if limit is None and len(decoded) > max_rows:
            raise QueryError(f"more than {max_rows} rows: add a LIMIT or narrow the WHERE")
        decoded = decoded[:cut]
    else:
        cut = max_rows + 1 if limit is None else min(limit, max_rows + 1)
        if limit is None and len(decoded) > max_rows:
            raise QueryError(f"more than {max_rows} rows: add a LIMIT or narrow the WHERE")
        if limit is not None and len(merged) > cut and cut:
            last_key = merged[cut - 1][0]
        decoded = decoded[:cut]
    columns, rows = _project(spec, decoded, key_columns)
    return Finished(columns, rows, last_key, _non_finite(rows))


def _project(
    spec: ScanSpec, decoded: list[dict[str, object]], key_columns: Sequence[str]
) -> tuple[list[str], list[list[object]]]:
    if spec.outputs is None:
        columns = list(key_columns)
        for row in decoded:
            for name in row:
                if name not in columns:
                    columns.append(name)
        pick = [evaluator(Col(name)) for name in columns]
        return columns, [[value(row) for value in pick] for row in decoded]
    values = [evaluator(output.node) for output in spec.outputs]
    names: set[str] = set()
    for output in spec.outputs:
        names |= columns_of(output.node)
    for name in names:
        if decoded and not any(any(key.casefold() == name.casefold() for key in row) for row in decoded):
            raise QueryError(f"column {name!r} is not in the table")
    return [output.name for output in spec.outputs], [[value(row) for value in values] for row in decoded]


def _finish_aggregate(
    spec: ScanSpec, limit: int | None, partials: Sequence[bytes], max_rows: int
) -> Finished:
    merged = merge_partials(spec.aggregates, partials)
    if not spec.group and not merged:  # an aggregate over no rows still answers one row
        merged[()] = [_initial(a.func) for a in spec.aggregates]
    groups: list[dict[str, object]] = []
    for key, states in merged.items():
        row: dict[str, object] = {f"{GROUP_PREFIX}{i}": value for i, value in enumerate(key)}
        for i, (aggregate, state) in enumerate(zip(spec.aggregates, states, strict=True)):
            row[f"{AGGREGATE_PREFIX}{i}"] = _final(aggregate.func, state)
        groups.append(row)
    if spec.having is not None:
        having = evaluator(spec.having)
        groups = [row for row in groups if having(row) is True]
    if spec.order:
        order = [evaluator(item.node) for item in spec.order]
        sort_key = _order_compare(spec.order)
        groups.sort(key=lambda row: sort_key(tuple(value(row) for value in order)))
    if limit is not None:
        groups = groups[:limit]
    if len(groups) > max_rows:
        raise QueryError(f"more than {max_rows} groups: add a LIMIT or narrow the WHERE")
    assert spec.outputs is not None
    values = [evaluator(output.node) for output in spec.outputs]
    rows = [[value(row) for value in values] for row in groups]
    return Finished([output.name for output in spec.outputs], rows, None, _non_finite(rows))


def _non_finite(rows: Iterable[Iterable[object]]) -> bool:
    return any(isinstance(value, float) and not math.isfinite(value) for row in rows for value in row)


def with_where(spec: ScanSpec, where: Node | None) -> ScanSpec:
    return dataclasses.replace(spec, where=where)

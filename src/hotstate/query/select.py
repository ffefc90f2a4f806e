"""SELECT statements beyond key lookups, compiled from sqlglot into a `PullQuery` carrying a `ScanSpec`.

sql.py hands a statement here when its plain grammar (columns, key predicates joined by AND, LIMIT) does
not cover it: expressions or aggregates in SELECT, a WHERE with OR, NOT, LIKE, functions or comparisons of
columns, GROUP BY, HAVING, ORDER BY. The WHERE's top-level AND terms that are plain key predicates still
go to the planner as `conditions`, so they narrow the partitions and key ranges read; the whole WHERE is
evaluated at the replica that reads each partition (query/scan.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sqlglot import exp

from hotstate.query.expressions import (
    Call,
    Col,
    ExpressionError,
    Node,
    compile_expression,
    is_condition,
    position,
    show,
)
from hotstate.query.pull_query import Predicate, PullQuery, UnsupportedQueryError
from hotstate.query.scan import (
    AGGREGATE_PREFIX,
    GROUP_PREFIX,
    Aggregate,
    OrderItem,
    Output,
    ScanSpec,
)

__all__ = ["select_query"]

# sqlglot's arguments of a SELECT that this module reads, beyond sql.py's.
SCAN_CLAUSES = frozenset({"group", "having", "order"})


def select_query(
    statement: exp.Select,
    table: str,
    limit: int | None,
    key_predicate: Callable[[exp.Expression, str], Predicate],
) -> PullQuery:
    """The query of `statement` (its FROM already read as `table`, its LIMIT as `limit`); `key_predicate`
    reads a WHERE term as a plain predicate or raises UnsupportedQueryError (sql.py's)."""
    compiler = _Select(table)
    where_clause = statement.args.get("where")
    where: Node | None = None
    conditions: list[Predicate] = []
    if isinstance(where_clause, exp.Where):
        where = compiler.predicate(where_clause.this, "WHERE")
        for term in and_terms(where_clause.this):
            try:
                conditions.append(key_predicate(term, table))
            except UnsupportedQueryError:
                continue  # evaluated only at the replicas, with the rest of the WHERE
    spec = compiler.spec(statement, where)
    return PullQuery(table, None, tuple(conditions), limit, spec)


def and_terms(node: exp.Expression) -> list[exp.Expression]:
    """The conditions a chain of ANDs (in parentheses or not) joins, left to right."""
    terms: list[exp.Expression] = []
    pending = [node]
    # A loop, not recursion: a long chain of ANDs must not hit the recursion limit.
    while pending:
        item = pending.pop()
        if isinstance(item, exp.Paren):
            pending.append(item.this)
        elif isinstance(item, exp.And):
            pending.extend((item.expression, item.this))
        else:
            terms.append(item)
    return terms


@dataclass(slots=True)
class _Select:
    table: str
    aggregates: list[Aggregate] = field(default_factory=list)

    def predicate(self, node: exp.Expression, clause: str, *, aggregates: bool = False) -> Node:
        compiled = compile_expression(node, self.table, aggregate=self.aggregate if aggregates else None)
        if not is_condition(compiled):
            raise ExpressionError(f"{clause} needs a condition, got {show(node)}{position(node)}")
        return compiled

    def aggregate(self, node: exp.Expression) -> Node:
        if isinstance(node, exp.Count):
            inner = node.this
            if inner is None or isinstance(inner, exp.Star):
                found = Aggregate("count_star", None)
            elif isinstance(inner, exp.Distinct):
                values = inner.expressions
                if len(values) != 1:
                    raise ExpressionError(f"COUNT(DISTINCT ...) takes one expression: {show(node)}")
                found = Aggregate("count_distinct", self.argument(values[0], node))
            else:
                found = Aggregate("count", self.argument(inner, node))
        else:
            func = type(node).__name__.lower()
            if isinstance(node.this, exp.Distinct):
                raise ExpressionError(f"DISTINCT is supported only in COUNT: {show(node)}{position(node)}")
            found = Aggregate(func, self.argument(node.this, node))
        if found not in self.aggregates:
            self.aggregates.append(found)
        return Col(f"{AGGREGATE_PREFIX}{self.aggregates.index(found)}")

    def argument(self, node: exp.Expression, call: exp.Expression) -> Node:
        def nested(inner: exp.Expression) -> Node:
            raise ExpressionError(f"aggregates cannot be nested: {show(call)}{position(call)}")

        return compile_expression(node, self.table, aggregate=nested)

    def spec(self, statement: exp.Select, where: Node | None) -> ScanSpec:
        group_clause = statement.args.get("group")
        select_items = statement.expressions
        group_nodes = [
            self.group_item(item, select_items) for item in (group_clause.expressions if group_clause else [])
        ]
        outputs = self.outputs(select_items)
        having_clause = statement.args.get("having")
        having = self.predicate(having_clause.this, "HAVING", aggregates=True) if having_clause else None
        order = self.order(statement.args.get("order"), outputs)
        aggregating = bool(group_nodes) or bool(self.aggregates)
        if not aggregating:
            if having is not None:
                raise ExpressionError("HAVING needs GROUP BY or an aggregate function")
            return ScanSpec(where, outputs, order=tuple(order))
        if outputs is None:
            raise ExpressionError("SELECT * cannot be combined with GROUP BY or aggregates: name the columns")

        def grouped(node: Node) -> Node:
            return _grouped(node, group_nodes)

        return ScanSpec(
            where,
            tuple(Output(output.name, grouped(output.node)) for output in outputs),
            tuple(group_nodes),
            tuple(self.aggregates),
            None if having is None else grouped(having),
            tuple(OrderItem(grouped(item.node), item.descending, item.nulls_first) for item in order),
            aggregating=True,
        )

    def group_item(self, node: exp.Expression, select_items: list[exp.Expression]) -> Node:
        if isinstance(node, exp.Literal) and not node.is_string:
            target = _ordinal(node, select_items)
            if isinstance(target, exp.Alias):
                target = target.this
            node = target
        return compile_expression(node, self.table)

    def outputs(self, items: list[exp.Expression]) -> tuple[Output, ...] | None:
        outputs: list[Output] = []
        for item in items:
            if isinstance(item, exp.Star) or (
                isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
            ):
                if len(items) > 1:
                    raise UnsupportedQueryError("SELECT * cannot be combined with other columns")
                return None
            if isinstance(item, exp.Alias):
                name = item.alias
                node = compile_expression(item.this, self.table, aggregate=self.aggregate)
            else:
                node = compile_expression(item, self.table, aggregate=self.aggregate)
                plain = isinstance(node, Col) and not node.path and isinstance(item, exp.Column)
                name = node.name if isinstance(node, Col) and plain else show(item)
            outputs.append(Output(name, node))
        return tuple(outputs)

    def order(self, clause: object, outputs: tuple[Output, ...] | None) -> list[OrderItem]:
        if not isinstance(clause, exp.Order):
            return []
        items: list[OrderItem] = []
        for ordered in clause.expressions:
            node = ordered.this if isinstance(ordered, exp.Ordered) else ordered
            descending = bool(ordered.args.get("desc")) if isinstance(ordered, exp.Ordered) else False
            nulls_first = ordered.args.get("nulls_first") if isinstance(ordered, exp.Ordered) else None
            items.append(OrderItem(self.order_node(node, outputs), descending, nulls_first))
        return items

    def order_node(self, node: exp.Expression, outputs: tuple[Output, ...] | None) -> Node:
        if isinstance(node, exp.Literal) and not node.is_string:
            if outputs is None:
                raise ExpressionError(f"ORDER BY {node.sql()} needs named columns in SELECT, not *")
            index = int(str(node.this)) if str(node.this).isdigit() else 0
            if not 1 <= index <= len(outputs):
                raise ExpressionError(
                    f"ORDER BY {node.sql()}: SELECT has {len(outputs)} columns{position(node)}"
                )
            return outputs[index - 1].node
        if isinstance(node, exp.Column) and outputs is not None and not node.table:
            for output in outputs:
                if output.name.casefold() == node.name.casefold() and not (
                    isinstance(output.node, Col) and output.node.name.casefold() == node.name.casefold()
                ):
                    return output.node
        return compile_expression(node, self.table, aggregate=self.aggregate)


def _ordinal(node: exp.Literal, items: list[exp.Expression]) -> exp.Expression:
    text = str(node.this)
    index = int(text) if text.isdigit() else 0
    if not 1 <= index <= len(items):
        raise ExpressionError(f"GROUP BY {text}: SELECT has {len(items)} columns{position(node)}")
    return items[index - 1]


def _grouped(node: Node, group: list[Node]) -> Node:
    """`node` over a finished group: each GROUP BY expression it holds read from `#g<i>`; a column outside
    them and outside any aggregate is an error, as in SQL."""
    for index, candidate in enumerate(group):
        if _folded(node) == _folded(candidate):
            return Col(f"{GROUP_PREFIX}{index}")
    if isinstance(node, Col):
        if node.name.startswith(AGGREGATE_PREFIX) and not node.path:
            return node
        shown = ".".join((node.name, *node.path))
        raise ExpressionError(f"column {shown!r} must be in GROUP BY or inside an aggregate function")
    if isinstance(node, Call):
        return Call(node.op, tuple(_grouped(arg, group) for arg in node.args))
    return node


def _folded(node: Node) -> Node:
    """`node` with its column names case-folded: names match whatever their case (sql.py)."""
    if isinstance(node, Col):
        return Col(node.name.casefold(), tuple(part.casefold() for part in node.path))
    if isinstance(node, Call):
        return Call(node.op, tuple(_folded(arg) for arg in node.args))
    return node

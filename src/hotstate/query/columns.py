"""A partition's columns as Arrow arrays, and a scan's WHERE decided over them at once. Pure.

A replica that keeps a column copy of a partition (server/column_cache.py) answers a filter or a
`COUNT(*) ... WHERE` from it with one `pyarrow.compute` call per comparison, where reading the rows from
RocksDB and decoding them costs about a microsecond a row in Python (docs/queries.md, the cost model).

Only what has the very same answer both ways is taken: a column whose values are all ints (within int64),
all floats or all strings, NULLs among them; a top-level column compared with a number or string constant
(`=`, `!=`, `<`, `<=`, `>`, `>=`) where `expressions.batch_evaluator` would compare them with Python's
operators, `IS NULL`, `IN` and `NOT IN` lists of constants of the column's kind (ints or strings), and
AND, OR and NOT of such, with SQL's three values (each condition's TRUE and FALSE rows). Anything else
(another type, a coercion, an expression) has no column form, and the scan reads the rows as before, with
the row evaluator's answer or error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

import pyarrow as pa
import pyarrow.compute as pc

from hotstate.query.expressions import Call, Col, Lit, Node, column_condition

__all__ = [
    "aggregate_inputs",
    "column_aggregates",
    "column_array",
    "column_mask",
    "column_top",
    "joined_column",
    "top_inputs",
]

# Ints within this magnitude are exact as doubles: compared with a float, Arrow's double comparison
# answers what Python's exact one does.
_EXACT_IN_DOUBLE: Final = 2**53
_INT64 = (-(2**63), 2**63 - 1)

_KINDS: Final[dict[type, pa.DataType]] = {int: pa.int64(), float: pa.float64(), str: pa.string()}
_ORDER: Final = {"<": pc.less, "<=": pc.less_equal, ">": pc.greater, ">=": pc.greater_equal}
_EQUALITY: Final = {"=": pc.equal, "!=": pc.not_equal}


def column_array(values: Sequence[object]) -> pa.Array | None:
    """One column of a chunk of rows, as the rows hold it, as an Arrow array that means the same to
    `column_mask`; None when the values have no such form (mixed types, bools, other types, an int
    beyond int64, a string that is not UTF-8)."""
    kinds = set(map(type, values))
    kinds.discard(type(None))
    if not kinds:
        return pa.nulls(len(values))
    if len(kinds) != 1:
        return None
    arrow_type = _KINDS.get(kinds.pop())
    if arrow_type is None:
        return None
    try:
        return pa.array(values, arrow_type)
    except (pa.ArrowException, OverflowError, UnicodeError):
        return None


def joined_column(chunks: Sequence[pa.Array]) -> pa.ChunkedArray | None:
    """A column's chunks as one column, or None when their types differ (ints in one chunk, floats in
    another); a chunk of NULLs alone takes the others' type."""
    types = {chunk.type for chunk in chunks if chunk.type != pa.null()}
    if len(types) > 1:
        return None
    arrow_type = types.pop() if types else pa.null()
    return pa.chunked_array([chunk.cast(arrow_type) for chunk in chunks], arrow_type)


def column_mask(node: Node, columns: Mapping[str, pa.ChunkedArray]) -> pa.ChunkedArray | None:
    """For each row, whether the condition is TRUE (not FALSE, not NULL), or None when the columns'
    types give it no column form (the rows are read then)."""
    if column_condition(node) is None:
        return None
    truth = _truth(node, columns)
    return None if truth is None else truth[0]


# For each row, whether a condition is TRUE and whether it is FALSE (neither: NULL), SQL's three values.
_Truth = tuple[pa.ChunkedArray, pa.ChunkedArray]


def _truth(node: Node, columns: Mapping[str, pa.ChunkedArray]) -> _Truth | None:
    """`node`'s TRUE and FALSE rows, or None without a column form; `node` has column_condition's shape."""
    assert isinstance(node, Call)
    if node.op in ("and", "or"):
        left = _truth(node.args[0], columns)
        right = None if left is None else _truth(node.args[1], columns)
        if left is None or right is None:
            return None
        if node.op == "and":
            return pc.and_(left[0], right[0]), pc.or_(left[1], right[1])
        return pc.or_(left[0], right[0]), pc.and_(left[1], right[1])
    if node.op == "not":
        inner = _truth(node.args[0], columns)
        return None if inner is None else (inner[1], inner[0])
    column = node.args[0]
    assert isinstance(column, Col)
    values = columns.get(column.name)
    if values is None:
        return None
    if node.op == "is_null":
        return pc.is_null(values), pc.is_valid(values)
    if values.type == pa.null():  # every row NULL: each comparison and membership is NULL
        nothing = pa.chunked_array([pa.repeat(False, len(values))], pa.bool_())
        return nothing, nothing
    if node.op in ("in", "not_in"):
        found = _membership(values, node.args[1:])
        if found is None:
            return None
        # NULL IN (...) is NULL; is_in gives false for it, so the FALSE rows are the non-NULL others.
        absent = pc.and_(pc.is_valid(values), pc.invert(found))
        return (found, absent) if node.op == "in" else (absent, found)
    compared = _compared(node, values)
    if compared is None:
        return None
    return pc.fill_null(compared, False), pc.fill_null(pc.invert(compared), False)


def _membership(values: pa.ChunkedArray, items: Sequence[Node]) -> pa.ChunkedArray | None:
    """Whether each value is one of the constants `items`, when they all are of the column's kind (ints
    for int64, strings for strings: as `expressions._in` tests them, with no coercion)."""
    constants: list[Any] = [item.value for item in items if isinstance(item, Lit)]
    kinds = {type(value) for value in constants}
    if len(kinds) != 1 or len(constants) != len(items) or values.type != _KINDS.get(kinds.pop()):
        return None
    if values.type == pa.int64() and not all(_INT64[0] <= value <= _INT64[1] for value in constants):
        return None
    return pc.is_in(values, value_set=pa.array(constants, values.type))


def _compared(node: Call, values: pa.ChunkedArray) -> pa.ChunkedArray | None:
    """The comparison `column op constant` of each value (NULL for a NULL), or None without a form."""
    constant = node.args[1]
    assert isinstance(constant, Lit)
    value: Any = constant.value
    kind = type(value)
    if node.op in _EQUALITY:
        # expressions.batch_evaluator compares in one step only a value of exactly the constant's type.
        if values.type != _KINDS[kind]:
            return None
        compare = _EQUALITY[node.op]
    else:
        compare = _ORDER[node.op]
        if kind is str:
            # UTF-8's byte order is the code points' order, which Python's str comparison follows.
            if values.type != pa.string():
                return None
        elif values.type == pa.string() or not _exact(values, value):
            return None
    if kind is int and not _INT64[0] <= value <= _INT64[1]:
        return None
    return compare(values, pa.scalar(value, _KINDS[kind]))


def _exact(values: pa.ChunkedArray, value: int | float) -> bool:
    """Whether Arrow's comparison of numbers of these two kinds is Python's: the same kind, or the int
    side exact as a double."""
    if type(value) is int:
        return values.type == pa.int64() or abs(value) <= _EXACT_IN_DOUBLE
    if values.type == pa.float64():
        return True
    low, high = pc.min_max(values).values()
    return low.as_py() is None or (
        abs(low.as_py()) <= _EXACT_IN_DOUBLE and abs(high.as_py()) <= _EXACT_IN_DOUBLE
    )


def _sum_exact(values: pa.ChunkedArray) -> bool:
    """Whether Arrow's int64 sum of `values` (or of any subset) cannot overflow: Python's sum is exact."""
    low, high = (scalar.as_py() for scalar in pc.min_max(values).values())
    return low is None or max(abs(low), abs(high)) * max(1, len(values)) < 2**63


def aggregate_inputs(
    group: Sequence[str], aggregates: Sequence[tuple[str, str | None]], columns: Mapping[str, pa.ChunkedArray]
) -> dict[str, pa.ChunkedArray] | None:
    """The columns `column_aggregates` reads (`g<i>`: the i-th GROUP BY column, `a<j>`: the j-th
    aggregate's), or None when a column's type gives the aggregates no exact column form: GROUP BY on ints
    or strings; SUM and AVG of ints that cannot overflow int64 (floats are summed in key order by the
    rows' rule, and an Arrow sum adds them in another order); MIN and MAX of ints or strings; COUNT of
    any. `group` names the GROUP BY columns, `aggregates` are (function, column or None for COUNT(*))."""
    inputs: dict[str, pa.ChunkedArray] = {}
    for index, name in enumerate(group):
        values = columns.get(name)
        if values is None or values.type not in (pa.int64(), pa.string()):
            return None
        inputs[f"g{index}"] = values
    for index, (func, arg) in enumerate(aggregates):
        if func == "count_star":
            continue
        values = None if arg is None else columns.get(arg)
        if values is None or values.type == pa.null():
            return None
        if func in ("sum", "avg"):
            if values.type != pa.int64() or not _sum_exact(values):
                return None
        elif func in ("min", "max"):
            if values.type not in (pa.int64(), pa.string()):
                return None
        elif func != "count":
            return None
        inputs[f"a{index}"] = values
    return inputs


def column_aggregates(
    groups: int,
    aggregates: Sequence[tuple[str, str | None]],
    inputs: Mapping[str, pa.ChunkedArray],
    mask: pa.ChunkedArray | None,
    rows: int,
    max_groups: int,
) -> dict[tuple[object, ...], list[Any]]:
    """Partial aggregates by group, in query/scan.py's states, of the rows `mask` keeps (all `rows`: None)
    of `aggregate_inputs`' columns (or a slice of each), `groups` of them GROUP BY columns. ValueError past
    `max_groups`."""
    if not inputs:  # COUNT(*) alone, without GROUP BY
        count = rows if mask is None else pc.sum(mask).as_py() or 0
        # As the rows' COUNT(*) ... WHERE: a count, 0 too, once there were rows to count.
        return {(): [count for _ in aggregates]} if rows else {}
    data = pa.table(dict(inputs))
    if mask is not None:
        data = data.filter(mask)
    if not data.num_rows:
        return {}
    requests: list[tuple[Any, ...]] = [([], "count_all")]
    for index, (func, _) in enumerate(aggregates):
        column = f"a{index}"
        if func in ("sum", "avg"):
            requests.append((column, "sum", pc.ScalarAggregateOptions(min_count=1)))
        if func in ("count", "avg"):
            requests.append((column, "count"))
        if func in ("min", "max"):
            requests.append((column, func))
    keys = [f"g{index}" for index in range(groups)]
    if keys:
        result = data.group_by(keys, use_threads=False).aggregate(requests).to_pydict()
    else:
        result = {"count_all": [data.num_rows]}
        for column, func, *_ in requests[1:]:
            result[f"{column}_{func}"] = [_scalar(func, data.column(column))]
    found = len(result["count_all"])
    if found > max_groups:
        raise ValueError(f"the GROUP BY makes more than {max_groups:,} groups (the limit)")
    out: dict[tuple[object, ...], list[Any]] = {}
    for at in range(found):
        key = tuple(result[name][at] for name in keys)
        states: list[Any] = []
        for index, (func, _) in enumerate(aggregates):
            column = f"a{index}"
            if func == "count_star":
                states.append(result["count_all"][at])
            elif func == "avg":
                states.append([result[f"{column}_sum"][at], result[f"{column}_count"][at]])
            else:
                states.append(result[f"{column}_{func}"][at])
        out[key] = states
    return out


def _scalar(func: str, values: pa.ChunkedArray) -> object:
    if func == "sum":
        return pc.sum(values, min_count=1).as_py()
    if func == "count":
        return pc.count(values).as_py()
    return (pc.min if func == "min" else pc.max)(values).as_py()


def top_inputs(
    order: Sequence[tuple[str, bool, bool]], columns: Mapping[str, pa.ChunkedArray]
) -> dict[str, pa.ChunkedArray] | None:
    """The columns `column_top` sorts by (`o<i>`: the i-th ORDER BY item's), or None when they have no
    column form that sorts as the rows do: ints, strings, floats without NaN (Python's order of a NaN is no
    order). `order`: (column, descending, NULLs first)."""
    inputs = {}
    for index, (name, _, _) in enumerate(order):
        values = columns.get(name)
        if values is None or values.type not in (pa.int64(), pa.string(), pa.float64()):
            return None
        if values.type == pa.float64() and pc.any(pc.is_nan(values)).as_py():
            return None
        inputs[f"o{index}"] = values
    return inputs


def column_top(
    order: Sequence[tuple[str, bool, bool]],
    inputs: Mapping[str, pa.ChunkedArray],
    keys: pa.ChunkedArray,
    mask: pa.ChunkedArray | None,
    keep: int,
) -> tuple[list[bytes], list[list[object]]]:
    """The first `keep` rows `mask` keeps (all: None) by ORDER BY `order` and then by key, as the rows'
    top-n takes them: their keys and each one's ORDER BY values."""
    table = pa.table({**inputs, "#key": keys})
    if mask is not None:
        table = table.filter(mask)
    if not table.num_rows or not keep:
        return [], []
    sort_keys = [
        (f"o{index}", "descending" if descending else "ascending", "at_start" if nulls_first else "at_end")
        for index, (_, descending, nulls_first) in enumerate(order)
    ]
    indices = pc.sort_indices(table, sort_keys=[*sort_keys, ("#key", "ascending", "at_end")])
    top = table.take(indices.slice(0, keep)).to_pydict()
    values = [[top[f"o{index}"][at] for index in range(len(order))] for at in range(len(top["#key"]))]
    return top["#key"], values

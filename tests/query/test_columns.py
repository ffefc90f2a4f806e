"""The column form of a scan's WHERE (query/columns.py): the same rows as the row evaluator, or no answer."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from hotstate.protocol.rows import Projection
from hotstate.query.columns import (
    aggregate_inputs,
    column_aggregates,
    column_array,
    column_mask,
    column_top,
    joined_column,
    top_inputs,
)
from hotstate.query.expressions import Call, Col, Lit, Node, column_condition, evaluator

_BIG = 2**53 + 1  # not exact as a double: a float comparison of it needs Python's exact rule

_values = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-5, 5),
    st.sampled_from([_BIG, -_BIG, 2**62]),
    st.floats(-5, 5),
    st.sampled_from([float("nan"), float("inf"), 9007199254740992.0]),
    st.sampled_from(["a", "b", "5", "", "é", "\U0001f600"]),
    st.sampled_from([Decimal("1.5"), b"x"]),
)
_constants = st.one_of(
    st.integers(-5, 5),
    st.sampled_from([_BIG, 2**70]),
    st.floats(-5, 5),
    st.sampled_from([float("nan"), 9007199254740992.0]),
    st.sampled_from(["a", "b", "5", "é", "\U0001f600"]),
)


def _leaves(constants: st.SearchStrategy[Any], ops: list[str], items: st.SearchStrategy[Any]) -> Any:
    """Conditions on a column x or y: comparisons with `constants`, IS NULL, [NOT] IN lists of `items`."""
    columns = st.sampled_from(["x", "y"])
    return st.one_of(
        st.builds(
            lambda op, c, value: Call(op, (Col(c), Lit(value))), st.sampled_from(ops), columns, constants
        ),
        st.builds(lambda c: Call("is_null", (Col(c),)), columns),
        st.builds(
            lambda op, c, values: Call(op, (Col(c), *map(Lit, values))),
            st.sampled_from(["in", "not_in"]),
            columns,
            st.lists(items, min_size=1, max_size=4),
        ),
    )


def _nested(leaves: st.SearchStrategy[Any], max_leaves: int) -> Any:
    """AND, OR and NOT over `leaves`: SQL's three values (a NULL comparison under NOT stays NULL)."""
    return st.recursive(
        leaves,
        lambda inner: st.one_of(
            st.builds(lambda a, b: Call("and", (a, b)), inner, inner),
            st.builds(lambda a, b: Call("or", (a, b)), inner, inner),
            st.builds(lambda a: Call("not", (a,)), inner),
        ),
        max_leaves=max_leaves,
    )


_conditions = _nested(
    _leaves(
        _constants,
        ["=", "!=", "<", "<=", ">", ">="],
        st.one_of(st.integers(-5, 5), st.sampled_from([_BIG, 2**70]), st.sampled_from(["a", "b", "é"])),
    ),
    4,
)


def _columns(pairs: list[tuple[object, object]], chunk: int) -> dict[str, pa.ChunkedArray] | None:
    """The two columns of `pairs` built a chunk at a time as a replica's copy is, or None (no form)."""
    columns = {}
    for index, name in enumerate(("x", "y")):
        values = [pair[index] for pair in pairs]
        arrays = [column_array(values[at : at + chunk]) for at in range(0, len(values), chunk)]
        if any(array is None for array in arrays):
            return None
        joined = joined_column([a for a in arrays if a is not None] or [pa.nulls(0)])
        if joined is None:
            return None
        columns[name] = joined
    return columns


@settings(max_examples=400, deadline=None)  # the first pyarrow.compute call loads its kernels
@given(
    _conditions,
    st.one_of(
        st.lists(st.tuples(st.integers(-5, 5), st.integers(-5, 5)), max_size=12),
        st.lists(
            st.tuples(st.one_of(st.floats(allow_nan=True), st.none()), st.one_of(st.integers(), st.none())),
            max_size=12,
        ),
        st.lists(
            st.tuples(st.sampled_from(["a", "b", "5", "é"]), st.sampled_from(["a", "b", None])), max_size=12
        ),
        st.lists(st.tuples(_values, _values), max_size=12),
    ),
    st.integers(1, 5),
)
def test_the_column_form_keeps_the_rows_the_row_evaluator_finds_true(
    condition: Node, pairs: list[tuple[object, object]], chunk: int
) -> None:
    assert column_condition(condition) is not None
    columns = _columns(pairs, chunk)
    if columns is None:
        return  # values with no Arrow form of the same meaning: the scan reads the rows
    mask = column_mask(condition, columns)
    if mask is None:
        return  # no column form for these types: the scan reads the rows
    projection = Projection(["x", "y"])
    one = evaluator(condition, projection.readers)
    assert mask.to_pylist() == [one(projection.of_row(pair)) is True for pair in pairs]


@settings(max_examples=300, deadline=None)
@given(
    _nested(_leaves(st.integers(-2, 2), ["=", "!=", "<", ">="], st.integers(-2, 2)), 5),
    st.lists(
        st.tuples(st.one_of(st.none(), st.integers(-2, 2)), st.one_of(st.none(), st.integers(-2, 2))),
        min_size=1,
        max_size=12,
    ),
)
def test_and_or_not_over_int_columns_keep_the_rows_the_row_evaluator_finds_true(
    condition: Node, pairs: list[tuple[object, object]]
) -> None:
    """Every leaf has a column form here, so the property is about AND, OR and NOT's three values."""
    columns = _columns(pairs, 4)
    assert columns is not None
    mask = column_mask(condition, columns)
    assert mask is not None
    projection = Projection(["x", "y"])
    one = evaluator(condition, projection.readers)
    assert mask.to_pylist() == [one(projection.of_row(pair)) is True for pair in pairs]


def test_values_of_one_kind_with_nulls_have_a_column_form_and_others_none() -> None:
    assert column_array([1, None, 3]).type == pa.int64()  # type: ignore[union-attr]
    assert column_array([1.5, None]).type == pa.float64()  # type: ignore[union-attr]
    assert column_array(["a", None]).type == pa.string()  # type: ignore[union-attr]
    assert column_array([None, None]).type == pa.null()  # type: ignore[union-attr]
    for odd in (
        [1, 2.5],
        [True, False],
        [1, True],
        [2**63],
        [Decimal(1)],
        [b"x"],
        ["\ud800"],
        [dt.date(2026, 1, 1)],
    ):
        assert column_array(odd) is None, odd
    # ints in one chunk, floats in another: no column; a chunk of NULLs takes the others' type
    assert joined_column([pa.array([1]), pa.array([1.5])]) is None
    joined = joined_column([pa.nulls(2), pa.array([1, 2])])
    assert joined is not None and joined.type == pa.int64() and joined.to_pylist() == [None, None, 1, 2]


def test_the_column_form_takes_simple_conditions_and_the_types_they_mean_the_same_for() -> None:
    ints = {"x": pa.chunked_array([pa.array([1, 7, None, 3])])}
    mask = column_mask(Call("=", (Col("x"), Lit(7))), ints)
    assert mask is not None and mask.to_pylist() == [False, True, False, False]
    mask = column_mask(Call("<", (Col("x"), Lit(2.5))), ints)  # ints against a float, exact as doubles
    assert mask is not None and mask.to_pylist() == [True, False, False, False]
    # Equality with a constant of another kind, order across strings and numbers: the rows decide.
    assert column_mask(Call("=", (Col("x"), Lit(7.0))), ints) is None
    assert column_mask(Call("<", (Col("x"), Lit("7"))), ints) is None
    big = {"x": pa.chunked_array([pa.array([_BIG])])}
    assert column_mask(Call("<", (Col("x"), Lit(1.5))), big) is None  # not exact as a double
    assert column_mask(Call("=", (Col("z"), Lit(1))), ints) is None  # no such column in the copy
    for node in (
        Call("or", (Call("=", (Col("x"), Lit(7))), Call("like", (Col("y"), Lit("s%"), Lit(""))))),
        Call("=", (Col("x"), Col("y"))),
        Call("=", (Col("x", ("f",)), Lit(1))),
        Call("=", (Col("x"), Lit(None))),
        Call("=", (Col("x"), Lit(True))),
        Call("=", (Col("x"), Lit(dt.date(2026, 1, 1)))),
        Call("and", (Call("=", (Col("x"), Lit(7))), Call("in", (Col("y"), Col("x"))))),
        Call("not", (Call("in", (Col("y"), Lit(True))),)),
        Call("is_null", (Call("+", (Col("x"), Lit(1))),)),
    ):
        assert column_condition(node) is None, node
        assert column_mask(node, ints) is None
    assert column_condition(
        Call("and", (Call("=", (Col("x"), Lit(7))), Call(">", (Col("y"), Lit("s")))))
    ) == frozenset({"x", "y"})
    # NULL IN (...), NOT of a NULL comparison: NULL, so neither kept nor, under NOT, turned TRUE.
    nulls = {"x": pa.chunked_array([pa.array([1, None, 3])])}
    for node, kept in (
        (Call("in", (Col("x"), Lit(1), Lit(2))), [True, False, False]),
        (Call("not_in", (Col("x"), Lit(1), Lit(2))), [False, False, True]),
        (Call("not", (Call("=", (Col("x"), Lit(1))),)), [False, False, True]),
        (Call("not", (Call("is_null", (Col("x"),)),)), [True, False, True]),
        (Call("or", (Call("is_null", (Col("x"),)), Call("=", (Col("x"), Lit(3))))), [False, True, True]),
    ):
        mask = column_mask(node, nulls)
        assert mask is not None and mask.to_pylist() == kept, node
    assert column_mask(Call("in", (Col("x"), Lit(1), Lit("1"))), nulls) is None  # the rows decide


_AGGREGATES = ["count_star", "count", "sum", "min", "max", "avg"]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.integers(-3, 3)),
            st.one_of(st.none(), st.sampled_from(["a", "b", "é"])),
            st.one_of(st.none(), st.integers(-(2**40), 2**40), st.sampled_from([2**62, -(2**62)])),
        ),
        max_size=15,
    ),
    st.lists(st.sampled_from(["gi", "gs"]), max_size=2, unique=True),
    st.lists(
        st.tuples(st.sampled_from(_AGGREGATES), st.sampled_from(["v", "gs", "gi"])), min_size=1, max_size=4
    ),
    st.one_of(st.none(), st.builds(lambda c: Call(">", (Col("v"), Lit(c))), st.integers(-5, 5))),
    st.integers(1, 6),
)
def test_the_column_form_of_aggregates_gives_the_rows_partial_states(
    rows: list[tuple[int | None, str | None, int | None]],
    group: list[str],
    aggregates: list[tuple[str, str]],
    where: Node | None,
    step: int,
) -> None:
    from hotstate.protocol.rows import encode_row
    from hotstate.query.expressions import EvalError, unpack
    from hotstate.query.scan import AGGREGATE, Aggregate, ScanProgram, ScanRun, merged_state

    program = ScanProgram(
        AGGREGATE,
        where,
        group=tuple(Col(name) for name in group),
        aggregates=tuple(
            Aggregate(func, None if func == "count_star" else Col(arg)) for func, arg in aggregates
        ),
    )
    data = [{"gi": gi, "gs": gs, "v": v} for gi, gs, v in rows]
    run = ScanRun(program)
    try:
        run.feed([(b"k%03d" % at, encode_row(row)) for at, row in enumerate(data)])
        answer = run.answer()[1]
    except EvalError:
        # SUM of strings, a sum past int64 and the like: the rows' error, which the column form never answers
        return
    partial: Any = unpack(answer)
    want = {tuple(key): states for key, states in partial["groups"]}
    columns: Any = {
        name: joined_column([column_array([row[name] for row in data])]) for name in ("gi", "gs", "v")
    }
    assert all(column is not None for column in columns.values())
    mask = None if where is None else column_mask(where, columns)
    specs = [(func, None if func == "count_star" else arg) for func, arg in aggregates]
    inputs = aggregate_inputs(group, specs, columns)
    if inputs is None or (where is not None and mask is None):
        return  # no exact column form for these types: the scan reads the rows
    # A slice at a time, as a replica's steps take them, merged as its run merges them.
    got: dict[tuple[object, ...], list[Any]] = {}
    for start in range(0, max(1, len(data)), step):
        sliced = {name: column.slice(start, step) for name, column in inputs.items()}
        part = None if mask is None else mask.slice(start, step)
        rows_in = min(step, len(data) - start)
        for key, states in column_aggregates(len(group), specs, sliced, part, rows_in, 1000).items():
            mine = got.setdefault(key, states)
            if mine is not states:
                got[key] = [
                    merged_state(func, a, b) for (func, _), a, b in zip(specs, mine, states, strict=True)
                ]
    assert {
        key: [list(s) if isinstance(s, tuple) else s for s in states] for key, states in got.items()
    } == want


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.one_of(st.none(), st.integers(-3, 3)),
            st.one_of(st.none(), st.sampled_from(["a", "b", "é"])),
            st.one_of(st.none(), st.sampled_from([0.0, -0.0, 1.5, -2.5, float("nan"), float("inf")])),
        ),
        max_size=15,
    ),
    st.lists(
        st.tuples(st.sampled_from(["gi", "gs", "v"]), st.booleans(), st.one_of(st.none(), st.booleans())),
        min_size=1,
        max_size=3,
    ),
    st.integers(0, 6),
    st.integers(1, 6),
)
def test_the_column_form_of_a_top_n_takes_the_rows_top_n(
    rows: list[tuple[int | None, str | None, float | None]],
    order: list[tuple[str, bool, bool | None]],
    keep: int,
    step: int,
) -> None:
    import heapq

    from hotstate.protocol.rows import encode_row
    from hotstate.query.scan import TOP, OrderItem, ScanProgram, ScanRun, sort_key_of

    items = tuple(OrderItem(Col(name), descending, nulls) for name, descending, nulls in order)
    data = [{"gi": gi, "gs": gs, "v": v} for gi, gs, v in rows]
    encoded = [(b"k%03d" % at, encode_row(row)) for at, row in enumerate(data)]
    run = ScanRun(ScanProgram(TOP, None, keep, items))
    run.feed(encoded)
    want = [key for key, _ in run.answer()[0]]
    columns: Any = {
        name: joined_column([column_array([row[name] for row in data])]) for name in ("gi", "gs", "v")
    }
    spec = [(name, descending, descending if nulls is None else nulls) for name, descending, nulls in order]
    inputs = top_inputs(spec, columns)
    if inputs is None:
        return  # a NaN: the rows' order
    keys = pa.chunked_array([pa.array([key for key, _ in encoded], pa.binary())], pa.binary())
    best: list[tuple[tuple[object, ...], bytes]] = []
    for start in range(0, max(1, len(data)), step):  # a slice at a time, as a replica's steps take them
        sliced = {name: column.slice(start, step) for name, column in inputs.items()}
        found, values = column_top(spec, sliced, keys.slice(start, step), None, keep)
        best = heapq.nsmallest(
            keep, [*best, *((sort_key_of(v, items), k) for k, v in zip(found, values, strict=True))]
        )
    assert [key for _, key in best] == want

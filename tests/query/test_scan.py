"""Scans end to end without servers: SQL -> ScanSpec -> per-partition ScanRun -> merge, with sqlite3 as the
oracle for filters, aggregates, GROUP BY/HAVING and ORDER BY ... LIMIT over rows split among partitions."""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotstate.protocol.rows import encode_row
from hotstate.query.expressions import Col, EvalError
from hotstate.query.pull_query import QueryError, UnsupportedQueryError
from hotstate.query.scan import (
    AGGREGATE,
    MAX_GROUPS,
    Aggregate,
    Finished,
    ScanProgram,
    ScanRun,
    finish,
    merge_partials,
    program_for,
    spec_of_conditions,
)
from hotstate.query.sql import parse

MAX_ROWS = 1000


def run(
    sql: str,
    rows: Sequence[dict[str, object]],
    *,
    partitions: int = 3,
    step: int = 2,
    max_rows: int = MAX_ROWS,
) -> Finished:
    """`sql` over `rows` (key column `k`, its value the row's index) split round robin among partitions."""
    query = parse(sql)
    spec = query.scan or spec_of_conditions(query.conditions, query.columns)
    program = ScanProgram.decode(program_for(spec, query.limit, max_rows).encode())  # as on the wire
    items = [(index.to_bytes(8, "big"), encode_row({"k": index, **row})) for index, row in enumerate(rows)]
    answers = []
    for partition in range(partitions):
        mine = items[partition::partitions]
        scan = ScanRun(program)
        for start in range(0, len(mine), step):
            scan.feed(mine[start : start + step])
            if scan.done:
                break
        answers.append(scan.answer())
    return finish(spec, query.limit, [a[0] for a in answers], [a[1] for a in answers], ["k"], max_rows)


def sqlite(sql: str, rows: Sequence[dict[str, object]]) -> list[tuple[object, ...]]:
    db = sqlite3.connect(":memory:")
    db.execute("CREATE TABLE t (k INTEGER, g INTEGER, x INTEGER, s TEXT)")
    db.executemany(
        "INSERT INTO t VALUES (?, ?, ?, ?)", [(i, r["g"], r["x"], r["s"]) for i, r in enumerate(rows)]
    )
    return [tuple(row) for row in db.execute(sql)]


_rows = st.lists(
    st.fixed_dictionaries(
        {
            "g": st.one_of(st.none(), st.integers(0, 3)),
            "x": st.one_of(st.none(), st.integers(-5, 5)),
            "s": st.one_of(st.none(), st.sampled_from(["a", "ab", "b", "ba"])),
        }
    ),
    max_size=25,
)


def _same(got: list[list[object]], expected: list[tuple[object, ...]], *, ordered: bool) -> None:
    def norm(row: Sequence[object]) -> tuple[object, ...]:
        return tuple(round(v, 9) if isinstance(v, float) else v for v in row)

    mine = [norm(row) for row in got]
    theirs = [norm(row) for row in expected]
    if not ordered:
        mine.sort(key=repr)
        theirs.sort(key=repr)
    assert mine == theirs


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT g, COUNT(*), COUNT(x), COUNT(DISTINCT x), SUM(x), MIN(x), MAX(x), AVG(x) FROM t GROUP BY g",
        "SELECT COUNT(*), SUM(x), MIN(s), MAX(s), AVG(x) FROM t",
        "SELECT COUNT(*) FROM t WHERE x > 0 OR s LIKE 'a%'",
        "SELECT g, SUM(x) AS total FROM t WHERE s IS NOT NULL GROUP BY g HAVING COUNT(*) > 1",
        "SELECT g, s, COUNT(*) FROM t GROUP BY g, s",
        "SELECT g + 1, MAX(x) - MIN(x) FROM t GROUP BY g + 1",
        "SELECT g, COUNT(*) FROM t GROUP BY 1 HAVING SUM(x) IS NULL OR SUM(x) > 2",
    ],
)
@given(rows=_rows)
@settings(max_examples=60, deadline=None)
def test_aggregates_agree_with_sqlite(sql: str, rows: list[dict[str, object]]) -> None:
    _same(run(sql, rows).rows, sqlite(sql, rows), ordered=False)


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT k, x FROM t WHERE x > 1 ORDER BY x DESC, k LIMIT 4",
        "SELECT k, x FROM t ORDER BY x, k LIMIT 3",
        "SELECT k, x * 2 AS y FROM t WHERE s = 'a' ORDER BY y DESC, k",
        "SELECT g, COUNT(*) AS n FROM t GROUP BY g ORDER BY n DESC, g LIMIT 2",
        "SELECT g, SUM(x) FROM t GROUP BY g ORDER BY 2, 1",
        "SELECT k FROM t WHERE x BETWEEN -1 AND 1 AND NOT s = 'b' ORDER BY k",
    ],
)
@given(rows=_rows)
@settings(max_examples=60, deadline=None)
def test_order_by_limit_agrees_with_sqlite(sql: str, rows: list[dict[str, object]]) -> None:
    _same(run(sql, rows).rows, sqlite(sql, rows), ordered=True)


@given(rows=_rows, limit=st.integers(0, 6))
@settings(max_examples=80, deadline=None)
def test_a_filter_keeps_key_order_and_pages(rows: list[dict[str, object]], limit: int) -> None:
    done = run(f"SELECT k, x FROM t WHERE x > 0 LIMIT {limit}", rows)
    matching = [(i, r["x"]) for i, r in enumerate(rows) if r["x"] is not None and r["x"] > 0]  # type: ignore[operator]
    assert [tuple(row) for row in done.rows] == matching[:limit]
    more = len(matching) > limit
    assert (done.last_key is not None) is (more and limit > 0)
    if done.last_key is not None:
        assert int.from_bytes(done.last_key, "big") == matching[limit - 1][0]


def test_plain_where_on_a_non_key_column_and_select_star() -> None:
    rows = [{"g": 1, "x": 5, "s": "a"}, {"g": 2, "x": 1, "s": "b"}]
    done = run("SELECT * FROM t WHERE x > 2", rows)
    assert done.columns == ["k", "g", "x", "s"]
    assert done.rows == [[0, 1, 5, "a"]]


def test_count_over_no_rows_is_one_row_of_zero() -> None:
    assert run("SELECT COUNT(*), SUM(x) FROM t", []).rows == [[0, None]]
    assert run("SELECT g, COUNT(*) FROM t GROUP BY g", []).rows == []


def test_aggregate_output_names() -> None:
    done = run("SELECT g, COUNT(*), SUM(x) AS total FROM t GROUP BY g", [{"g": 1, "x": 1, "s": None}])
    assert done.columns == ["g", "COUNT(*)", "total"]


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        ("SELECT g, x FROM t GROUP BY g", "column 'x' must be in GROUP BY or inside an aggregate"),
        ("SELECT * FROM t GROUP BY g", "SELECT * cannot be combined with GROUP BY"),
        ("SELECT x FROM t HAVING x > 1", "HAVING needs GROUP BY or an aggregate"),
        ("SELECT SUM(COUNT(x)) FROM t", "aggregates cannot be nested"),
        ("SELECT SUM(DISTINCT x) FROM t", "DISTINCT is supported only in COUNT"),
        ("SELECT * FROM t JOIN u ON t.k = u.k", "joins are not supported"),
        ("SELECT * FROM t WHERE k IN (SELECT k FROM u)", "subqueries are not supported"),
        ("SELECT x, ROW_NUMBER() OVER (ORDER BY x) FROM t", "window functions are not supported"),
        ("SELECT * FROM t ORDER BY 1", "ORDER BY 1 needs named columns"),
        ("SELECT g FROM t GROUP BY 3", "GROUP BY 3: SELECT has 1 columns"),
        ("SELECT * FROM t WHERE x + 1", "WHERE needs a condition"),
    ],
)
def test_refused_with_a_message_naming_it(sql: str, message: str) -> None:
    with pytest.raises((QueryError, UnsupportedQueryError)) as caught:
        run(sql, [{"g": 1, "x": 1, "s": "a"}])
    assert message in str(caught.value)


def test_a_column_no_row_has_is_an_error() -> None:
    with pytest.raises(EvalError, match="no row has column 'nope'"):
        run("SELECT COUNT(*) FROM t WHERE nope > 1", [{"g": 1, "x": 1, "s": "a"}])
    with pytest.raises(QueryError, match="column 'nope' is not in the table"):
        run("SELECT nope + 1 FROM t", [{"g": 1, "x": 1, "s": "a"}])


def test_a_type_error_on_a_row_is_an_error() -> None:
    with pytest.raises(EvalError, match="cannot compare string 'a' with number 1"):
        run("SELECT COUNT(*) FROM t WHERE s > 1", [{"g": 1, "x": 1, "s": "a"}])
    with pytest.raises(EvalError, match="SUM needs numbers"):
        run("SELECT SUM(s) FROM t", [{"g": 1, "x": 1, "s": "a"}])


def test_order_by_without_limit_is_bounded_by_the_row_cap() -> None:
    rows = [{"g": 1, "x": i, "s": "a"} for i in range(12)]
    assert len(run("SELECT k FROM t ORDER BY x", rows, max_rows=12).rows) == 12
    with pytest.raises(QueryError, match="more than 11 rows: add a LIMIT"):
        run("SELECT k FROM t ORDER BY x", rows, max_rows=11)
    with pytest.raises(QueryError, match="more than 11 rows: add a LIMIT"):
        run("SELECT k FROM t WHERE x >= 0", rows, max_rows=11)


def test_group_and_distinct_caps() -> None:
    grouped = parse("SELECT x, COUNT(*) FROM t GROUP BY x").scan
    assert grouped is not None
    program = ScanProgram.decode(program_for(grouped, None, 10).encode())
    scan = ScanRun(program)
    items = [(i.to_bytes(8, "big"), encode_row({"x": i})) for i in range(MAX_GROUPS + 1)]
    with pytest.raises(EvalError, match="more than 100,000 groups"):
        scan.feed(items)
    spec = parse("SELECT COUNT(DISTINCT x) FROM t").scan
    assert spec is not None
    scan = ScanRun(program_for(spec, None, 10))
    with pytest.raises(EvalError, match="more than 100,000 distinct values"):
        scan.feed(items)


def test_rows_scanned_cap() -> None:
    spec = parse("SELECT COUNT(*) FROM t").scan
    assert spec is not None
    scan = ScanRun(program_for(spec, None, 10), max_scanned=3)
    items = [(i.to_bytes(8, "big"), encode_row({"x": i})) for i in range(4)]
    scan.feed(items[:3])
    with pytest.raises(EvalError, match="scanned more than 3 rows"):
        scan.feed(items[3:])


def test_partials_merge_in_any_order_and_grouping() -> None:
    spec = parse(
        "SELECT g, COUNT(*), COUNT(DISTINCT x), SUM(x), MIN(x), MAX(x), AVG(x) FROM t GROUP BY g"
    ).scan
    assert spec is not None
    program = program_for(spec, None, 10)
    rows = [{"g": i % 3, "x": i % 5} for i in range(30)]
    items = [(i.to_bytes(8, "big"), encode_row(r)) for i, r in enumerate(rows)]
    partials = []
    for part in (items[:7], items[7:8], items[8:]):
        scan = ScanRun(program)
        scan.feed(part)
        partials.append(scan.answer()[1])
    one = ScanRun(program)
    one.feed(items)
    whole = merge_partials(spec.aggregates, [one.answer()[1]])
    assert merge_partials(spec.aggregates, partials) == whole
    assert merge_partials(spec.aggregates, reversed(partials)) == whole


def test_floats_and_non_finite() -> None:
    rows = [{"g": 1, "x": 1, "s": "a"}]
    done = run("SELECT CAST(x AS DOUBLE) / 3 FROM t", rows)
    assert math.isclose(done.rows[0][0], 1 / 3)  # type: ignore[arg-type]
    assert not done.non_finite


def test_rows_lacking_a_column_or_naming_it_in_another_case_read_as_whole_rows_do() -> None:
    """A replica decodes only the program's columns, by their exact names; a row without one of them
    exactly (absent, or `X` for `x`) is read as expressions read a whole row: case-insensitively, else
    NULL. Mixed in one chunk with rows that have every name."""
    rows: list[dict[str, object]] = [
        {"g": 1, "x": 3, "s": "a"},
        {"g": 1, "X": 5, "s": "b"},  # x by another case
        {"g": 2, "s": "c"},  # no x at all
        {"g": 2, "x": None, "s": "d"},
        {"G": 2, "x": 7, "s": "e"},
    ]
    assert run("SELECT COUNT(*) FROM t WHERE x >= 3", rows, partitions=1, step=5).rows == [[3]]
    assert run("SELECT s FROM t WHERE x = 5", rows, partitions=1, step=5).rows == [["b"]]
    assert run(
        "SELECT g, SUM(x), COUNT(x) FROM t GROUP BY g ORDER BY g", rows, partitions=1, step=5
    ).rows == [
        [1, 8, 2],
        [2, 7, 1],
    ]
    assert run("SELECT s FROM t ORDER BY x DESC NULLS LAST LIMIT 2", rows, partitions=1, step=5).rows == [
        ["e"],
        ["b"],
    ]


def test_a_top_n_passes_over_rows_that_cannot_enter_and_keeps_ties_in_key_order() -> None:
    xs = [(i * 37) % 101 for i in range(3000)]
    rows = [{"g": i % 7, "x": x, "s": "a"} for i, x in enumerate(xs)]
    expected = sorted(range(3000), key=lambda i: (-xs[i], i))[:5]
    got = run("SELECT k FROM t ORDER BY x DESC LIMIT 5", rows, partitions=1, step=500)
    assert got.rows == [[i] for i in expected]
    expected = sorted(range(3000), key=lambda i: (xs[i], i))[:5]
    got = run("SELECT k FROM t ORDER BY x LIMIT 5", rows, partitions=1, step=500)
    assert got.rows == [[i] for i in expected]


def test_a_count_of_every_row_reads_only_keys() -> None:
    spec = parse("SELECT COUNT(*) FROM t").scan
    assert spec is not None
    scan = ScanRun(program_for(spec, None, MAX_ROWS))
    assert scan.keys_only
    scan.feed_keys([b"a", b"b"])
    scan.feed([(b"c", b"not even a row")])
    assert merge_partials(spec.aggregates, [scan.answer()[1]]) == {(): [3]}
    spec = parse("SELECT COUNT(*) FROM t WHERE x > 1").scan
    assert spec is not None
    assert not ScanRun(program_for(spec, None, MAX_ROWS)).keys_only


def test_a_partial_sum_past_64_bits_is_a_query_error_not_a_crash() -> None:
    program = ScanProgram(AGGREGATE, None, aggregates=(Aggregate("sum", Col("v")),))
    run = ScanRun(program)
    run.feed([(b"a", encode_row({"v": 2**63})), (b"b", encode_row({"v": 2**63}))])  # 2**64: past uint64
    with pytest.raises(EvalError, match="partial aggregate cannot be sent"):
        run.answer()

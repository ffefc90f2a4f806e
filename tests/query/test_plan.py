from __future__ import annotations

import datetime as dt
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotstate.controller.image import TableInfo
from hotstate.controller.records import WINDOW_KEY_TYPES, KeyColumn, KeyType
from hotstate.protocol.keys import KeyValue, encode_key, partition_for, prefix_end
from hotstate.query.plan import (
    Access,
    FullScan,
    InvalidKeyValueError,
    KeyLookup,
    KeyRange,
    QueryPlan,
    TableMismatchError,
    TooManyKeysError,
    UnknownTableError,
    find_table,
    general_access,
    plan,
    scan_access,
)
from hotstate.query.sql import (
    Condition,
    Op,
    Predicate,
    PullQuery,
    QueryError,
    TupleIn,
    UnsupportedQueryError,
    parse,
)


def table(*columns: tuple[str, KeyType], partitions: int = 4, name: str = "t") -> TableInfo:
    key = tuple(KeyColumn(column, kind) for column, kind in columns)
    return TableInfo(name, 7, partitions, 1, key, None)


BY_ID = table(("id", KeyType.INT))
BY_NAME = table(("name", KeyType.STRING))
BY_TS = table(("ts", KeyType.TIMESTAMP))
BY_USER_DAY = table(("user", KeyType.STRING), ("day", KeyType.INT), ("seq", KeyType.INT))


def access(sql: str, info: TableInfo, *, max_keys: int = 10_000) -> Access:
    return plan(parse(sql), info, max_keys=max_keys).access


def lookup(*keys: tuple[KeyValue, ...], partitions: int = 4) -> KeyLookup:
    encoded = sorted(encode_key(key) for key in keys)
    return KeyLookup(tuple(encoded), tuple(partition_for(key, partitions) for key in encoded))


NOTHING = KeyLookup((), ())


def selects(plan_access: Access, encoded: bytes) -> bool:
    if isinstance(plan_access, FullScan):
        return True
    if isinstance(plan_access, KeyLookup):
        return encoded in plan_access.keys
    start, end = plan_access.start, plan_access.end
    return (start is None or start <= encoded) and (end is None or encoded < end)


# --- plans ----------------------------------------------------------------------------------------------


def test_no_where_is_a_full_scan_with_columns_and_limit() -> None:
    assert plan(parse("SELECT a, B FROM T LIMIT 3"), BY_ID) == QueryPlan(FullScan(), ("a", "B"), 3)


def test_equality_and_in_are_lookups_deduplicated_in_key_order() -> None:
    assert access("SELECT * FROM t WHERE id = 5", BY_ID) == lookup((5,))
    assert access("SELECT * FROM t WHERE ID IN (3, -1, 2, 3)", BY_ID) == lookup((-1,), (2,), (3,))
    result = access("SELECT * FROM t WHERE id IN (10, 2)", BY_ID)
    assert isinstance(result, KeyLookup)
    assert list(result.keys) == sorted(result.keys)
    assert result.partitions == tuple(partition_for(key, 4) for key in result.keys)


def test_composite_key_lookup_is_the_cross_product_of_in_lists() -> None:
    sql = "SELECT * FROM t WHERE seq IN (1, 2) AND user IN ('b', 'a') AND day = 7"
    expected = lookup(("a", 7, 1), ("a", 7, 2), ("b", 7, 1), ("b", 7, 2))
    assert access(sql, BY_USER_DAY) == expected


def test_row_in_and_row_equality() -> None:
    info = table(("a", KeyType.INT), ("b", KeyType.STRING))
    assert access("SELECT * FROM t WHERE (a, b) IN ((1, 'x'), (2, 'y'), (1, 'x'))", info) == lookup(
        (1, "x"), (2, "y")
    )
    assert access("SELECT * FROM t WHERE (b, a) = ('x', 1)", info) == lookup((1, "x"))
    # A row IN narrowed by another condition on one of its columns.
    assert access("SELECT * FROM t WHERE (a, b) IN ((1, 'x'), (2, 'y')) AND a = 2", info) == lookup((2, "y"))
    assert access("SELECT * FROM t WHERE (a, b) IN ((1, 'x'), (2, 'y')) AND a > 1", info) == lookup((2, "y"))
    # A row IN on a prefix of the key, with one matching row, is a prefix range.
    three = table(("a", KeyType.INT), ("b", KeyType.STRING), ("c", KeyType.INT))
    prefix = encode_key((2, "y"))
    assert access("SELECT * FROM t WHERE (a, b) = (2, 'y')", three) == KeyRange(prefix, prefix + b"\xff")


def test_bounds_on_pinned_columns_filter_the_lookup() -> None:
    assert access("SELECT * FROM t WHERE id IN (1, 5, 9) AND id > 1 AND id <= 9", BY_ID) == lookup((5,), (9,))
    assert access("SELECT * FROM t WHERE id = 5 AND id BETWEEN 6 AND 9", BY_ID) == NOTHING


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM t WHERE id > 5 AND id < 3",
        "SELECT * FROM t WHERE id > 5 AND id <= 5",
        "SELECT * FROM t WHERE id >= 5 AND id < 5",
        "SELECT * FROM t WHERE id BETWEEN 9 AND 1",
        "SELECT * FROM t WHERE id = 1 AND id = 2",
        "SELECT * FROM t WHERE id IN (1, 2) AND id IN (3, 4)",
        "SELECT * FROM t WHERE id = NULL",
        "SELECT * FROM t WHERE id IN (NULL)",
        "SELECT * FROM t WHERE id > NULL",
        "SELECT * FROM t WHERE id BETWEEN 1 AND NULL",
    ],
)
def test_predicates_nothing_satisfies_plan_to_no_keys(sql: str) -> None:
    assert access(sql, BY_ID) == NOTHING


def test_null_in_an_in_list_is_ignored() -> None:
    assert access("SELECT * FROM t WHERE id IN (NULL, 4)", BY_ID) == lookup((4,))


def test_ranges_on_a_single_key_column() -> None:
    five, nine = encode_key((5,)), encode_key((9,))
    assert access("SELECT * FROM t WHERE id >= 5", BY_ID) == KeyRange(five, None)
    assert access("SELECT * FROM t WHERE id > 5", BY_ID) == KeyRange(five + b"\xff", None)
    assert access("SELECT * FROM t WHERE id < 9", BY_ID) == KeyRange(None, nine)
    assert access("SELECT * FROM t WHERE id <= 9", BY_ID) == KeyRange(None, nine + b"\xff")
    assert access("SELECT * FROM t WHERE id BETWEEN 5 AND 9", BY_ID) == KeyRange(five, nine + b"\xff")
    assert access("SELECT * FROM t WHERE id >= 3 AND 5 <= id AND id < 10 AND id < 9", BY_ID) == KeyRange(
        five, nine
    )
    # Equal values: the exclusive bound wins.
    assert access("SELECT * FROM t WHERE id >= 5 AND id > 5", BY_ID) == KeyRange(five + b"\xff", None)
    assert access("SELECT * FROM t WHERE id <= 9 AND id < 9", BY_ID) == KeyRange(None, nine)


def test_equality_on_a_prefix_plus_a_range_on_the_next_column() -> None:
    user = encode_key(("ann",))
    user_day = encode_key(("ann", 3))
    assert access("SELECT * FROM t WHERE user = 'ann'", BY_USER_DAY) == KeyRange(user, user + b"\xff")
    assert access("SELECT * FROM t WHERE user = 'ann' AND day > 3", BY_USER_DAY) == KeyRange(
        user_day + b"\xff", user + b"\xff"
    )
    assert access("SELECT * FROM t WHERE user = 'ann' AND day <= 3", BY_USER_DAY) == KeyRange(
        user, user_day + b"\xff"
    )
    assert access("SELECT * FROM t WHERE day = 3 AND user = 'ann'", BY_USER_DAY) == KeyRange(
        user_day, user_day + b"\xff"
    )
    result = access("SELECT * FROM t WHERE user = 'ann' AND day = 3 AND seq BETWEEN 1 AND 2", BY_USER_DAY)
    assert result == KeyRange(encode_key(("ann", 3, 1)), encode_key(("ann", 3, 2)) + b"\xff")


def test_a_string_prefix_is_not_bounded_by_prefix_end() -> None:
    # 'a' encodes as a byte prefix of 'a\x00', so prefix_end would let a greater string into `= 'a'`.
    info = table(("s", KeyType.STRING), ("n", KeyType.INT))
    inside, outside = encode_key(("a", 1)), encode_key(("a\x00", 1))
    assert prefix_end(encode_key(("a",))) is not None
    assert outside < prefix_end(encode_key(("a",)))  # type: ignore[operator]
    result = access("SELECT * FROM t WHERE s = 'a'", info)
    assert selects(result, inside) and not selects(result, outside)
    result = access("SELECT * FROM t WHERE s > 'a'", info)
    assert selects(result, outside) and not selects(result, inside)
    result = access("SELECT * FROM t WHERE s <= 'a'", info)
    assert selects(result, inside) and not selects(result, outside)


# --- coercion -------------------------------------------------------------------------------------------


def test_timestamps_from_strings_and_literals_in_utc() -> None:
    midnight = dt.datetime(2026, 1, 2)
    expected = lookup((midnight,))
    for literal in [
        "'2026-01-02 00:00:00'",
        "'2026-01-02T00:00:00Z'",
        "'2026-01-02T01:00:00+01:00'",
        "'2026-01-02'",
        "TIMESTAMP '2026-01-02 00:00:00'",
        "TIMESTAMP '2026-01-01 19:00:00-05:00'",
    ]:
        assert access(f"SELECT * FROM t WHERE ts = {literal}", BY_TS) == expected, literal
    result = access("SELECT * FROM t WHERE ts >= '2026-01-02' AND ts < TIMESTAMP '2026-01-03'", BY_TS)
    assert result == KeyRange(encode_key((midnight,)), encode_key((dt.datetime(2026, 1, 3),)))
    assert selects(result, encode_key((dt.datetime(2026, 1, 2, 23, 59, 59, 999999),)))
    assert not selects(result, encode_key((dt.datetime(2026, 1, 3),)))


def test_other_types() -> None:
    floats = table(("f", KeyType.FLOAT))
    assert access("SELECT * FROM t WHERE f IN (1, 1.0, -0.0, 0)", floats) == lookup((0.0,), (1.0,))
    bools = table(("b", KeyType.BOOL))
    assert access("SELECT * FROM t WHERE b = TRUE", bools) == lookup((True,))
    blobs = table(("b", KeyType.BYTES))
    assert access("SELECT * FROM t WHERE b IN (X'00ff', 0x01)", blobs) == lookup((b"\x00\xff",), (b"\x01",))
    assert access("SELECT * FROM t WHERE name = 'é'", BY_NAME) == lookup(("é",))


@pytest.mark.parametrize(
    ("info", "where", "message"),
    [
        (BY_ID, "id = 'x'", "key column 'id' must be a signed 64-bit integer (INT), got 'x' (str)"),
        (BY_ID, "id = 1.5", "key column 'id' must be a signed 64-bit integer (INT), got 1.5 (float)"),
        (BY_ID, "id > 9223372036854775808", "must be a signed 64-bit integer (INT), got 9223372036854775808"),
        (BY_ID, "id = TRUE", "key column 'id' must be a signed 64-bit integer (INT), got True (bool)"),
        (BY_NAME, "name = 1", "key column 'name' must be a string (STRING), got 1 (int)"),
        (table(("f", KeyType.FLOAT)), "f = 'x'", "key column 'f' must be a number (FLOAT), got 'x' (str)"),
        (table(("b", KeyType.BOOL)), "b = 1", "key column 'b' must be TRUE or FALSE (BOOL), got 1 (int)"),
        (
            table(("b", KeyType.BYTES)),
            "b = 'ab'",
            "key column 'b' must be a hex literal such as X'0aff' (BYTES), got 'ab' (str)",
        ),
        (
            BY_TS,
            "ts = 'noon'",
            "key column 'ts' must be a TIMESTAMP such as TIMESTAMP '2026-01-02 03:04:05' or an ISO-8601 "
            "string, got 'noon' (str)",
        ),
        (BY_TS, "ts < 5", "key column 'ts' must be a TIMESTAMP such as"),
        (BY_ID, "id IN (1, 'x')", "got 'x' (str)"),
        (BY_ID, "id = NULL AND id = 'x'", "got 'x' (str)"),
    ],
)
def test_invalid_key_values(info: TableInfo, where: str, message: str) -> None:
    with pytest.raises(InvalidKeyValueError) as caught:
        access(f"SELECT * FROM t WHERE {where}", info)
    assert message in str(caught.value)
    assert caught.value.column == info.key_columns[0].name


def test_unencodable_string_is_an_invalid_key_value() -> None:
    query = PullQuery("t", None, (Condition("name", Op.EQ, ("\ud800",)),), None)
    with pytest.raises(InvalidKeyValueError, match="key column 'name' must be a string"):
        plan(query, BY_NAME)


# --- unsupported shapes ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("info", "where", "message"),
    [
        (BY_ID, "url = 'x'", "WHERE on non-key column 'url' is not supported (key columns: id)"),
        (BY_ID, "id = 1 AND url > 'x'", "WHERE on non-key column 'url' is not supported"),
        (
            BY_USER_DAY,
            "day = 3",
            "equality on key column 'day' needs equality on key column 'user' too: rows are found by "
            "equality on the leading key columns (user, day, seq) and a range on the next",
        ),
        (
            BY_USER_DAY,
            "user = 'a' AND seq = 1",
            "equality on key column 'seq' needs equality on key column 'day'",
        ),
        (BY_USER_DAY, "day > 3", "a range on key column 'day' needs equality on key column 'user' too"),
        (
            BY_USER_DAY,
            "user > 'a' AND day = 1",
            "equality on key column 'day' needs equality on key column 'user'",
        ),
        (
            BY_USER_DAY,
            "user = 'a' AND day > 1 AND seq < 5",
            "a range on key column 'seq' needs equality on key column 'day' too",
        ),
        (
            BY_USER_DAY,
            "user IN ('a', 'b') AND day > 1",
            "several values for key column 'user' need equality on every key column (user, day, seq)",
        ),
        (BY_USER_DAY, "user = 'a' AND day IN (1, 2)", "several values for key column 'day'"),
        (BY_USER_DAY, "(user, day) IN (('a', 1), ('a', 2))", "several values for key column 'day'"),
    ],
)
def test_unsupported_shapes(info: TableInfo, where: str, message: str) -> None:
    # What the key alone cannot answer, said by the key analysis, is a scan whose replicas evaluate the
    # WHERE (query/scan.py): the key predicates that still apply narrow it.
    conditions = parse(f"SELECT * FROM t WHERE {where}").conditions
    with pytest.raises(UnsupportedQueryError) as caught:
        general_access(conditions, info, 10_000)
    assert message in str(caught.value)
    scan = plan(parse(f"SELECT * FROM t WHERE {where}"), info)
    assert scan.scan is not None and scan.scan.where is not None
    assert scan.access == scan_access(conditions, info, 10_000)


def test_a_scan_reads_what_its_key_predicates_narrow_it_to() -> None:
    assert access("SELECT * FROM t WHERE id = 1 AND url > 'x'", BY_ID) == lookup((1,))
    assert access("SELECT * FROM t WHERE user = 'a' AND seq = 1", BY_USER_DAY) == KeyRange(
        encode_key(("a",)), encode_key(("a",)) + b"\xff"
    )
    assert access("SELECT * FROM t WHERE day = 3", BY_USER_DAY) == FullScan()
    assert access("SELECT * FROM t WHERE url = 'x' OR id = 1", BY_ID) == FullScan()


def test_a_shape_error_comes_before_a_contradiction() -> None:
    conditions = parse("SELECT * FROM t WHERE day = NULL").conditions
    with pytest.raises(UnsupportedQueryError, match="needs equality on key column 'user'"):
        general_access(conditions, BY_USER_DAY, 10_000)


def test_too_many_keys() -> None:
    in_list = ", ".join(str(i) for i in range(30))
    sql = f"SELECT * FROM t WHERE user IN ('a', 'b') AND day IN ({in_list}) AND seq IN ({in_list})"
    with pytest.raises(TooManyKeysError, match="expands to 1,800 keys, more than the limit of 1,000"):
        access(sql, BY_USER_DAY, max_keys=1000)
    result = access(sql, BY_USER_DAY, max_keys=1800)
    assert isinstance(result, KeyLookup) and len(result.keys) == 1800
    assert issubclass(TooManyKeysError, UnsupportedQueryError)
    # Bounds shrink the lists before they multiply.
    narrowed = sql + " AND day < 2 AND seq < 2"
    small = access(narrowed, BY_USER_DAY, max_keys=8)
    assert isinstance(small, KeyLookup) and len(small.keys) == 8


def test_malformed_conditions_built_by_hand() -> None:
    cases: list[Predicate] = [
        Condition("id", Op.BETWEEN, (1,)),
        Condition("id", Op.LT, (1, 2)),
        TupleIn(("id",), ((1, 2),)),
    ]
    for condition in cases:
        with pytest.raises(UnsupportedQueryError):
            plan(PullQuery("t", None, (condition,), None), BY_ID)


# --- tables ---------------------------------------------------------------------------------------------


def test_table_names_match_case_insensitively() -> None:
    assert plan(parse("SELECT * FROM T"), BY_ID).access == FullScan()
    with pytest.raises(TableMismatchError, match="the query reads table 'u', not 't'"):
        plan(parse("SELECT * FROM u"), BY_ID)


def test_key_column_names_prefer_an_exact_match() -> None:
    info = table(("K", KeyType.INT), ("k", KeyType.STRING))
    assert access("SELECT * FROM t WHERE k = 'x' AND K = 1", info) == lookup((1, "x"))
    assert access("SELECT * FROM t WHERE k = 'x' AND `K` = 1", info) == lookup((1, "x"))


def test_find_table() -> None:
    tables = {"Views": table(name="Views"), "clicks": table(name="clicks"), "CLICKS": table(name="CLICKS")}
    assert find_table(tables, "views").name == "Views"
    assert find_table(tables, "clicks").name == "clicks"
    assert find_table(tables, "CLICKS").name == "CLICKS"
    with pytest.raises(UnknownTableError, match="table 'nope' does not exist"):
        find_table(tables, "nope")
    with pytest.raises(UnknownTableError, match="matches several tables \\('CLICKS', 'clicks'\\)"):
        find_table(tables, "Clicks")


def test_every_error_is_a_query_error() -> None:
    for error in (InvalidKeyValueError, TooManyKeysError, UnknownTableError, TableMismatchError):
        assert issubclass(error, QueryError)


# --- membership: a plan selects exactly the keys its predicate holds for ---------------------------------

INTS = st.integers(-4, 4) | st.sampled_from([-(2**63), 2**63 - 1])
# Strings around the escaped 0x00 byte, where a prefix of a value is also a byte prefix of its encoding.
STRINGS = st.text(alphabet="\x00\x01a\xff\u00e9", max_size=3)
FLOATS = st.sampled_from([-1.5, -0.0, 0.0, 0.5, 2.0, float("inf"), float("-inf")])
STAMPS = st.sampled_from([dt.datetime(2026, 1, d, h) for d in (1, 2) for h in (0, 12)])
VALUES: dict[KeyType, st.SearchStrategy[Any]] = {
    KeyType.INT: INTS,
    KeyType.STRING: STRINGS,
    KeyType.FLOAT: FLOATS,
    KeyType.TIMESTAMP: STAMPS,
    KeyType.BYTES: STRINGS.map(lambda text: text.encode()),
    KeyType.BOOL: st.booleans(),
}
RANGE_OPS = [Op.LT, Op.LE, Op.GT, Op.GE, Op.BETWEEN]


def holds(condition: Predicate, names: Sequence[str], key: Sequence[Any]) -> bool:
    """The predicate evaluated on a key tuple as SQL would, with Python's comparisons."""
    if isinstance(condition, TupleIn):
        return any(
            all(
                v is not None and key[names.index(c)] == v
                for c, v in zip(condition.columns, row, strict=True)
            )
            for row in condition.rows
        )
    value = key[names.index(condition.column)]
    operands = condition.values
    if condition.op is Op.IN:
        return any(v is not None and value == v for v in operands)
    if any(v is None for v in operands):
        return False
    if condition.op is Op.BETWEEN:
        return bool(operands[0] <= value <= operands[1])
    other: Any = operands[0]
    return bool(
        {
            Op.EQ: value == other,
            Op.LT: value < other,
            Op.LE: value <= other,
            Op.GT: value > other,
            Op.GE: value >= other,
        }[condition.op]
    )


@st.composite
def range_conditions(draw: st.DrawFn, column: str, values: st.SearchStrategy[Any]) -> list[Condition]:
    found = []
    for _ in range(draw(st.integers(1, 3))):
        op = draw(st.sampled_from([*RANGE_OPS, Op.EQ, Op.IN]))
        if op is Op.BETWEEN:
            found.append(Condition(column, op, (draw(values), draw(values))))
        elif op is Op.IN:
            found.append(Condition(column, op, tuple(draw(st.lists(values, min_size=1, max_size=3)))))
        else:
            found.append(Condition(column, op, (draw(values),)))
    return found


def check_membership(
    info: TableInfo, conditions: Sequence[Predicate], keys: Sequence[tuple[Any, ...]]
) -> None:
    names = [column.name for column in info.key_columns]
    result = plan(PullQuery(info.name, None, tuple(conditions), None), info).access
    for key in keys:
        expected = all(holds(condition, names, key) for condition in conditions)
        assert selects(result, encode_key(key)) == expected, (conditions, key, result)


@settings(max_examples=300)
@given(st.data(), st.sampled_from(list(VALUES)))
def test_single_column_membership(data: st.DataObject, kind: KeyType) -> None:
    info = table(("k", kind))
    values = VALUES[kind]
    conditions = data.draw(range_conditions("k", values))
    keys = data.draw(st.lists(values.map(lambda v: (v,)), min_size=1, max_size=8))
    check_membership(info, conditions, keys)


@settings(max_examples=300)
@given(st.data(), st.sampled_from(list(VALUES)), st.sampled_from(list(VALUES)))
def test_composite_membership(data: st.DataObject, first: KeyType, second: KeyType) -> None:
    info = table(("a", first), ("b", second))
    shape = data.draw(st.sampled_from(["range on a", "a = v, range on b", "both pinned"]))
    if shape == "range on a":
        conditions = [
            c for c in data.draw(range_conditions("a", VALUES[first])) if c.op not in (Op.EQ, Op.IN)
        ] or [Condition("a", Op.GE, (data.draw(VALUES[first]),))]
    else:
        conditions = [Condition("a", Op.EQ, (data.draw(VALUES[first]),))]
        conditions += data.draw(range_conditions("b", VALUES[second]))
        if shape == "both pinned":
            conditions.append(Condition("b", Op.IN, tuple(data.draw(st.lists(VALUES[second], min_size=1)))))
    keys = data.draw(st.lists(st.tuples(VALUES[first], VALUES[second]), min_size=1, max_size=8))
    # Keys sharing the pinned value make the interesting cases common.
    pinned = conditions[0].values[0] if conditions[0].op is Op.EQ else None
    if pinned is not None:
        keys += [(pinned, b) for _, b in keys]
    check_membership(info, conditions, keys)


@settings(max_examples=200)
@given(st.data())
def test_three_column_prefix_membership(data: st.DataObject) -> None:
    info = table(("s", KeyType.STRING), ("i", KeyType.INT), ("t", KeyType.STRING))
    s, i = data.draw(STRINGS), data.draw(INTS)
    conditions: list[Predicate] = [TupleIn(("s", "i"), ((s, i),))]
    conditions += data.draw(range_conditions("t", STRINGS))
    keys = data.draw(st.lists(st.tuples(STRINGS, INTS, STRINGS), min_size=1, max_size=8))
    keys += [(s, i, t) for _, _, t in keys] + [(s, ii, t) for _, ii, t in keys]
    check_membership(info, conditions, keys)


@settings(max_examples=200)
@given(st.data(), st.sampled_from(list(VALUES)))
def test_arbitrary_conditions_only_raise_query_errors(data: st.DataObject, kind: KeyType) -> None:
    info = table(("k", kind), ("j", KeyType.INT))
    anything = st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.floats(),
        st.text(max_size=4),
        st.binary(max_size=4),
        st.datetimes(),
        st.sampled_from(["2026-01-01", "2026-01-01T00:00:00+05:00", "x"]),
    )
    condition = st.builds(
        Condition,
        st.sampled_from(["k", "K", "j", "other"]),
        st.sampled_from(list(Op)),
        st.lists(anything, max_size=3).map(tuple),
    )
    conditions = data.draw(st.lists(condition, max_size=4))
    try:
        plan(PullQuery("t", None, tuple(conditions), None), info, max_keys=5)
    except QueryError as e:
        assert str(e)


_KEY_VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.floats(allow_nan=True),
    st.text(max_size=6),
    st.binary(max_size=4),
    st.datetimes(timezones=st.sampled_from([None, dt.UTC])),
    st.sampled_from(["2026-01-02T03:04:05", "2026-01-02 03:04:05+01:00", "not a time"]),
)


@settings(max_examples=300)
@given(
    # A window bound is never a table's only key column (the controller refuses it).
    key_type=st.sampled_from([kind for kind in KeyType if kind not in WINDOW_KEY_TYPES]),
    column=st.sampled_from(["k", "K", "other"]),
    values=st.lists(_KEY_VALUES, min_size=1, max_size=6),
    max_keys=st.integers(min_value=0, max_value=4),
)
def test_the_one_column_lookup_plans_exactly_as_the_general_path(
    key_type: KeyType, column: str, values: list[Any], max_keys: int
) -> None:
    from hotstate.query.plan import general_access, one_column_lookup

    info = TableInfo("t", 1, 4, 0, (KeyColumn("k", key_type),), None)
    for condition in (Condition(column, Op.IN, tuple(values)), Condition(column, Op.EQ, tuple(values[:1]))):
        try:
            fast: object = one_column_lookup([condition], info, max_keys)
        except Exception as error:
            fast = (type(error), str(error))
        try:
            general: object = general_access([condition], info, max_keys)
        except Exception as error:
            general = (type(error), str(error))
        if column == "other":
            assert fast is None  # the general path words the non-key-column error
        else:
            assert fast == general, (condition, fast, general)

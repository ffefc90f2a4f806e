"""The linearizability checker on hand-written, generated and brute-forced histories, and its speed."""

from __future__ import annotations

import itertools
import math
import random
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hotstate.sim.linearizability import (
    UNKNOWN,
    CheckResult,
    HistoryRecorder,
    KeyValueRegisterModel,
    Model,
    Operation,
    TableInput,
    TableOutput,
    TableSetModel,
    assert_linearizable,
    check,
)

TABLES = TableSetModel()
REGISTERS = KeyValueRegisterModel()
AnyOp = Operation[Any, Any]
AnyModel = Model[Any, Any, Any]


def op(client: int, input: tuple[Any, ...], call: float, output: Any, ret: float) -> AnyOp:
    return Operation(client, input, call, output, ret)


def timeout(client: int, input: tuple[Any, ...], call: float) -> AnyOp:
    return Operation.timed_out(client, input, call)


def names(*ns: str) -> frozenset[str]:
    return frozenset(ns)


def verdict(model: Model[Any, Any, Any], history: Sequence[AnyOp]) -> bool | None:
    result = check(model, history, timeout_s=30)
    assert result.ok is not None, result.explanation
    return result.ok


class Unpartitioned(Model[Any, Any, Any]):
    """A model with partitioning turned off, so the search itself sees multi-key histories."""

    def __init__(self, inner: Model[Any, Any, Any]) -> None:
        self.inner = inner

    def init(self) -> Any:
        return self.inner.init()

    def step(self, state: Any, input: Any, output: Any) -> tuple[bool, Any]:
        return self.inner.step(state, input, output)


# ------------------------------------------------------------------------------------- hand-written


def test_overlapping_creates_cannot_both_succeed() -> None:
    history = [op(1, ("create", "a"), 0, "ok", 10), op(2, ("create", "a"), 5, "ok", 15)]
    result = check(TABLES, history)
    assert result.ok is False
    # The explanation names what was linearized and what could not come next.
    assert "create 'a' -> ok" in result.explanation
    assert "rejected by the model" in result.explanation
    assert len(result.partial) == 1
    assert [o.client_id for o in result.stuck] == [2]


def test_create_delete_create_in_sequence_is_linearizable() -> None:
    history = [
        op(1, ("create", "a"), 0, "ok", 1),
        op(2, ("delete", "a"), 2, "ok", 3),
        op(3, ("create", "a"), 4, "ok", 5),
        op(1, ("list",), 6, names("a"), 7),
    ]
    assert verdict(TABLES, history) is True


def test_concurrent_create_and_delete_may_order_either_way() -> None:
    # delete overlaps both creates, so it can fall between them.
    history = [
        op(1, ("create", "a"), 0, "ok", 2),
        op(2, ("delete", "a"), 1, "ok", 5),
        op(3, ("create", "a"), 4, "ok", 6),
    ]
    assert verdict(TABLES, history) is True
    # Without the overlap the second create must see the table.
    history[2] = op(3, ("create", "a"), 6, "ok", 7)
    history[1] = op(2, ("delete", "a"), 8, "ok", 9)
    assert verdict(TABLES, history) is False


def test_list_missing_a_completed_create_is_not_linearizable() -> None:
    history = [op(1, ("create", "a"), 0, "ok", 1), op(2, ("list",), 2, names(), 3)]
    result = check(TABLES, history)
    assert result.ok is False
    assert "list -> {}" in result.explanation


def test_list_concurrent_with_create_may_miss_it() -> None:
    history = [op(1, ("create", "a"), 0, "ok", 4), op(2, ("list",), 2, names(), 3)]
    assert verdict(TABLES, history) is True


def test_lists_must_agree_on_an_order_of_concurrent_creates() -> None:
    # Two concurrent creates; one reader sees only a, another (later) only b: no single order explains both.
    history = [
        op(1, ("create", "a"), 0, "ok", 10),
        op(2, ("create", "b"), 0, "ok", 10),
        op(3, ("list",), 1, names("a"), 2),
        op(4, ("list",), 3, names("b"), 4),
    ]
    assert verdict(TABLES, history) is False
    history[3] = op(4, ("list",), 3, names("a", "b"), 4)
    assert verdict(TABLES, history) is True


def test_a_timed_out_create_may_explain_a_later_exists() -> None:
    history = [
        timeout(1, ("create", "a"), 0),
        op(2, ("create", "a"), 5, "exists", 6),
        op(2, ("list",), 7, names("a"), 8),
    ]
    assert verdict(TABLES, history) is True


def test_a_timed_out_create_may_never_have_happened() -> None:
    history = [
        timeout(1, ("create", "a"), 0),
        op(2, ("list",), 5, names(), 6),
        op(2, ("create", "a"), 7, "ok", 8),
    ]
    assert verdict(TABLES, history) is True


def test_a_timed_out_create_cannot_take_effect_before_its_call() -> None:
    history = [
        op(2, ("create", "a"), 0, "exists", 1),
        timeout(1, ("create", "a"), 5),
    ]
    assert verdict(TABLES, history) is False


def test_a_timed_out_create_takes_effect_at_most_once() -> None:
    # Seen by one list, deleted, back for a later list: one create cannot do that.
    history = [
        timeout(1, ("create", "a"), 0),
        op(2, ("list",), 1, names("a"), 2),
        op(2, ("delete", "a"), 3, "ok", 4),
        op(2, ("list",), 5, names("a"), 6),
    ]
    assert verdict(TABLES, history) is False
    # ...but a second timed-out create can.
    assert verdict(TABLES, [*history, timeout(3, ("create", "a"), 4.5)]) is True


def test_definite_failures_are_checked_like_any_output() -> None:
    assert verdict(TABLES, [op(1, ("delete", "a"), 0, "missing", 1)]) is True
    assert verdict(TABLES, [op(1, ("delete", "a"), 0, "ok", 1)]) is False
    assert verdict(TABLES, [op(1, ("create", "a"), 0, "exists", 1)]) is False


def test_touching_intervals_count_as_concurrent() -> None:
    history = [op(1, ("create", "a"), 0, "ok", 5), op(2, ("list",), 5, names(), 6)]
    assert verdict(TABLES, history) is True


def test_tables_partition_by_name_only_without_lists() -> None:
    creates = [op(1, ("create", "a"), 0, "ok", 1), op(2, ("create", "b"), 0, "ok", 1)]
    assert check(TABLES, creates).partitions == 2
    assert check(TABLES, [*creates, op(3, ("list",), 2, names("a", "b"), 3)]).partitions == 1


def test_malformed_outputs_raise_instead_of_reading_as_inconsistency() -> None:
    with pytest.raises(ValueError, match="create answers"):
        check(TABLES, [op(1, ("create", "a"), 0, "not leader", 1)])
    with pytest.raises(ValueError, match="not a TableSetModel input"):
        check(TABLES, [op(1, ("drop", "a"), 0, "ok", 1)])


def test_operation_validates_times() -> None:
    with pytest.raises(ValueError):
        op(1, ("list",), 2, names(), 1)
    with pytest.raises(ValueError):
        op(1, ("list",), 2, UNKNOWN, 1)
    with pytest.raises(ValueError):
        op(1, ("list",), 0, names(), math.inf)
    with pytest.raises(ValueError):
        op(1, ("list",), math.nan, names(), 1)


def test_a_timed_out_create_with_a_deadline_takes_effect_before_it_or_never() -> None:
    history = [
        Operation.timed_out(1, ("create", "a"), 0, effect_deadline=0.4),
        op(2, ("list",), 0.5, names(), 0.6),
        op(2, ("list",), 2, names("a"), 3),
    ]
    assert verdict(TABLES, history) is False
    # Without the deadline it may have taken effect between the lists.
    history[0] = timeout(1, ("create", "a"), 0)
    assert verdict(TABLES, history) is True


def test_a_fitting_read_is_not_taken_before_an_unknown_that_must_precede_it() -> None:
    # The list fits the initial state, but the create (deadline before the list's call) must come before
    # it, and the delete needs the create: the only linearization is create, delete, list.
    history = [
        Operation.timed_out(1, ("create", "a"), 0, effect_deadline=1),
        op(2, ("delete", "a"), 0, "ok", 10),
        op(3, ("list",), 2, names(), 3),
    ]
    assert verdict(TABLES, history) is True
    assert brute_force(TABLES, history) is True


def test_stale_read_after_a_completed_write_is_not_linearizable() -> None:
    history = [
        op(1, ("put", "x", 1), 0, "ok", 1),
        op(1, ("put", "x", 2), 2, "ok", 3),
        op(2, ("get", "x"), 4, 1, 5),
    ]
    result = check(REGISTERS, history)
    assert result.ok is False
    assert "get('x') -> 1" in result.explanation


def test_concurrent_writes_may_take_effect_in_either_order() -> None:
    for seen in (1, 2):
        history = [
            op(1, ("put", "x", 1), 0, "ok", 10),
            op(2, ("put", "x", 2), 0, "ok", 10),
            op(3, ("get", "x"), 11, seen, 12),
            op(3, ("get", "x"), 13, seen, 14),
        ]
        assert verdict(REGISTERS, history) is True
    # ...but not in both orders at once.
    history[3] = op(3, ("get", "x"), 13, 1, 14)
    assert verdict(REGISTERS, history) is False


def test_cas_and_unknown_puts() -> None:
    history = [
        op(1, ("put", "x", 0), 0, "ok", 1),
        timeout(2, ("put", "x", 5), 2),
        op(1, ("cas", "x", 5, 6), 3, True, 4),
        op(1, ("get", "x"), 5, 6, 6),
        op(3, ("get", "y"), 0, None, 1),
    ]
    assert verdict(REGISTERS, history) is True
    assert verdict(Unpartitioned(REGISTERS), history) is True
    history[2] = op(1, ("cas", "x", 5, 6), 3, False, 4)
    assert verdict(REGISTERS, history) is False


def test_registers_partition_by_key() -> None:
    history = [op(1, ("put", k, 1), 0, "ok", 1) for k in "abc"]
    assert check(REGISTERS, history).partitions == 3
    history.append(op(2, ("get", "b"), 2, 2, 3))
    result = check(REGISTERS, history)
    assert result.ok is False
    assert result.state == "{'b': 1}"  # the failing part's state only


def test_empty_and_all_unknown_histories_are_linearizable() -> None:
    assert check(TABLES, []).ok is True
    assert check(TABLES, [timeout(1, ("create", "a"), 0), timeout(2, ("list",), 1)]).ok is True


def test_assert_linearizable_raises_with_the_explanation() -> None:
    with pytest.raises(AssertionError, match="NOT linearizable"):
        assert_linearizable(TABLES, [op(1, ("create", "a"), 0, "exists", 1)])


def test_gives_up_at_the_time_limit() -> None:
    # Concurrent timed-out creates of distinct names, and two concurrent lists that each saw half of them:
    # whichever went second should have seen the other half too. Every name alone is fine, so only the
    # whole history shows it, and the search must try every subset of the creates before failing.
    n = 22
    history = [timeout(i, ("create", f"t{i}"), 0) for i in range(n)]
    history.append(op(n, ("list",), 1, names(*(f"t{i}" for i in range(n // 2))), 2))
    history.append(op(n + 1, ("list",), 1, names(*(f"t{i}" for i in range(n // 2, n))), 2))
    result = check(TABLES, history, timeout_s=0.2)
    assert result.ok is None
    assert "Gave up" in result.explanation
    # Smaller, it is decided.
    small = [timeout(i, ("create", f"t{i}"), 0) for i in range(4)]
    small += [op(4, ("list",), 1, names("t0", "t1"), 2), op(5, ("list",), 1, names("t2", "t3"), 2)]
    assert verdict(TABLES, small) is False


def test_projections_find_violations_the_whole_search_cannot_afford() -> None:
    # Many timed-out creates make the exhaustive search over the whole history hopeless, but a list that
    # saw a table nobody ever created shows in the projection onto that table.
    n = 40
    history = [timeout(i, ("create", f"t{i}"), 0) for i in range(n)]
    history.append(op(n, ("list",), 1, names("t0", "ghost"), 2))
    result = check(TABLES, history, timeout_s=30)
    assert result.ok is False
    assert "projection onto table 'ghost'" in result.explanation


# -------------------------------------------------------------------------------------------- recorder


def test_recorder_records_outcomes_and_pending_operations() -> None:
    ticks = itertools.count()
    recorder: HistoryRecorder[TableInput, TableOutput] = HistoryRecorder(clock=lambda: float(next(ticks)))
    a = recorder.invoke(1, ("create", "a"))
    b = recorder.invoke(2, ("create", "a"))
    recorder.invoke(3, ("list",))
    recorder.ok(a, "ok")
    recorder.fail(b, "exists")
    d = recorder.invoke(4, ("delete", "a"))
    recorder.timeout(d)
    e = recorder.invoke(5, ("list",))
    recorder.timeout(e, effect_deadline=100.0)
    ops = recorder.operations()
    assert ops[0] == op(1, ("create", "a"), 0.0, "ok", 3.0)
    assert ops[1] == op(2, ("create", "a"), 1.0, "exists", 4.0)
    assert ops[2].unknown and ops[2].return_time == math.inf  # never completed
    assert ops[3].unknown and ops[3].return_time == math.inf
    assert ops[4] == Operation.timed_out(5, ("list",), 6.0, effect_deadline=100.0)
    with pytest.raises(ValueError):
        recorder.ok(a, "ok")
    assert check(TABLES, ops).ok is True


def test_recorder_from_many_threads() -> None:
    recorder: HistoryRecorder[TableInput, TableOutput] = HistoryRecorder()
    state: set[str] = set()
    lock = threading.Lock()

    def client(cid: int) -> None:
        rng = random.Random(cid)
        for _ in range(100):
            name = rng.choice("abc")
            token = recorder.invoke(cid, ("create", name))
            with lock:
                output = "exists" if name in state else "ok"
                state.add(name)
            recorder.ok(token, output)
            token = recorder.invoke(cid, ("delete", name))
            with lock:
                output = "ok" if name in state else "missing"
                state.discard(name)
            recorder.ok(token, output)

    threads = [threading.Thread(target=client, args=(cid,)) for cid in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ops = recorder.operations()
    assert len(ops) == 800
    assert_linearizable(TABLES, ops, timeout_s=30)


# ------------------------------------------------------------------------------- generated histories

TABLE_NAMES = ("a", "b", "c")
KEYS = ("x", "y")


def table_inputs() -> st.SearchStrategy[tuple[Any, ...]]:
    name = st.sampled_from(TABLE_NAMES)
    return st.one_of(
        st.tuples(st.just("create"), name), st.tuples(st.just("delete"), name), st.just(("list",))
    )


def register_inputs() -> st.SearchStrategy[tuple[Any, ...]]:
    key = st.sampled_from(KEYS)
    value = st.integers(0, 2)
    return st.one_of(
        st.tuples(st.just("put"), key, value),
        st.tuples(st.just("get"), key),
        st.tuples(st.just("cas"), key, st.one_of(st.none(), value), value),
    )


def both_models() -> list[tuple[st.SearchStrategy[tuple[Any, ...]], AnyModel]]:
    """The table set and the key-value registers, each with its inputs."""
    return [(table_inputs(), TABLES), (register_inputs(), REGISTERS)]


def sequential_outputs(model: Model[Any, Any, Any], inputs: Sequence[tuple[Any, ...]]) -> list[Any]:
    """The outputs of running `inputs` in order: the model's unique legal output each time."""
    state = model.init()
    outputs = []
    for inp in inputs:
        _, after = model.step(state, inp, UNKNOWN)
        output = legal_output(model, state, inp, after)
        ok, state = model.step(state, inp, output)
        assert ok
        outputs.append(output)
    return outputs


def legal_output(model: Model[Any, Any, Any], state: Any, inp: tuple[Any, ...], after: Any) -> Any:
    kind = inp[0]
    if kind in ("create", "delete"):
        return "ok" if after != state else ("exists" if kind == "create" else "missing")
    if kind == "list":
        return state
    if kind == "put":
        return "ok"
    if kind == "get":
        return dict(state).get(inp[1])
    return dict(state).get(inp[1]) == inp[2]  # cas


def assign_clients(ops: list[AnyOp]) -> list[AnyOp]:
    """Give each operation a client that is idle during it, as real clients issue one request at a time."""
    busy_until: list[float] = []
    out = []
    for o in sorted(ops, key=lambda o: o.call_time):
        cid = next((c for c, t in enumerate(busy_until) if t < o.call_time), len(busy_until))
        if cid == len(busy_until):
            busy_until.append(0.0)
        busy_until[cid] = o.return_time
        out.append(Operation(cid, o.input, o.call_time, o.output, o.return_time))
    return out


@st.composite
def linearizable_histories(
    draw: st.DrawFn, inputs: st.SearchStrategy[tuple[Any, ...]], model: Model[Any, Any, Any]
) -> list[AnyOp]:
    """A sequential run at points 0, 10, 20, ..., each operation's interval widened around its point.

    Some operations become timeouts (they took effect at their point, but the client never learned it),
    and some timeouts that never took effect are added.
    """
    seq = draw(st.lists(inputs, min_size=1, max_size=24))
    outputs = sequential_outputs(model, seq)
    ops: list[AnyOp] = []
    for i, (inp, out) in enumerate(zip(seq, outputs, strict=True)):
        point = 10.0 * i
        if draw(st.integers(0, 9)) == 0:
            ops.append(Operation.timed_out(0, inp, point - draw(st.integers(0, 40))))
        else:
            ops.append(
                Operation(0, inp, point - draw(st.integers(0, 40)), out, point + draw(st.integers(0, 40)))
            )
    for _ in range(draw(st.integers(0, 2))):
        ops.append(Operation.timed_out(0, draw(inputs), draw(st.integers(-40, 10 * len(seq)))))
    return draw(st.permutations(assign_clients(ops)))


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_widened_sequential_runs_are_linearizable(data: st.DataObject) -> None:
    for inputs, model in both_models():
        history = data.draw(linearizable_histories(inputs, model))
        result = check(model, history, timeout_s=30)
        assert result.ok is True, result.explanation


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_a_read_of_something_never_written_is_not_linearizable(data: st.DataObject) -> None:
    cases: list[tuple[st.SearchStrategy[tuple[Any, ...]], AnyModel, tuple[str, ...], object]] = [
        (table_inputs(), TABLES, ("list",), frozenset({"ghost"})),
        (register_inputs(), REGISTERS, ("get", "x"), "ghost"),
    ]
    for inputs, model, reader, ghost in cases:
        history = data.draw(linearizable_histories(inputs, model))
        readers = [i for i, o in enumerate(history) if o.input == reader and not o.unknown]
        if readers:
            i = data.draw(st.sampled_from(readers))
            o = history[i]
            assert o.output is not UNKNOWN
            output = o.output | ghost if isinstance(ghost, frozenset) else ghost
            history[i] = Operation(o.client_id, o.input, o.call_time, output, o.return_time)
        else:
            when = data.draw(st.integers(-40, 250))
            history.append(Operation(99, reader, when, ghost, when + data.draw(st.integers(0, 40))))
        result = check(model, history, timeout_s=30)
        assert result.ok is False, history
        assert "NOT linearizable" in result.explanation


def flipped(o: AnyOp) -> AnyOp | None:
    """The operation with a different output of the right shape, or None if it has no other."""
    kind = o.input[0]
    flips: dict[Any, Any] = {"ok": "exists", "exists": "ok"} if kind == "create" else {}
    if kind == "delete":
        flips = {"ok": "missing", "missing": "ok"}
    if kind == "list":
        assert o.output is not UNKNOWN
        return Operation(o.client_id, o.input, o.call_time, o.output ^ {"a"}, o.return_time)
    if kind == "get":
        return Operation(o.client_id, o.input, o.call_time, 7 if o.output is None else None, o.return_time)
    if kind == "cas":
        return Operation(o.client_id, o.input, o.call_time, not o.output, o.return_time)
    if o.output in flips:
        return Operation(o.client_id, o.input, o.call_time, flips[o.output], o.return_time)
    return None


@settings(max_examples=200, deadline=None)
@given(st.data())
def test_any_flipped_output_of_a_sequential_history_is_not_linearizable(data: st.DataObject) -> None:
    # Without overlap or timeouts there is one order, and in it each output is the only legal one.
    for inputs, model in both_models():
        seq = data.draw(st.lists(inputs, min_size=1, max_size=30))
        outputs = sequential_outputs(model, seq)
        history = [
            Operation(i % 3, inp, 10.0 * i, out, 10.0 * i + 9)
            for i, (inp, out) in enumerate(zip(seq, outputs, strict=True))
        ]
        assert check(model, history).ok is True
        flippable = [i for i, o in enumerate(history) if flipped(o) is not None]
        if not flippable:
            continue
        i = data.draw(st.sampled_from(flippable))
        corrupted = flipped(history[i])
        assert corrupted is not None
        history[i] = corrupted
        result = check(model, history)
        assert result.ok is False
        assert corrupted in result.stuck


# ------------------------------------------------------------------------------------- brute force


def brute_force(model: Model[Any, Any, Any], history: Sequence[AnyOp]) -> bool:
    """Every order of every choice of timeouts to include, consistent with real time."""
    definite = [o for o in history if not o.unknown]
    unknown = [o for o in history if o.unknown]
    for k in range(len(unknown) + 1):
        for included in itertools.combinations(unknown, k):
            for order in itertools.permutations(definite + list(included)):
                if any(
                    later.return_time < earlier.call_time
                    for i, earlier in enumerate(order)
                    for later in order[i + 1 :]
                ):
                    continue
                state = model.init()
                for o in order:
                    ok, state = model.step(state, o.input, o.output)
                    if not ok:
                        break
                else:
                    return True
    return False


def table_outputs(inp: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    if inp[0] == "create":
        return st.sampled_from(["ok", "exists"])
    if inp[0] == "delete":
        return st.sampled_from(["ok", "missing"])
    return st.frozensets(st.sampled_from(TABLE_NAMES[:2]))


def register_outputs(inp: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    if inp[0] == "put":
        return st.just("ok")
    if inp[0] == "get":
        return st.one_of(st.none(), st.integers(0, 2))
    return st.booleans()


@st.composite
def small_histories(
    draw: st.DrawFn,
    inputs: st.SearchStrategy[tuple[Any, ...]],
    outputs: Any,
) -> list[AnyOp]:
    ops: list[AnyOp] = []
    for client in range(draw(st.integers(1, 6))):
        inp = draw(inputs)
        call = draw(st.integers(0, 12))
        kind = draw(st.integers(0, 9))
        if kind == 0:
            ops.append(Operation.timed_out(client, inp, call))
        elif kind == 1:
            ops.append(Operation.timed_out(client, inp, call, call + draw(st.integers(0, 8))))
        else:
            ops.append(Operation(client, inp, call, draw(outputs(inp)), call + draw(st.integers(0, 8))))
    return ops


small_table_inputs = st.one_of(
    st.tuples(st.sampled_from(["create", "delete"]), st.sampled_from(TABLE_NAMES[:2])), st.just(("list",))
)
small_register_inputs = st.one_of(
    st.tuples(st.just("put"), st.sampled_from(KEYS), st.integers(0, 2)),
    st.tuples(st.just("get"), st.sampled_from(KEYS)),
    st.tuples(
        st.just("cas"), st.sampled_from(KEYS), st.one_of(st.none(), st.integers(0, 2)), st.integers(0, 2)
    ),
)


@settings(max_examples=500, deadline=None)
@given(small_histories(small_table_inputs, table_outputs))
def test_agrees_with_brute_force_on_tables(history: list[AnyOp]) -> None:
    expected = brute_force(TABLES, history)
    assert check(TABLES, history).ok is expected
    assert check(TABLES, history, bounded_first=False).ok is expected


@settings(max_examples=500, deadline=None)
@given(small_histories(small_register_inputs, register_outputs))
def test_agrees_with_brute_force_on_registers(history: list[AnyOp]) -> None:
    expected = brute_force(REGISTERS, history)
    assert check(REGISTERS, history).ok is expected
    # Unpartitioned, and without the read shortcut (the wrapper does not say which operations read).
    assert check(Unpartitioned(REGISTERS), history, bounded_first=False).ok is expected


# -------------------------------------------------------------------------------------------- speed


def cluster_like_history(
    n_ops: int, clients: int, seed: int, timeout_rate: float = 0.01, effect_window: float = math.inf
) -> list[AnyOp]:
    """Clients issuing requests back to back against a table set, each taking effect inside its interval.

    Latencies of 1-10 ms and think times of 0-1 ms make every request overlap several others; a timed-out
    request took effect within 50 ms or not at all, at random, and its client moves on after 20 ms.
    `effect_window` (at least 50 ms) gives timed-out requests a deadline that long after their call.
    """
    rng = random.Random(seed)
    pool = [f"t{i}" for i in range(12)]
    planned: list[tuple[float, int, tuple[str, ...], float, float, bool]] = []
    now = [0.0] * clients
    for i in range(n_ops):
        c = i % clients
        call = now[c] + rng.uniform(0, 0.001)
        ret = call + rng.uniform(0.001, 0.010)
        roll = rng.random()
        name = rng.choice(pool)
        inp: tuple[str, ...] = (
            ("create", name) if roll < 0.4 else ("delete", name) if roll < 0.7 else ("list",)
        )
        timed_out = rng.random() < timeout_rate
        if timed_out:
            point = call + rng.uniform(0, 0.05) if rng.random() < 0.5 else math.inf  # inf: never applied
        else:
            point = rng.uniform(call, ret)
        planned.append((point, c, inp, call, ret, timed_out))
        now[c] = call + 0.020 if timed_out else ret
    state: frozenset[str] = frozenset()
    ops: list[AnyOp] = []
    for point, c, inp, call, ret, timed_out in sorted(planned, key=lambda p: p[0]):
        _, after = TABLES.step(state, inp, UNKNOWN)
        if timed_out:
            ops.append(Operation.timed_out(c, inp, call, call + effect_window))
        else:
            ops.append(Operation(c, inp, call, legal_output(TABLES, state, inp, after), ret))
        if point != math.inf:  # inf: a timed-out request that never took effect
            state = after
    return ops


def timed_check(history: list[AnyOp]) -> tuple[CheckResult[Any, Any], float]:
    start = time.perf_counter()
    result = check(TABLES, history, timeout_s=60)
    return result, time.perf_counter() - start


def test_two_thousand_operations_from_eight_clients() -> None:
    # 1% timed out, with no deadline: the bounded search finds the linearization.
    history = cluster_like_history(2000, 8, seed=1)
    assert sum(o.unknown for o in history) > 10
    result, elapsed = timed_check(history)
    assert result.ok is True, result.explanation
    assert result.partitions == 1  # lists keep it whole
    # Typically 0.05-0.3 s on a 2-core machine; the bound leaves room for a slow CI runner.
    assert elapsed < 10.0


def test_a_late_violation_in_two_thousand_operations_is_found() -> None:
    # Proving a violation means exhausting the search, which unbounded timeouts make exponential: these
    # have deadlines (typically 0.2-0.5 s; with unbounded ones, seconds to minutes).
    history = cluster_like_history(2000, 8, seed=2, timeout_rate=0.02, effect_window=0.1)
    lists = [i for i, o in enumerate(history) if o.input == ("list",) and not o.unknown]
    i = lists[-10]
    o = history[i]
    assert o.output is not UNKNOWN
    history[i] = Operation(o.client_id, o.input, o.call_time, o.output | {"ghost"}, o.return_time)
    result, elapsed = timed_check(history)
    assert result.ok is False
    assert history[i] in result.stuck
    assert len(result.partial) > 1900
    assert elapsed < 10.0

"""A linearizability checker: Wing & Gong's search with Lowe's improvements, as Porcupine implements it.

A history is linearizable when every operation can be given a point between its call and its return such
that applying the operations in the order of their points to the sequential model yields exactly the
recorded outputs. Operations with an `UNKNOWN` output (timeouts) may take their point anywhere after their
call (before their deadline, if they have one), or be left out.

The search (Lowe, "Testing for linearizability", 2017; Porcupine's `checkSingle`):

- the calls and returns of the definite operations form one doubly linked list in time order; at equal
  times calls come first, so operations that merely touch count as concurrent (the lenient reading);
- the candidates for the next linearization point are the calls before the first return in the list; the
  search takes the first one the model accepts, *lifts* its call and return out of the list and starts
  again from the head; when it reaches a return (the operation that returns there was not linearized and
  nothing else can go first), it backtracks: puts the last lifted pair back and tries the next candidate;
- a cache of (set of linearized operations, model state) prunes a node reached a second time, since every
  continuation from it was already explored (or is being explored on the current path).

Additions, each a reduction that keeps the search complete:

- a read (`Model.is_read_only`) that fits the current state is taken at once, with no alternative tried:
  it can be moved to the front of any linearization from there (unless an unknown operation whose
  deadline precedes the read's call could still come first). Without this, each concurrent list
  multiplies the orders tried, as a create it did not see is tried before it and fails only later;
- unknown operations are kept out of the list (they block nothing) and are tried only after every
  definite candidate at a node, so one that never took effect costs little and one that did is tried
  where its effect is first missed;
- an unknown operation whose step would not change the state is never linearized: leaving it out is
  equivalent and keeps more options open;
- the cache compares unknown operations by inclusion: a node with the same definite operations and state
  as a visited one, but a superset of its unknown operations, has only a subset of its futures.

Unknown operations without deadlines remain the expensive part: each one pending can take effect at any
later node, so the states between two reads multiply by two per pending operation. So `check` runs
cheaper searches first, each allowed a bounded number of nodes: one with those effects confined to a
window (a linearization found there is one of the history; nearly every linearizable history has one),
then the model's projections (`Model.project`: a projection that is not linearizable proves the history
is not; most violations show in one), then a wider window, and only then the exhaustive search. The worst
case stays exponential (the problem is NP-complete), hence `timeout_s`.

P-compositionality: a model may split a history into independent sub-histories (`Model.partition`), each
checked alone; the history is linearizable iff every part is.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Generic, Protocol, TypeAlias, TypeVar

from hotstate.sim.history import UNKNOWN, HistoryRecorder, Operation, Unknown

__all__ = [
    "UNKNOWN",
    "CheckResult",
    "HistoryRecorder",
    "KeyValueRegisterModel",
    "Model",
    "Operation",
    "TableSetModel",
    "Unknown",
    "assert_linearizable",
    "check",
]

StateT = TypeVar("StateT", bound=Hashable)
InputT = TypeVar("InputT")
OutputT = TypeVar("OutputT")


class Model(Protocol[StateT, InputT, OutputT]):
    """A sequential specification. States must be hashable and compare by value (they key the cache).

    Subclass it to inherit the defaults of `partition` and the `describe_*` methods.
    """

    def init(self) -> StateT:
        """The state before any operation."""
        ...

    def step(self, state: StateT, input: InputT, output: OutputT | Unknown) -> tuple[bool, StateT]:
        """Whether `output` is a legal answer to `input` in `state`, and the state after the operation.

        With `output is UNKNOWN` the model must accept and return the state the operation would produce;
        the checker itself considers the operation not having taken effect. Raise on malformed operations
        rather than returning False, so a mis-recorded history is not reported as a consistency bug.
        """
        ...

    def partition(
        self, history: Sequence[Operation[InputT, OutputT]]
    ) -> list[list[Operation[InputT, OutputT]]] | None:
        """Independent sub-histories (P-compositionality), or None to check the history whole."""
        return None

    def project(
        self, history: Sequence[Operation[InputT, OutputT]]
    ) -> list[tuple[str, list[Operation[InputT, OutputT]]]] | None:
        """Relaxations, named: sub-histories that are linearizable whenever the history is (projections).

        Optional. When the history cannot be partitioned, they are checked (after the quick bounded
        search, before the exhaustive one) as a cheap way to find a violation: most violations show in
        one small projection, where the exhaustive search over unknown outcomes is affordable.
        """
        return None

    def is_read_only(self, input: InputT, output: OutputT | Unknown) -> bool:
        """Whether every step that accepts this (definite) output leaves the state unchanged.

        Optional (the default says no): the search takes such an operation as soon as the state fits it,
        without trying alternatives, which is what keeps concurrent reads from multiplying the search.
        """
        return False

    def describe_operation(self, input: InputT, output: OutputT | Unknown) -> str:
        return f"{input!r} -> {output!r}"

    def describe_state(self, state: StateT) -> str:
        return repr(state)


# --------------------------------------------------------------------------------------------- results


@dataclass
class CheckResult(Generic[InputT, OutputT]):
    """The verdict: `ok` is True, False, or None when the search gave up at the time limit.

    When `ok is False`, `partial` is the longest linearization found of the failing part (a valid
    linearization of a prefix of it), `state` the model state after it (described), and `stuck` the
    operations that were candidates to come next, none of which leads to a full linearization.
    `explanation` puts all of that into words, for an assertion message.
    """

    ok: bool | None
    explanation: str = ""
    partial: list[Operation[InputT, OutputT]] = field(default_factory=list)
    stuck: list[Operation[InputT, OutputT]] = field(default_factory=list)
    state: str = ""
    partitions: int = 1
    explored: int = 0
    elapsed_s: float = 0.0

    def __str__(self) -> str:
        return self.explanation or f"linearizable: {self.ok}"


def assert_linearizable(
    model: Model[StateT, InputT, OutputT],
    history: Sequence[Operation[InputT, OutputT]],
    *,
    timeout_s: float | None = None,
) -> CheckResult[InputT, OutputT]:
    """`check`, raising AssertionError with the explanation unless the history is linearizable."""
    result = check(model, history, timeout_s=timeout_s)
    if result.ok is not True:
        raise AssertionError(result.explanation)
    return result


# ---------------------------------------------------------------------------------------------- search

_OK = 1
_FAIL = 0
_GAVE_UP = -1
_DEADLINE_EVERY = 4096  # search steps between clock reads


@dataclass
class _Outcome:
    verdict: int
    explored: int
    best: list[int]  # op indices of the deepest partial linearization found (unless linearizable)


def _search(
    model: Model[StateT, InputT, OutputT],
    ops: Sequence[Operation[InputT, OutputT]],
    deadline: float | None,
    budget: int | None = None,
) -> _Outcome:
    """Search for a linearization, until `deadline` (monotonic) or `budget` nodes explored."""
    n = len(ops)
    definite = [not op.unknown for op in ops]
    n_definite = sum(definite)
    if n_definite == 0:
        return _Outcome(_OK, 0, [])

    # Entries are numbered in time order, so comparing ids compares positions. Calls sort before returns
    # at equal times (Porcupine's convention): touching intervals are concurrent.
    events: list[tuple[float, int, int]] = []
    for i, recorded in enumerate(ops):
        events.append((recorded.call_time, 0, i))
        if recorded.return_time != math.inf:
            events.append((recorded.return_time, 1, i))
    events.sort()
    n_entries = len(events)
    never = n_entries + 4  # beyond every entry id, sentinels included
    entry_op = [i for _, _, i in events]
    # Padded for the sentinels, which are not calls: a scan for candidates stops at the tail.
    entry_is_call = [kind == 0 for _, kind, _ in events] + [False] * 4
    match = [-1] * n_entries  # a definite call's return entry
    # An unknown operation with a finite return time took effect before then if at all, so it can be
    # linearized only while no operation called after that time is.
    expiry = [never] * n
    call_entry = [-1] * n
    for e in range(n_entries):
        op = entry_op[e]
        if entry_is_call[e]:
            call_entry[op] = e
        elif definite[op]:
            match[call_entry[op]] = e
        else:
            expiry[op] = e
    deadlines = any(x != never for x in expiry)

    # Two lists sharing the link arrays: definite calls and returns, and unknown calls.
    head, tail, uhead, utail = n_entries, n_entries + 1, n_entries + 2, n_entries + 3
    nxt = [0] * (n_entries + 4)
    prv = [0] * (n_entries + 4)
    for first, last, members in (
        (head, tail, [e for e in range(n_entries) if definite[entry_op[e]]]),
        (uhead, utail, [e for e in range(n_entries) if not definite[entry_op[e]] and entry_is_call[e]]),
    ):
        chain = [first, *members, last]
        for a, b in itertools.pairwise(chain):
            nxt[a] = b
            prv[b] = a

    # Separate bit spaces, so the cache can compare sets of unknown operations by inclusion.
    bit = [0] * n
    d_count = t_count = 0
    for i in range(n):
        if definite[i]:
            bit[i] = 1 << d_count
            d_count += 1
        else:
            bit[i] = 1 << t_count
            t_count += 1

    inputs = [op.input for op in ops]
    outputs = [op.output for op in ops]
    read_only = [definite[i] and model.is_read_only(op.input, op.output) for i, op in enumerate(ops)]
    step = model.step

    def candidates(state: StateT, maxcall: int) -> tuple[list[int], int]:
        """The definite calls before the first pending return, and that return's entry; or a read alone.

        A read (read-only operation) that fits the current state can be moved to the front of any
        linearization from here: nothing must precede it (it is a candidate) and it changes no state. So
        it is taken alone, with nothing else tried (bound -1: no unknown operation either). The exception
        is an unknown operation whose deadline falls before the read's call, which must precede it.
        """
        out = []
        fitting = []
        e = nxt[head]
        while entry_is_call[e]:
            op = entry_op[e]
            if read_only[op] and step(state, inputs[op], outputs[op])[0]:
                if not deadlines:
                    return [e], -1
                fitting.append(e)
            out.append(e)
            e = nxt[e]
        if fitting:
            first_deadline = never
            u = nxt[uhead]
            while u < e:
                if maxcall < expiry[entry_op[u]] < first_deadline:
                    first_deadline = expiry[entry_op[u]]
                u = nxt[u]
            if fitting[0] < first_deadline:
                return [fitting[0]], -1
        return out, e

    state = model.init()
    dbits = 0
    tbits = 0
    done = 0
    maxcall = -1  # the latest call entry among linearized operations
    # (definite set, state) -> unknown sets of the nodes visited with them. A node is pruned when a visited
    # one has the same definite operations and state and a subset of its unknown operations, so all of its
    # futures (the pending operations are a superset; their deadlines are no nearer).
    cache: dict[tuple[int, StateT], list[int]] = {}

    def covered(key: tuple[int, StateT], unknown: int) -> bool:
        """Whether a visited node prunes this one (see `cache`); if not, this one is recorded as visited."""
        seen = cache.get(key)
        if seen is None:
            cache[key] = [unknown]
            return False
        if any(prior & ~unknown == 0 for prior in seen):
            return True
        seen.append(unknown)
        return False

    # One frame per choice on the current path: the node's candidates, the position after the choice (-1
    # for an unknown operation, chosen after all of them), the node's first pending return, the entry
    # lifted, and the node's state and latest call.
    f_cands: list[list[int]] = []
    f_pos: list[int] = []
    f_bound: list[int] = []
    f_entry: list[int] = []
    f_state: list[StateT] = []
    f_maxcall: list[int] = []
    best_done = -1
    best_len = -1
    best: list[int] = []
    explored = 0
    steps = 0

    cands, bound = candidates(state, maxcall)
    pos = 0
    uentry = -1  # >= 0: trying unknown operations at this node, this one next
    while done < n_definite:
        steps += 1
        if steps % _DEADLINE_EVERY == 0 and (
            (deadline is not None and time.monotonic() > deadline)
            or (budget is not None and explored > budget)
        ):
            if len(f_entry) > best_len:
                best = [entry_op[e] for e in f_entry]
            return _Outcome(_GAVE_UP, explored, best)
        if uentry < 0:
            if pos < len(cands):
                entry = cands[pos]
                pos += 1
                op = entry_op[entry]
                ok, new_state = step(state, inputs[op], outputs[op])
                if not ok:
                    continue
                new_d = dbits | bit[op]
                if covered((new_d, new_state), tbits):
                    continue
                explored += 1
                f_cands.append(cands)
                f_pos.append(pos)
                f_bound.append(bound)
                f_entry.append(entry)
                f_state.append(state)
                f_maxcall.append(maxcall)
                state = new_state
                dbits = new_d
                done += 1
                maxcall = max(maxcall, entry)
                ret = match[entry]
                nxt[prv[entry]] = nxt[entry]
                prv[nxt[entry]] = prv[entry]
                nxt[prv[ret]] = nxt[ret]
                prv[nxt[ret]] = prv[ret]
                cands, bound = candidates(state, maxcall)
                pos = 0
                continue
            # No definite candidate leads anywhere from here: try the unknown ones.
            uentry = nxt[uhead]
            continue

        if uentry < bound:  # utail's id exceeds every entry's, so this also stops at the list's end
            entry = uentry
            uentry = nxt[uentry]
            op = entry_op[entry]
            if expiry[op] < maxcall:
                continue
            ok, new_state = step(state, inputs[op], outputs[op])
            # One that changes nothing is never needed: leaving it out is equivalent.
            if not ok or new_state == state:
                continue
            new_t = tbits | bit[op]
            if covered((dbits, new_state), new_t):
                continue
            explored += 1
            f_cands.append(cands)
            f_pos.append(-1)
            f_bound.append(bound)
            f_entry.append(entry)
            f_state.append(state)
            f_maxcall.append(maxcall)
            state = new_state
            tbits = new_t
            maxcall = max(maxcall, entry)
            nxt[prv[entry]] = nxt[entry]
            prv[nxt[entry]] = prv[entry]
            cands, bound = candidates(state, maxcall)
            pos = 0
            uentry = -1
            continue

        # A dead end: every choice at this node has been tried.
        depth = len(f_entry)
        if done > best_done or (done == best_done and depth > best_len):
            best_done, best_len = done, depth
            best = [entry_op[e] for e in f_entry]
        if not f_entry:
            return _Outcome(_FAIL, explored, best)
        entry = f_entry.pop()
        state = f_state.pop()
        cands = f_cands.pop()
        pos = f_pos.pop()
        bound = f_bound.pop()
        maxcall = f_maxcall.pop()
        op = entry_op[entry]
        nxt[prv[entry]] = entry
        prv[nxt[entry]] = entry
        if definite[op]:
            dbits &= ~bit[op]
            done -= 1
            ret = match[entry]
            nxt[prv[ret]] = ret
            prv[nxt[ret]] = ret
            uentry = -1
        else:
            tbits &= ~bit[op]
            uentry = nxt[entry]
    return _Outcome(_OK, explored, [])


# ---------------------------------------------------------------------------------------------- check


def check(
    model: Model[StateT, InputT, OutputT],
    history: Sequence[Operation[InputT, OutputT]],
    *,
    timeout_s: float | None = None,
    bounded_first: bool = True,
) -> CheckResult[InputT, OutputT]:
    """Whether `history` is linearizable with respect to `model`.

    `timeout_s` bounds the whole check; when it runs out the result has `ok = None`. Deterministic
    otherwise: the same history always gives the same verdict and explanation.

    Unknown operations without a deadline (`return_time = inf`) can take effect at any later moment, and
    each one pending multiplies the states the search can reach. If a part has some, and `bounded_first`,
    the exhaustive search comes after shortcuts, each allowed a bounded number of nodes (see `_stages`):
    a search with their effects confined to a window of 4 times the part's longest definite operation,
    the model's projections (only when the history is not partitioned), a window of 32 times, in turn.
    """
    start = time.monotonic()
    deadline = None if timeout_s is None else start + timeout_s
    ops = list(history)
    parts = model.partition(ops)
    if parts is None:
        parts = [ops]
    index = {id(op): i for i, op in enumerate(ops)}
    explored = 0
    for part_no, part in enumerate(parts):
        scope = (
            f"{len(ops)} operations"
            if len(parts) == 1
            else f"part {part_no + 1} of {len(parts)}: {len(part)} of {len(ops)} operations"
        )
        for kind, name, searched in _stages(model, part, len(parts) == 1, bounded_first):
            # Only the exact search may take all the time there is; the others are shortcuts.
            budget = None if kind == "exact" else _SHORTCUT_BUDGET_PER_OP * len(searched) + _SHORTCUT_BUDGET
            outcome = _search(model, searched, deadline, budget)
            explored += outcome.explored
            if (
                outcome.verdict == _GAVE_UP
                and kind != "exact"
                and (deadline is None or time.monotonic() < deadline)
            ):
                continue
            if outcome.verdict == _GAVE_UP:
                # A bounded variant numbers its operations as the part does; show the originals.
                shown = part if kind == "bounded" else searched
                result = _gave_up(part, shown, scope, outcome, start, explored, timeout_s)
                result.partitions = len(parts)
                return result
            if outcome.verdict == _OK and kind != "projection":
                break
            if outcome.verdict == _FAIL and kind != "bounded":
                if kind == "projection":
                    scope = (
                        f"{len(ops)} operations; already its projection {name}, {len(searched)} operations"
                    )
                result = _failure(model, ops, searched, scope, outcome, start, explored, index)
                result.partitions = len(parts)
                return result
    return CheckResult(ok=True, partitions=len(parts), explored=explored, elapsed_s=time.monotonic() - start)


def _stages(
    model: Model[StateT, InputT, OutputT],
    part: list[Operation[InputT, OutputT]],
    whole: bool,
    bounded_first: bool,
) -> Iterator[tuple[str, str, list[Operation[InputT, OutputT]]]]:
    """The searches for one part, cheapest first, as (kind, name, operations).

    "bounded": unknown effects in a window; a linearization settles it, a failure does not. The tight
    window finds most linearizations. "projection": a failure settles it, a linearization does not; they
    find most violations cheaply. "exact": settles it, however long it takes.
    """
    bounded = _bounded_variants(part) if bounded_first else []
    if bounded:
        yield "bounded", "", bounded[0]
        for name, projected in (model.project(part) or []) if whole else []:
            yield "projection", name, projected
        for variant in bounded[1:]:
            yield "bounded", "", variant
    yield "exact", "", part


_WINDOW_FACTORS = (4.0, 32.0)
# Nodes a shortcut search may explore before it is abandoned: a linearizable history typically needs one
# to ten per operation.
_SHORTCUT_BUDGET_PER_OP = 20
_SHORTCUT_BUDGET = 10_000


def _bounded_variants(
    part: Sequence[Operation[InputT, OutputT]],
) -> list[list[Operation[InputT, OutputT]]]:
    """The part with its unbounded unknown operations given deadlines, tightest first."""
    if not any(op.unknown and op.return_time == math.inf for op in part):
        return []
    longest = max((op.return_time - op.call_time for op in part if not op.unknown), default=0.0)
    if longest <= 0:
        return []
    return [
        [
            Operation.timed_out(op.client_id, op.input, op.call_time, op.call_time + factor * longest)
            if op.unknown and op.return_time == math.inf
            else op
            for op in part
        ]
        for factor in _WINDOW_FACTORS
    ]


def _gave_up(
    part: list[Operation[InputT, OutputT]],
    searched: list[Operation[InputT, OutputT]],
    scope: str,
    outcome: _Outcome,
    start: float,
    explored: int,
    timeout_s: float | None,
) -> CheckResult[InputT, OutputT]:
    elapsed = time.monotonic() - start
    unknown = sum(op.unknown and op.return_time == math.inf for op in part)
    return CheckResult(
        ok=None,
        explanation=(
            f"Gave up after {elapsed:.2f} s (timeout_s={timeout_s}): linearizability unknown ({scope}, "
            f"{unknown} with unknown outcome and no deadline). {explored} states explored; the deepest "
            f"partial linearization found has {len(outcome.best)} operations. Unknown outcomes without "
            "deadlines make the search exponential (each one pending doubles the states it can reach); "
            "deadlines (Operation.timed_out(..., effect_deadline)) help."
        ),
        partial=[searched[i] for i in outcome.best],
        explored=explored,
        elapsed_s=elapsed,
    )


# ---------------------------------------------------------------------------------------- explanation

_SHOWN_PREFIX = 25
_SHOWN_UNKNOWN = 5


def _failure(
    model: Model[StateT, InputT, OutputT],
    ops: list[Operation[InputT, OutputT]],
    part: list[Operation[InputT, OutputT]],
    scope: str,
    outcome: _Outcome,
    start: float,
    explored: int,
    index: dict[int, int],
) -> CheckResult[InputT, OutputT]:
    """`index` numbers operations by their place in the history; projected ones are found by call."""
    origin = min((op.call_time for op in ops), default=0.0)
    by_call: dict[tuple[int, float], int] = {}
    for i, op in enumerate(ops):
        by_call.setdefault((op.client_id, op.call_time), i)

    def number(op: Operation[InputT, OutputT]) -> int | str:
        return index.get(id(op), by_call.get((op.client_id, op.call_time), "?"))

    def show(op: Operation[InputT, OutputT]) -> str:
        ret = f"{op.return_time - origin:8.4f}"
        if op.unknown:
            ret = "       ?" if op.return_time == math.inf else f"?{op.return_time - origin:7.4f}"
        return (
            f"#{number(op)} client {op.client_id} "
            f"[{op.call_time - origin:8.4f} .. {ret}] {model.describe_operation(op.input, op.output)}"
        )

    partial = [part[i] for i in outcome.best]
    state = model.init()
    for op in partial:
        _, state = model.step(state, op.input, op.output)
    linearized = set(outcome.best)
    remaining = [part[i] for i in range(len(part)) if i not in linearized]
    first_return = min((op.return_time for op in remaining if not op.unknown), default=math.inf)
    last_call = max((op.call_time for op in partial), default=-math.inf)
    # The candidates to go next, as the search saw them: called no later than the first pending return
    # (and, for an unknown operation, with its deadline not passed).
    stuck = sorted(
        (
            op
            for op in remaining
            if op.call_time <= first_return and not (op.unknown and op.return_time < last_call)
        ),
        key=lambda op: (op.unknown, op.call_time, str(number(op))),
    )
    blocking = [op for op in remaining if not op.unknown and op.return_time == first_return]

    lines = [
        f"NOT linearizable ({scope}).",
        f"Longest linearizable prefix found: {len(partial)} operation(s), in linearization order:",
    ]
    if len(partial) > _SHOWN_PREFIX:
        lines.append(f"  ... {len(partial) - _SHOWN_PREFIX} earlier operations")
    lines.extend(f"  {show(op)}" for op in partial[-_SHOWN_PREFIX:])
    lines.append(f"State after it: {model.describe_state(state)}")
    lines.append(
        "Next must come one of these candidates (called before the earliest pending return, marked *), "
        "but none leads to a linearization:"
    )
    unknown = [op for op in stuck if op.unknown]
    for op in stuck:
        if op.unknown:
            continue
        accepted, _ = model.step(state, op.input, op.output)
        why = "accepted, but every continuation from it fails" if accepted else "rejected by the model"
        mark = "*" if any(op is b for b in blocking) else " "
        lines.append(f" {mark}{show(op)}  <- {why}")
    if unknown:
        lines.append(
            f"  and {len(unknown)} with unknown outcome, none of which helps by taking effect here"
            + (":" if len(unknown) <= _SHOWN_UNKNOWN else f"; the first {_SHOWN_UNKNOWN}:")
        )
        lines.extend(f"  {show(op)}" for op in unknown[:_SHOWN_UNKNOWN])
    lines.append(
        "(Operations: #index-in-history client [call .. return], times relative to the first call; "
        "'?' = outcome unknown, with the deadline for its effect if it has one.)"
    )
    return CheckResult(
        ok=False,
        explanation="\n".join(lines),
        partial=partial,
        stuck=stuck,
        state=model.describe_state(state),
        explored=explored,
        elapsed_s=time.monotonic() - start,
    )


# ---------------------------------------------------------------------------------------------- models

TableInput: TypeAlias = tuple[str, ...]
TableOutput: TypeAlias = str | frozenset[str]
TableState: TypeAlias = frozenset[str]


class TableSetModel(Model[TableState, TableInput, TableOutput]):
    """The cluster's set of table names under concurrent create, delete and list.

    Inputs and their definite outputs:

    - `("create", name)`: `"ok"` (it did not exist; now it does) or `"exists"` (no change);
    - `("delete", name)`: `"ok"` (it existed; now it does not) or `"missing"` (no change);
    - `("list",)`: the frozenset of all names.

    Partitioning by name is valid only without `list`: a list reads every name at one instant, so it ties
    the per-name sub-histories together (a list seeing create(a) but not create(b) orders them).
    """

    def init(self) -> TableState:
        return frozenset()

    def step(
        self, state: TableState, input: TableInput, output: TableOutput | Unknown
    ) -> tuple[bool, TableState]:
        match input:
            case ("create", str(name)):
                present = name in state
                new = state if present else state | {name}
                if output is UNKNOWN:
                    return True, new
                if output not in ("ok", "exists"):
                    raise ValueError(f"create answers 'ok' or 'exists', not {output!r}")
                return (output == "exists") == present, new
            case ("delete", str(name)):
                present = name in state
                new = state - {name} if present else state
                if output is UNKNOWN:
                    return True, new
                if output not in ("ok", "missing"):
                    raise ValueError(f"delete answers 'ok' or 'missing', not {output!r}")
                return (output == "ok") == present, new
            case ("list",):
                if output is UNKNOWN:
                    return True, state
                if not isinstance(output, frozenset):
                    raise ValueError(f"list answers a frozenset of names, not {output!r}")
                return output == state, state
        raise ValueError(f"not a TableSetModel input: {input!r}")

    def partition(
        self, history: Sequence[Operation[TableInput, TableOutput]]
    ) -> list[list[Operation[TableInput, TableOutput]]] | None:
        if any(op.input[0] == "list" for op in history):
            return None
        return _group_by(history, _second)

    def project(
        self, history: Sequence[Operation[TableInput, TableOutput]]
    ) -> list[tuple[str, list[Operation[TableInput, TableOutput]]]] | None:
        """Per name: its creates and deletes, and every list with its output narrowed to that name.

        A linearization of the history, restricted to these, is one of the projection (the state
        narrowed to the name), so a projection that is not linearizable proves the history is not.
        """
        names = sorted({op.input[1] for op in history if op.input[0] != "list" and len(op.input) > 1})
        names += sorted(
            {n for op in history if isinstance(op.output, frozenset) for n in op.output} - set(names)
        )
        projections = []
        for name in names:
            projected = []
            for op in history:
                if op.input[0] != "list":
                    if op.input[1:] == (name,):
                        projected.append(op)
                elif isinstance(op.output, frozenset):
                    seen = op.output & {name}
                    projected.append(Operation(op.client_id, op.input, op.call_time, seen, op.return_time))
            projections.append((f"onto table {name!r} (lists narrowed to it)", projected))
        return projections

    def is_read_only(self, input: TableInput, output: TableOutput | Unknown) -> bool:
        return input[0] == "list" or output in ("exists", "missing")

    def describe_operation(self, input: TableInput, output: TableOutput | Unknown) -> str:
        shown = _names(output) if isinstance(output, frozenset) else str(output)
        if input[0] == "list":
            return f"list -> {shown}"
        return f"{input[0]} {input[1]!r} -> {shown}"

    def describe_state(self, state: TableState) -> str:
        return _names(state)


def _names(names: Iterable[str]) -> str:
    return "{" + ", ".join(repr(n) for n in sorted(names)) + "}"


RegisterInput: TypeAlias = tuple[Hashable, ...]
RegisterState: TypeAlias = frozenset[tuple[Hashable, Hashable]]


class KeyValueRegisterModel(Model[RegisterState, RegisterInput, Hashable]):
    """Independent registers by key. Values are hashable; an absent key reads as None.

    - `("put", key, value)` -> `"ok"`;
    - `("get", key)` -> the value;
    - `("cas", key, expected, new)` -> True (it held `expected`; now `new`) or False (no change).

    No operation touches two keys, so the history always partitions by key.
    """

    def init(self) -> RegisterState:
        return frozenset()

    def step(
        self, state: RegisterState, input: RegisterInput, output: Hashable | Unknown
    ) -> tuple[bool, RegisterState]:
        match input:
            case ("put", key, value):
                new = _assign(state, key, value)
                if output is UNKNOWN:
                    return True, new
                if output != "ok":
                    raise ValueError(f"put answers 'ok', not {output!r}")
                return True, new
            case ("get", key):
                return output is UNKNOWN or output == _lookup(state, key), state
            case ("cas", key, expected, value):
                holds = _lookup(state, key) == expected
                new = _assign(state, key, value) if holds else state
                if output is UNKNOWN:
                    return True, new
                if not isinstance(output, bool):
                    raise ValueError(f"cas answers True or False, not {output!r}")
                return output == holds, new
        raise ValueError(f"not a KeyValueRegisterModel input: {input!r}")

    def partition(
        self, history: Sequence[Operation[RegisterInput, Hashable]]
    ) -> list[list[Operation[RegisterInput, Hashable]]] | None:
        return _group_by(history, _second)

    def is_read_only(self, input: RegisterInput, output: Hashable | Unknown) -> bool:
        return input[0] == "get" or (input[0] == "cas" and output is False)

    def describe_operation(self, input: RegisterInput, output: Hashable | Unknown) -> str:
        args = ", ".join(repr(a) for a in input[1:])
        return f"{input[0]}({args}) -> {output!r}"

    def describe_state(self, state: RegisterState) -> str:
        return "{" + ", ".join(f"{k!r}: {v!r}" for k, v in sorted(state, key=repr)) + "}"


def _lookup(state: RegisterState, key: Hashable) -> Hashable:
    for k, v in state:
        if k == key:
            return v
    return None


def _assign(state: RegisterState, key: Hashable, value: Hashable) -> RegisterState:
    return frozenset({(k, v) for k, v in state if k != key} | {(key, value)})


_OpT = TypeVar("_OpT")


_TupleT = TypeVar("_TupleT", bound=tuple[Hashable, ...])


def _second(op: Operation[_TupleT, OutputT]) -> Hashable:
    """The name or key an operation is about (malformed inputs are left for `step` to reject)."""
    return op.input[1] if len(op.input) > 1 else None


def _group_by(history: Sequence[_OpT], key: Callable[[_OpT], Hashable]) -> list[list[_OpT]]:
    groups: dict[Hashable, list[_OpT]] = {}
    for op in history:
        groups.setdefault(key(op), []).append(op)
    return list(groups.values())

"""The OR-Tools min-cost flow: lower bounds, and optimality of the compressed active graph against
brute force on small clusters (real solver, no mocks)."""

from __future__ import annotations

import itertools
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotstate.assignor import (
    AssignorConfig,
    AssignorInternalError,
    PartitionId,
    Placement,
    Server,
    Table,
)
from hotstate.assignor.active_flow import active_tiebreak, candidates, flow_active_targets
from hotstate.assignor.assign import check_not_worse, table_bounds_of
from hotstate.assignor.balance import balanced_bounds
from hotstate.assignor.cost import actives_cost, model_of
from hotstate.assignor.flow import FlowNetwork
from hotstate.assignor.problem import build_problem

from .helpers import RACKS


def test_lower_bounds_force_flow_through_an_expensive_arc() -> None:
    net = FlowNetwork()
    src = net.add_node(4)
    cheap, dear = net.add_node(), net.add_node()
    sink = net.add_node(-4)
    a = net.add_arc(src, cheap, 1, 4)
    b = net.add_arc(src, dear, 5, 4)
    net.add_arc(cheap, sink, 0, 4)
    net.add_arc(dear, sink, 0, 4, lo=3)  # at least 3 units must go the expensive way
    flows, cost = net.solve()
    assert flows[a] == 1 and flows[b] == 3
    assert cost == 1 * 1 + 3 * 5


def test_infeasible_network_is_an_internal_error() -> None:
    net = FlowNetwork()
    src = net.add_node(2)
    sink = net.add_node(-2)
    net.add_arc(src, sink, 0, 1)
    with pytest.raises(AssignorInternalError, match="min-cost flow"):
        net.solve()


def test_cost_regression_guard_raises() -> None:
    check_not_worse(3, 3, "x")
    with pytest.raises(AssignorInternalError, match="costs 4 > plain balanced 3"):
        check_not_worse(4, 3, "actives")


@st.composite
def small_problems(
    draw: st.DrawFn,
) -> tuple[list[Server], list[Table], dict[PartitionId, Placement], AssignorConfig]:
    n = draw(st.integers(1, 3))
    servers = [
        Server(f"s{i}", rack=draw(st.sampled_from(RACKS)), capacity=draw(st.integers(1, 2))) for i in range(n)
    ]
    tables = [
        Table(
            f"t{t}",
            draw(st.integers(1, 3)),
            writer_racks=tuple(draw(st.sets(st.sampled_from(RACKS), max_size=2))),
        )
        for t in range(draw(st.integers(1, 2)))
    ]
    ids = [s.id for s in servers]
    prev = {}
    for t in tables:
        for i in range(t.partitions):
            if draw(st.booleans()):
                prev[PartitionId(t.name, i)] = Placement(draw(st.sampled_from(ids)))
    cfg = AssignorConfig(traffic_cost=draw(st.integers(0, 5)), non_overlap_cost=draw(st.integers(0, 5)))
    return servers, tables, prev, cfg


@settings(max_examples=60, deadline=None)
@given(small_problems(), st.booleans())
def test_compressed_flow_matches_brute_force_optimum(
    case: tuple[list[Server], list[Table], dict[PartitionId, Placement], AssignorConfig],
    per_table: bool,
) -> None:
    servers, tables, prev, cfg = case
    problem = build_problem(servers, tables, prev, None, cfg)
    model = model_of(problem)
    n_parts = len(problem.partitions)
    bounds = balanced_bounds(n_parts, problem.capacities)
    t_bounds = table_bounds_of(problem) if per_table else None
    targets = flow_active_targets(problem, model, bounds, t_bounds)
    got = actives_cost(problem, model, [targets[p] for p in range(n_parts)])

    def feasible(assignment: tuple[int, ...]) -> bool:
        counts = Counter(assignment)
        if any(not bounds[0][s] <= counts[s] <= bounds[1][s] for s in range(len(servers))):
            return False
        if t_bounds is not None:
            for t, (lo, hi) in enumerate(t_bounds):
                per = Counter(s for p, s in enumerate(assignment) if problem.table_of[p] == t)
                if any(not lo[s] <= per[s] <= hi[s] for s in range(len(servers))):
                    return False
        return True

    best = min(
        actives_cost(problem, model, list(a))
        for a in itertools.product(range(len(servers)), repeat=n_parts)
        if feasible(a)
    )
    assert got == best
    assert feasible(tuple(targets[p] for p in range(n_parts)))


def test_active_tiebreak_prefers_previous_active_then_caught_up_then_any_data() -> None:
    servers = [Server(x) for x in "abcde"]
    pid = PartitionId("t", 0)
    prev = {pid: Placement("a", ("b",), ("c",))}
    lags = {pid: {"b": 0, "c": 10_000_000, "e": 3}}
    problem = build_problem(servers, [Table("t", 1)], prev, lags, AssignorConfig())
    assert [active_tiebreak(problem, 0, s) for s in range(5)] == [0, 1, 2, 3, 1]
    # Candidates get their own arcs: previous replicas, and servers caught up from leftover state.
    assert candidates(problem, 0) == [0, 1, 2, 4]

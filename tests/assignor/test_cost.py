"""The KIP-925 edge cost."""

from __future__ import annotations

from hotstate.assignor import AssignorConfig, PartitionId, Placement, Server, Table
from hotstate.assignor.cost import CostModel, actives_cost, cross_rack_count, replica_cost, standbys_cost
from hotstate.assignor.problem import build_problem


def test_edge_cost_terms() -> None:
    m = CostModel(traffic_cost=10, non_overlap_cost=1)
    src = frozenset({"az-a"})
    assert m.edge(src, "az-a", True) == 0
    assert m.edge(src, "az-b", True) == 10
    assert m.edge(src, "az-a", False) == 1
    assert m.edge(src, "az-b", False) == 11
    assert m.edge(src, None, True) == 10  # unknown location counts as cross-rack
    assert m.edge(frozenset(), "az-b", True) == 0  # unknown sources: no traffic to save


def test_held_means_previous_active_for_actives_and_any_replica_for_standbys() -> None:
    servers = [Server("a", "az-a"), Server("b", "az-b"), Server("c", "az-a")]
    prev = {PartitionId("t", 0): Placement("a", ("b",))}
    problem = build_problem(servers, [Table("t", 1, writer_racks=("az-a",))], prev, None, AssignorConfig())
    m = CostModel(10, 1)
    a, b, c = 0, 1, 2
    assert replica_cost(problem, m, "active", 0, a) == 0
    assert replica_cost(problem, m, "active", 0, b) == 11  # moving the active onto the standby is a move
    assert replica_cost(problem, m, "standby", 0, b) == 10  # but the standby there has the data
    assert replica_cost(problem, m, "standby", 0, c) == 1
    assert actives_cost(problem, m, [c]) == 1
    assert standbys_cost(problem, m, [[b, c]]) == 11
    assert cross_rack_count(problem, [b]) == 1

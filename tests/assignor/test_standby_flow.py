"""KIP-925 standby optimisation: cheaper, never at the expense of spread or balance."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings

from hotstate.assignor import AssignorConfig, PartitionId, Server, Table, assign
from hotstate.assignor.cost import model_of, standbys_cost
from hotstate.assignor.problem import build_problem
from hotstate.assignor.standby_flow import optimize_standbys
from hotstate.assignor.standbys import place_standbys, tag_classes

from .helpers import Case, cases


def test_standby_moves_into_the_source_rack_within_its_zone() -> None:
    # Spread is over zones only; each zone has a server in az-a (the writers' rack) and one in az-b.
    servers = [
        Server("z1-a", rack="az-a", tags={"zone": "z1"}),
        Server("z1-b", rack="az-b", tags={"zone": "z1"}),
        Server("z2-a", rack="az-a", tags={"zone": "z2"}),
        Server("z2-b", rack="az-b", tags={"zone": "z2"}),
    ]
    cfg = AssignorConfig(num_standby_replicas=1, rack_aware_assignment_tags=("zone",))
    out = assign(servers, [Table("t", 4, writer_racks=("az-a",))], config=cfg)
    zone = {s.id: s.tags["zone"] for s in servers}
    for pa in out.partitions.values():
        (sb,) = pa.standbys
        assert zone[sb] != zone[pa.active]
    # Two standbys can sit in az-a without breaking balance (one per server in each zone's pair).
    in_source = sum(1 for pa in out.partitions.values() if pa.standbys[0].endswith("-a"))
    assert in_source == 2
    assert out.explanation.cost.standby <= out.explanation.cost.standby_baseline


@settings(max_examples=80, deadline=None)
@given(cases())
def test_optimisation_keeps_tag_class_and_counts_and_never_costs_more(case: Case) -> None:
    problem = build_problem(case.servers, case.tables, case.previous, case.lags, case.config)
    classes = tag_classes(problem.vectors)
    n = len(problem.partitions)
    actives = [(p * 7) % problem.num_servers for p in range(n)]
    warmups: list[tuple[int, ...]] = [()] * n
    slots, _ = place_standbys(problem, actives, warmups)
    before = [[s.server for s in row] for row in slots]
    after = optimize_standbys(problem, model_of(problem), classes, slots, actives, warmups)
    assert Counter(s for row in before for s in row) == Counter(s for row in after for s in row)
    for p in range(n):
        assert [problem.vectors[s] for s in before[p]] == [problem.vectors[s] for s in after[p]]
        assert actives[p] not in after[p] and len(set(after[p])) == len(after[p])
    model = model_of(problem)
    assert standbys_cost(problem, model, after) <= standbys_cost(problem, model, before)


def test_unchanged_input_keeps_standbys_where_they_are() -> None:
    servers = [Server(f"s{i}", rack=("az-a", "az-b")[i % 2]) for i in range(6)]
    cfg = AssignorConfig(num_standby_replicas=2, rack_aware_assignment_tags=())
    tables = [Table("t", 12, writer_racks=("az-a",))]
    first = assign(servers, tables, config=cfg)
    lags = {pid: dict.fromkeys(pa.replicas(), 0) for pid, pa in first.partitions.items()}
    second = assign(servers, tables, first, lags, cfg)
    assert second.partitions == first.partitions
    assert all(r.reason != "warmup" for r in second.explanation.replicas)
    assert PartitionId("t", 0) in second.partitions

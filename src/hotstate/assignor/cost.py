"""The KIP-925 cost of putting a replica of a partition on a server.

cost = traffic_cost x (server's rack is not one of the partition's source racks)
     + non_overlap_cost x (server did not hold this partition before)

"Held" depends on the role, because what non_overlap_cost prices differs:
- an *active* held the partition if it was the partition's active: moving an active (even to a
  caught-up standby) is a leadership change, and KIP-925 prices the non-overlap with the previous
  active assignment. So the flow moves as few actives as balance needs.
- a *standby* held the partition if it had any replica of it (active, standby or warmup): a standby
  on such a server needs no new copy of the data.

The cost depends on the server only through its rack and whether it held the partition. That is
what lets the flow graph work on rack classes instead of single servers.

A partition with no known source racks has no cross-rack traffic to save, so its traffic term is 0.
A server with no rack is never in a source rack (where it is unknown, count the traffic).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hotstate.assignor.model import AssignedRole
from hotstate.assignor.problem import NO_SERVER, Problem


@dataclass(frozen=True, slots=True)
class CostModel:
    traffic_cost: int
    non_overlap_cost: int

    def cross_rack(self, sources: frozenset[str], rack: str | None) -> bool:
        return bool(sources) and rack not in sources

    def edge(self, sources: frozenset[str], rack: str | None, held: bool) -> int:
        cost = 0
        if self.cross_rack(sources, rack):
            cost += self.traffic_cost
        if not held:
            cost += self.non_overlap_cost
        return cost


def model_of(problem: Problem) -> CostModel:
    return CostModel(problem.config.traffic_cost, problem.config.non_overlap_cost)


def held_as(problem: Problem, role: AssignedRole, p: int, s: int) -> bool:
    if role == "active":
        return s == problem.prev_active[p]
    return s in problem.held[p]


def replica_cost(problem: Problem, model: CostModel, role: AssignedRole, p: int, s: int) -> int:
    return model.edge(problem.sources[p], problem.racks[s], held_as(problem, role, p, s))


def actives_cost(problem: Problem, model: CostModel, actives: Sequence[int]) -> int:
    return sum(replica_cost(problem, model, "active", p, s) for p, s in enumerate(actives) if s != NO_SERVER)


def standbys_cost(problem: Problem, model: CostModel, standbys: Sequence[Sequence[int]]) -> int:
    return sum(replica_cost(problem, model, "standby", p, s) for p, row in enumerate(standbys) for s in row)


def cross_rack_count(problem: Problem, actives: Sequence[int]) -> int:
    """Actives outside their partition's source racks (the traffic KIP-925 is about)."""
    unit = CostModel(1, 0)
    return sum(unit.edge(problem.sources[p], problem.racks[s], True) for p, s in enumerate(actives))

"""A min-cost flow network with lower bounds, solved by OR-Tools' SimpleMinCostFlow.

OR-Tools takes arcs with capacities and nodes with supplies. Balance needs *lower* bounds too (a
server must get at least floor(n c / C) actives), so an arc [lo, hi] is rewritten the textbook way:
capacity hi - lo, and lo units of supply moved from its head to its tail. Exact node supplies do the
rest, so no "big M" costs are needed and the solver's answer is exact.

Arcs are handed over in the order they were added and OR-Tools is single-threaded here, so the same
network always yields the same flows.
"""

from __future__ import annotations

from hotstate.assignor.errors import AssignorInternalError


class FlowNetwork:
    """Builder for one solve; not shared, not reused."""

    def __init__(self) -> None:
        self._supply: list[int] = []
        self._tails: list[int] = []
        self._heads: list[int] = []
        self._caps: list[int] = []
        self._costs: list[int] = []
        self._lows: list[int] = []

    @property
    def num_arcs(self) -> int:
        return len(self._tails)

    @property
    def num_nodes(self) -> int:
        return len(self._supply)

    def add_node(self, supply: int = 0) -> int:
        self._supply.append(supply)
        return len(self._supply) - 1

    def add_supply(self, node: int, amount: int) -> None:
        self._supply[node] += amount

    def add_arc(self, tail: int, head: int, cost: int, hi: int, lo: int = 0) -> int:
        self._tails.append(tail)
        self._heads.append(head)
        self._caps.append(hi - lo)
        self._costs.append(cost)
        self._lows.append(lo)
        if lo:
            if lo > hi:
                raise AssignorInternalError(f"flow arc {tail}->{head} has bounds [{lo}, {hi}]")
            self._supply[tail] -= lo
            self._supply[head] += lo
        return len(self._tails) - 1

    def solve(self) -> tuple[list[int], int]:
        """Flows per arc (lower bounds included) and the total cost; raises if there is no solution."""
        if not self._tails:
            if any(self._supply):
                raise AssignorInternalError("flow network has supplies but no arcs")
            return [], 0
        # Imported here: numpy and OR-Tools are ~130 ms of a server's start, and only the active controller
        # places replicas (in a worker thread).
        import numpy as np
        from ortools.graph.python import min_cost_flow

        solver = min_cost_flow.SimpleMinCostFlow()
        arcs = solver.add_arcs_with_capacity_and_unit_cost(
            np.asarray(self._tails, dtype=np.int32),
            np.asarray(self._heads, dtype=np.int32),
            np.asarray(self._caps, dtype=np.int64),
            np.asarray(self._costs, dtype=np.int64),
        )
        solver.set_nodes_supplies(
            np.arange(len(self._supply), dtype=np.int32), np.asarray(self._supply, dtype=np.int64)
        )
        status = solver.solve()
        if status != solver.OPTIMAL:
            raise AssignorInternalError(
                f"min-cost flow returned {status!r} for {self.num_nodes} nodes / {self.num_arcs} arcs; "
                f"the balance bounds should always be feasible"
            )
        flows = solver.flows(arcs)
        low_cost = sum(lo * c for lo, c in zip(self._lows, self._costs, strict=True))
        return [int(f) + lo for f, lo in zip(flows, self._lows, strict=True)], int(
            solver.optimal_cost()
        ) + low_cost

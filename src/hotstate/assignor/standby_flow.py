"""KIP-925 cost optimisation of standbys that cannot weaken the KIP-708 spread.

Reliability first: the KIP-708 pass fixed, for every standby, a *tag class* (the servers with one
tag vector), and every server's standby count. Moving a standby to another server of the same class
changes neither the partition's spread nor any server's load, so within each class a min-cost flow
is free to re-pick servers for the lowest KIP-925 cost:

- groups of standby slots with the same source racks, previous holders in the class and number of
  slots in the class -> rack pools of the class (priced as "new") and -> each holder (priced "held");
- pools -> servers; every server must take exactly its KIP-708 count.

In a large class the pools do not see "not on the active's server" (that would need an arc per
server); the expansion step enforces it and, if it ever cannot, the class keeps its KIP-708
placement. Small classes (servers x slots <= EXACT_ARC_BUDGET) get an arc per allowed server instead,
which is exact. As the KIP-708 placement is itself a feasible flow, the result never costs more.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Sequence

from hotstate.assignor.active_flow import rack_sort_key
from hotstate.assignor.cost import CostModel, replica_cost
from hotstate.assignor.errors import AssignorInternalError
from hotstate.assignor.flow import FlowNetwork
from hotstate.assignor.problem import Problem
from hotstate.assignor.standbys import StandbySlot, TagClasses

GENERIC_TIEBREAK = 2
EXACT_ARC_BUDGET = 20_000


def standby_tiebreak(problem: Problem, p: int, s: int, kip708_servers: Sequence[int]) -> int:
    """Among equal costs, keep the KIP-708 choice (0), else reuse a previous replica (1), else new (2).

    Preferring the KIP-708 choice means the flow only moves a standby when that lowers the cost;
    KIP-708 itself keeps previous standbys, so in a steady state nothing moves.
    """
    if s in kip708_servers:
        return 0
    return 1 if s in problem.held[p] else GENERIC_TIEBREAK


def optimize_standbys(
    problem: Problem,
    model: CostModel,
    classes: TagClasses,
    slots: list[list[StandbySlot]],
    actives: Sequence[int],
    warmups: Sequence[Sequence[int]],
) -> list[list[int]]:
    """Cost-optimised servers, per partition in slot order (same length as ``slots``)."""
    result = [[slot.server for slot in row] for row in slots]
    by_class: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for p, row in enumerate(slots):
        for j, slot in enumerate(row):
            by_class[classes.class_of[slot.server]].append((p, j))
    for c in sorted(by_class):
        if len(classes.members[c]) < 2:
            continue
        placed = _optimize_class(problem, model, classes.members[c], by_class[c], result, actives, warmups)
        if placed is None or all(result[p][j] == s for (p, j), s in zip(by_class[c], placed, strict=True)):
            continue
        old = sum(replica_cost(problem, model, "standby", p, result[p][j]) for p, j in by_class[c])
        new = sum(
            replica_cost(problem, model, "standby", p, s)
            for (p, _), s in zip(by_class[c], placed, strict=True)
        )
        if new > old:
            raise AssignorInternalError(f"standby flow for tag class {classes.vectors[c]} cost {new} > {old}")
        for (p, j), s in zip(by_class[c], placed, strict=True):
            result[p][j] = s
    return result


def _optimize_class(
    problem: Problem,
    model: CostModel,
    members: Sequence[int],
    class_slots: Sequence[tuple[int, int]],
    current: Sequence[Sequence[int]],
    actives: Sequence[int],
    warmups: Sequence[Sequence[int]],
) -> list[int] | None:
    member_set = set(members)
    count: dict[int, int] = defaultdict(int)
    slots_of: dict[int, list[int]] = defaultdict(list)  # partition -> its slot positions in this class
    for p, j in class_slots:
        count[current[p][j]] += 1
        slots_of[p].append(j)
    scale = GENERIC_TIEBREAK * len(class_slots) + 1

    # Small classes get an arc to every allowed server, so "not on the active" is in the flow itself
    # and expansion cannot fail; large ones go through rack pools to keep the graph small.
    exact = len(members) * len(class_slots) <= EXACT_ARC_BUDGET
    net = FlowNetwork()
    server_node = {s: net.add_node(-count[s]) for s in members}
    racks = [] if exact else sorted({problem.racks[s] for s in members}, key=rack_sort_key)
    pool_node = {}
    for rack in racks:
        pool_node[rack] = net.add_node()
        for s in members:
            if problem.racks[s] == rack:
                net.add_arc(pool_node[rack], server_node[s], 0, count[s])

    def forbidden(p: int) -> set[int]:
        return {actives[p], *warmups[p]}

    groups: dict[tuple[tuple[str, ...], int, tuple[tuple[int, int, bool], ...]], list[int]] = defaultdict(
        list
    )
    for p in sorted(slots_of):
        bad = forbidden(p)
        mine = [current[p][j] for j in slots_of[p]]
        specific = member_set if exact else (problem.held[p] & member_set) | set(mine)
        holders = tuple(
            (s, standby_tiebreak(problem, p, s, mine), s in problem.held[p])
            for s in sorted(specific)
            if s not in bad
        )
        groups[(tuple(sorted(problem.sources[p])), len(slots_of[p]), holders)].append(p)

    plan: list[tuple[list[int], int, list[tuple[int, int | None, str | None]]]] = []
    for (sources_t, m, holders), parts in groups.items():
        sources = frozenset(sources_t)
        g = net.add_node(len(parts) * m)
        arcs: list[tuple[int, int | None, str | None]] = []
        for s, tb, held in holders:
            cost = model.edge(sources, problem.racks[s], held) * scale + tb
            arcs.append((net.add_arc(g, server_node[s], cost, len(parts)), s, None))
        for rack in racks:
            cost = model.edge(sources, rack, False) * scale + GENERIC_TIEBREAK
            arcs.append((net.add_arc(g, pool_node[rack], cost, len(parts) * m), None, rack))
        plan.append((parts, m, arcs))
    flows, _ = net.solve()

    chosen: dict[int, list[int]] = defaultdict(list)
    pool_units: dict[str | None, list[int]] = defaultdict(list)
    for parts, m, arcs in plan:
        remaining = dict.fromkeys(parts, m)
        head = 0
        for arc, server, rack in arcs:
            f = flows[arc]
            if not f:
                continue
            if server is not None:
                takers = sorted(
                    (p for p in parts if remaining[p] > 0 and server not in chosen[p]),
                    key=lambda p: (-remaining[p], p),
                )[:f]
                if len(takers) < f:
                    return None
                for p in takers:
                    chosen[p].append(server)
                    remaining[p] -= 1
            else:
                for _ in range(f):
                    while head < len(parts) and remaining[parts[head]] == 0:
                        head += 1
                    if head == len(parts):
                        return None
                    p = parts[head]
                    pool_units[rack].append(p)
                    remaining[p] -= 1
    demand_of_pool = {rack: {s: count[s] for s in members if problem.racks[s] == rack} for rack in racks}
    for s_list in chosen.values():
        for s in s_list:
            if not exact:
                demand_of_pool[problem.racks[s]][s] -= 1
    for rack in racks:
        if not _fill_pool(problem, sorted(pool_units[rack]), demand_of_pool[rack], chosen, forbidden):
            return None

    out = []
    position: dict[int, list[int]] = {}
    for p, j in class_slots:
        if p not in position:
            # Keep each server in the slot it had, so an unchanged placement is returned unchanged.
            new = chosen[p]
            old = [current[p][x] for x in slots_of[p]]
            stay = [s for s in old if s in new]
            fresh = sorted(s for s in new if s not in old)
            position[p] = [s if s in stay else fresh.pop(0) for s in old]
        out.append(position[p][slots_of[p].index(j)])
    return out


def _fill_pool(
    problem: Problem,
    units: Sequence[int],
    demand: dict[int, int],
    chosen: dict[int, list[int]],
    forbidden: Callable[[int], set[int]],
) -> bool:
    """Give each unit a server of the pool with room, never a forbidden or repeated one."""
    heap = [(-d, s) for s, d in demand.items() if d > 0]
    heapq.heapify(heap)
    for p in units:
        bad = forbidden(p) | set(chosen[p])
        pick = None
        for h in sorted(problem.held[p]):
            if demand.get(h, 0) > 0 and h not in bad:
                pick = h
                break
        if pick is None:
            stash = []
            while heap:
                d, s = heap[0]
                if -d != demand[s]:
                    heapq.heappop(heap)
                    if demand[s] > 0:
                        heapq.heappush(heap, (-demand[s], s))
                    continue
                if s in bad:
                    stash.append(heapq.heappop(heap))
                    continue
                pick = s
                break
            for entry in stash:
                heapq.heappush(heap, entry)
        if pick is None:
            return False
        chosen[p].append(pick)
        demand[pick] -= 1
    return True

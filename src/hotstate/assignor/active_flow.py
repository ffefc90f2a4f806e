"""KIP-925 min-cost flow for actives, on a compressed graph.

A graph with an arc per (partition, server) has P x N arcs (10 million for 10,000 x 1,000). But the
cost of an arc depends only on the server's rack and on whether the server was the partition's
active, so:

- servers with the same (rack, capacity) form a *class*, and partitions reach a class through one
  arc priced as "moved here" (the class node then feeds its servers, each bounded by its own balance
  bounds);
- partitions with the same source racks and the same *candidates* form a *group* (one node with
  supply = group size); a partition's candidates are its previous active and the servers that hold
  its data (caught-up replicas, other standbys and warmups);
- candidates are specific servers, so each group also gets one arc per candidate.

Arcs: groups x (classes + candidates) + 2 x servers. For 10,000 partitions with one standby on 1,000
servers in 3 racks that is about 50,000 arcs instead of 10 million.

Ties in KIP-925 cost are broken inside the solver by a second, lower-order cost: staying on the
previous active (0) beats a caught-up replica (1) beats a replica still restoring, such as a running
warmup (2), beats a server without the data (3). The KIP-925 cost is scaled above the sum of all
tie-breaks, so the tie-break never buys a worse KIP-925 cost; it stops needless moves between equally
cheap servers, sends a moved active where no warmup is needed, and keeps a warmup's target stable
until it has caught up, which is what makes repeated assignments converge.
"""

from __future__ import annotations

from collections.abc import Sequence

from hotstate.assignor.balance import Bounds
from hotstate.assignor.cost import CostModel
from hotstate.assignor.errors import AssignorInternalError
from hotstate.assignor.flow import FlowNetwork
from hotstate.assignor.problem import Problem

GENERIC_TIEBREAK = 3


def active_tiebreak(problem: Problem, p: int, s: int) -> int:
    if s == problem.prev_active[p]:
        return 0
    if problem.caught_up(p, s):
        return 1
    if s in problem.held[p]:
        return 2
    return GENERIC_TIEBREAK


def candidates(problem: Problem, p: int) -> list[int]:
    """Servers with their own arc for ``p``: the previous active and every server with its data."""
    lags = problem.lags[p]
    return sorted(problem.held[p] | {s for s in lags if lags[s] <= problem.config.acceptable_recovery_lag})


def rack_sort_key(rack: str | None) -> tuple[bool, str]:
    return (rack is None, rack or "")


def server_classes(problem: Problem) -> tuple[list[tuple[str | None, int]], list[int]]:
    """Classes of interchangeable servers: same rack (same costs) and same capacity (same bounds)."""
    keys = sorted(
        {(problem.racks[s], problem.capacities[s]) for s in range(problem.num_servers)},
        key=lambda k: (rack_sort_key(k[0]), k[1]),
    )
    index = {k: i for i, k in enumerate(keys)}
    return keys, [index[(problem.racks[s], problem.capacities[s])] for s in range(problem.num_servers)]


def flow_active_targets(
    problem: Problem,
    model: CostModel,
    bounds: Bounds,
    table_bounds: Sequence[Bounds] | None,
) -> dict[int, int]:
    """Balanced min-cost targets for every partition; with ``table_bounds`` also balanced per table."""
    n_servers = problem.num_servers
    n_parts = len(problem.partitions)
    if n_parts == 0:
        return {}
    per_table = table_bounds is not None
    scale = GENERIC_TIEBREAK * n_parts + 1
    class_keys, class_of = server_classes(problem)
    members_of_class: list[list[int]] = [[] for _ in class_keys]
    for s in range(n_servers):
        members_of_class[class_of[s]].append(s)

    net = FlowNetwork()
    sink = net.add_node(-n_parts)
    lo, hi = bounds
    server_node = [net.add_node() for _ in range(n_servers)]
    for s in range(n_servers):
        net.add_arc(server_node[s], sink, 0, hi[s], lo[s])

    # entry[t][s]: where flow for table t reaches server s; class_node[t][k]: the class's entry node.
    n_scopes = len(problem.table_names) if per_table else 1
    entry: list[list[int]] = []
    class_node: list[list[int]] = []
    class_fanout: dict[int, list[tuple[int, int]]] = {}  # class node -> [(arc, server)]
    for t in range(n_scopes):
        if table_bounds is not None:
            t_lo, t_hi = table_bounds[t]
            row = [net.add_node() for _ in range(n_servers)]
            for s in range(n_servers):
                net.add_arc(row[s], server_node[s], 0, t_hi[s], t_lo[s])
        else:
            row = server_node
        entry.append(row)
        nodes = []
        for members in members_of_class:
            k_node = net.add_node()
            nodes.append(k_node)
            class_fanout[k_node] = [(net.add_arc(k_node, row[s], 0, n_parts), s) for s in members]
        class_node.append(nodes)

    groups: dict[tuple[int, tuple[str, ...], tuple[tuple[int, int, bool], ...]], list[int]] = {}
    for p in range(n_parts):
        scope = problem.table_of[p] if per_table else 0
        holders = tuple(
            (s, active_tiebreak(problem, p, s), s == problem.prev_active[p]) for s in candidates(problem, p)
        )
        groups.setdefault((scope, tuple(sorted(problem.sources[p])), holders), []).append(p)

    group_arcs: list[tuple[list[int], list[tuple[int, int | None, int | None]]]] = []
    for (scope, sources_t, holders), members in groups.items():
        sources = frozenset(sources_t)
        g = net.add_node(len(members))
        arcs: list[tuple[int, int | None, int | None]] = []  # (arc, specific server, class node)
        for s, tb, was_active in holders:
            cost = model.edge(sources, problem.racks[s], was_active) * scale + tb
            arcs.append((net.add_arc(g, entry[scope][s], cost, len(members)), s, None))
        for k, (rack, _cap) in enumerate(class_keys):
            cost = model.edge(sources, rack, False) * scale + GENERIC_TIEBREAK
            arcs.append(
                (net.add_arc(g, class_node[scope][k], cost, len(members)), None, class_node[scope][k])
            )
        group_arcs.append((members, arcs))

    flows, _ = net.solve()
    return _expand(problem, flows, group_arcs, class_fanout)


def _expand(
    problem: Problem,
    flows: Sequence[int],
    group_arcs: Sequence[tuple[list[int], list[tuple[int, int | None, int | None]]]],
    class_fanout: dict[int, list[tuple[int, int]]],
) -> dict[int, int]:
    """Turn group/class flows back into one server per partition."""
    targets: dict[int, int] = {}
    pending: dict[int, list[int]] = {}
    for members, arcs in group_arcs:
        i = 0
        for arc, server, k_node in arcs:
            f = flows[arc]
            if not f:
                continue
            chunk = members[i : i + f]
            i += f
            if server is not None:
                for p in chunk:
                    targets[p] = server
            else:
                assert k_node is not None
                pending.setdefault(k_node, []).extend(chunk)
        if i != len(members):
            raise AssignorInternalError(f"flow moved {i} of {len(members)} partitions out of a group")
    for k_node in sorted(pending):
        parts = sorted(pending[k_node])
        demand = {s: flows[arc] for arc, s in class_fanout[k_node] if flows[arc]}
        if sum(demand.values()) != len(parts):
            raise AssignorInternalError("class node flow in and out differ")
        rest = []
        # A partition sent to the class as "moved" may still land on one of its candidates in the
        # class; that never raises the real cost, so do it where the server has room.
        for p in parts:
            ranked = sorted((active_tiebreak(problem, p, s), s) for s in candidates(problem, p))
            for _, s in ranked:
                if demand.get(s, 0) > 0:
                    targets[p] = s
                    demand[s] -= 1
                    break
            else:
                rest.append(p)
        servers = sorted(s for s, d in demand.items() if d > 0)
        j = 0
        for p in rest:
            while demand[servers[j]] == 0:
                j += 1
            targets[p] = servers[j]
            demand[servers[j]] -= 1
    return targets

"""The one entry point: ``assign(cluster, tables, previous, lags, config) -> Assignment``.

Order of decisions (Kafka Streams' HighAvailabilityTaskAssignor):
1. a balanced *target* for every active: plain and sticky (strategy ``none``) or KIP-925 min-cost
   flow (``min_traffic``, ``balance_subtopology``), checked never to cost more than the plain one;
2. KIP-441: actives to caught-up replicas; a target that is not caught up wants a warmup;
3. KIP-708: standby targets spread over tag values, first standbys before second ones, balanced;
4. KIP-925 for standbys: cheaper servers within the same tag class only (spread first);
5. KIP-441 for standbys: a standby whose target is not caught up stays on a caught-up server while the
   target warms up. max_warmup_replicas bounds only the warmups (for actives and standbys); a standby
   that rebuilds a lost copy is always placed, so a partition never runs below its standbys while a
   server could host one (restoring.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from hotstate.assignor.active_flow import flow_active_targets
from hotstate.assignor.actives import choose_actives, warmups_by_partition
from hotstate.assignor.balance import Bounds, balanced_bounds, plain_preferences, sticky_balanced_targets
from hotstate.assignor.config import AssignorConfig
from hotstate.assignor.cost import CostModel, actives_cost, cross_rack_count, model_of, standbys_cost
from hotstate.assignor.errors import AssignorInternalError
from hotstate.assignor.explain import (
    active_reason,
    refused_target_standby_reason,
    standby_reasons,
    standby_shortfall_notes,
    warmup_reason,
)
from hotstate.assignor.model import (
    Assignment,
    CostSummary,
    Explanation,
    Placement,
    ReplicaReason,
    Server,
    Table,
)
from hotstate.assignor.problem import Lags, Previous, Problem, build_problem
from hotstate.assignor.restoring import (
    grant,
    plan_standbys,
    settle_slot,
    standby_on_refused_target,
    warmup_requests,
)
from hotstate.assignor.standby_flow import optimize_standbys
from hotstate.assignor.standbys import place_standbys, tag_classes

log = logging.getLogger(__name__)


def check_within_bounds(targets: Mapping[int, int], bounds: Bounds, what: str) -> None:
    lo, hi = bounds
    counts = [0] * len(lo)
    for s in targets.values():
        counts[s] += 1
    for s, n in enumerate(counts):
        if not lo[s] <= n <= hi[s]:
            raise AssignorInternalError(f"{what}: server #{s} got {n} actives, bounds [{lo[s]}, {hi[s]}]")


def check_not_worse(optimized: int, baseline: int, what: str) -> None:
    """KIP-925's promise: the optimized placement never costs more than the plain balanced one."""
    if optimized > baseline:
        raise AssignorInternalError(
            f"{what}: min-cost flow result costs {optimized} > plain balanced {baseline}"
        )


def table_bounds_of(problem: Problem) -> list[Bounds]:
    sizes = [0] * len(problem.table_names)
    for t in problem.table_of:
        sizes[t] += 1
    return [balanced_bounds(n, problem.capacities) for n in sizes]


def balanced_targets(problem: Problem, model: CostModel) -> tuple[dict[int, int], dict[int, int]]:
    """(target, plain baseline) per partition, both within the strategy's balance bounds."""
    n = len(problem.partitions)
    bounds = balanced_bounds(n, problem.capacities)
    strategy = problem.config.rack_aware_assignment_strategy
    if strategy == "balance_subtopology":
        per_table = table_bounds_of(problem)
        targets = flow_active_targets(problem, model, bounds, per_table)
        # The greedy plain placement does not balance tables, so the plain baseline here is the same
        # network priced without traffic: balanced, sticky, rack-blind.
        plain = flow_active_targets(problem, CostModel(0, model.non_overlap_cost), bounds, per_table)
        for t, tb in enumerate(per_table):
            check_within_bounds(
                {p: s for p, s in targets.items() if problem.table_of[p] == t}, tb, "per table"
            )
    else:
        preferences = [plain_preferences(problem, p) for p in range(n)]
        plain = sticky_balanced_targets(range(n), preferences, problem.capacities, bounds)
        targets = plain if strategy == "none" else flow_active_targets(problem, model, bounds, None)
    check_within_bounds(targets, bounds, "targets")
    return targets, plain


def assign(
    cluster: Iterable[Server],
    tables: Iterable[Table],
    previous: Previous = None,
    lags: Lags = None,
    config: AssignorConfig | None = None,
) -> Assignment:
    """Place every partition's active, standbys and warmups.

    ``previous`` is the last assignment (an ``Assignment`` or a mapping of ``Placement``);
    ``lags`` maps a partition to {server id: offset lag}; a previous active without a report counts as
    caught up, any other server without a report as having no state. Raises ``ValueError`` on bad input.
    """
    problem = build_problem(cluster, tables, previous, lags, config or AssignorConfig())
    for warning in problem.warnings:
        log.warning("hotstate assignor: %s", warning)
    model = model_of(problem)
    targets, plain = balanced_targets(problem, model)
    target_cost = actives_cost(problem, model, [targets[p] for p in range(len(problem.partitions))])
    plain_cost = actives_cost(problem, model, [plain[p] for p in range(len(problem.partitions))])
    check_not_worse(target_cost, plain_cost, "actives")

    choices = choose_actives(problem, targets)
    actives = [c.active for c in choices]
    # Standby targets keep clear of every warmup an active wants, granted or not: which are granted is
    # decided together with the standbys' warmups, below. A refused target that a partition short of
    # standbys needs takes one after (standby_on_refused_target).
    wanted_warmups = warmups_by_partition(choices)

    slots, _ = place_standbys(problem, actives, wanted_warmups)
    kip708 = [[slot.server for slot in row] for row in slots]
    if problem.config.rack_aware_assignment_strategy == "none":
        standby_targets = kip708
    else:
        standby_targets = optimize_standbys(
            problem, model, tag_classes(problem.vectors), slots, actives, wanted_warmups
        )
    standby_cost = standbys_cost(problem, model, standby_targets)
    kip708_cost = standbys_cost(problem, model, kip708)
    check_not_worse(standby_cost, kip708_cost, "standbys")

    plans = [
        plan_standbys(problem, p, standby_targets[p], actives[p], wanted_warmups[p])
        for p in range(len(problem.partitions))
    ]
    granted = grant(warmup_requests(problem, choices, plans), problem.config.max_warmup_replicas)
    warmups = warmups_by_partition(choices, granted)
    outcomes = [[settle_slot(p, plan, granted) for plan in row] for p, row in enumerate(plans)]
    extra = [
        standby_on_refused_target(problem, p, choices[p], granted, len(row)) for p, row in enumerate(plans)
    ]
    placed = [len(row) + (x is not None) for row, x in zip(plans, extra, strict=True)]

    reasons: list[ReplicaReason] = []
    partitions = {}
    for p, pid in enumerate(problem.partitions):
        reasons.append(active_reason(problem, model, p, choices[p], bool(warmups[p])))
        reasons.extend(standby_reasons(problem, model, p, actives[p], slots[p], outcomes[p]))
        standbys = [o.server for o in outcomes[p]]
        x = extra[p]
        if x is not None:
            reasons.append(refused_target_standby_reason(problem, model, p, [actives[p], *standbys], x))
            standbys.append(x)
        reasons.extend(warmup_reason(problem, model, p, s) for s in warmups[p])
        standby_warmups = [o.plan.target for o in outcomes[p] if o.warmup]
        partitions[pid] = Placement(
            active=problem.server_ids[actives[p]],
            standbys=tuple(problem.server_ids[s] for s in standbys),
            warmups=tuple(problem.server_ids[s] for s in (*warmups[p], *standby_warmups)),
        )
    explanation = Explanation(
        replicas=tuple(reasons),
        notes=(
            *problem.notes,
            *standby_shortfall_notes(problem, placed),
        ),
        warnings=problem.warnings,
        cost=CostSummary(
            active_target=target_cost,
            active_baseline=plain_cost,
            active=actives_cost(problem, model, actives),
            standby=standby_cost,
            standby_baseline=kip708_cost,
            cross_rack_actives=cross_rack_count(problem, actives),
        ),
        strategy=problem.config.rack_aware_assignment_strategy,
    )
    return Assignment(partitions=partitions, explanation=explanation)

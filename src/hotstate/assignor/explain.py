"""Why each replica is where it is: structured reasons, and ``explain`` to print them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Final

from hotstate.assignor.actives import ActiveChoice, lag_of
from hotstate.assignor.cost import CostModel, held_as, replica_cost
from hotstate.assignor.model import AssignedRole, Assignment, ReplicaReason, SpreadLevel
from hotstate.assignor.problem import Problem
from hotstate.assignor.restoring import StandbyOutcome
from hotstate.assignor.standbys import StandbySlot
from hotstate.assignor.tags import new_keys, spread_level, spread_score, used_values

REASONS: Final[dict[str, str]] = {
    "caught_up": "active on its balanced target, which is caught up",
    "no_state": "active on its balanced target; no replica had state yet",
    "held_for_warmup": "active kept on a caught-up replica while the balanced target warms up",
    "most_caught_up": "active on the most caught-up replica; none was within acceptable.recovery.lag",
    "warmup": "warmup on the balanced target; promoted to active once caught up",
    "spread_ideal": "standby whose every tag value differs from the active's and the other standbys'",
    "spread_partial": "standby new on some tag keys; the other keys have no unused value left",
    "least_loaded": "standby on the least loaded server; no tag key had an unused value",
    "standby_held_for_warmup": "standby kept on a caught-up server while its balanced target warms up",
    "standby_warmup": "warmup on a standby's balanced target; takes the standby once caught up",
    "standby_on_warmup_target": (
        "standby on the active's balanced target, whose warmup waits for the budget: the only server left"
    ),
}


def _lag_text(lag: float) -> str:
    return "unknown" if lag == float("inf") else str(int(lag))


def _cost(problem: Problem, model: CostModel, role: AssignedRole, p: int, s: int) -> tuple[int, str]:
    """The replica's cost and how it is made up."""
    cross = model.cross_rack(problem.sources[p], problem.racks[s])
    moved = not held_as(problem, role, p, s)
    cost = replica_cost(problem, model, role, p, s)
    what = "moved" if role == "active" else "new copy"
    return cost, f"cost {cost} (cross-rack: {'yes' if cross else 'no'}, {what}: {'yes' if moved else 'no'})"


def active_reason(
    problem: Problem, model: CostModel, p: int, choice: ActiveChoice, warmup_granted: bool
) -> ReplicaReason:
    ids = problem.server_ids
    lags = problem.lags[p]
    limit = problem.config.acceptable_recovery_lag
    target = ids[choice.target]
    if choice.reason == "caught_up":
        why = f"balanced target, caught up (lag {_lag_text(lag_of(lags, choice.active))} <= {limit})"
    elif choice.reason == "no_state":
        why = "balanced target; no replica reported a lag (new partition)"
    elif choice.reason == "held_for_warmup":
        why = (
            f"caught up (lag {_lag_text(lag_of(lags, choice.active))} <= {limit}); balanced target {target} "
            f"has lag {_lag_text(lag_of(lags, choice.target))}"
        )
        why += (
            " and warms up"
            if warmup_granted
            else f"; no warmup slot free (max_warmup_replicas={problem.config.max_warmup_replicas}) yet"
        )
    else:
        why = f"nobody within {limit}; lowest lag {_lag_text(lag_of(lags, choice.active))}"
        if choice.active != choice.target:
            why += f"; balanced target {target} " + (
                "warms up" if warmup_granted else "waits for a warmup slot"
            )
    cost, cost_text = _cost(problem, model, "active", p, choice.active)
    return ReplicaReason(
        partition=problem.partitions[p],
        server=ids[choice.active],
        role="active",
        reason=choice.reason,
        detail=f"{why}; {cost_text}",
        cost=cost,
        target=target,
    )


def warmup_reason(problem: Problem, model: CostModel, p: int, s: int) -> ReplicaReason:
    lag = _lag_text(lag_of(problem.lags[p], s))
    cost, cost_text = _cost(problem, model, "warmup", p, s)
    return ReplicaReason(
        partition=problem.partitions[p],
        server=problem.server_ids[s],
        role="warmup",
        reason="warmup",
        detail=(
            f"balanced target, not caught up yet (lag {lag}, acceptable "
            f"{problem.config.acceptable_recovery_lag}); takes the active once caught up; {cost_text}"
        ),
        cost=cost,
        target=problem.server_ids[s],
    )


def standby_reason(
    problem: Problem, model: CostModel, p: int, slot: StandbySlot, server: int
) -> ReplicaReason:
    tag_keys = problem.config.rack_aware_assignment_tags
    level = spread_level(slot.score, len(tag_keys))
    code = "least_loaded" if level == "least_loaded" else f"spread_{level}"
    keys = new_keys(slot.score, tag_keys)
    where = f"new on {', '.join(keys)}" if keys else "no tag key had an unused value"
    if server != slot.server:
        how = f"moved within its tag group from {problem.server_ids[slot.server]} for a lower cost"
    elif slot.kept:
        how = "kept (was a standby and still spreads as well as any choice)"
    else:
        how = "least loaded server among the best-spread ones"
    cost, cost_text = _cost(problem, model, "standby", p, server)
    return ReplicaReason(
        partition=problem.partitions[p],
        server=problem.server_ids[server],
        role="standby",
        reason=code,
        detail=f"{level} spread ({where}); {how}; {cost_text}",
        cost=cost,
        spread=level,
    )


def _restore_text(problem: Problem, p: int, s: int, warmup: bool) -> str:
    budget = f"max_warmup_replicas={problem.config.max_warmup_replicas}"
    return (
        f"restores ({_lag_text(lag_of(problem.lags[p], s))} > acceptable "
        f"{problem.config.acceptable_recovery_lag}; "
        + (f"counts against {budget})" if warmup else f"rebuilds a lost copy, not limited by {budget})")
    )


def _spread_after(problem: Problem, earlier: Sequence[int], s: int) -> SpreadLevel:
    """The spread level a replica on server `s` reaches beside the partition's `earlier` replicas."""
    tag_keys = problem.config.rack_aware_assignment_tags
    used = used_values([problem.vectors[x] for x in earlier], len(tag_keys))
    return spread_level(spread_score(problem.vectors[s], used), len(tag_keys))


def _held_standby_reason(
    problem: Problem, model: CostModel, p: int, earlier: Sequence[int], outcome: StandbyOutcome
) -> ReplicaReason:
    keeper = outcome.server
    level = _spread_after(problem, earlier, keeper)
    target = problem.server_ids[outcome.plan.target]
    waits = "warms up" if outcome.warmup else "waits for a warmup slot"
    cost, cost_text = _cost(problem, model, "standby", p, keeper)
    return ReplicaReason(
        partition=problem.partitions[p],
        server=problem.server_ids[keeper],
        role="standby",
        reason="standby_held_for_warmup",
        detail=(
            f"caught up (lag {_lag_text(lag_of(problem.lags[p], keeper))}); balanced target {target} "
            f"{_restore_text(problem, p, outcome.plan.target, True)} and {waits}; {level} spread; {cost_text}"
        ),
        cost=cost,
        spread=level,
        target=target,
    )


def _standby_warmup_reason(problem: Problem, model: CostModel, p: int, s: int) -> ReplicaReason:
    cost, cost_text = _cost(problem, model, "warmup", p, s)
    return ReplicaReason(
        partition=problem.partitions[p],
        server=problem.server_ids[s],
        role="warmup",
        reason="standby_warmup",
        detail=(
            f"a standby's balanced target, {_restore_text(problem, p, s, True)}; "
            f"takes the standby once caught up; {cost_text}"
        ),
        cost=cost,
        target=problem.server_ids[s],
    )


def standby_reasons(
    problem: Problem,
    model: CostModel,
    p: int,
    active: int,
    slots: Sequence[StandbySlot],
    outcomes: Sequence[StandbyOutcome],
) -> list[ReplicaReason]:
    """Reasons for one partition's standbys and standby warmups, in slot order."""
    out: list[ReplicaReason] = []
    placed = [active]
    for slot, outcome in zip(slots, outcomes, strict=True):
        if outcome.server == outcome.plan.target:
            reason = standby_reason(problem, model, p, slot, outcome.server)
            if outcome.plan.restores:
                extra = _restore_text(problem, p, outcome.server, False)
                reason = replace(reason, detail=f"{reason.detail}; {extra}")
            out.append(reason)
        else:
            out.append(_held_standby_reason(problem, model, p, placed, outcome))
        if outcome.warmup:
            out.append(_standby_warmup_reason(problem, model, p, outcome.plan.target))
        placed.append(outcome.server)
    return out


def refused_target_standby_reason(
    problem: Problem, model: CostModel, p: int, earlier: Sequence[int], s: int
) -> ReplicaReason:
    """The standby on an active's balanced target whose warmup was refused (restoring.py, rule 7)."""
    level = _spread_after(problem, earlier, s)
    cost, cost_text = _cost(problem, model, "standby", p, s)
    return ReplicaReason(
        partition=problem.partitions[p],
        server=problem.server_ids[s],
        role="standby",
        reason="standby_on_warmup_target",
        detail=(
            f"the active's balanced target, its warmup waiting for a slot; every other server holds a "
            f"replica, so the missing standby goes here and {_restore_text(problem, p, s, False)}; "
            f"takes the active once caught up; {level} spread; {cost_text}"
        ),
        cost=cost,
        spread=level,
    )


def standby_shortfall_notes(problem: Problem, wanted: Sequence[int]) -> list[str]:
    """One note per (table, asked, placed) for partitions that got fewer standbys than asked."""
    short: dict[tuple[str, int, int], int] = {}
    for p, w in enumerate(wanted):
        asked = problem.standbys_asked[p]
        if w < asked:
            key = (problem.table_names[problem.table_of[p]], asked, w)
            short[key] = short.get(key, 0) + 1
    return [
        f"table {table!r}: {n} partitions have {w} of {asked} standbys "
        f"(not enough servers besides the active and warmups)"
        for (table, asked, w), n in sorted(short.items())
    ]


def explain(assignment: Assignment) -> str:
    """A readable account of the assignment: costs, warnings, notes, then every replica and why."""
    ex = assignment.explanation
    c = ex.cost
    lines = [
        f"strategy {ex.strategy}: active cost {c.active} (balanced target {c.active_target}, "
        f"plain balanced {c.active_baseline}), standby cost {c.standby} (KIP-708 only {c.standby_baseline}), "
        f"{c.cross_rack_actives} actives outside their source racks",
    ]
    lines += [f"warning: {w}" for w in ex.warnings]
    lines += [f"note: {n}" for n in ex.notes]
    current = None
    for r in ex.replicas:
        if r.partition != current:
            current = r.partition
            lines.append(f"{r.partition}:")
        lines.append(f"  {r.role:<8}{r.server:<12}{r.reason}: {r.detail}")
    return "\n".join(lines)

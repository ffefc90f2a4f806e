"""KIP-441 for standbys, and one budget for every replica that restores (Kafka Streams' TaskMovement).

The balanced placement says where replicas should end up: a *target* for every active, and (KIP-708
spread, KIP-925 cost) a target for every standby slot. Whether a replica goes there now depends on lags,
as for actives: a replica *restores* when its server is not caught up for its partition, and restoring
is what ``max_warmup_replicas`` limits. Rules, each in its own function below:

1. ``has_state``: a partition nobody reported a lag for and without a previous active is new (a table
   just created): every replica starts empty and in sync, so placing it restores nothing and is not
   limited.
2. ``restores``: a replica restores when its partition has state and its server is not caught up
   (lag above ``acceptable_recovery_lag``, or no state there at all).
3. ``keeper_for``: a standby whose target is not caught up stays on (or moves to) a caught-up server
   that holds no other replica of the partition: a previous standby first, in its order (caught-up
   standbys are sticky), then the lowest lag. The target gets a warmup instead, within the budget; once
   it has caught up, a later assignment puts the standby there and drops the keeper's copy.
4. ``plan_standbys``: per standby slot, the target itself (caught up, or the partition is new), or a
   keeper plus a warmup on the target, or (no caught-up server is free) a standby restoring on the
   target, which also needs the budget.
5. ``grant``: active warmups, standby warmups and restoring standbys share ``max_warmup_replicas``.
   Restores already under way (the server held a replica of the partition) are never cut for the
   budget: abandoning them throws away their progress, and a follower that merely fell out of the ISR
   would lose its copy; they count first. New restores start only while the total stays within the
   budget: a standby that restores the partition's redundancy (no caught-up server was free) before an
   active warmup before a standby warmup (balance), then the lowest lag, then partition order.

A request that is not granted waits for a later assignment: an active stays where it is, a standby
stays on its keeper, and a standby without a keeper is not placed yet (the partition has one standby
fewer for now, with a note).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from hotstate.assignor.actives import ActiveChoice, lag_of
from hotstate.assignor.problem import Problem

RestoreKind = Literal["standby", "active_warmup", "standby_warmup"]
# Lower first: redundancy before balance, and the active's balance before the standbys'.
KIND_RANK: Final[dict[RestoreKind, int]] = {"standby": 0, "active_warmup": 1, "standby_warmup": 2}


@dataclass(frozen=True, slots=True)
class StandbyPlan:
    """One standby slot: its balanced ``target``, whether a replica there restores, and the caught-up
    ``keeper`` that holds the standby meanwhile (None: none was free, or none is needed)."""

    target: int
    restores: bool
    keeper: int | None


@dataclass(frozen=True, slots=True)
class Restore:
    """A replica that would restore: of ``partition`` on ``server``."""

    partition: int
    server: int
    kind: RestoreKind
    running: bool
    lag: float


def has_state(problem: Problem, p: int) -> bool:
    return bool(problem.lags[p])


def restores(problem: Problem, p: int, s: int) -> bool:
    return has_state(problem, p) and not problem.caught_up(p, s)


def keeper_for(problem: Problem, p: int, taken: Collection[int]) -> int | None:
    """A caught-up server for ``p`` outside ``taken``: a previous standby first, then the lowest lag."""
    lags = problem.lags[p]
    previous = [s for s in problem.prev_standbys[p] if s not in taken and problem.caught_up(p, s)]
    if previous:
        return previous[0]
    others = [s for s in lags if s not in taken and problem.caught_up(p, s)]
    return min(others, key=lambda s: (lags[s], s), default=None)


def plan_standbys(
    problem: Problem, p: int, targets: Sequence[int], active: int, warmups: Sequence[int]
) -> list[StandbyPlan]:
    taken = {active, *warmups, *targets}
    plans = []
    for target in targets:
        if not restores(problem, p, target):
            plans.append(StandbyPlan(target, False, None))
            continue
        keeper = keeper_for(problem, p, taken)
        if keeper is not None:
            taken.add(keeper)
        plans.append(StandbyPlan(target, True, keeper))
    return plans


def running(problem: Problem, p: int, s: int) -> bool:
    """The server already holds a replica of ``p`` that is restoring: its restore is under way."""
    return s in problem.held[p]


def restore_of(problem: Problem, p: int, s: int, kind: RestoreKind) -> Restore:
    return Restore(p, s, kind, running(problem, p, s), lag_of(problem.lags[p], s))


def restore_requests(
    problem: Problem, choices: Sequence[ActiveChoice], plans: Sequence[Sequence[StandbyPlan]]
) -> list[Restore]:
    out = [restore_of(problem, p, c.target, "active_warmup") for p, c in enumerate(choices) if c.wants_warmup]
    for p, row in enumerate(plans):
        for plan in row:
            if plan.restores:
                kind: RestoreKind = "standby" if plan.keeper is None else "standby_warmup"
                out.append(restore_of(problem, p, plan.target, kind))
    return out


def priority(r: Restore) -> tuple[int, int, float, int, int]:
    return (0 if r.running else 1, KIND_RANK[r.kind], r.lag, r.partition, r.server)


def grant(requests: Iterable[Restore], budget: int) -> set[tuple[int, int]]:
    """(partition, server) of the requests that restore now: every running one, then new ones in
    priority order while the total stays within ``budget``."""
    granted: set[tuple[int, int]] = set()
    for r in sorted(requests, key=priority):
        if r.running or len(granted) < budget:
            granted.add((r.partition, r.server))
    return granted


@dataclass(frozen=True, slots=True)
class StandbyOutcome:
    """Where one slot's standby is now (None: not placed yet) and whether its target warms up."""

    plan: StandbyPlan
    server: int | None
    warmup: bool


def settle_slot(p: int, plan: StandbyPlan, granted: Collection[tuple[int, int]]) -> StandbyOutcome:
    if not plan.restores:
        return StandbyOutcome(plan, plan.target, False)
    allowed = (p, plan.target) in granted
    if plan.keeper is not None:
        return StandbyOutcome(plan, plan.keeper, allowed)
    return StandbyOutcome(plan, plan.target if allowed else None, False)

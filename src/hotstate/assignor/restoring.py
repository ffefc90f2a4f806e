"""KIP-441 for standbys, and the warmup budget for moves (Kafka Streams' TaskMovement).

The balanced placement says where replicas should end up: a *target* for every active, and (KIP-708
spread, KIP-925 cost) a target for every standby slot. Whether a replica goes there now depends on lags,
as for actives: a replica *restores* when its server is not caught up for its partition. As in Kafka
Streams, ``max_warmup_replicas`` bounds only the *warmups*, the extra replicas that move an active or a
standby to its balanced target; configured standbys are always assigned, so a partition never runs
below its standbys while a server could host one. Rules, each in its own function below:

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
   keeper plus a warmup on the target, or (no caught-up server is free: the partition lost a copy) a
   standby restoring on the target. That standby is not a warmup: it is placed whatever the budget.
5. ``grant``: active warmups and standby warmups share ``max_warmup_replicas``. Warmups already under
   way (the server held a replica of the partition) are never cut for the budget: abandoning them
   throws away their progress, and a follower that merely fell out of the ISR would lose its copy; they
   count first. New warmups start only while the total stays within the budget: an active's before a
   standby's, then the lowest lag, then partition order.
6. ``settle_slot``: a warmup that is not granted waits for a later assignment; its standby stays on the
   keeper meanwhile. A standby restoring a lost copy is never held back.
7. ``standby_on_refused_target``: standby targets keep clear of the server an active wants to warm up
   on. When that warmup is refused and the partition is short of standbys (it needs every server), the
   refused target takes the missing standby, restoring: it needs the copy anyway, and once caught up it
   can take the active with no warmup (Kafka Streams' standby/active swap).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from hotstate.assignor.actives import ActiveChoice, lag_of
from hotstate.assignor.problem import Problem

WarmupKind = Literal["active_warmup", "standby_warmup"]
# Lower first: the active's balance before the standbys'.
KIND_RANK: Final[dict[WarmupKind, int]] = {"active_warmup": 0, "standby_warmup": 1}


@dataclass(frozen=True, slots=True)
class StandbyPlan:
    """One standby slot: its balanced ``target``, whether a replica there restores, and the caught-up
    ``keeper`` that holds the standby meanwhile (None: none was free, or none is needed)."""

    target: int
    restores: bool
    keeper: int | None


@dataclass(frozen=True, slots=True)
class Warmup:
    """A warmup that would restore ``partition`` on ``server``, to move a replica there."""

    partition: int
    server: int
    kind: WarmupKind
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


def warmup_of(problem: Problem, p: int, s: int, kind: WarmupKind) -> Warmup:
    return Warmup(p, s, kind, running(problem, p, s), lag_of(problem.lags[p], s))


def warmup_requests(
    problem: Problem, choices: Sequence[ActiveChoice], plans: Sequence[Sequence[StandbyPlan]]
) -> list[Warmup]:
    """The warmups wanted for moves: an active's target that is not caught up, and a standby's target
    that is not caught up while a keeper holds the standby. A standby without a keeper is no warmup."""
    out = [warmup_of(problem, p, c.target, "active_warmup") for p, c in enumerate(choices) if c.wants_warmup]
    for p, row in enumerate(plans):
        for plan in row:
            if plan.restores and plan.keeper is not None:
                out.append(warmup_of(problem, p, plan.target, "standby_warmup"))
    return out


def priority(r: Warmup) -> tuple[int, int, float, int, int]:
    return (0 if r.running else 1, KIND_RANK[r.kind], r.lag, r.partition, r.server)


def grant(requests: Iterable[Warmup], budget: int) -> set[tuple[int, int]]:
    """(partition, server) of the warmups that start or go on now: every running one, then new ones in
    priority order while the total stays within ``budget``."""
    granted: set[tuple[int, int]] = set()
    for r in sorted(requests, key=priority):
        if r.running or len(granted) < budget:
            granted.add((r.partition, r.server))
    return granted


@dataclass(frozen=True, slots=True)
class StandbyOutcome:
    """Where one slot's standby is now and whether its target warms up."""

    plan: StandbyPlan
    server: int
    warmup: bool


def settle_slot(p: int, plan: StandbyPlan, granted: Collection[tuple[int, int]]) -> StandbyOutcome:
    if plan.keeper is None:
        # On its target: caught up, new, or restoring a lost copy, which the budget never holds back.
        return StandbyOutcome(plan, plan.target, False)
    return StandbyOutcome(plan, plan.keeper, (p, plan.target) in granted)


def standby_on_refused_target(
    problem: Problem, p: int, choice: ActiveChoice, granted: Collection[tuple[int, int]], placed: int
) -> int | None:
    """The server that takes a missing standby of ``p`` because its active's warmup was refused.

    Standby targets keep clear of an active's wanted warmup; with ``placed`` standbys fewer than asked,
    every other server already holds one, so only that target is left, and it is free when its warmup
    is refused. It restores there as a standby, whatever the budget."""
    refused = choice.wants_warmup and (p, choice.target) not in granted
    if refused and placed < problem.standbys_asked[p]:
        return choice.target
    return None

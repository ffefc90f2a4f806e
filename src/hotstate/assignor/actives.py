"""KIP-441: actives go to caught-up replicas; new owners warm up first.

The balanced placement (plain or min-cost flow) gives every partition a *target* server. Whether the
active actually goes there depends on lags:

- target caught up (lag <= acceptable.recovery.lag): the active goes to the target;
- target not caught up, someone else is: a caught-up server keeps (or takes) the active, preferring
  the previous active, and the target gets a *warmup* replica if the cluster-wide warmup budget allows
  (shared with standbys' warmups, not with standbys, see restoring.py); a later assignment promotes
  the warmup once it has caught up;
- nobody caught up: the most caught-up server takes it (lowest lag; the target wins ties, then the
  previous active), again with a warmup on the target when that is someone else. With no lag report
  at all (a new table) the target simply takes it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from hotstate.assignor.problem import Problem

UNKNOWN_LAG = float("inf")


@dataclass(frozen=True, slots=True)
class ActiveChoice:
    active: int
    target: int
    reason: str  # caught_up | no_state | held_for_warmup | most_caught_up
    wants_warmup: bool


def lag_of(lags: Mapping[int, int], s: int) -> float:
    return lags.get(s, UNKNOWN_LAG)


def choose_active(
    target: int, prev_active: int, lags: Mapping[int, int], acceptable_lag: int
) -> ActiveChoice:
    """Where the active of one partition goes, given its balanced target."""
    if lag_of(lags, target) <= acceptable_lag:
        return ActiveChoice(target, target, "caught_up", False)
    caught_up = sorted(s for s, lag in lags.items() if lag <= acceptable_lag)
    if caught_up:
        keeper = prev_active if prev_active in caught_up else min(caught_up, key=lambda s: (lags[s], s))
        return ActiveChoice(keeper, target, "held_for_warmup", True)
    if not lags:
        return ActiveChoice(target, target, "no_state", False)

    def rank(s: int) -> tuple[float, int, int]:
        return (lag_of(lags, s), 0 if s == target else 1 if s == prev_active else 2, s)

    best = min([target, *lags], key=rank)
    return ActiveChoice(best, target, "most_caught_up", best != target)


def choose_actives(problem: Problem, targets: Mapping[int, int]) -> list[ActiveChoice]:
    acceptable = problem.config.acceptable_recovery_lag
    return [
        choose_active(targets[p], problem.prev_active[p], problem.lags[p], acceptable)
        for p in range(len(problem.partitions))
    ]


def warmups_by_partition(
    choices: Sequence[ActiveChoice], granted: Collection[tuple[int, int]] | None = None
) -> list[tuple[int, ...]]:
    """Each partition's warmup on its target: every one wanted (``granted`` None), or those granted."""
    return [
        (c.target,) if c.wants_warmup and (granted is None or (p, c.target) in granted) else ()
        for p, c in enumerate(choices)
    ]

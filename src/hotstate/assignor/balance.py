"""Balance bounds and the plain balanced (rack-blind, sticky) placement of actives.

Balanced means: server s with capacity c_s out of a total C gets between floor(n c_s / C) and
ceil(n c_s / C) of n replicas. With equal capacities, counts differ by at most one.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from hotstate.assignor.problem import NO_SERVER, Problem

Bounds = tuple[tuple[int, ...], tuple[int, ...]]  # (lo per server, hi per server)


def balanced_bounds(total: int, capacities: Sequence[int]) -> Bounds:
    cap_sum = sum(capacities)
    lo = tuple(total * c // cap_sum for c in capacities)
    hi = tuple(-(-total * c // cap_sum) for c in capacities)
    return lo, hi


class LoadScale:
    """Exact, fast load comparison: count/capacity as the integer count x (L / capacity).

    L is the least common multiple of the capacities, so the scaled loads are whole numbers and two
    servers compare exactly as their rational loads do (no float ties, no Fraction overhead).
    """

    def __init__(self, capacities: Sequence[int]) -> None:
        lcm = math.lcm(*capacities) if capacities else 1
        self._unit = [lcm // c for c in capacities]

    def key(self, count: int, server: int) -> tuple[int, int]:
        """Order servers by the load they would have after taking one more replica, then by index."""
        return ((count + 1) * self._unit[server], server)


def plain_preferences(problem: Problem, p: int) -> list[int]:
    """Servers the plain placement tries for ``p``, best first.

    The previous active first: a caught-up warmup may have been built for a standby (restoring.py), and
    preferring it would move actives that balance leaves where they are. Then caught-up warmups, which
    take the active whenever balance moves it off its server (that is what they were built for), then
    other caught-up replicas (lowest lag first), which take over without a warmup when the owner is
    gone; last a warmup still restoring, so that its target does not change under it.
    """
    prev = problem.prev_active[p]
    warm = [w for w in problem.prev_warmups[p] if problem.caught_up(p, w)]
    lags = problem.lags[p]
    others = sorted(
        (s for s in problem.held[p] if s != prev and s not in warm and problem.caught_up(p, s)),
        key=lambda s: (lags[s], s),
    )
    head = [prev, *warm] if prev != NO_SERVER else warm
    restoring = [w for w in problem.prev_warmups[p] if w not in warm]
    return [*head, *others, *restoring]


def sticky_balanced_targets(
    partitions: Sequence[int],
    preferences: Sequence[Sequence[int]],
    capacities: Sequence[int],
    bounds: Bounds,
) -> dict[int, int]:
    """Place ``partitions`` within ``bounds``, on their preferred servers where balance allows.

    First preferences are kept up to each server's lower bound; then each partition takes its first
    preference that is below its lower bound or, while spare room lasts, below its upper bound; the
    rest go to the least loaded server, servers below their lower bound first. The spare room
    ``total - sum(lo)`` is spent only by servers at or above their lower bound, so partitions left
    always equal the deficits plus the spare room, and every server ends within its bounds.
    """
    lo, hi = bounds
    counts = [0] * len(capacities)
    out: dict[int, int] = {}
    spare = len(partitions) - sum(lo)
    for p in partitions:
        prefs = preferences[p]
        if prefs and counts[prefs[0]] < lo[prefs[0]]:
            out[p] = prefs[0]
            counts[prefs[0]] += 1
    for p in partitions:
        if p in out:
            continue
        for s in preferences[p]:
            if counts[s] < lo[s] or (counts[s] < hi[s] and spare > 0):
                spare -= 0 if counts[s] < lo[s] else 1
                out[p] = s
                counts[s] += 1
                break
    # Each server sits in the heap at most once, re-pushed with its new load after every pick, so no
    # entry is ever stale. Tier 0 (below the lower bound) comes first: deficits before spare room.
    scale = LoadScale(capacities)
    heap = [(0 if counts[s] < lo[s] else 1, *scale.key(counts[s], s)) for s in range(len(counts))]
    heap = [entry for entry in heap if counts[entry[2]] < hi[entry[2]]]
    heapq.heapify(heap)
    for p in partitions:
        if p in out:
            continue
        _, _, s = heapq.heappop(heap)
        out[p] = s
        counts[s] += 1
        if counts[s] < hi[s]:
            heapq.heappush(heap, (0 if counts[s] < lo[s] else 1, *scale.key(counts[s], s)))
    return out

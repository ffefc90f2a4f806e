"""Balance bounds and the plain balanced (rack-blind, sticky) placement of actives.

Balanced means: server s with capacity c_s out of a total C gets between floor(n c_s / C) and
ceil(n c_s / C) of n replicas. With equal capacities, counts differ by at most one.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence

from hotstate.assignor.problem import NO_SERVER

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


def sticky_balanced_targets(
    partitions: Sequence[int], prev_active: Sequence[int], capacities: Sequence[int], bounds: Bounds
) -> dict[int, int]:
    """Place ``partitions`` within ``bounds``, keeping previous actives where balance allows.

    Kept first up to each server's lower bound, then (while spare room lasts) up to its upper bound;
    the rest go to the least loaded server that still needs replicas. Deficits are filled before any
    server goes above its lower bound, so the spare room ``sum(hi) - total`` is never over-spent and
    every server ends within its bounds.
    """
    lo, hi = bounds
    counts = [0] * len(capacities)
    out: dict[int, int] = {}
    extras = len(partitions) - sum(lo)
    for p in partitions:
        s = prev_active[p]
        if s != NO_SERVER and counts[s] < lo[s]:
            out[p] = s
            counts[s] += 1
    for p in partitions:
        s = prev_active[p]
        if p not in out and s != NO_SERVER and counts[s] < hi[s] and extras > 0:
            out[p] = s
            counts[s] += 1
            extras -= 1
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

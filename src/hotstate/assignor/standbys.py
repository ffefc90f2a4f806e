"""KIP-708 standby placement: spread over tag values, then least loaded, stickily.

Rules, each in its own function below:

1. ``eligible``: never on the partition's active or warmup server, never twice on one server.
2. ``best_classes``: spread first. Servers with the same tag vector are interchangeable for spread
   (a *tag class*); each class scores by how many tag keys would get a value the partition's active
   and earlier standbys do not use yet. The best score wins: every key new is KIP-708's *ideal*,
   some keys new (no eligible server is new on all of them) is *partial*, none is *least loaded*.
3. ``keep_previous``: a previous warmup, then a previous standby, stays if it is still eligible and
   spreads as well as the best choice would. A warmup comes first so that a standby's target does not
   change while it warms up (restoring.py keeps the standby on a caught-up server meanwhile).
4. ``fill_rounds``: every partition's first standby before any partition's second, and so on, each
   on the least loaded server of the best-spread classes (a previous holder wins a load tie, a
   caught-up one first: it needs no restore).
5. ``rebalance_last_standbys``: last standbys move off servers above their share and onto servers
   below it (a server that just joined), where that spreads them just as well. Only such moves:
   when spread forces a server above its share (a rack with few servers), nothing moves, so a
   stable input gives a stable output.

Loads are standby counts per unit of capacity, so standbys balance over servers by capacity.
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from hotstate.assignor.balance import LoadScale, balanced_bounds
from hotstate.assignor.problem import Problem
from hotstate.assignor.tags import SpreadScore, TagVector, spread_score, used_values


@dataclass(frozen=True, slots=True)
class StandbySlot:
    server: int
    score: SpreadScore
    kept: bool


@dataclass(frozen=True, slots=True)
class TagClasses:
    vectors: tuple[TagVector, ...]
    members: tuple[tuple[int, ...], ...]
    class_of: tuple[int, ...]


def _vector_key(vector: TagVector) -> tuple[tuple[bool, str], ...]:
    return tuple((v is None, v or "") for v in vector)


def tag_classes(vectors: Sequence[TagVector]) -> TagClasses:
    distinct = sorted(set(vectors), key=_vector_key)
    index = {v: i for i, v in enumerate(distinct)}
    members: list[list[int]] = [[] for _ in distinct]
    for s, v in enumerate(vectors):
        members[index[v]].append(s)
    return TagClasses(tuple(distinct), tuple(tuple(m) for m in members), tuple(index[v] for v in vectors))


def eligible(s: int, active: int, warmups: Sequence[int], current: Sequence[int]) -> bool:
    return s != active and s not in warmups and s not in current


def wanted_standbys(asked: int, num_servers: int, num_warmups: int) -> int:
    """Standbys to place: as asked, or fewer when there are not enough other servers."""
    return max(0, min(asked, num_servers - 1 - num_warmups))


def best_classes(
    classes: TagClasses, used: Sequence[set[str | None]], excluded: Sequence[int]
) -> tuple[SpreadScore, list[int]]:
    """The best spread score any eligible server reaches, and the tag classes that reach it."""
    taken: dict[int, int] = defaultdict(int)
    for s in excluded:
        taken[classes.class_of[s]] += 1
    best: SpreadScore = (-1, -1)
    winners: list[int] = []
    for c, vector in enumerate(classes.vectors):
        if len(classes.members[c]) <= taken[c]:
            continue
        score = spread_score(vector, used)
        if score > best:
            best, winners = score, [c]
        elif score == best:
            winners.append(c)
    return best, winners


def keep_previous(
    problem: Problem,
    classes: TagClasses,
    p: int,
    active: int,
    warmups: Sequence[int],
    wanted: int,
) -> list[StandbySlot]:
    """Previous warmups and standbys of ``p`` that are still eligible and still spread as well as possible."""
    kept: list[StandbySlot] = []
    num_keys = len(classes.vectors[0]) if classes.vectors else 0
    for s in (*problem.prev_warmups[p], *problem.prev_standbys[p]):
        if len(kept) >= wanted:
            break
        current = [k.server for k in kept]
        if not eligible(s, active, warmups, current):
            continue
        used = used_values([problem.vectors[x] for x in (active, *current)], num_keys)
        best, _ = best_classes(classes, used, [active, *warmups, *current])
        score = spread_score(problem.vectors[s], used)
        if score == best:
            kept.append(StandbySlot(s, score, True))
    return kept


def _respread_last(
    problem: Problem, classes: TagClasses, row: list[StandbySlot], active: int, warmups: Sequence[int]
) -> tuple[list[int], list[int]] | None:
    """For a partition's last standby: (tag classes spreading it as well, servers it must avoid)."""
    current = [slot.server for slot in row[:-1]]
    excluded = [active, *warmups, *current, row[-1].server]
    used = used_values(
        [problem.vectors[x] for x in (active, *current)], len(problem.config.rack_aware_assignment_tags)
    )
    score, winners = best_classes(classes, used, excluded)
    return (winners, excluded) if score == row[-1].score else None


def rebalance_last_standbys(
    problem: Problem,
    classes: TagClasses,
    slots: list[list[StandbySlot]],
    actives: Sequence[int],
    warmups: Sequence[Sequence[int]],
    total: int,
) -> None:
    """Move last standbys off servers above their share, and onto servers below it, until no move helps.

    The placement rounds are greedy, so a server can end above its upper bound, or (a server that
    just joined) below its lower bound. Only a partition's last standby moves (no later standby was
    judged next to it), and only to a server that spreads it exactly as well, so KIP-708's choice
    stands. Every move lowers the total excess plus deficit, so this ends; running it to the end here,
    not in the next assignment, is what makes a stable input give a stable output.
    """
    lo, hi = balanced_bounds(total, problem.capacities)
    count = [0] * problem.num_servers
    for row in slots:
        for slot in row:
            count[slot.server] += 1
    while _move_excess(problem, classes, slots, actives, warmups, count, hi) + _fill_deficits(
        problem, classes, slots, actives, warmups, count, lo
    ):
        pass


def _move_excess(
    problem: Problem,
    classes: TagClasses,
    slots: list[list[StandbySlot]],
    actives: Sequence[int],
    warmups: Sequence[Sequence[int]],
    count: list[int],
    hi: Sequence[int],
) -> int:
    if all(count[s] <= hi[s] for s in range(problem.num_servers)):
        return 0
    moves = 0
    heaps = _LoadHeaps(classes, problem.capacities, count)
    for p, row in enumerate(slots):
        if not row or count[row[-1].server] <= hi[row[-1].server]:
            continue
        options = _respread_last(problem, classes, row, actives[p], warmups[p])
        if options is None:
            continue
        winners, excluded = options
        found = [e for e in (heaps.least_loaded(c, excluded) for c in winners) if e is not None]
        if not found or count[min(found)[1]] >= hi[min(found)[1]]:
            continue
        heaps.give_back(row[-1].server)
        heaps.take(min(found)[1])
        row[-1] = StandbySlot(min(found)[1], row[-1].score, False)
        moves += 1
    return moves


def _fill_deficits(
    problem: Problem,
    classes: TagClasses,
    slots: list[list[StandbySlot]],
    actives: Sequence[int],
    warmups: Sequence[Sequence[int]],
    count: list[int],
    lo: Sequence[int],
) -> int:
    short: dict[int, list[int]] = defaultdict(list)  # tag class -> servers below their lower bound
    for d in range(problem.num_servers):
        if count[d] < lo[d]:
            short[classes.class_of[d]].append(d)
    moves = 0
    for p, row in enumerate(slots):
        if not short:
            break
        if not row or count[row[-1].server] <= lo[row[-1].server]:
            continue
        options = _respread_last(problem, classes, row, actives[p], warmups[p])
        if options is None:
            continue
        winners, excluded = options
        for c in winners:
            target = next((d for d in short.get(c, ()) if d not in excluded), None)
            if target is None:
                continue
            count[row[-1].server] -= 1
            count[target] += 1
            row[-1] = StandbySlot(target, row[-1].score, False)
            moves += 1
            if count[target] >= lo[target]:
                short[c].remove(target)
                if not short[c]:
                    del short[c]
            break
    return moves


class _LoadHeaps:
    """Per tag class, servers by load; the least loaded eligible one is found in O(log n)."""

    def __init__(self, classes: TagClasses, capacities: Sequence[int], counts: list[int]) -> None:
        self._scale = LoadScale(capacities)
        self.counts = counts
        self._heaps: list[list[tuple[int, int]]] = []
        for members in classes.members:
            heap = [self.key(s) for s in members]
            heapq.heapify(heap)
            self._heaps.append(heap)
        self._class_of = classes.class_of

    def key(self, s: int) -> tuple[int, int]:
        return self._scale.key(self.counts[s], s)

    def least_loaded(self, c: int, excluded: Sequence[int]) -> tuple[int, int] | None:
        heap = self._heaps[c]
        stash = []
        found = None
        while heap:
            entry = heap[0]
            if entry != self.key(entry[1]):
                heapq.heappop(heap)  # stale: the server took a replica since this entry was pushed
                continue
            if entry[1] in excluded:
                stash.append(heapq.heappop(heap))
                continue
            found = entry
            break
        for entry in stash:
            heapq.heappush(heap, entry)
        return found

    def take(self, s: int) -> None:
        self.counts[s] += 1
        heapq.heappush(self._heaps[self._class_of[s]], self.key(s))

    def give_back(self, s: int) -> None:
        # The server's old, higher entry no longer matches its key, so it is skipped as stale.
        self.counts[s] -= 1
        heapq.heappush(self._heaps[self._class_of[s]], self.key(s))


def fill_rounds(
    problem: Problem,
    classes: TagClasses,
    slots: list[list[StandbySlot]],
    actives: Sequence[int],
    warmups: Sequence[Sequence[int]],
    wanted: Sequence[int],
) -> None:
    counts = [0] * problem.num_servers
    for row in slots:
        for slot in row:
            counts[slot.server] += 1
    heaps = _LoadHeaps(classes, problem.capacities, counts)
    num_keys = len(problem.config.rack_aware_assignment_tags)
    for r in range(max(wanted, default=0)):
        for p in range(len(slots)):
            if len(slots[p]) != r or r >= wanted[p]:
                continue
            current = [slot.server for slot in slots[p]]
            excluded = [actives[p], *warmups[p], *current]
            used = used_values([problem.vectors[x] for x in (actives[p], *current)], num_keys)
            score, winners = best_classes(classes, used, excluded)
            best: tuple[int, int] | None = None
            for c in winners:
                cand = heaps.least_loaded(c, excluded)
                if cand is not None and (best is None or cand < best):
                    best = cand
            if best is None:
                continue  # cannot happen: wanted leaves room for one more eligible server
            chosen = best[1]
            # A previous holder already has the data: prefer it when it is just as lightly loaded.
            holders = sorted(
                (not problem.caught_up(p, h), h not in problem.prev_standbys[p], h) for h in problem.held[p]
            )
            for _, _, h in holders:
                if classes.class_of[h] in winners and h not in excluded and heaps.key(h)[0] == best[0]:
                    chosen = h
                    break
            heaps.take(chosen)
            slots[p].append(StandbySlot(chosen, score, False))


def place_standbys(
    problem: Problem, actives: Sequence[int], warmups: Sequence[Sequence[int]]
) -> tuple[list[list[StandbySlot]], list[int]]:
    """KIP-708 placement for every partition; returns the slots and how many each partition wanted."""
    classes = tag_classes(problem.vectors)
    wanted = [
        wanted_standbys(problem.standbys_asked[p], problem.num_servers, len(warmups[p]))
        for p in range(len(problem.partitions))
    ]
    slots = [
        keep_previous(problem, classes, p, actives[p], warmups[p], wanted[p]) for p in range(len(wanted))
    ]
    fill_rounds(problem, classes, slots, actives, warmups, wanted)
    rebalance_last_standbys(problem, classes, slots, actives, warmups, sum(wanted))
    return slots, wanted

"""The kernel both simulators run on: a simulated clock, one event queue, seeded random streams, a network
that delays, drops, duplicates and partitions, and the failure that carries its replay command.

Events are ordered by (time, sequence number), so two events at the same millisecond run in the order
they were scheduled; every random choice comes from a stream named after the seed, so a run is a pure
function of its seed and replays exactly. No wall clock, thread or socket is involved.

The Raft simulator (`sim/world.py`) and the replication simulator (`sim/replication/`) each add their
own event kinds after the shared ones (`EVENT_KINDS_USED`), their own faults and their own invariants;
the disks they model are in `sim/disk.py`.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = [
    "CALM",
    "CRASH",
    "DELIVER",
    "DISK_DONE",
    "EVENT_KINDS_USED",
    "HEAL",
    "PARTITION",
    "RESTART",
    "TICK",
    "Kernel",
    "Link",
    "SimFailure",
]

# Event kinds every simulator has; each numbers its own from EVENT_KINDS_USED on.
(
    DELIVER,  # a message reaches its destination
    TICK,  # a core's next deadline
    DISK_DONE,  # a write in flight reached the disk
    CRASH,  # the next random crash
    RESTART,  # a crashed node starts again
    PARTITION,  # the next random network partition
    HEAL,  # a partition ends
    CALM,  # the faults stop: whatever is down starts, the network heals, the run must converge
) = range(8)
EVENT_KINDS_USED = 8


class SimFailure(Exception):
    """A run broke an invariant (or a core raised); carries what is needed to replay it."""

    def __init__(self, seed: int, time: int, event: int, reason: str, replay: str) -> None:
        super().__init__(f"seed {seed}: {reason} (at t={time} ms, event {event})\n  replay: {replay}")
        self.seed = seed
        self.time = time
        self.event = event
        self.reason = reason
        self.replay = replay


@dataclass(frozen=True, slots=True)
class Link:
    """How the network treats a message: dropped with probability `drop`, else sent twice with probability
    `duplicate`, each copy delayed by a whole number of ms in [delay_min_ms, delay_max_ms]. A probability of
    None is a reliable network: never, and nothing is drawn for it."""

    drop: float | None
    duplicate: float | None
    delay_min_ms: int
    delay_max_ms: int


class Kernel:
    def __init__(self, seed: int, stream: str, replay: str) -> None:
        """`stream`: the name of the run's main random stream (each seed draws its own from it)."""
        self.seed = seed
        self.replay = replay
        self.rng = self.stream(stream)
        self.now = 0
        self.events_run = 0
        self._seq = 0
        self._queue: list[tuple[int, int, int, int, Any]] = []
        # node -> side while the network is split, None while it is whole.
        self.partition: dict[int, int] | None = None

    def stream(self, name: str) -> random.Random:
        """Another random stream of this seed: a feature that draws from its own stream leaves every other
        choice of a seed as it was before the feature existed."""
        return random.Random(f"{name}/{self.seed}")

    # ------------------------------------------------------------------ clock and queue
    def schedule(self, when: int, kind: int, target: int, payload: Any) -> None:
        self._seq += 1
        heapq.heappush(self._queue, (when, self._seq, kind, target, payload))

    def gap(self, mean_ms: int) -> int:
        """A random wait with mean about `mean_ms` (exponential): the time to the next random fault."""
        return 1 + int(self.rng.expovariate(1 / mean_ms))

    def run(
        self,
        end: int,
        handle: Callable[[int, int, Any], None],
        *,
        after: Callable[[], None] = lambda: None,
        stop: Callable[[], bool] = lambda: False,
    ) -> None:
        """Runs events in order until none is left before `end` (or `stop()`): `handle(kind, target,
        payload)` for each, then `after()`, where the invariants are checked."""
        queue = self._queue
        while queue and queue[0][0] <= end and not stop():
            when, _, kind, target, payload = heapq.heappop(queue)
            self.now = when
            self.events_run += 1
            handle(kind, target, payload)
            after()

    def failure(self, error: BaseException) -> SimFailure:
        """The failure to raise for `error`, met at the current event, with the command that replays it."""
        return SimFailure(
            self.seed, self.now, self.events_run, f"{type(error).__name__}: {error}", self.replay
        )

    # ------------------------------------------------------------------ network
    def cut(self, a: int, b: int) -> bool:
        """Whether a partition separates nodes `a` and `b` (a node not named is on side 0)."""
        sides = self.partition
        return sides is not None and sides.get(a, 0) != sides.get(b, 0)

    def send(self, src: int, dst: int, kind: int, target: int, payload: Any, link: Link) -> None:
        """Puts a message on the network, unless a partition separates `src` and `dst`."""
        if self.cut(src, dst):
            return
        rng = self.rng
        if link.drop is not None and rng.random() < link.drop:
            return
        copies = 2 if link.duplicate is not None and rng.random() < link.duplicate else 1
        low, high = min(link.delay_min_ms, link.delay_max_ms), link.delay_max_ms
        for _ in range(copies):
            self.schedule(self.now + rng.randint(low, high), kind, target, payload)

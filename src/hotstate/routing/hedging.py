"""When to hedge a forwarded partition query: a pure policy, fed latencies and asked for decisions.

A peer that is alive but slow (a GC pause, a SIGSTOP, a saturated core: a gray failure) still answers
heartbeats late enough to be judged alive for a while, and every query routed to it waits. Hedging ("The
Tail at Scale", Dean and Barroso): when a forward has not answered within the *hedge delay*, the same
partitions go to their next candidates as well, and the first answer wins.

- The delay per peer is the p95 of its recent answer times (a ring of the last `window` samples), clamped
  to [`delay_floor_ms`, `delay_cap_ms`]; a peer with fewer than `min_samples` samples gets the cap.
- The extra load is bounded: each forward earns `max_percent`/100 of a hedge, a hedge spends one, and at
  most `burst` may be saved up, so over any long run hedges stay at most `max_percent` of forwards (plus
  the burst), and a storm of slow answers cannot double the load. `max_percent` 0 turns hedging off.
- A peer with a forward unanswered for longer than its hedge delay is *slow*: queries try it after the
  other candidates (`last_if_slow`) until that forward is answered or given up. A hedged forward is
  left to run to its own timeout for that reason: the hedges of the first queries find the gray peer,
  and the queries after them go elsewhere without spending any.

No clock, socket or randomness inside: the shell (`server/coordinator.py`) passes the latencies it measured.
"""

from __future__ import annotations

import itertools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace

from hotstate.routing.router import Route

__all__ = ["HedgeConfig", "HedgePolicy", "last_if_slow"]

RECOMPUTE_EVERY = 16


@dataclass(frozen=True, slots=True)
class HedgeConfig:
    """The `query.hedge.*` settings (server/settings.py); `burst`, `window` and `min_samples` are fixed by
    the code (tests vary them)."""

    # Below this a hedge would mostly duplicate answers already on their way (a loopback round trip with
    # a busy event loop takes a few ms).
    delay_floor_ms: int = 10
    # A hedge after this long at the latest, whatever the history says.
    delay_cap_ms: int = 200
    max_percent: int = 5
    burst: float = 10.0
    window: int = 200
    min_samples: int = 20

    def __post_init__(self) -> None:
        if not 0 < self.delay_floor_ms <= self.delay_cap_ms:
            raise ValueError(
                f"query.hedge.delay.floor.ms={self.delay_floor_ms}: must be from 1 to "
                f"query.hedge.delay.cap.ms={self.delay_cap_ms}"
            )
        if not 0 <= self.max_percent <= 100:
            raise ValueError(f"query.hedge.max.percent={self.max_percent}: must be from 0 to 100")
        if self.burst < 1 or self.window < 1 or not 1 <= self.min_samples <= self.window:
            raise ValueError("hedge burst >= 1, window >= 1 and 1 <= min_samples <= window")

    @property
    def enabled(self) -> bool:
        return self.max_percent > 0


class HedgePolicy:
    def __init__(self, config: HedgeConfig) -> None:
        self.config = config
        self._samples: dict[int, deque[float]] = {}
        self._delays: dict[int, float] = {}
        # Start with a full burst: the first gray failure after a start is hedged too.
        self._budget = config.burst
        self._observed = 0
        self.hedges = 0
        # Forwards in flight per peer: request id -> when sent (ms of the caller's clock).
        self._outstanding: dict[int, dict[int, float]] = {}
        self._ids = itertools.count()

    def sent(self, peer: int, now_ms: float) -> int:
        """A forward to `peer` leaves now; returns its id for `done`."""
        request_id = next(self._ids)
        self._outstanding.setdefault(peer, {})[request_id] = now_ms
        return request_id

    def done(self, peer: int, request_id: int, now_ms: float, *, answered: bool) -> None:
        """The forward ended: answered (its time counts towards the delay) or failed, timed out, given up."""
        outstanding = self._outstanding.get(peer, {})
        sent_at = outstanding.pop(request_id, None)
        if not outstanding:
            self._outstanding.pop(peer, None)
        if answered and sent_at is not None:
            self.observe(peer, now_ms - sent_at)

    def slow(self, peer: int, now_ms: float) -> bool:
        """Whether `peer` has a forward unanswered for longer than its hedge delay (never when hedging is
        off)."""
        outstanding = self._outstanding.get(peer)
        if not outstanding:
            return False
        delay = self.delay_ms(peer)
        return delay is not None and now_ms - min(outstanding.values()) > delay

    def observe(self, peer: int, latency_ms: float) -> None:
        """A forward to `peer` answered after `latency_ms`."""
        samples = self._samples.get(peer)
        if samples is None:
            samples = self._samples[peer] = deque(maxlen=self.config.window)
        samples.append(latency_ms)
        self._observed += 1
        # The p95 is recomputed every few answers, not on each: a sort per forward would cost more than
        # the hedge saves on a healthy cluster.
        if self._observed % RECOMPUTE_EVERY == 0 or len(samples) <= self.config.min_samples:
            self._delays.pop(peer, None)

    def forwarded(self) -> None:
        """A forward was sent: it earns its fraction of a hedge."""
        self._budget = min(self.config.burst, self._budget + self.config.max_percent / 100)

    def delay_ms(self, peer: int) -> float | None:
        """How long to wait for `peer` before hedging; None: never hedge (hedging off)."""
        config = self.config
        if not config.enabled:
            return None
        delay = self._delays.get(peer)
        if delay is None:
            samples = self._samples.get(peer)
            if samples is None or len(samples) < config.min_samples:
                delay = config.delay_cap_ms
            else:
                ordered = sorted(samples)
                p95 = ordered[min(len(ordered) - 1, math.ceil(0.95 * len(ordered)) - 1)]
                delay = min(config.delay_cap_ms, max(config.delay_floor_ms, p95))
            self._delays[peer] = delay
        return delay

    def take(self) -> bool:
        """Spend one hedge if the budget has one."""
        if self._budget < 1:
            return False
        self._budget -= 1
        self.hedges += 1
        return True


def last_if_slow(route: Route, slow: Callable[[int], bool]) -> Route:
    """`route` with the candidates on slow peers moved after the others of their kind, live or down, in
    their order (never dropped: a slow peer may be the only one that can serve). A slow live peer still
    comes before every peer down by heartbeats: it answers, late; they may not answer at all."""
    if not any(slow(c.node_id) for c in route.candidates):
        return route
    # sorted is stable: the router's order holds within each group.
    return replace(route, candidates=tuple(sorted(route.candidates, key=lambda c: (c.down, slow(c.node_id)))))

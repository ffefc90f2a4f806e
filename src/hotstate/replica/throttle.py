"""The move throttle's arithmetic (`replica.move.throttle.bytes.per.sec`, Kafka's reassignment throttle).

Pure: a token bucket over bytes, with the clock passed in. The server (server/replicas.py) owns one and
asks it before each catch-up fetch and store-snapshot chunk of a replica outside the ISR (a warmup, a new or
restoring copy), then charges what the answer carried. The size of an answer is known only once it arrives,
so the bucket may go into debt: the next request waits until the debt is paid at the configured rate. Over
any interval the bytes let through are at most `rate` x the interval + the burst + one answer.
"""

from __future__ import annotations

import math


class TokenBucket:
    def __init__(self, rate_bytes_per_s: int, burst_bytes: int, now_ms: int) -> None:
        """`rate_bytes_per_s` > 0: the sustained rate; `burst_bytes` > 0: what may go at once after an idle
        spell (the bucket starts full)."""
        if rate_bytes_per_s <= 0 or burst_bytes <= 0:
            raise ValueError(f"rate {rate_bytes_per_s} and burst {burst_bytes} must be > 0")
        self.rate = rate_bytes_per_s
        self.burst = burst_bytes
        self._tokens = float(burst_bytes)
        self._at = now_ms

    def _refill(self, now_ms: int) -> None:
        if now_ms > self._at:
            self._tokens = min(float(self.burst), self._tokens + (now_ms - self._at) * self.rate / 1000)
            self._at = now_ms

    def tokens(self, now_ms: int) -> float:
        """What may go now (negative: the debt still to pay)."""
        self._refill(now_ms)
        return self._tokens

    def wait_ms(self, now_ms: int) -> int:
        """How long until a request may go: 0 when the bucket is not in debt."""
        tokens = self.tokens(now_ms)
        return 0 if tokens >= 0 else math.ceil(-tokens * 1000 / self.rate)

    def charge(self, nbytes: int, now_ms: int) -> None:
        """`nbytes` went through (an answer arrived)."""
        self._refill(now_ms)
        self._tokens -= nbytes

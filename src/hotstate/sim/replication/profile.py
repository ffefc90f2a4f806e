"""A replication run's parameters, all drawn from its seed, and the constants every part of it shares."""

from __future__ import annotations

import dataclasses
import math
import random
from dataclasses import dataclass

from hotstate.replica.core import ReplicaConfig
from hotstate.routing.heartbeat import HeartbeatConfig
from hotstate.routing.hedging import HedgeConfig
from hotstate.sim.kernel import EVENT_KINDS_USED

# The simulator's own event kinds, after the kernel's.
(
    PRODUCE,
    META,
    ISR,
    SNAP,
    REASSIGN,
    PROBE,
    PROBED,
    BEAT,
    BEAT_CHECK,
    LAG_REPORTS,
    LAG_ARRIVE,
    QUERY,
    SERVE,
    QUERY_REPLY,
    QUERY_RETRY,
    APPLY,
    HEDGE,
) = range(EVENT_KINDS_USED, EVENT_KINDS_USED + 17)
SESSION_TIMEOUT_MS = 300
TABLE_ID, PARTITION_ID = 1, 0  # the one partition simulated
TABLE = "t"
# The servers' failure detection, scaled down with the rest of the simulated timeouts.
HEARTBEATS = HeartbeatConfig(send_interval_ms=20, check_interval_ms=40, window_ms=400)
# Query bounds: unbounded (None) reads may use a replica of unknown lag, bounded ones never.
QUERY_BOUNDS = (None, None, 0, 0, 0, 3, 30)
# The share of queries that carry a consistency token (the end of the last acknowledged write).
TOKEN_QUERIES = 0.3
# The share of queries with hedging off (the `hedging` query property): they never hedge, and a slow peer
# keeps its place in their routes.
UNHEDGED_QUERIES = 0.1
# The servers' hedging settings (query.hedge.*, routing/hedging.py), their delays in ms of the query clock
# below: a hedge waits 1 to 20 simulated ms, about a forward's round trip on the simulated network.
HEDGING = HedgeConfig()
# The query path's clock (routing/attempts.py: attempt timeouts, token waits, the query's deadline, in
# seconds) runs this many times faster than the simulated one, whose timeouts are scaled down about as much:
# a forward to a server that is not connected is given up after 30 simulated ms, a query after 1 s.
QUERY_CLOCK = 10


def query_clock(now_ms: int) -> float:
    """The query path's clock (seconds) at simulated time `now_ms`."""
    return now_ms * QUERY_CLOCK / 1000


def sim_ms(seconds: float) -> int:
    """A span of the query path's clock, in simulated ms (at least 1)."""
    return max(1, round(seconds * 1000 / QUERY_CLOCK))


def sim_ms_after(query_ms: float) -> int:
    """The simulated ms to wait for at least `query_ms` of the query clock to pass (at least 1): a hedge
    must never leave before its delay."""
    return max(1, math.ceil(query_ms / QUERY_CLOCK))


@dataclass(frozen=True, slots=True)
class ReplicationProfile:
    replicas: int
    min_insync: int
    chaos_ms: int
    calm_ms: int
    delay_max_ms: int
    drop: float
    duplicate: float
    crash_every_ms: int
    down_max_ms: int
    partition_every_ms: int
    partition_max_ms: int
    produce_every_ms: int
    disk_max_ms: int
    meta_delay_max_ms: int
    config: ReplicaConfig
    spares: int = 0  # nodes of the pool beyond the initial replicas: where reassignments can move to
    reassign_every_ms: int = 0  # mean gap between the controller's reassignment ticks (0: never)
    # Fast fencing (controller.evidence): a hint makes the controller probe a node, whose result it acts on
    # up to this long later. 0: the controller fences on session expiry only.
    probe_delay_max_ms: int = 0
    # Pull queries through the real router, heartbeat status and lag rules (0: none).
    query_every_ms: int = 0
    lag_report_every_ms: int = 100

    @staticmethod
    def from_seed(seed: int) -> ReplicationProfile:
        rng = random.Random(f"replication-profile/{seed}")
        replicas = rng.choice([2, 3, 3, 4])
        profile = ReplicationProfile(
            replicas=replicas,
            min_insync=rng.randint(1, min(2, replicas)),
            chaos_ms=rng.choice([2000, 3000]),
            calm_ms=6000,
            delay_max_ms=rng.choice([2, 10, 40]),
            drop=rng.choice([0.0, 0.02, 0.1]),
            duplicate=rng.choice([0.0, 0.05]),
            crash_every_ms=rng.choice([0, 300, 800]),
            down_max_ms=rng.choice([50, 400, 1200]),
            partition_every_ms=rng.choice([0, 500, 1200]),
            partition_max_ms=rng.choice([200, 800]),
            produce_every_ms=rng.choice([5, 15, 40]),
            disk_max_ms=rng.choice([0, 2, 8]),
            meta_delay_max_ms=rng.choice([1, 30, 150]),
            config=ReplicaConfig(  # min_insync_replicas is set from min_insync below
                fetch_max_wait_ms=rng.choice([20, 100]),
                fetch_max_bytes=rng.choice([1000, 8000, 1 << 20]),
                fetch_timeout_ms=rng.choice([150, 400]),
                fetch_backoff_ms=rng.choice([5, 30]),
                replica_lag_time_max_ms=rng.choice([150, 500, 2000]),
                isr_change_retry_ms=rng.choice([50, 300]),
                min_insync_replicas=1,
                log_retention_records=rng.choice([5, 40, 100_000]),
            ),
        )
        config = dataclasses.replace(profile.config, min_insync_replicas=profile.min_insync)
        # Drawn after everything else, so every other choice of a seed is what it was before reassignments.
        return dataclasses.replace(
            profile,
            config=config,
            spares=rng.choice([1, 2]),
            reassign_every_ms=rng.choice([0, 80, 200, 500]),
            probe_delay_max_ms=rng.choice([0, 5, 40]),
            query_every_ms=rng.choice([4, 15]),
            lag_report_every_ms=rng.choice([30, 100]),
        )

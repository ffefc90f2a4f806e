"""Fault schedules: everything a simulated run does is drawn from its seed through one of these."""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from hotstate.raft.config import RaftConfig


@dataclass(frozen=True, slots=True)
class FaultProfile:
    voters: int
    observers: int
    chaos_ms: int  # faults happen in [0, chaos_ms)
    calm_ms: int  # then a fast, whole network with every member up: the quorum must converge within this
    delay_min_ms: int
    delay_max_ms: int
    drop: float
    duplicate: float
    crash_every_ms: int  # mean gap between crashes; 0 = none
    down_max_ms: int
    crash_leader_bias: float  # chance a crash picks the leader rather than any member
    partition_every_ms: int  # mean gap between network partitions; 0 = none
    partition_max_ms: int
    propose_every_ms: int
    snapshot_every: int  # entries applied between snapshots; 0 = never
    disk_max_ms: int  # an fsync takes up to this long; a crash inside it tears the write
    # Crashes aimed at the protocol's weak moments (as FoundationDB's "buggify"): a voter right after it
    # grants a vote (restarting before the rival's Vote lands), a leader soon after it wins.
    crash_after_vote: float = 0.0
    crash_after_win: float = 0.0
    isolate_leader: float = 0.0  # chance a partition cuts the leader off alone
    raft: RaftConfig = field(default_factory=RaftConfig)
    # A crashed leader's connections close: followers probe it and, refused, stand at once
    # (RaftNode.leader_gone) up to this long after the crash. 0: they wait for their fetch timeout.
    leader_gone_max_ms: int = 0
    # Mean gap between AddVoter/RemoveVoter attempts on the leader during the faults; 0 = a fixed quorum.
    reconfigure_every_ms: int = 0

    @staticmethod
    def from_seed(seed: int, voters: int, observers: int) -> FaultProfile:
        rng = random.Random(f"profile/{seed}/{voters}/{observers}")
        # Small fetch sizes split the log into many responses: that is what exposes commit-rule bugs.
        fetch_max_bytes = rng.choice([100, 250, 1024 * 1024])
        election_timeout = rng.choice([100, 250, 500])
        return FaultProfile(
            voters=voters,
            observers=observers,
            chaos_ms=rng.choice([2000, 3000, 4000]),
            calm_ms=8000,
            delay_min_ms=rng.choice([0, 1, 2]),
            delay_max_ms=rng.choice([3, 10, 30, 80]),
            drop=rng.choice([0.0, 0.01, 0.05, 0.15]),
            duplicate=rng.choice([0.0, 0.02, 0.1]),
            crash_every_ms=rng.choice([0, 300, 700, 1500]),
            down_max_ms=rng.choice([20, 200, 1000]),
            crash_leader_bias=rng.choice([0.2, 0.6]),
            partition_every_ms=rng.choice([0, 500, 1500]),
            partition_max_ms=rng.choice([200, 800, 2000]),
            propose_every_ms=rng.choice([6, 20, 60]),
            snapshot_every=rng.choice([0, 15, 60]),
            disk_max_ms=rng.choice([0, 1, 5]),
            crash_after_vote=rng.choice([0.0, 0.0, 0.3]),
            crash_after_win=rng.choice([0.0, 0.0, 0.3]),
            isolate_leader=rng.choice([0.0, 0.5, 0.9]),
            raft=RaftConfig(
                # Short timeouts against slow links make candidacies collide (split votes, rival candidates).
                election_timeout_ms=election_timeout,
                fetch_timeout_ms=2 * election_timeout,
                election_backoff_max_ms=election_timeout,
                request_timeout_ms=election_timeout,
                fetch_max_wait_ms=min(200, election_timeout),
                fetch_max_bytes=fetch_max_bytes,
                append_linger_ms=rng.choice([0, 2, 5]),
            ),
            # Drawn last, so a seed's other choices are what they were before this existed.
            leader_gone_max_ms=rng.choice([0, 2, 20]),
            # After that (the same reason): a third of the seeds keep the voters of their shape.
            reconfigure_every_ms=rng.choice([0, 150, 500]),
        )

    @staticmethod
    def leader_crashes(voters: int, *, chaos_ms: int = 20_000) -> FaultProfile:
        """Only the leader fails, on a good network: what the time-to-new-leader benchmark measures."""
        return FaultProfile(
            voters=voters,
            observers=0,
            chaos_ms=chaos_ms,
            calm_ms=2000,
            delay_min_ms=0,
            delay_max_ms=2,
            drop=0.0,
            duplicate=0.0,
            crash_every_ms=2500,
            down_max_ms=500,
            crash_leader_bias=1.0,
            partition_every_ms=0,
            partition_max_ms=0,
            propose_every_ms=10,
            snapshot_every=200,
            disk_max_ms=1,
        )

    @staticmethod
    def steady(voters: int, *, duration_ms: int = 5000, propose_every_ms: int = 1) -> FaultProfile:
        """No faults, a busy leader: what the throughput benchmark measures."""
        return FaultProfile(
            voters=voters,
            observers=0,
            chaos_ms=duration_ms,
            calm_ms=1000,
            delay_min_ms=0,
            delay_max_ms=1,
            drop=0.0,
            duplicate=0.0,
            crash_every_ms=0,
            down_max_ms=0,
            crash_leader_bias=0.0,
            partition_every_ms=0,
            partition_max_ms=0,
            propose_every_ms=propose_every_ms,
            snapshot_every=500,
            disk_max_ms=0,
        )

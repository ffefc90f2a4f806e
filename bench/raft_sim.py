"""Benchmark of the KRaft core under the simulator -> bench/results/raft_sim.json.

1. Failover: simulated ms from a leader's crash to the next leader, default timeouts, 3 and 5 voters,
   over many seeds (p50/p99), also as a multiple of the election timeout.
2. Throughput: committed entries per wall-clock second of core + simulator, 3 voters, against a 1-voter
   run in the same process (the baseline: no replication, no elections).
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

from hotstate.raft.config import RaftConfig
from hotstate.sim.profile import FaultProfile
from hotstate.sim.world import World

RESULTS = Path(__file__).parent / "results" / "raft_sim.json"


def percentile(values: list[int], fraction: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(fraction * (len(ordered) - 1))))
    return float(ordered[index])


def failover(voters: int, seeds: int) -> dict[str, object]:
    samples: list[int] = []
    for seed in range(seeds):
        world = World(seed, FaultProfile.leader_crashes(voters, chaos_ms=15_000))
        samples.extend(world.run().failover_ms)
    timeout = RaftConfig().election_timeout_ms
    return {
        "voters": voters,
        "seeds": seeds,
        "samples": len(samples),
        "p50_ms": percentile(samples, 0.50),
        "p99_ms": percentile(samples, 0.99),
        "max_ms": max(samples),
        "mean_ms": round(statistics.fmean(samples), 1),
        "p50_over_election_timeout": round(percentile(samples, 0.50) / timeout, 2),
        "p99_over_election_timeout": round(percentile(samples, 0.99) / timeout, 2),
    }


def throughput(voters: int, simulated_ms: int) -> dict[str, float | int]:
    world = World(1, FaultProfile.steady(voters, duration_ms=simulated_ms, propose_every_ms=1))
    started = time.perf_counter()
    stats = world.run()
    wall = time.perf_counter() - started
    return {
        "voters": voters,
        "simulated_ms": simulated_ms,
        "committed": stats.committed,
        "wall_s": round(wall, 3),
        "committed_per_wall_s": round(stats.committed / wall),
        "events_per_wall_s": round(stats.events / wall),
    }


def main() -> int:
    quick = "--quick" in sys.argv
    seeds = 20 if quick else 100
    simulated = 5_000 if quick else 30_000
    result: dict[str, object] = {
        "benchmark": "raft_sim",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "config": {
            "election_timeout_ms": RaftConfig().election_timeout_ms,
            "fetch_timeout_ms": RaftConfig().fetch_timeout_ms,
            "election_backoff_max_ms": RaftConfig().election_backoff_max_ms,
        },
        "failover": [failover(3, seeds), failover(5, seeds)],
    }
    baseline = throughput(1, simulated)
    replicated = throughput(3, simulated)
    result["throughput"] = {
        "baseline_1_voter": baseline,
        "three_voters": replicated,
        "ratio_3_voters_to_1": round(
            replicated["committed_per_wall_s"] / baseline["committed_per_wall_s"], 3
        ),
    }
    if not quick:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

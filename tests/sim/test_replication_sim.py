"""Partition replication under seeded fault schedules: invariants after every event, then convergence."""

from __future__ import annotations

import pytest

from hotstate.sim.broken_replica import BROKEN_REPLICA_RULES
from hotstate.sim.replication import ReplicationProfile, ReplicationSimFailure, ReplicationWorld, run_seed

SEEDS = 400
CHUNK = 50


@pytest.mark.parametrize("start", range(0, SEEDS, CHUNK), ids=lambda s: f"seeds{s}-{s + CHUNK - 1}")
def test_every_invariant_holds_for_every_seed(start: int) -> None:
    stats = [run_seed(seed) for seed in range(start, start + CHUNK)]
    # The schedules must do real work: acked writes, failovers, snapshots somewhere in the chunk.
    assert sum(s.acked for s in stats) > 100 * CHUNK
    assert sum(s.committed_end for s in stats) > 300 * CHUNK
    assert sum(s.snapshots for s in stats) > 0


@pytest.mark.parametrize("rule", sorted(BROKEN_REPLICA_RULES))
def test_each_broken_rule_is_caught(rule: str) -> None:
    factory = BROKEN_REPLICA_RULES[rule]
    for seed in range(100):
        try:
            run_seed(seed, core_factory=factory)
        except ReplicationSimFailure as failure:
            assert f"--seed {seed} --broken {rule}" in str(failure)
            return
    pytest.fail(f"no seed in 0..99 caught the broken rule {rule!r}")


def test_a_seed_replays_exactly() -> None:
    def trace(seed: int) -> list[str]:
        world = ReplicationWorld(seed, ReplicationProfile.from_seed(seed), trace=True)
        stats = world.run()
        return [*stats.log, f"{stats.acked} {stats.committed_end} {stats.produce_errors} {stats.snapshots}"]

    assert trace(7) == trace(7)
    assert trace(7) != trace(8)

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
    # And reassignments that run to the end, not only their first step: many seeds walk a placement in
    # several steps (add a replica, let it join the ISR, then drop the old copies), some move the active to
    # a replica the move added, and removed replicas are deleted.
    assert sum(1 for s in stats if s.multi_step_moves) >= CHUNK // 5
    assert sum(1 for s in stats if s.active_moves) >= CHUNK // 5
    assert sum(1 for s in stats if s.full_moves) >= 3
    assert sum(s.replicas_removed for s in stats) > CHUNK


def test_a_reassignment_moves_the_active_to_a_new_replica_and_drops_the_old_one() -> None:
    # Seed 38 ends with replicas (1, 2) moving to active 4 with standbys 3 and 2: 3 and 4 are added, join
    # the ISR through the active's own ISR change, then 4 becomes the active and 1 is dropped and deleted.
    world = ReplicationWorld(38, ReplicationProfile.from_seed(38), trace=True)
    stats = world.run()
    assert stats.full_moves >= 1
    assert world.controller.replicas == (4, 3, 2) and world.controller.active == 4
    assert world.nodes[1].core is None and world.nodes[1].disk.end == 0 and world.nodes[1].store.position == 0
    log = "\n".join(stats.log)
    assert "controller reassigns: replicas (1, 4, 3, 2), active 1 epoch 2" in log
    assert "ISR of epoch 2 becomes (1, 4, 3, 2)" in log
    assert "controller reassigns: replicas (4, 3, 2), active 4 epoch 3" in log
    assert "replica 1 removed" in log.split("active 4 epoch 3")[-1]


def test_seeds_without_reassignment_keep_their_replica_set() -> None:
    seed = next(s for s in range(100) if not ReplicationProfile.from_seed(s).reassign_every_ms)
    world = ReplicationWorld(seed, ReplicationProfile.from_seed(seed))
    stats = world.run()
    assert stats.reassign_steps == 0
    assert world.controller.replicas == tuple(range(1, world.profile.replicas + 1))
    # The spare nodes run (and crash) like the others, but never hold anything.
    spares = [n for n in world.nodes.values() if n.id not in world.controller.replicas]
    assert spares and all(n.core is None and n.disk.end == 0 for n in spares)


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
        return [
            *stats.log,
            f"{stats.acked} {stats.committed_end} {stats.produce_errors} {stats.snapshots} "
            f"{stats.reassign_steps} {stats.replicas_removed}",
        ]

    assert trace(7) == trace(7)
    assert trace(7) != trace(8)
    assert trace(38) == trace(38)  # with reassignments

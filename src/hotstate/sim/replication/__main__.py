"""`python -m hotstate.sim.replication --seed N` (one seed, with its event log) or `--seeds N` (many)."""

from __future__ import annotations

import argparse
import sys

import hotstate.sim.replication as replication
from hotstate.replica.core import ReplicaCore
from hotstate.replica.shell import ReplicaShell
from hotstate.sim.replication.profile import ReplicationProfile
from hotstate.sim.replication.world import ReplicationSimFailure, ReplicationWorld, run_seed
from hotstate.sim.soak import soak


def main(argv: list[str] | None = None) -> int:
    from hotstate.sim.broken_replica import BROKEN_REPLICA_RULES, BROKEN_SHELLS

    parser = argparse.ArgumentParser(
        prog="python -m hotstate.sim.replication", description=replication.__doc__
    )
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--seed", type=int)
    group.add_argument("--seeds", type=int)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--broken", choices=sorted(BROKEN_REPLICA_RULES))
    parser.add_argument("--broken-shell", choices=sorted(BROKEN_SHELLS))
    args = parser.parse_args(argv)
    factory = BROKEN_REPLICA_RULES[args.broken] if args.broken else ReplicaCore
    shell = BROKEN_SHELLS[args.broken_shell] if args.broken_shell else ReplicaShell
    if args.seed is not None:
        world = ReplicationWorld(
            args.seed,
            ReplicationProfile.from_seed(args.seed),
            core_factory=factory,
            shell_factory=shell,
            trace=True,
        )
        try:
            stats = world.run()
        except ReplicationSimFailure as failure:
            print("\n".join(world.stats.log[-60:]))
            print(failure, file=sys.stderr)
            return 1
        print("\n".join(stats.log[-30:]))
        print(
            f"seed {args.seed}: ok; {stats.acked} acked writes, {stats.committed_end} records committed, "
            f"{stats.snapshots} snapshots, {stats.produce_errors} produce errors; {stats.moves_done} "
            f"placements reached ({stats.multi_step_moves} in several steps, {stats.full_moves} moving the "
            f"active to a new replica) in {stats.reassign_steps} "
            f"reassignment steps, {stats.active_moves} moving the active, {stats.replicas_removed} replicas "
            f"deleted; {stats.probe_fences} fenced on a refused probe; {stats.queries} queries, "
            f"{stats.answered} answered ({stats.answered_bounded} bounded, {stats.answered_by_standby} by a "
            f"standby, {stats.hedge_won} by a hedge), {stats.unserved} unserved, {stats.lag_unknown} times a "
            f"replica's lag was unknown; {stats.hedged} of {stats.forwards} forwards hedged"
        )
        return 0
    return soak(
        range(args.start, args.start + args.seeds),
        lambda seed: run_seed(seed, core_factory=factory, shell_factory=shell),
    )


if __name__ == "__main__":
    sys.exit(main())

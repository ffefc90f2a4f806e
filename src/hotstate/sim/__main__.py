"""`python -m hotstate.sim`: replay one seed (`--seed N`) or soak many (`--seeds N`)."""

from __future__ import annotations

import argparse
import sys

from hotstate.sim.broken import BROKEN_RULES
from hotstate.sim.runner import run_seed, shape_for
from hotstate.sim.soak import soak
from hotstate.sim.world import SimulationFailure


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m hotstate.sim", description=__doc__)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--seed", type=int, help="replay this one seed, printing its event log")
    group.add_argument("--seeds", type=int, help="run this many seeds (from --start), cycling cluster shapes")
    parser.add_argument("--start", type=int, default=0, help="first seed of a --seeds soak")
    parser.add_argument(
        "--voters", type=int, help="with --seed: number of voters (default: the seed's shape)"
    )
    parser.add_argument("--observers", type=int, help="with --seed: number of observers")
    parser.add_argument("--broken", choices=sorted(BROKEN_RULES), help="run a core with this rule broken")
    args = parser.parse_args(argv)

    if args.seed is not None:
        shape = shape_for(args.seed)
        voters = args.voters if args.voters is not None else shape.voters
        observers = args.observers if args.observers is not None else shape.observers
        try:
            stats = run_seed(args.seed, voters, observers, broken=args.broken, trace=True)
        except SimulationFailure as failure:
            print(failure, file=sys.stderr)
            return 1
        print(
            f"seed {args.seed}: ok; {stats.events} events, {stats.committed} entries committed, "
            f"{stats.elections_won} elections, last epoch {stats.max_epoch}"
        )
        return 0

    def run(seed: int) -> None:
        shape = shape_for(seed)
        run_seed(seed, shape.voters, shape.observers, broken=args.broken)

    return soak(range(args.start, args.start + args.seeds), run)


if __name__ == "__main__":
    sys.exit(main())

"""Runs many seeded schedules and reports the first failure with the command that replays it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from hotstate.raft.node import RaftNode
from hotstate.sim.broken import BROKEN_RULES
from hotstate.sim.profile import FaultProfile
from hotstate.sim.world import RunStats, SimulationFailure, World


def replay_command(seed: int, voters: int, observers: int, broken: str | None) -> str:
    command = f"python -m hotstate.sim --seed {seed} --voters {voters} --observers {observers}"
    return command + (f" --broken {broken}" if broken else "")


def run_seed(
    seed: int, voters: int, observers: int, *, broken: str | None = None, trace: bool = False
) -> RunStats:
    factory: type[RaftNode] = BROKEN_RULES[broken] if broken else RaftNode
    world = World(
        seed,
        FaultProfile.from_seed(seed, voters, observers),
        node_factory=factory,
        replay=replay_command(seed, voters, observers, broken),
        trace=trace,
    )
    return world.run()


@dataclass(frozen=True, slots=True)
class Shape:
    voters: int
    observers: int


# The shapes every batch of seeds cycles through: 3 and 5 voters, with and without observers.
SHAPES = (Shape(3, 0), Shape(3, 1), Shape(5, 0), Shape(5, 2))


def shape_for(seed: int) -> Shape:
    return SHAPES[seed % len(SHAPES)]


def run_seeds(seeds: Iterable[int], *, broken: str | None = None) -> list[RunStats]:
    """Every seed must pass; the first failure raises SimulationFailure."""
    results = []
    for seed in seeds:
        shape = shape_for(seed)
        results.append(run_seed(seed, shape.voters, shape.observers, broken=broken))
    return results


def first_failure(seeds: Iterable[int], *, broken: str | None = None) -> SimulationFailure | None:
    for seed in seeds:
        shape = shape_for(seed)
        try:
            run_seed(seed, shape.voters, shape.observers, broken=broken)
        except SimulationFailure as failure:
            return failure
    return None

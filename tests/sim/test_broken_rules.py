"""The simulator must catch a core that breaks any one safety rule, and replay the failure exactly."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hotstate.sim.broken import BROKEN_RULES
from hotstate.sim.runner import first_failure, run_seed, shape_for
from hotstate.sim.world import SimulationFailure

# Each rule is caught within 200 seeds today (most within a few dozen); the bound leaves room for schedules
# to change.
SEARCH = range(0, 600)


@pytest.mark.parametrize("rule", sorted(BROKEN_RULES))
def test_simulator_catches_the_broken_rule_and_replays_it(rule: str) -> None:
    failure = first_failure(SEARCH, broken=rule)
    assert failure is not None, f"no seed in {SEARCH} caught the broken rule {rule!r}"
    assert f"--broken {rule}" in failure.replay and f"--seed {failure.seed}" in failure.replay
    shape = shape_for(failure.seed)
    with pytest.raises(SimulationFailure) as again:
        run_seed(failure.seed, shape.voters, shape.observers, broken=rule)
    assert (again.value.reason, again.value.event, again.value.time) == (
        failure.reason,
        failure.event,
        failure.time,
    )


def test_the_printed_replay_command_reproduces_the_failure() -> None:
    # A rule caught early in the search (seed 27, at event 990), so the search costs little next to the
    # replay; forget-vote, searched above already, takes some 190 seeds.
    failure = first_failure(SEARCH, broken="skip-own-epoch-rule")
    assert failure is not None
    args = failure.replay.split()[1:]  # drop "python"
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1
    assert failure.reason in done.stderr

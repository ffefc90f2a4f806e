"""A seed is a complete description of a run: same seed, same events, whatever the process."""

from __future__ import annotations

import os
import subprocess
import sys

from hotstate.sim.runner import run_seed


def test_same_seed_same_run() -> None:
    first = run_seed(123, 5, 2)
    second = run_seed(123, 5, 2)
    assert first.log == second.log
    assert (first.events, first.messages, first.committed) == (
        second.events,
        second.messages,
        second.committed,
    )


def test_different_seeds_differ() -> None:
    assert run_seed(1, 3, 0).log != run_seed(2, 3, 0).log


def test_run_does_not_depend_on_hash_randomization() -> None:
    outputs = set()
    for hash_seed in ("0", "1", "12345"):
        env = dict(os.environ, PYTHONHASHSEED=hash_seed)
        done = subprocess.run(
            [sys.executable, "-m", "hotstate.sim", "--seed", "77"],
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
            check=True,
        )
        outputs.add(done.stdout)
    assert len(outputs) == 1

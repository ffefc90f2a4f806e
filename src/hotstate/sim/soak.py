"""The `--seeds N` soak of both simulators' command lines (`python -m hotstate.sim`, `...sim.replication`)."""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

from hotstate.sim.kernel import SimFailure


def soak(seeds: range, run: Callable[[int], object]) -> int:
    """Run every seed, printing each failure (it carries its replay command) and a summary; the exit status.
    A failure does not stop the soak: the summary counts them all."""
    started = time.monotonic()
    failures = 0
    for seed in seeds:
        try:
            run(seed)
        except SimFailure as failure:
            failures += 1
            print(failure, file=sys.stderr)
    print(f"{len(seeds) - failures} passed, {failures} failed ({time.monotonic() - started:.1f} s)")
    return 1 if failures else 0

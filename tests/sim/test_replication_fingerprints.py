"""Seeds' fingerprints: a change of the simulator that should not change behaviour (a refactoring, a move to
a shared shell) must leave them as they were. When one changes on purpose, the commit says why."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from hotstate.sim.replication import ReplicationProfile, ReplicationWorld

FINGERPRINTS = {
    0: "f156a7e341988731",
    1: "280c0a6122dacf3b",
    2: "41d20e810969d9a7",
    3: "feea87b4bcb8b9ac",
    5: "6c81e05f2d6c6e9d",
    7: "a475e1ac6d2aa8fa",
    9: "2fa6507ac4c6169c",
    13: "0cfc5f322ba7ba03",
}


def fingerprint(seed: int) -> str:
    """The run's event log and every counter, hashed."""
    stats = ReplicationWorld(seed, ReplicationProfile.from_seed(seed), trace=True).run()
    counters = sorted((k, v) for k, v in dataclasses.asdict(stats).items() if k != "log")
    text = "\n".join([*stats.log, repr(counters)])
    return hashlib.sha256(text.encode()).hexdigest()[:16]


@pytest.mark.parametrize("seed", sorted(FINGERPRINTS))
def test_a_seed_runs_as_it_did(seed: int) -> None:
    assert fingerprint(seed) == FINGERPRINTS[seed]

"""Seeds' fingerprints: a change of the simulator that should not change behaviour (a refactoring, a move to
a shared shell) must leave them as they were. When one changes on purpose, the commit says why."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from hotstate.sim.replication import ReplicationProfile, ReplicationWorld

# Changed by queries through routing/attempts.py (new query events: the controller's session checks run
# after every event, so its decisions land at other times), then by the replicas' pump becoming the
# servers' own (replica/shell.py): its deferred store write is an event of its own. With the deferral
# turned off, the shell gave exactly the fingerprints the simulator's own pump gave.
FINGERPRINTS = {
    0: "d0805c8da106de3c",
    1: "970a953d945f649a",
    2: "84da504a195706ea",
    3: "2c64bb04a6314a64",
    5: "45059c785c8b7021",
    7: "a9af590a9950dd35",
    9: "f9ef74a224a088b4",
    13: "5f128113b9c359fd",
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

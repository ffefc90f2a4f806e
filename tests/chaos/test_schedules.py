"""A short chaos schedule against real servers in network namespaces: `make test`'s share of `make chaos`.

The seed is fixed so that a failure replays (as far as real processes allow) and chosen so that its one
schedule holds every fault kind: kill, pause, restart, partition (minority, bridge, the metadata leader),
one-way, packet drops and a slow link, each for 2-3 s with 1.5-2.5 s between them."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotstate.chaos.nemesis import KINDS, schedule
from hotstate.chaos.run import RunConfig, run_schedule
from hotstate.chaos.workload import WorkloadConfig

pytestmark = pytest.mark.usefixtures("netns_available")

DURATION_S = 42.0
CONFIG = RunConfig(
    servers=3,
    racks=3,
    duration_s=DURATION_S,
    hold_s=(2.0, 3.0),
    calm_s=(1.5, 2.5),
    workload=WorkloadConfig(partitions=3, standby_replicas=1),
)
SEED = 1847


def test_the_seed_covers_every_fault_kind() -> None:
    steps = schedule(SEED, [1, 2, 3], DURATION_S, hold_s=CONFIG.hold_s, calm_s=CONFIG.calm_s)
    assert {s.kind for s in steps} == set(KINDS)


def test_a_short_schedule_of_every_fault_kind_finds_no_violation(tmp_path: Path) -> None:
    result = run_schedule(SEED, CONFIG, tmp_path)
    print(
        "\n".join(
            f"{f['detail']}: write gap {f['write_gap_s']} s, read gap {f['read_gap_s']} s"
            for f in result["faults"]
        )
    )
    assert result["violations"] == [], result["violations"]
    assert result["ready_after_heal"] and result["converged"]
    assert result["metadata_linearizable"] is True
    assert len(result["faults"]) == 9, result["faults"]
    # Enough happened to mean something: writes acknowledged and reads served through the faults.
    assert result["writes_acked"] >= 100 and result["reads_ok"] >= 200, result
    assert result["metadata_ops"] >= 10

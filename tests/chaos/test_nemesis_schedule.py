"""The nemesis's schedule is a pure function of its seed."""

from __future__ import annotations

import pytest

from hotstate.chaos.nemesis import KINDS, bridge_halves, schedule


def test_the_same_seed_gives_the_same_schedule_and_another_seed_another() -> None:
    assert schedule(7, [1, 2, 3], 120.0) == schedule(7, [3, 2, 1], 120.0)
    assert schedule(7, [1, 2, 3], 120.0) != schedule(8, [1, 2, 3], 120.0)


def test_steps_fit_the_duration_in_order_and_hit_existing_servers() -> None:
    for seed in range(50):
        steps = schedule(seed, [1, 2, 3, 4, 5], 60.0)
        assert steps, seed
        end = 0.0
        for step in steps:
            assert step.at_s >= end and step.at_s + step.hold_s <= 60.0
            end = step.at_s + step.hold_s
            assert set(step.targets) <= {1, 2, 3, 4, 5}
            if step.kind == "partition-minority":
                assert 1 <= len(step.targets) <= 2
            if step.kind == "drop":
                assert len(set(step.targets)) == 2 and step.param in {"20", "40", "60"}


def test_every_kind_appears_over_some_seeds_and_kinds_can_be_chosen() -> None:
    seen = {step.kind for seed in range(30) for step in schedule(seed, [1, 2, 3], 60.0)}
    assert seen == set(KINDS)
    assert {s.kind for s in schedule(1, [1, 2, 3], 60.0, kinds=["kill"])} == {"kill"}
    with pytest.raises(ValueError, match="unknown fault kinds"):
        schedule(1, [1, 2, 3], 60.0, kinds=["meteor"])
    with pytest.raises(ValueError, match="at least 3 servers"):
        schedule(1, [1, 2], 60.0)


def test_a_bridge_leaves_each_half_a_majority_through_the_bridge() -> None:
    assert bridge_halves((2, 3, 1)) == (2, [3], [1])
    bridge, left, right = bridge_halves((3, 5, 1, 4, 2))
    assert bridge == 3 and left == [1, 5] and right == [2, 4]


def test_the_printed_replay_command_repeats_every_option_that_shapes_the_schedule() -> None:
    from hotstate.chaos.run import RunConfig, replay_command

    config = RunConfig(servers=5, racks=3, duration_s=45.0, rack_rate="100mbit", kinds=("kill", "drop"))
    assert replay_command(1042, config) == (
        "python -m hotstate.chaos --schedules 1 --seed 1042 --duration 45 --servers 5 --racks 3 "
        "--rack-rate 100mbit --kinds kill,drop"
    )

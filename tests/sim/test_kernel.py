"""The simulator kernel both simulators run on: event order, seeded streams, the network, the replay."""

from __future__ import annotations

from typing import Any

from hotstate.sim.kernel import DELIVER, TICK, Kernel, Link


def test_events_run_by_time_then_in_the_order_they_were_scheduled() -> None:
    kernel = Kernel(1, "test", "replay me")
    seen: list[tuple[int, int, Any]] = []
    kernel.schedule(5, TICK, 1, "b")
    kernel.schedule(3, TICK, 2, "a")
    kernel.schedule(5, TICK, 3, "c")
    kernel.schedule(9, TICK, 4, "late")
    kernel.run(8, lambda kind, target, payload: seen.append((kernel.now, target, payload)))
    assert seen == [(3, 2, "a"), (5, 1, "b"), (5, 3, "c")]
    assert kernel.events_run == 3


def test_streams_are_named_per_seed_so_a_new_one_changes_no_other() -> None:
    a, b = Kernel(7, "main", ""), Kernel(7, "main", "")
    b.stream("other").random()
    assert [a.rng.random() for _ in range(5)] == [b.rng.random() for _ in range(5)]
    assert Kernel(8, "main", "").rng.random() != Kernel(7, "main", "").rng.random()


def test_the_network_cuts_drops_duplicates_and_delays() -> None:
    kernel = Kernel(3, "net", "")
    arrivals: list[int] = []
    kernel.partition = {1: 0, 2: 1}
    kernel.send(1, 2, DELIVER, 2, "cut", Link(None, None, 0, 0))
    kernel.send(1, 3, DELIVER, 3, "to a node not named: side 0", Link(None, None, 4, 4))
    kernel.send(1, 3, DELIVER, 3, "always dropped", Link(1.0, None, 0, 0))
    kernel.send(1, 3, DELIVER, 3, "twice", Link(0.0, 1.0, 1, 2))
    kernel.run(100, lambda kind, target, payload: arrivals.append(kernel.now))
    assert kernel.cut(1, 2) and not kernel.cut(1, 3)
    assert sorted(arrivals)[-1] == 4 and len(arrivals) == 3
    assert all(1 <= t <= 2 for t in sorted(arrivals)[:2])


def test_a_failure_names_the_seed_time_event_and_replay_command() -> None:
    kernel = Kernel(42, "x", "python -m hotstate.sim --seed 42")
    kernel.schedule(7, TICK, 0, None)
    kernel.run(10, lambda kind, target, payload: None)
    failure = kernel.failure(AssertionError("two leaders"))
    assert (failure.seed, failure.time, failure.event) == (42, 7, 1)
    assert failure.reason == "AssertionError: two leaders"
    assert str(failure).endswith("replay: python -m hotstate.sim --seed 42")

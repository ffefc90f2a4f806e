"""The hedging policy (routing/hedging.py): pure, driven with latencies and forwards."""

from __future__ import annotations

import random

import pytest

from hotstate.routing.hedging import RECOMPUTE_EVERY, HedgeConfig, HedgePolicy, last_if_slow
from hotstate.routing.router import Candidate, Route


def test_a_peer_without_enough_history_gets_the_cap() -> None:
    policy = HedgePolicy(HedgeConfig(delay_cap_ms=150, min_samples=5))
    assert policy.delay_ms(2) == 150
    for _ in range(4):
        policy.observe(2, 1.0)
    assert policy.delay_ms(2) == 150


def test_the_delay_is_the_p95_of_recent_answers_within_floor_and_cap() -> None:
    config = HedgeConfig(delay_floor_ms=10, delay_cap_ms=200, window=100, min_samples=20)
    policy = HedgePolicy(config)
    for i in range(100):
        policy.observe(1, float(i))  # 0..99 ms: p95 is 94
    assert policy.delay_ms(1) == 94
    fast = HedgePolicy(config)
    for _ in range(100):
        fast.observe(1, 0.5)
    assert fast.delay_ms(1) == 10  # the floor
    slow = HedgePolicy(config)
    for _ in range(100):
        slow.observe(1, 900.0)
    assert slow.delay_ms(1) == 200  # the cap


def test_only_the_window_counts_and_the_delay_follows_within_a_few_answers() -> None:
    policy = HedgePolicy(HedgeConfig(window=50, min_samples=10, delay_floor_ms=1, delay_cap_ms=1000))
    for _ in range(50):
        policy.observe(1, 100.0)
    assert policy.delay_ms(1) == 100
    for _ in range(50 + RECOMPUTE_EVERY):
        policy.observe(1, 5.0)
    assert policy.delay_ms(1) == 5


def test_hedges_never_exceed_the_fraction_of_forwards_plus_the_burst() -> None:
    config = HedgeConfig(max_percent=5, burst=3)
    policy = HedgePolicy(config)
    taken = 0
    rng = random.Random(7)
    forwards = 10_000
    for _ in range(forwards):
        policy.forwarded()
        # Every forward is slow and wants a hedge, sometimes two.
        for _ in range(rng.choice([1, 2])):
            taken += policy.take()
    assert taken <= forwards * config.max_percent / 100 + config.burst
    assert taken >= forwards * config.max_percent / 100 - 1  # and the budget is really used
    assert policy.hedges == taken


def test_hedging_off_never_hedges() -> None:
    policy = HedgePolicy(HedgeConfig(max_percent=0))
    policy.observe(1, 1.0)
    assert policy.delay_ms(1) is None


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"delay_floor_ms": 0}, "floor"),
        ({"delay_floor_ms": 300, "delay_cap_ms": 200}, "floor"),
        ({"max_percent": 150}, "percent"),
        ({"min_samples": 500, "window": 100}, "min_samples"),
    ],
)
def test_bad_settings_are_named(fields: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        HedgeConfig(**fields)  # type: ignore[arg-type]


def test_a_peer_with_a_forward_unanswered_past_its_delay_is_slow_until_it_ends() -> None:
    policy = HedgePolicy(HedgeConfig(delay_cap_ms=100))
    request = policy.sent(4, now_ms=1000)
    assert not policy.slow(4, now_ms=1100)  # exactly the delay: not yet
    assert policy.slow(4, now_ms=1101)
    assert not policy.slow(5, now_ms=1101)
    policy.done(4, request, now_ms=1500, answered=False)
    assert not policy.slow(4, now_ms=1600)


def test_slow_peers_go_last_in_a_route_never_dropped() -> None:
    candidates = (Candidate(1, "active", 0), Candidate(2, "standby", 3), Candidate(3, "standby", 5))
    route = Route("t", 0, candidates, ())
    assert last_if_slow(route, lambda node: False) is route
    reordered = last_if_slow(route, lambda node: node == 1)
    assert [c.node_id for c in reordered.candidates] == [2, 3, 1]
    everyone = last_if_slow(route, lambda node: True)
    assert [c.node_id for c in everyone.candidates] == [1, 2, 3]


def test_a_slow_live_peer_still_comes_before_the_peers_down_by_heartbeats() -> None:
    candidates = (
        Candidate(1, "active", 0),
        Candidate(2, "standby", 3),
        Candidate(3, "standby", 5, down=True),
        Candidate(4, "standby", 6, down=True),
    )
    route = Route("t", 0, candidates, ())
    reordered = last_if_slow(route, lambda node: node in (1, 3))
    assert [(c.node_id, c.down) for c in reordered.candidates] == [
        (2, False),
        (1, False),
        (4, True),
        (3, True),
    ]

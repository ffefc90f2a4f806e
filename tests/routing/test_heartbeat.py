"""HeartbeatStatus, one rule per test, driven by a tiny simulation: arrivals and fixed-rate checks."""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotstate.routing.heartbeat import HeartbeatConfig, HeartbeatStatus, PeerStatus

SELF, PEER = 1, 2
CONFIG = HeartbeatConfig()
SEND = CONFIG.send_interval_ms
CHECK = CONFIG.check_interval_ms
MISSED = CONFIG.missed_threshold

Transition = tuple[int, int, bool]  # (check time, peer, alive after)


def simulate(
    arrivals: Iterable[tuple[int, int]],
    until_ms: int,
    *,
    peers: Sequence[int] = (PEER,),
    config: HeartbeatConfig = CONFIG,
    start_ms: int = 0,
) -> tuple[HeartbeatStatus, list[Transition]]:
    """Checks at the fixed rate `next_check_ms` gives; arrivals at or before a check are seen by it."""
    status = HeartbeatStatus(SELF, config, start_ms)
    status.set_peers(peers, start_ms)
    pending = sorted(arrivals)
    transitions: list[Transition] = []
    i = 0
    while (now := status.next_check_ms()) <= until_ms:
        while i < len(pending) and pending[i][0] <= now:
            status.received(pending[i][1], pending[i][0])
            i += 1
        before = {p: status.alive(p) for p in peers}
        status.check(now)
        transitions += [(now, p, status.alive(p)) for p in peers if status.alive(p) != before[p]]
    return status, transitions


def beats(start: int, stop: int, step: int = SEND, peer: int = PEER) -> list[tuple[int, int]]:
    return [(t, peer) for t in range(start, stop, step)]


def first_check_at_or_after(t: int, start_ms: int = 0) -> int:
    return start_ms + -(-(t - start_ms) // CHECK) * CHECK


# ---------------------------------------------------------------------- config


def test_defaults_are_ksqldbs() -> None:
    assert (SEND, CHECK, CONFIG.window_ms, MISSED, CONFIG.received_threshold) == (100, 200, 2000, 3, 2)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"send_interval_ms": 0},
        {"check_interval_ms": -1},
        {"missed_threshold": 0},
        {"received_threshold": 0},
        {"window_ms": 250},  # two slots: a run of three missed could never be seen
    ],
)
def test_bad_config_is_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError):
        HeartbeatConfig(**kwargs)


# ---------------------------------------------------------------------- staying up, going down


@pytest.mark.parametrize("phase", [0, 1, 37, 99])
def test_regular_heartbeats_keep_a_peer_up(phase: int) -> None:
    status, transitions = simulate(beats(phase, 20_000), 20_000)
    assert transitions == []
    assert status.alive(PEER)


@pytest.mark.parametrize("phase", [0, 13, 50, 99])
@pytest.mark.parametrize("kill_at", [5_000, 5_001, 5_099, 5_150])
def test_a_killed_peer_is_down_by_the_first_check_after_missed_threshold_slots(
    phase: int, kill_at: int
) -> None:
    arrivals = beats(phase, kill_at + 1)
    last = arrivals[-1][0]
    status, transitions = simulate(arrivals, 10_000)
    assert len(transitions) == 1
    down_at, peer, alive = transitions[0]
    assert (peer, alive) == (PEER, False)
    # Exactly the first check with `missed_threshold` empty slots behind it ...
    assert down_at == first_check_at_or_after(last + MISSED * SEND)
    # ... which is within the KLIP-12 budget: 3 send intervals plus one check interval, under a second.
    assert down_at - kill_at <= MISSED * SEND + CHECK < 1_000
    assert status.status()[PEER] == PeerStatus(False, down_at, last)


@pytest.mark.parametrize("dropped", [1, MISSED - 1])
@pytest.mark.parametrize("phase", range(0, 100, 7))
def test_fewer_missed_heartbeats_than_the_threshold_do_not_mark_a_peer_down(dropped: int, phase: int) -> None:
    drop = {5_000 + phase + i * SEND for i in range(dropped)}
    arrivals = [(t, p) for t, p in beats(phase, 10_000) if t not in drop]
    assert len(arrivals) == len(beats(phase, 10_000)) - dropped
    _, transitions = simulate(arrivals, 10_000)
    assert transitions == []


def test_missed_slots_must_be_consecutive() -> None:
    # Every other heartbeat lost for ten seconds: half the slots missed, never two in a row.
    _, transitions = simulate(beats(0, 10_000, 2 * SEND), 10_000)
    assert transitions == []


def test_silence_from_the_start_marks_a_listed_peer_down() -> None:
    _, transitions = simulate([], 2_000)
    assert transitions == [(first_check_at_or_after(MISSED * SEND), PEER, False)]


# ---------------------------------------------------------------------- coming back


def down_peer(until: int = 1_000) -> tuple[HeartbeatStatus, int]:
    """A peer that heartbeat until 450 and then went silent: down at 800."""
    status, transitions = simulate(beats(50, 500), until)
    assert transitions == [(800, PEER, False)]
    return status, 800


def test_a_down_peer_comes_back_only_after_received_threshold_consecutive_slots() -> None:
    status, _ = down_peer(3_000)
    status.received(PEER, 3_150)
    status.check(3_200)  # (3100, 3200] received: one slot
    assert not status.alive(PEER)
    status.received(PEER, 3_250)
    status.check(3_400)  # (3200, 3300] received, (3300, 3400] missed: the run is broken
    assert not status.alive(PEER)
    status.received(PEER, 3_450)
    status.received(PEER, 3_550)
    status.check(3_600)  # (3400, 3500] and (3500, 3600] received: two in a row
    assert status.alive(PEER)
    assert status.status()[PEER] == PeerStatus(True, 3_600, 3_550)


def test_a_peer_heartbeating_too_sparsely_stays_down() -> None:
    # Hysteresis: one heartbeat per 250 ms never misses three slots in a row (an up peer stays up) but
    # never fills two slots in a row either (a down peer stays down).
    arrivals = beats(50, 500) + beats(2_050, 10_000, 250)
    _, transitions = simulate(arrivals, 10_000)
    assert transitions == [(800, PEER, False)]
    _, transitions = simulate(beats(0, 10_000, 250), 10_000)
    assert transitions == []


def test_last_status_update_changes_only_when_the_flag_flips() -> None:
    status, down_at = down_peer(3_000)
    status.check(3_200)
    assert status.status()[PEER].last_status_update_ms == down_at
    status, transitions = simulate(beats(0, 3_000), 3_000)
    assert transitions == []
    assert status.status()[PEER].last_status_update_ms == 0


# ---------------------------------------------------------------------- jitter


@settings(max_examples=100, deadline=None)
@given(
    phase=st.integers(0, 200),
    gaps=st.lists(st.integers(95, 130), min_size=50, max_size=150),
)
def test_jittered_arrivals_do_not_flap(phase: int, gaps: list[int]) -> None:
    times = [phase]
    for gap in gaps:
        times.append(times[-1] + gap)
    _, transitions = simulate([(t, PEER) for t in times], times[-1])
    assert transitions == []


def test_jitter_then_death_is_still_detected_in_time() -> None:
    rng = random.Random(7)
    times = [0]
    while times[-1] < 10_000:
        times.append(times[-1] + rng.randint(95, 130))
    _, transitions = simulate([(t, PEER) for t in times], 12_000)
    assert len(transitions) == 1
    assert transitions[0][0] - times[-1] <= MISSED * SEND + CHECK


# ---------------------------------------------------------------------- membership


def test_a_newly_listed_peer_starts_alive_and_gets_missed_threshold_slots_to_prove_it() -> None:
    status = HeartbeatStatus(SELF, CONFIG, 0)
    status.set_peers([PEER], 0)
    for now in range(200, 2_001, 200):
        status.check(now)  # the peer heartbeats regularly from 0
    status.set_peers([PEER, 3], 1_050)
    assert status.status()[3] == PeerStatus(True, 1_050, None)
    status.check(1_200)  # slots before 1050 are not held against it: only one missed since
    assert status.alive(3)
    status.check(1_400)  # (1100, 1400]: three missed slots, all observed while listed
    assert not status.alive(3)
    assert status.status()[3] == PeerStatus(False, 1_400, None)


def test_unlisted_peers_are_dropped_and_relisted_ones_start_afresh() -> None:
    status, _ = down_peer()
    status.set_peers([PEER, 3], 1_000)
    status.set_peers([3], 1_100)
    assert PEER not in status.status()
    assert not status.alive(PEER)
    assert not status.received(PEER, 1_150)  # heartbeats from an unlisted server are ignored
    status.set_peers([PEER, 3], 1_200)
    assert status.status()[PEER] == PeerStatus(True, 1_200, None)


def test_self_is_always_alive_and_never_a_peer() -> None:
    status = HeartbeatStatus(SELF, CONFIG, 10)
    status.set_peers([SELF, PEER], 10)
    status.check(5_000)
    assert status.alive(SELF)
    assert not status.alive(PEER)
    assert not status.alive(99)  # not listed: not routable
    assert status.status() == {SELF: PeerStatus(True, 10, None), PEER: PeerStatus(False, 5_000, None)}


def test_next_check_is_one_interval_after_the_last() -> None:
    status = HeartbeatStatus(SELF, CONFIG, 1_000)
    assert status.next_check_ms() == 1_000 + CHECK
    status.check(1_234)
    assert status.next_check_ms() == 1_234 + CHECK


# ---------------------------------------------------------------------- the receiver's own clock


def test_a_receiver_pause_marks_peers_down_until_received_threshold_slots_after_it() -> None:
    # Chosen behaviour: this server was paused from 5000 to 10000. On resume it reads the backlog of
    # heartbeats at once (one arrival time), but its first check runs before: the peer looks silent for
    # five seconds and is marked down. It is up again once two slots after the pause have heartbeats.
    status = HeartbeatStatus(SELF, CONFIG, 0)
    status.set_peers([PEER], 0)
    for now in range(200, 5_001, 200):
        for t in range(now - 150, now, SEND):
            status.received(PEER, t)
        status.check(now)
    assert status.alive(PEER)
    status.check(10_000)
    assert not status.alive(PEER)
    for _ in range(50):
        status.received(PEER, 10_001)  # the backlog, all read at once
    status.received(PEER, 10_080)
    status.check(10_100)  # (10000, 10100] received, but (9900, 10000] missed
    assert not status.alive(PEER)
    status.received(PEER, 10_180)
    status.check(10_200)
    assert status.alive(PEER)
    assert status.status()[PEER] == PeerStatus(True, 10_200, 10_180)


def test_arrival_times_going_backwards_are_taken_as_the_last_one() -> None:
    status = HeartbeatStatus(SELF, CONFIG, 0)
    status.set_peers([PEER], 0)
    status.received(PEER, 500)
    status.received(PEER, 400)
    assert status.status()[PEER].last_heartbeat_ms == 500


def test_memory_is_bounded_however_fast_a_peer_sends() -> None:
    status = HeartbeatStatus(SELF, CONFIG, 0)
    status.set_peers([PEER], 0)
    for t in range(0, 10_000):
        status.received(PEER, t)
    arrivals = status._peers[PEER].arrivals  # white-box: the bound is the point of this test
    assert len(arrivals) <= 2 * CONFIG.window_ms // SEND + 2
    status.check(10_000)
    assert status.alive(PEER)


def test_arrivals_older_than_the_window_are_dropped() -> None:
    status = HeartbeatStatus(SELF, CONFIG, 0)
    status.set_peers([PEER], 0)
    for t in range(0, 1_000, SEND):
        status.received(PEER, t)
    status.check(10_000)
    assert len(status._peers[PEER].arrivals) == 0  # white-box, as above
    assert status.status()[PEER].last_heartbeat_ms == 900


# ---------------------------------------------------------------------- determinism

events = st.lists(
    st.tuples(st.integers(0, 5_000), st.sampled_from([2, 3, 4])),
    max_size=120,
)


def replay(arrivals: list[tuple[int, int]], checks: list[int], shift: int = 0) -> list[dict[int, PeerStatus]]:
    status = HeartbeatStatus(SELF, CONFIG, shift)
    status.set_peers([2, 3, 4], shift)
    seen = []
    pending = sorted(arrivals)
    i = 0
    for now in sorted(checks):
        while i < len(pending) and pending[i][0] <= now:
            status.received(pending[i][1], pending[i][0] + shift)
            i += 1
        status.check(now + shift)
        seen.append(status.status())
    return seen


@settings(max_examples=150, deadline=None)
@given(
    arrivals=events,
    checks=st.lists(st.integers(0, 5_000), min_size=1, max_size=40),
    shift=st.integers(1, 10**9),
)
def test_decisions_depend_only_on_arrival_times_and_now(
    arrivals: list[tuple[int, int]], checks: list[int], shift: int
) -> None:
    first = replay(arrivals, checks)
    assert replay(arrivals, checks) == first  # same inputs, same outputs
    # Only relative times matter: shifting every time by the same amount shifts the timestamps only.
    shifted = replay(arrivals, checks, shift)
    for mine, theirs in zip(first, shifted, strict=True):
        assert {n: s.alive for n, s in mine.items()} == {n: s.alive for n, s in theirs.items()}
        assert {n: s.last_status_update_ms + shift for n, s in mine.items()} == {
            n: s.last_status_update_ms for n, s in theirs.items()
        }


# ---------------------------------------------------------------------- against a naive model


def naive_alive(
    config: HeartbeatConfig, arrivals: list[int], checks: list[int], listed_at: int = 0
) -> list[bool]:
    """The rule as stated, keeping every arrival: the status after each check."""
    step = config.send_interval_ms
    alive, out = True, []
    for now in checks:
        slots = [now - k * step for k in range(config.window_ms // step, 0, -1)]
        missed = received = 0
        for start in slots:
            if start < listed_at:
                continue
            if any(start < t <= start + step for t in arrivals if t > now - config.window_ms):
                received, missed = received + 1, 0
            else:
                missed, received = missed + 1, 0
        if alive and missed >= config.missed_threshold:
            alive = False
        elif not alive and received >= config.received_threshold:
            alive = True
        out.append(alive)
    return out


@settings(max_examples=200, deadline=None)
@given(
    send=st.integers(20, 100),
    slots=st.integers(3, 8),
    missed=st.integers(1, 3),
    received=st.integers(1, 3),
    gaps=st.lists(st.integers(0, 250), max_size=80),
    check_every=st.integers(10, 150),
)
def test_matches_the_rule_applied_to_every_arrival(
    send: int, slots: int, missed: int, received: int, gaps: list[int], check_every: int
) -> None:
    config = HeartbeatConfig(send, check_every, send * slots, missed, received)
    arrivals, t = [], 0
    for gap in gaps:
        t += gap
        arrivals.append(t)
    checks = list(range(check_every, t + 4 * send * slots, check_every))
    status = HeartbeatStatus(SELF, config, 0)
    status.set_peers([PEER], 0)
    got, i = [], 0
    for now in checks:
        while i < len(arrivals) and arrivals[i] <= now:
            status.received(PEER, arrivals[i])
            i += 1
        status.check(now)
        got.append(status.alive(PEER))
    assert got == naive_alive(config, arrivals, checks)


# ---------------------------------------------------------------------- version


@pytest.mark.parametrize("seed", range(20))
def test_the_version_changes_exactly_when_an_answer_of_alive_may_change(seed: int) -> None:
    """Readers keep routes made from `alive` while the version stays: it must move with every flip (and
    with the list of peers), and only then, or kept routes would never be reused."""
    rng = random.Random(seed)
    status = HeartbeatStatus(SELF, CONFIG, 0)
    status.set_peers((2, 3), 0)
    version = status.version
    status.set_peers((3, 2), 0)  # the same peers
    assert status.version == version
    for now in range(0, 6_000, 50):
        for peer in (2, 3):
            if rng.random() < (0.9 if (now // 1_000 + peer) % 2 else 0.05):
                status.received(peer, now)
        if now % CHECK == 0:
            before = {p: status.alive(p) for p in (2, 3)}
            status.check(now)
            flipped = any(status.alive(p) != before[p] for p in (2, 3))
            assert (status.version != version) == flipped
            version = status.version
    status.set_peers((2,), 6_000)
    assert status.version != version

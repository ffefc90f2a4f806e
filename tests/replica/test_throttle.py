"""The move throttle's token bucket (replica/throttle.py), on a clock the test moves."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotstate.replica.throttle import TokenBucket


def test_a_full_bucket_lets_a_burst_through_then_makes_the_debt_wait_at_the_rate() -> None:
    bucket = TokenBucket(1000, 500, now_ms=0)  # 1,000 bytes/s
    assert bucket.wait_ms(0) == 0
    bucket.charge(500, 0)
    assert bucket.wait_ms(0) == 0  # empty, not in debt
    bucket.charge(250, 0)
    assert bucket.wait_ms(0) == 250 and bucket.wait_ms(100) == 150 and bucket.wait_ms(250) == 0
    assert bucket.tokens(1250) == 500  # never more than the burst


def test_the_clock_going_back_changes_nothing() -> None:
    bucket = TokenBucket(1000, 500, now_ms=100)
    bucket.charge(600, 100)
    assert bucket.wait_ms(50) == 100


def test_a_rate_or_burst_of_zero_is_refused() -> None:
    with pytest.raises(ValueError):
        TokenBucket(0, 10, 0)
    with pytest.raises(ValueError):
        TokenBucket(10, 0, 0)


@settings(max_examples=200, deadline=None)
@given(
    rate=st.integers(1, 10_000_000),
    burst=st.integers(1, 10_000_000),
    answers=st.lists(st.tuples(st.integers(0, 5_000_000), st.integers(0, 2_000)), min_size=1, max_size=40),
)
def test_a_client_that_waits_as_told_never_exceeds_rate_times_time_plus_burst_plus_one_answer(
    rate: int, burst: int, answers: list[tuple[int, int]]
) -> None:
    bucket = TokenBucket(rate, burst, now_ms=0)
    now = 0
    sent = 0
    for size, pause in answers:
        now += bucket.wait_ms(now)  # the request goes only when told it may
        assert bucket.wait_ms(now) == 0
        # Everything before this request went through by `now`: within the bound.
        assert sent <= rate * now / 1000 + burst + 1e-6 * max(1, sent)
        bucket.charge(size, now)
        sent += size
        now += pause

"""Rates from sampled totals (server/console/rates.py)."""

from __future__ import annotations

import pytest

from hotstate.server.console.rates import RateWindow, WriteTotals


def test_a_rate_is_the_growth_over_the_window_and_tables_add_up() -> None:
    window = RateWindow(10_000)
    assert window.per_second() is None
    window.add(0, {"a": 0})
    assert window.per_second() is None and window.span_ms() == 0
    window.add(1_000, {"a": 50})
    assert window.per_second() == {"a": 50.0}
    # A table first seen later started from nothing; both cover the same span.
    window.add(2_000, {"a": 100, "b": 40})
    assert window.per_second() == {"a": 50.0, "b": 20.0}
    for t in range(3_000, 15_000, 1_000):
        window.add(t, {"a": 100, "b": 40})
    assert window.per_second() == {"a": 0.0, "b": 0.0}
    assert window.span_ms() == 10_000


def test_a_total_that_falls_starts_the_window_over() -> None:
    window = RateWindow(10_000)
    window.add(0, {"q": 100})
    window.add(1_000, {"q": 200})
    window.add(2_000, {"q": 5})  # reset: no negative rate
    assert window.per_second() is None
    window.add(2_000, {"q": 10})  # the clock did not move: ignored
    window.add(3_000, {"q": 25})
    assert window.per_second() == {"q": 20.0}
    with pytest.raises(ValueError):
        RateWindow(0)


def test_writes_count_only_between_samples_that_both_saw_the_partition_active_here() -> None:
    totals = WriteTotals()
    totals.observe({("t", 0): 100})
    assert totals.totals == {"t": 0}
    totals.observe({("t", 0): 130, ("t", 1): 5_000})  # partition 1 just became active here
    assert totals.totals == {"t": 30}
    totals.observe({("t", 1): 5_010})  # partition 0 moved away
    totals.observe({("t", 0): 900, ("t", 1): 5_020})  # and back: its jump is no write
    assert totals.totals == {"t": 50}
    totals.forget("t")
    assert totals.totals == {}

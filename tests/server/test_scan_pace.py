"""ScanPace: the slices a scan feeds its program, sized from the last slice's time per row."""

from __future__ import annotations

import pytest

from hotstate.server.scan_pace import FIRST_SLICE_ROWS, ScanPace


def test_the_first_slice_is_small_then_cheap_rows_fill_the_chunk() -> None:
    pace = ScanPace(256, 0.001)
    chunk = list(range(1000))
    pieces = pace.slices(chunk)
    first = next(pieces)
    assert first == chunk[:FIRST_SLICE_ROWS]
    pace.took(len(first), len(first) * 1e-6)  # 1 us a row: 1,000 rows fit a step, the chunk's cap holds
    assert next(pieces) == chunk[FIRST_SLICE_ROWS : FIRST_SLICE_ROWS + 256]


def test_costly_rows_shrink_the_slice_down_to_one_row() -> None:
    pace = ScanPace(256, 0.001)
    pace.took(8, 0.008)  # 1 ms a row: one row a step
    assert pace.rows == 1
    pace.took(1, 0.017)  # 17 ms for the one: never fewer than one
    assert pace.rows == 1
    pace.took(1, 0.0001)  # cheap again: back up at once
    assert pace.rows == 10


def test_a_slice_under_the_clocks_grain_counts_as_cheap() -> None:
    pace = ScanPace(50, 0.001)
    pace.took(8, 0.0)
    assert pace.rows == 50
    pace.took(0, 1.0)  # an empty slice says nothing
    assert pace.rows == 50


def test_the_slices_cover_the_chunk_in_order_whatever_the_sizes_between() -> None:
    pace = ScanPace(256, 0.001)
    chunk = list(range(100))
    seen: list[int] = []
    for n, piece in enumerate(pace.slices(chunk)):
        seen.extend(piece)
        pace.took(len(piece), len(piece) * (0.0003 if n % 2 else 0.0001))
    assert seen == chunk


def test_a_chunk_that_fits_is_handed_on_whole() -> None:
    pace = ScanPace(256, 0.001)
    pace.took(8, 0.0)
    chunk = list(range(200))
    assert [p is chunk for p in pace.slices(chunk)] == [True]


def test_a_slice_holds_at_least_one_row() -> None:
    with pytest.raises(ValueError, match="at least one row"):
        ScanPace(0, 0.001)

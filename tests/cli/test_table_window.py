"""`hotstate table describe` shows a windowed table's window as GET /v1/tables gives it."""

from __future__ import annotations

from hotstate.cli.table import window_text


def test_a_window_is_shown_with_its_kind_sizes_and_bounds() -> None:
    hopping = {"column": "window", "kind": "HOPPING", "size_us": 600_000_000, "slide_us": 300_000_000}
    assert window_text(hopping | {"retention_us": 7_200_000_000}) == (
        "HOPPING size 10 min slide 5 min retention 2 h, of column window (key columns WINDOWSTART, WINDOWEND)"
    )
    tumbling = {"column": "w", "kind": "TUMBLING", "size_us": 90_000_000, "slide_us": 90_000_000}
    assert window_text(tumbling).startswith("TUMBLING size 90 s, of column w")
    session = {"column": "session_window", "kind": "SESSION", "size_us": None, "slide_us": None}
    assert window_text(session).startswith("SESSION, of column session_window")

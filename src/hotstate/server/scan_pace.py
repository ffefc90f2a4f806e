"""How many rows a scan reads and hands its program at a time.

A row's cost is what the query and the row make it: a count reads a key in a microsecond, a WHERE that
rewrites a 100 kB string takes milliseconds, and reading 256 rows of 120 kB from RocksDB takes 33 ms. A
fixed chunk between two reads of the clock lets a step of costly rows run for a whole chunk (256 rows of 17
ms each: four seconds of an event loop that also answers lookups and heartbeats), so the scan reads and
feeds slices sized from the last slice's time per row, down to one row: a step then overruns
`query.scan.step.ms` by at most a row's time. Pure: the caller times each slice and says how long it took.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Final, TypeVar

# The first slice of a scan is one row: its rows' cost is not known yet. With a first slice of 8 rows that
# cost 17 ms each, the loop's longest wait during the scan was 167 ms; with one row, 56 ms (measured
# in-process, 2 cores, the chunks then still read 256 rows at a time).
FIRST_SLICE_ROWS: Final = 1

T = TypeVar("T")


class ScanPace:
    """Slices of at most `most` rows, each sized so that it takes about `step_s` at the time per row the
    last slice took."""

    def __init__(self, most: int, step_s: float) -> None:
        if most < 1:
            raise ValueError(f"a slice holds at least one row, not {most}")
        self.most = most
        self.step_s = step_s
        self.rows = min(most, FIRST_SLICE_ROWS)

    def slices(self, chunk: list[T]) -> Iterator[list[T]]:
        """`chunk` in slices of the size current when each is taken (`took` between two changes it)."""
        if len(chunk) <= self.rows:
            yield chunk
            return
        at = 0
        while at < len(chunk):
            piece = chunk[at : at + self.rows]
            yield piece
            at += len(piece)

    def took(self, rows: int, seconds: float) -> None:
        """The last slice of `rows` rows took `seconds`: the next one is sized from it."""
        if rows < 1:
            return
        if seconds <= 0.0:  # under the clock's grain: as cheap as rows come
            self.rows = self.most
            return
        self.rows = max(1, min(self.most, int(rows * self.step_s / seconds)))

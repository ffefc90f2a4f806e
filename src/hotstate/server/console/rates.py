"""Query and write rates for the console (`GET /v1/rates`), from samples of totals the server keeps.

Pure: the shell (server/console/feed.py) samples about once a second, off the query path: the queries
counter of `/metrics`, and the log end of each partition this server is the active of. `WriteTotals`
turns those log ends into a growing count of records written per table (a partition counts only between
two samples that both saw it active here, so an active arriving or leaving is no burst of writes), and
`RateWindow` gives totals' growth per second over the last few samples.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping


class RateWindow:
    """Growth per second of named totals over the last `window_ms`, from (time, totals) samples.

    One window for several totals (a table each), so their rates cover the same span and add up: a name
    missing from a sample counts as 0 there (a table seen for the first time started from nothing)."""

    def __init__(self, window_ms: int) -> None:
        if window_ms <= 0:
            raise ValueError(f"a rate window is longer than 0 ms, not {window_ms}")
        self.window_ms = window_ms
        self._samples: deque[tuple[int, dict[str, float]]] = deque()

    def add(self, now_ms: int, totals: Mapping[str, float]) -> None:
        samples = self._samples
        if samples and now_ms <= samples[-1][0]:
            return  # the clock did not move: nothing to measure against
        last = samples[-1][1] if samples else {}
        if any(total < last.get(name, 0) for name, total in totals.items()):
            samples.clear()  # a total was reset (they never fall otherwise): start over
        samples.append((now_ms, dict(totals)))
        # Keep one sample at or before the window's start, so the window is covered whole.
        while len(samples) > 2 and samples[1][0] <= now_ms - self.window_ms:
            samples.popleft()

    def per_second(self) -> dict[str, float] | None:
        """Each name of the newest sample with its rate; None until two samples are apart in time."""
        if len(self._samples) < 2:
            return None
        (t0, first), (t1, last) = self._samples[0], self._samples[-1]
        return {name: (total - first.get(name, 0)) * 1000.0 / (t1 - t0) for name, total in last.items()}

    def span_ms(self) -> int:
        """How much time the rates cover (0 without rates)."""
        if len(self._samples) < 2:
            return 0
        return self._samples[-1][0] - self._samples[0][0]


PartitionKey = tuple[str, int]  # (table name, partition)


class WriteTotals:
    """Records written per table on this server's actives, from successive samples of their log ends."""

    def __init__(self) -> None:
        self.totals: dict[str, int] = {}
        self._ends: dict[PartitionKey, int] = {}

    def observe(self, active_ends: Mapping[PartitionKey, int]) -> None:
        """`active_ends`: the log end of every partition this server is the active of now."""
        for key, end in active_ends.items():
            previous = self._ends.get(key)
            table = key[0]
            self.totals.setdefault(table, 0)
            if previous is not None and end > previous:
                self.totals[table] += end - previous
        self._ends = dict(active_ends)

    def forget(self, table: str) -> None:
        """Drop a deleted table's total."""
        self.totals.pop(table, None)

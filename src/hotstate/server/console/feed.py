"""What the console shows that no other part of the server keeps: recent events and rates (asyncio shell).

Fed by the metadata publisher (every new image, diffed against the last one by console/events.py), by the
Raft driver (leader changes), and by a once-a-second tick that reads peers' heartbeat status, the queries
counter and the log ends of this server's actives (console/rates.py). Events are recorded only once this
server's image has caught up since it started: replaying an old metadata log is no news, and its times
would be wrong.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from hotstate.controller.image import MetadataImage
from hotstate.server.console.events import EventLog, image_events, leader_events, liveness_events
from hotstate.server.console.rates import RateWindow, WriteTotals
from hotstate.server.http.metrics import Metrics
from hotstate.server.liveness import Liveness
from hotstate.server.raft_driver import monotonic_ms

EVENTS_KEPT = 500
SAMPLE_INTERVAL_S = 1.0
RATE_WINDOW_MS = 10_000


def wall_ms() -> int:
    return int(time.time() * 1000)


@dataclass(frozen=True, slots=True)
class Rates:
    queries_per_s: float | None  # pull queries received over HTTP, every outcome
    rows_written_per_s: float | None  # records appended to the partitions this server is the active of
    tables: dict[str, float]  # rows_written_per_s by table
    window_s: float  # how much time the rates cover (0: none yet)


class ConsoleFeed:
    def __init__(
        self,
        node_id: int,
        *,
        image: Callable[[], MetadataImage],
        caught_up: Callable[[], bool],
        liveness: Liveness | None,
        replica_ends: Callable[[], tuple[tuple[int, int, int], ...]],
        metrics: Metrics,
    ) -> None:
        self.node_id = node_id
        self.events = EventLog(EVENTS_KEPT)
        self._image = image
        self._caught_up = caught_up
        self._liveness = liveness
        self._replica_ends = replica_ends
        self._metrics = metrics
        self._last_image = image()
        self._last_leader: int | None = None
        self._alive: dict[int, bool] = {}
        self._queries = RateWindow(RATE_WINDOW_MS)
        self._writes = RateWindow(RATE_WINDOW_MS)
        self._write_totals = WriteTotals()

    # ------------------------------------------------------------------ inputs
    def on_image(self, image: MetadataImage, entries: Sequence[object]) -> None:
        before, self._last_image = self._last_image, image
        if self._caught_up():
            self.events.record(image_events(before, image), wall_ms(), image.offset)

    def on_leader(self, leader_id: int | None, epoch: int) -> None:
        drafts = leader_events(self._last_leader, leader_id, epoch)
        if leader_id is not None:
            self._last_leader = leader_id
        self.events.record(drafts, wall_ms())

    async def run(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    def sample(self) -> None:
        now = monotonic_ms()
        image = self._image()
        if self._liveness is not None:
            peers = self._liveness.status.status()
            alive = {n: s.alive for n, s in peers.items() if n in image.servers}
            if self._caught_up():
                self.events.record(liveness_events(self._alive, alive), wall_ms())
            self._alive = alive
        self._queries.add(now, {"queries": _counter_total(self._metrics)})
        names = {t.table_id: t.name for t in image.tables.values()}
        ends: dict[tuple[str, int], int] = {}
        for table_id, partition, end in self._replica_ends():
            parts = image.partitions.get(table_id, ())
            name = names.get(table_id)
            if name is not None and partition < len(parts) and parts[partition].active == self.node_id:
                ends[(name, partition)] = end
        totals = self._write_totals
        totals.observe(ends)
        for gone in [t for t in totals.totals if t not in image.tables]:
            totals.forget(gone)
        self._writes.add(now, totals.totals)

    # ------------------------------------------------------------------ outputs
    def rates(self) -> Rates:
        queries = self._queries.per_second()
        tables = self._writes.per_second()
        return Rates(
            None if queries is None else queries["queries"],
            None if tables is None else sum(tables.values()),
            dict(sorted(tables.items())) if tables is not None else {},
            self._queries.span_ms() / 1000,
        )


def _counter_total(metrics: Metrics) -> float:
    return sum(
        sample.value
        for family in metrics.queries.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    )

"""The asyncio shell of failure detection and lag reporting (KLIP-12, KIP-535).

Every `heartbeat.send.interval.ms` this server sends a heartbeat to every other registered server; every
`heartbeat.check.interval.ms` the pure `HeartbeatStatus` decides each peer's status from the arrival times
on this server's clock. Every `lag.reporting.send.interval.ms` it sends the LagInfo of its local replicas
to every live peer and keeps the newest report of each peer in the `LagTable` the router reads.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from hotstate.controller.image import MetadataImage
from hotstate.replica.messages import Heartbeat, LagInfo, LagReport
from hotstate.routing.heartbeat import HeartbeatStatus, LivenessConfig
from hotstate.routing.lags import LagTable
from hotstate.server.raft_driver import monotonic_ms

log = logging.getLogger(__name__)


class Liveness:
    def __init__(
        self,
        node_id: int,
        config: LivenessConfig,
        *,
        send: Callable[[int, object], object],
        local_lags: Callable[[], list[LagInfo]],
        lags: LagTable | None = None,
    ) -> None:
        """`lags`: the table to keep the reports in, shared with the replicas that judge their lag by it."""
        self.node_id = node_id
        self.config = config
        self._send = send
        self._local_lags = local_lags
        now = monotonic_ms()
        self.status = HeartbeatStatus(node_id, config.heartbeat, now)
        self.lags = LagTable() if lags is None else lags
        self._peers: tuple[int, ...] = ()
        self._tasks: list[asyncio.Task[None]] = []
        self._was_alive: dict[int, bool] = {}

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._heartbeats(), name="heartbeats"),
            asyncio.create_task(self._checks(), name="heartbeat-checks"),
            asyncio.create_task(self._lag_reports(), name="lag-reports"),
        ]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def alive(self, node_id: int) -> bool:
        return node_id == self.node_id or self.status.alive(node_id)

    # ------------------------------------------------------------------ inputs
    def on_image(self, image: MetadataImage) -> None:
        peers = tuple(sorted(n for n in image.servers if n != self.node_id))
        if peers != self._peers:
            # A removed server's reports go too, whether or not a status check has seen it yet.
            gone_peers = (set(self._peers) | set(self._was_alive)) - set(peers)
            self._peers = peers
            self.status.set_peers(peers, monotonic_ms())
            for gone in gone_peers:
                self._was_alive.pop(gone, None)
                self.lags.forget(gone)

    def on_heartbeat(self, message: Heartbeat) -> None:
        if message.src in self._peers:
            self.status.received(message.src, monotonic_ms())

    def on_lag_report(self, message: LagReport) -> None:
        if message.src in self._peers:
            self.lags.update(message.src, message.replicas, monotonic_ms())

    # ------------------------------------------------------------------ loops
    async def _heartbeats(self) -> None:
        interval = self.config.heartbeat.send_interval_ms / 1000
        while True:
            beat = Heartbeat(self.node_id)
            for peer in self._peers:
                self._send(peer, beat)
            await asyncio.sleep(interval)

    async def _checks(self) -> None:
        interval = self.config.heartbeat.check_interval_ms / 1000
        while True:
            await asyncio.sleep(interval)
            self.status.check(monotonic_ms())
            for peer in self._peers:
                alive = self.status.alive(peer)
                if self._was_alive.get(peer, True) != alive:
                    log.info("server %d is %s", peer, "up" if alive else "down")
                self._was_alive[peer] = alive

    async def _lag_reports(self) -> None:
        interval = self.config.lag_report_interval_ms / 1000
        while True:
            reports = tuple(self._local_lags())
            self.lags.update(self.node_id, reports, monotonic_ms())
            report = LagReport(self.node_id, reports)
            for peer in self._peers:
                if self.status.alive(peer):
                    self._send(peer, report)
            await asyncio.sleep(interval)

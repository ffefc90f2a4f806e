"""Failure detection from heartbeats (KLIP-12), judged on the receiving server's clock only.

Every server sends a tiny heartbeat to every peer each `send_interval_ms`; each receiver records when
they ARRIVE, on its own monotonic clock, and every `check_interval_ms` decides each peer's status from
the arrivals of the last `window_ms`. Timestamps written by the sender are never used: clocks of two
machines are not comparable, and a skewed sender must not look alive (or dead) because of its clock.

The decision (KLIP-12's decide-status): the window (now - window, now] is cut into slots of
`send_interval_ms` ending at now; a slot is *received* when at least one heartbeat arrived in it, else
*missed*. Walking the slots in time order keeps the current run of consecutive missed and of
consecutive received slots, so at the end they are the runs ending at now. An alive peer goes down
once `missed_threshold` consecutive slots ending at now were missed; a down peer comes back only once
`received_threshold` consecutive slots ending at now were received. Between the two the status
holds, so a peer never flaps on one late heartbeat.

Sans-IO and deterministic: time comes in as `now_ms`, nothing here reads a clock, sleeps or sends.

A receiver that is itself paused (GC, SIGSTOP, an overloaded event loop) reads the heartbeats that
arrived meanwhile only when it resumes, all stamped with about the same time. Its first check after a
pause longer than `missed_threshold` slots therefore marks the peers down, and they come back as soon
as `received_threshold` slots have heartbeats again (the backlog read at once fills only one slot).
This is deliberate: from its own clock alone a receiver cannot tell its pause from its peers'
silence, guessing would make decisions depend on more than arrivals and now, and the cost is bounded
(remote replicas look down for about `received_threshold` send intervals after the pause).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class HeartbeatConfig:
    send_interval_ms: int = 100  # heartbeat.send.interval.ms
    check_interval_ms: int = 200  # heartbeat.check.interval.ms
    window_ms: int = 2000  # heartbeat.window.ms
    missed_threshold: int = 3  # heartbeat.missed.threshold
    received_threshold: int = 2  # heartbeat.received.threshold

    def __post_init__(self) -> None:
        if self.send_interval_ms <= 0 or self.check_interval_ms <= 0:
            raise ValueError("heartbeat intervals must be positive")
        if self.missed_threshold < 1 or self.received_threshold < 1:
            raise ValueError("heartbeat thresholds must be at least 1")
        # Otherwise the window holds too few slots for a run to ever reach a threshold.
        slots = self.window_ms // self.send_interval_ms
        if slots < max(self.missed_threshold, self.received_threshold):
            raise ValueError(
                f"heartbeat.window.ms={self.window_ms} holds {slots} slots of {self.send_interval_ms} ms,"
                f" fewer than the thresholds ({self.missed_threshold} missed,"
                f" {self.received_threshold} received)"
            )


@dataclass(frozen=True, slots=True)
class LivenessConfig:
    """What server/liveness.py runs on: these heartbeats, and the lag reports (KIP-535) sent with them."""

    heartbeat: HeartbeatConfig = field(default_factory=HeartbeatConfig)
    lag_report_interval_ms: int = 500  # lag.reporting.send.interval.ms


@dataclass(frozen=True, slots=True)
class PeerStatus:
    alive: bool
    last_status_update_ms: int  # when `alive` last flipped (or the peer was first listed)
    last_heartbeat_ms: int | None  # arrival time of the newest heartbeat, on this server's clock


@dataclass(slots=True)
class _Peer:
    alive: bool
    last_status_update_ms: int
    listed_at_ms: int
    last_heartbeat_ms: int | None = None
    arrivals: deque[int] = field(default_factory=deque)  # ascending, within the window


class HeartbeatStatus:
    """One server's view of which peers are alive; fed with arrivals, asked at each check."""

    def __init__(self, self_id: int, config: HeartbeatConfig, now_ms: int) -> None:
        self.self_id = self_id
        self.config = config
        self._created_ms = now_ms
        self._last_check_ms = now_ms
        self._peers: dict[int, _Peer] = {}
        # Bumped whenever what `alive` answers may change: a reader may keep decisions made from it
        # (routes) for as long as this stays the same.
        self.version = 0

    def set_peers(self, peer_ids: Iterable[int], now_ms: int) -> None:
        """Follow the metadata image's list of servers."""
        listed = set(peer_ids)
        listed.discard(self.self_id)
        # An unregistered server is forgotten, or /clusterStatus would list it as down forever.
        if listed != self._peers.keys():
            self.version += 1
        for gone in self._peers.keys() - listed:
            del self._peers[gone]
        for new in sorted(listed - self._peers.keys()):
            # Innocent until proven dead (as ksqlDB): a server just listed has had no chance to send a
            # heartbeat yet, and calling it down would make its replicas unavailable until it did. Slots
            # before the listing are not held against it (see `_runs`), so a silent newcomer is marked
            # down only after `missed_threshold` slots observed since.
            self._peers[new] = _Peer(alive=True, last_status_update_ms=now_ms, listed_at_ms=now_ms)

    def received(self, peer_id: int, now_ms: int) -> bool:
        """Record a heartbeat from `peer_id` arriving now; False (ignored) when the peer is not listed.

        `now_ms` must come from this server's monotonic clock; a time before an arrival already
        recorded is taken as that arrival's time."""
        peer = self._peers.get(peer_id)
        if peer is None:
            return False  # not (yet) in our image: nothing could be routed to it anyway
        arrivals = peer.arrivals
        if arrivals and now_ms < arrivals[-1]:
            now_ms = arrivals[-1]
        peer.last_heartbeat_ms = now_ms
        # Bounded memory: with a <= b <= c and c - a <= send_interval, every slot (one send interval
        # wide) holding b also holds a or c, so b can never decide a slot and is dropped. This keeps at
        # most two arrivals per send interval, however fast a peer sends.
        if len(arrivals) >= 2 and now_ms - arrivals[-2] <= self.config.send_interval_ms:
            arrivals.pop()
        arrivals.append(now_ms)
        self._expire(peer, now_ms)
        return True

    def check(self, now_ms: int) -> None:
        """Decide every listed peer's status from its arrivals in (now - window, now]."""
        self._last_check_ms = now_ms
        cfg = self.config
        for peer in self._peers.values():
            self._expire(peer, now_ms)
            missed, received = self._runs(peer, now_ms)
            if peer.alive and missed >= cfg.missed_threshold:
                peer.alive = False
                peer.last_status_update_ms = now_ms
                self.version += 1
            elif not peer.alive and received >= cfg.received_threshold:
                peer.alive = True
                peer.last_status_update_ms = now_ms
                self.version += 1

    def _runs(self, peer: _Peer, now_ms: int) -> tuple[int, int]:
        """(consecutive missed slots, consecutive received slots), both ending at now."""
        step = self.config.send_interval_ms
        slots = self.config.window_ms // step
        arrivals = peer.arrivals
        missed = received = 0
        i = 0
        for k in range(slots, 0, -1):
            start = now_ms - k * step  # the slot is (start, start + step]
            while i < len(arrivals) and arrivals[i] <= start:
                i += 1
            if start < peer.listed_at_ms:
                continue  # not observed while listed: neither missed nor received
            if i < len(arrivals) and arrivals[i] <= start + step:
                received += 1
                missed = 0
            else:
                missed += 1
                received = 0
        return missed, received

    def _expire(self, peer: _Peer, now_ms: int) -> None:
        oldest = now_ms - self.config.window_ms
        arrivals = peer.arrivals
        while arrivals and arrivals[0] <= oldest:
            arrivals.popleft()

    def next_check_ms(self) -> int:
        """When the next check is due: one check interval after the last one (or after creation)."""
        return self._last_check_ms + self.config.check_interval_ms

    def alive(self, peer_id: int) -> bool:
        """This server is always alive to itself; a server not listed in the image is not alive."""
        if peer_id == self.self_id:
            return True
        peer = self._peers.get(peer_id)
        return peer is not None and peer.alive

    def status(self) -> dict[int, PeerStatus]:
        """Every listed server's status, this one included (as ksqlDB's /clusterStatus), by node id."""
        view = {self.self_id: PeerStatus(True, self._created_ms, None)}
        for node_id, peer in self._peers.items():
            view[node_id] = PeerStatus(peer.alive, peer.last_status_update_ms, peer.last_heartbeat_ms)
        return dict(sorted(view.items()))

"""Where a pull query on one partition goes: a pure function of image, liveness, lags and the bound.

Rules (KLIP-12, KIP-535, docs/architecture.md §5):
- the active first when alive: it holds the freshest data. A restoring active (KIP-535) is held to the
  bound like any other replica, so an active rebuilding from scratch does not serve very stale rows;
- then the live standbys and warmups, freshest (lowest lag) first;
- a replica whose lag is over the query's bound is skipped;
- a replica that is down (silent by heartbeats) but otherwise qualifies is tried last, after every live
  one, in the same order (active first, then by lag). On a loaded machine heartbeats can miss a live
  server for a moment (a flap), and skipping it turned a query its only qualifying replica could serve
  into a 503. Tried last, it costs only queries that had nothing else: a killed server fails at once
  (its connection is refused or reset), a paused one within the executor's limits on one attempt. A down
  replica the lag rules would skip is skipped as "down";
- a replica that reported it cannot know its lag (it has heard nobody since it opened,
  `routing.freshness`) is skipped for a bounded read: it would refuse it. An unbounded read may use it;
- a replica that has not reported its lag yet is kept, after those with a known lag: its own server
  checks its lag when the query arrives and refuses it if too stale or unknown, while dropping it could
  leave a partition unservable just after a restart;
- equal lags prefer the local replica (no network hop), then the lower node id, so that every server
  routes the same way for the same inputs.

Routing is local: no remote calls. The executor tries the candidates in order and, when all fail,
raises `NoReplicaError` naming the partition and why each replica was skipped or failed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from hotstate.controller.image import PartitionInfo
from hotstate.routing.freshness import UNKNOWN_LAG_REASON
from hotstate.routing.lags import LagTable

if TYPE_CHECKING:
    # Only for annotations: importing the assignor package at run time would load OR-Tools for routing.
    from hotstate.assignor.model import AssignedRole


@dataclass(frozen=True, slots=True)
class Skip:
    node_id: int
    reason: str  # "down", "lag 1500 > bound 100", or what the executor met: "timed out", "refused", ...
    role: AssignedRole | None = None

    def __str__(self) -> str:
        who = str(self.node_id) if self.role is None else f"{self.node_id} ({self.role})"
        return f"{who}: {self.reason}"


@dataclass(frozen=True, slots=True)
class Candidate:
    node_id: int
    role: AssignedRole
    offset_lag: int | None  # None: the replica has not reported its lag yet
    down: bool = False  # silent by heartbeats: tried after every live candidate

    def skip(self, reason: str) -> Skip:
        """The skip an executor records when trying this candidate failed."""
        return Skip(self.node_id, f"down, tried anyway: {reason}" if self.down else reason, self.role)

    def passed(self, reason: str) -> Skip:
        """The skip an executor records when it did not try this candidate."""
        return Skip(self.node_id, reason, self.role)


class NoReplicaError(Exception):
    """No replica of the partition could serve the query; says why for each one."""

    def __init__(self, table: str, partition: int, skipped: Sequence[Skip]) -> None:
        self.table = table
        self.partition = partition
        self.skipped = tuple(skipped)
        reasons = "; ".join(str(s) for s in self.skipped) or "no replica is assigned"
        super().__init__(f"no replica of {table}/{partition} can serve: {reasons}")

    def with_more(self, skips: Iterable[Skip]) -> NoReplicaError:
        """The same error with the failures met while trying the candidates appended."""
        return NoReplicaError(self.table, self.partition, (*self.skipped, *skips))

    def __reduce__(self) -> tuple[type[NoReplicaError], tuple[str, int, tuple[Skip, ...]]]:
        # Exception pickles its message as the only argument, which this __init__ does not take.
        return (NoReplicaError, (self.table, self.partition, self.skipped))


@dataclass(frozen=True, slots=True)
class Route:
    table: str
    partition: int
    candidates: tuple[Candidate, ...]  # in the order to try
    skipped: tuple[Skip, ...]  # active, then standbys and warmups in the image's order

    def error(self, failed: Iterable[Skip] = ()) -> NoReplicaError:
        """The error to raise once every candidate failed (`failed` says how) or there was none."""
        return NoReplicaError(self.table, self.partition, (*self.skipped, *failed))


def route(
    part: PartitionInfo,
    *,
    table: str,
    alive: Callable[[int], bool],
    lags: LagTable,
    local_node: int,
    max_lag: int | None,
) -> Route:
    """Order the replicas of `part` (of table `table`, named in errors) for a pull query allowing
    `max_lag` records of staleness.

    `alive` is the liveness view: pass `HeartbeatStatus.alive`, or `frozenset.__contains__` of the live
    node ids. The local node counts as alive whatever `alive` says: it is the one running this.
    `max_lag` None means unbounded; a replica with lag == max_lag is within the bound."""
    if max_lag is not None and max_lag < 0:
        raise ValueError(f"max_lag must be >= 0 or None, not {max_lag}")
    live: list[Candidate] = []
    silent: list[Candidate] = []
    skipped: list[Skip] = []
    for node_id, role in _replicas(part):
        down = node_id != local_node and not alive(node_id)
        known = lags.lag(node_id, part.table_id, part.partition)
        offset_lag = None if known is None else known.offset_lag
        # A running active is as fresh as the partition gets: a lag in its report is only the skew
        # between reports sent at different times, and its server checks its real lag on arrival. Only a
        # restoring active (its store still catching up) is judged by its report.
        judged = role != "active" or (known is not None and known.state == "restoring")
        if judged and max_lag is not None and known is not None and not known.end_known:
            skipped.append(Skip(node_id, "down" if down else UNKNOWN_LAG_REASON, role))
            continue
        if judged and offset_lag is not None and max_lag is not None and offset_lag > max_lag:
            skipped.append(Skip(node_id, "down" if down else f"lag {offset_lag} > bound {max_lag}", role))
            continue
        (silent if down else live).append(Candidate(node_id, role, offset_lag, down))
    return Route(
        table, part.partition, (*_in_order(live, local_node), *_in_order(silent, local_node)), tuple(skipped)
    )


def _in_order(candidates: list[Candidate], local_node: int) -> list[Candidate]:
    """The active first, then the others freshest first (unreported last), the local one on equal lags."""
    return sorted(
        candidates,
        key=lambda c: (
            c.role != "active",
            c.offset_lag is None,
            c.offset_lag or 0,
            c.node_id != local_node,
            c.node_id,
        ),
    )


def _replicas(part: PartitionInfo) -> list[tuple[int, AssignedRole]]:
    """Each replica once with its role: the active, then standbys and warmups in the image's order."""
    seen: set[int] = set()
    out: list[tuple[int, AssignedRole]] = []
    if part.active is not None:
        seen.add(part.active)
        out.append((part.active, "active"))
    warmups = set(part.warmups)
    for node_id in (*part.replicas, *part.warmups):
        if node_id not in seen:
            seen.add(node_id)
            out.append((node_id, "warmup" if node_id in warmups else "standby"))
    return out

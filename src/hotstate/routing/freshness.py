"""How far a local replica is behind, for a pull query's staleness bound, and when it cannot know.

A bounded read (`max_lag` records) is served only by a replica whose store is at most that many records
behind the highest end of the partition that the serving server knows: the active's end as this replica
last heard it in a fetch answer, or any replica's end in the lag reports (KIP-535). Right after it opens,
though, a follower has heard nothing: its own log end is all it has, and taking that for the partition's
end made a restarted standby claim lag 0 while writes it had never seen were acknowledged, and a new, empty
replica answer "no row" for an acknowledged key. So a follower's lag is *unknown* until it has heard the
active (a fetch answer in its epoch) or a lag report of the partition from another server that arrived
after it opened; until then it refuses bounded reads and says so, and reports its end as unknown so that
routers skip it for them. An unbounded read may still use it.

An active knows its lag without hearing anyone: it holds every committed record once its HW reached its
epoch's start, so it is behind by what is committed and not applied (see `local_lag`), unless another
replica reported a higher HW: then a newer active committed what this one has not seen (it was deposed and
does not know it yet), and it is behind by that much.

Pure: the server's shell (`server/replicas.py`, `server/serving.py`) and the replication simulator call
the same functions.
"""

from __future__ import annotations

from dataclasses import dataclass

from hotstate.protocol.replica_state import ReplicaState
from hotstate.replica.core import ReplicaCore, ReplicaRole
from hotstate.replica.messages import FetchResponse, LagInfo, ReplicaError, ReplicaMessage
from hotstate.routing.lags import LagTable

__all__ = [
    "END_UNKNOWN",
    "UNKNOWN_LAG_REASON",
    "EndWitness",
    "bound_refusal",
    "end_known",
    "lag_report",
    "local_lag",
    "replica_state",
    "served_lag",
    "token_refusal",
]

# A LagInfo's end_offset_position and offset_lag when the replica cannot know its partition's end.
END_UNKNOWN = -1
UNKNOWN_LAG_REASON = "lag unknown: it has not heard the active or a lag report since it opened"


@dataclass(slots=True)
class EndWitness:
    """What one replica has heard of its partition's end since it opened (one per replica core)."""

    opened_at_ms: int
    heard_active: bool = False

    def observe(self, message: ReplicaMessage, core: ReplicaCore) -> None:
        """Call with every message just stepped into `core`: a fetch answer of the core's epoch that the
        core took in (its known end covers the answer's) means it heard the active."""
        if (
            isinstance(message, FetchResponse)
            and message.error is ReplicaError.NONE
            and message.leader_epoch == core.leader_epoch
            and core.known_end_offset >= message.log_end_offset
        ):
            self.heard_active = True


def end_known(core: ReplicaCore, witness: EndWitness, lags: LagTable, node_id: int) -> bool:
    """Whether the replica can know how far behind it is (an active always can)."""
    if core.role is ReplicaRole.LEADER or witness.heard_active:
        return True
    return lags.reported_since(core.table_id, core.partition, witness.opened_at_ms, exclude=node_id)


def served_lag(core: ReplicaCore, witness: EndWitness, lags: LagTable, node_id: int) -> int | None:
    """The replica's lag for a query's bound, as the server that holds it judges it; None: unknown."""
    leader = core.role is ReplicaRole.LEADER
    if not leader and not end_known(core, witness, lags, node_id):
        return None
    # A running active's lag does not use the partition's end (local_lag), and this runs on every pull query
    # a server answers from its own active: the reports are searched only when the end counts.
    running = leader and core.high_watermark >= core.epoch_start_offset
    known_end = core.known_end_offset
    if not running:
        known_end = max(known_end, lags.partition_end(core.table_id, core.partition))
    return local_lag(
        leader=leader,
        position=core.position,
        high_watermark=core.high_watermark,
        epoch_start=core.epoch_start_offset,
        known_end=known_end,
        reported_hw=lags.partition_hw(core.table_id, core.partition, exclude=node_id) if leader else 0,
    )


def local_lag(
    *,
    leader: bool,
    position: int,
    high_watermark: int,
    epoch_start: int,
    known_end: int,
    reported_hw: int = 0,
) -> int:
    """How far a local replica's store is behind, for the query's staleness bound.

    The active's log end includes records appended but not yet committed, which no replica can serve: its
    store is behind only by what is committed and not yet applied (0 when running, more while restoring).
    Otherwise a write of more rows than the bound, while in flight, would make the freshest replica refuse.
    Until its high watermark reaches its epoch's start, though, a new active may hold records its
    predecessor acknowledged above that HW: then it is behind its log end, like a follower. A follower is
    behind the partition's end as far as anyone knows it (KIP-535). `reported_hw`, the highest HW other
    replicas reported, is above an active's own only when a newer active committed more."""
    end = max(high_watermark, reported_hw) if leader and high_watermark >= epoch_start else known_end
    return max(0, end - position)


def bound_refusal(max_lag: int | None, lag: int | None) -> str | None:
    """Why a replica with `lag` (None: unknown) refuses a read bounded by `max_lag`; None: it serves it."""
    if max_lag is None:
        return None
    if lag is None:
        return UNKNOWN_LAG_REASON
    return f"lag {lag} > bound {max_lag}" if lag > max_lag else None


def token_refusal(core: ReplicaCore, wanted: int) -> tuple[ReplicaError, str] | None:
    """Why a replica refuses a read whose consistency token asks for store position `wanted`; None: its
    store is there. The active tells a token no write reached (beyond its log end, which holds every
    committed record) from one its store has not applied yet."""
    position = core.position
    if wanted <= position:
        return None
    if core.role is ReplicaRole.LEADER and wanted > core.log_end_offset:
        return (
            ReplicaError.TOKEN_AHEAD,
            f"the token asks for position {wanted}, beyond the partition's log end {core.log_end_offset}",
        )
    return ReplicaError.BEHIND_TOKEN, f"at position {position}, the token asks for {wanted}"


def replica_state(core: ReplicaCore, warmups: tuple[int, ...]) -> ReplicaState:
    """The replica's state in lag reports and answers: active, restoring (an active whose store has not yet
    applied what its log held when it became active, as far as that is committed), warmup or standby.

    Not "behind its HW": a running active's store trails its HW by the records being applied, thousands
    under load, and a report taken at that moment made routers judge the active by a lag measured against
    uncommitted records and skip it (a pull query failed with every replica "over the bound" at 50,000
    events/s). Its server checks its real lag when the query arrives in any case."""
    if core.role is ReplicaRole.LEADER:
        caught_up = core.position >= min(core.high_watermark, core.epoch_start_offset)
        return "active" if caught_up else "restoring"
    return "warmup" if core.id in warmups else "standby"


def lag_report(
    core: ReplicaCore,
    witness: EndWitness,
    lags: LagTable,
    node_id: int,
    *,
    table: str,
    state: ReplicaState,
    in_sync: bool,
) -> LagInfo:
    """The replica's LagInfo for the lag reports: its end as far as it knows it, or END_UNKNOWN."""
    known = end_known(core, witness, lags, node_id)
    end = core.known_end_offset if known else END_UNKNOWN
    return LagInfo(
        table,
        core.table_id,
        core.partition,
        state,
        core.position,
        end,
        max(0, end - core.position) if known else END_UNKNOWN,
        core.leader_epoch,
        core.high_watermark,
        in_sync,
    )

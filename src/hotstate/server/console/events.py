"""Recent cluster events for the console (`GET /v1/events`): what changed, told in words, with times.

Pure: the events are read off the difference between two metadata images (servers registered, fenced,
unfenced; tables created; actives moved; replicas reassigned; replicas leaving or rejoining the ISR), a
controller leader change, and peers' heartbeat status turning down or up. `EventLog` keeps the newest
ones in a bounded ring, each stamped with the wall time the caller passes. The asyncio shell that feeds it
is server/console/feed.py.

A change that touches many partitions at once (a server's death moves all its actives) is one event per
table and kind of change, naming the partitions, not one event per partition: the list stays readable
and the ring is not flooded.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from hotstate.controller.image import MetadataImage, PartitionInfo

# Every kind an event can have (docs/console.md lists them with their meaning).
EVENT_KINDS = (
    "server_registered",
    "server_unregistered",
    "server_draining",
    "server_fenced",
    "server_unfenced",
    "server_down",
    "server_up",
    "controller_leader",
    "table_created",
    "table_deleted",
    "table_overwritten",
    "active_moved",
    "reassigned",
    "isr_shrunk",
    "isr_expanded",
)
MAX_LISTED = 12  # partitions (or reassignments) named in one message; more are counted


@dataclass(frozen=True, slots=True)
class EventDraft:
    """An event before the log stamps it with a sequence number and a time."""

    kind: str
    message: str
    table: str | None = None
    servers: tuple[int, ...] = ()
    partitions: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ClusterEvent:
    seq: int  # 1, 2, ... in the order this server saw them
    time_ms: int  # wall clock (Unix ms) when this server saw it
    metadata_offset: int | None  # the image offset that showed it; None for heartbeat and quorum events
    kind: str
    message: str
    table: str | None
    servers: tuple[int, ...]
    partitions: tuple[int, ...]


class EventLog:
    """The newest `capacity` events, oldest dropped first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"an event log holds at least one event, not {capacity}")
        self._events: deque[ClusterEvent] = deque(maxlen=capacity)
        self._seq = 0

    @property
    def latest_seq(self) -> int:
        return self._seq

    def record(self, drafts: Iterable[EventDraft], now_ms: int, metadata_offset: int | None = None) -> None:
        for draft in drafts:
            self._seq += 1
            self._events.append(
                ClusterEvent(
                    self._seq,
                    now_ms,
                    metadata_offset,
                    draft.kind,
                    draft.message,
                    draft.table,
                    draft.servers,
                    draft.partitions,
                )
            )

    def after(self, seq: int, limit: int) -> list[ClusterEvent]:
        """The events numbered above `seq`, oldest first; at most the newest `limit` of them."""
        newer = [e for e in self._events if e.seq > seq]
        return newer[-limit:] if limit > 0 else []


# ---------------------------------------------------------------------- image changes


def image_events(before: MetadataImage, after: MetadataImage) -> list[EventDraft]:
    """What changed from `before` to `after`, servers first, then tables in name order."""
    out = _server_events(before, after)
    # Images share the parts no record touched: most commits (heartbeats) change no table.
    if after.tables is before.tables and after.partitions is before.partitions:
        return out
    before_ids = {t.table_id for t in before.tables.values()}
    for name, table in sorted(after.tables.items()):
        if table.table_id not in before_ids and table.staged:
            # An overwrite's new generation: the table itself is unchanged until the swap.
            continue
        if table.table_id not in before_ids:
            out.append(
                EventDraft(
                    "table_created",
                    f"table {name} created: {table.partitions} partitions, "
                    f"{table.standby_replicas} standby {_plural(table.standby_replicas, 'replica')} each",
                    table=name,
                )
            )
            continue
        old_parts = before.partitions.get(table.table_id, ())
        new_parts = after.partitions.get(table.table_id, ())
        if old_parts is not new_parts:
            # Partitions beyond the old count are the table's first placement, told by table_created.
            out.extend(_partition_events(name, old_parts, new_parts[: len(old_parts)]))
    after_ids = {t.table_id for t in after.tables.values()}
    for name, table in sorted(before.tables.items()):
        if table.table_id in after_ids or table.staged:
            continue  # a staged generation dropped (a failed overwrite) leaves the table as it was
        new = after.tables.get(name)
        if new is not None:
            out.append(
                EventDraft(
                    "table_overwritten",
                    f"table {name} overwritten: its new generation ({new.partitions} partitions) serves",
                    table=name,
                )
            )
        else:
            out.append(EventDraft("table_deleted", f"table {name} deleted", table=name))
    return out


def _server_events(before: MetadataImage, after: MetadataImage) -> list[EventDraft]:
    if after.servers is before.servers:
        return []
    out = []
    for node_id, server in sorted(after.servers.items()):
        old = before.servers.get(node_id)
        rack = f"rack {server.rack}" if server.rack else "no rack"
        if old is None:
            out.append(
                EventDraft("server_registered", f"server {node_id} registered ({rack})", servers=(node_id,))
            )
        elif old.incarnation_id != server.incarnation_id:
            out.append(
                EventDraft(
                    "server_registered",
                    f"server {node_id} registered again after a restart ({rack}); fenced until caught up",
                    servers=(node_id,),
                )
            )
        elif server.draining and not old.draining:
            message = f"server {node_id} draining: its replicas move to other servers, then it is removed"
            out.append(EventDraft("server_draining", message, servers=(node_id,)))
        elif old.fenced != server.fenced:
            if server.fenced:
                message = f"server {node_id} fenced: it serves nothing until it is back and caught up"
                out.append(EventDraft("server_fenced", message, servers=(node_id,)))
            else:
                message = f"server {node_id} unfenced: caught up, it can take partitions"
                out.append(EventDraft("server_unfenced", message, servers=(node_id,)))
    for node_id in sorted(set(before.servers) - set(after.servers)):
        message = f"server {node_id} removed: it holds no replica, and its node id is not used again"
        out.append(EventDraft("server_unregistered", message, servers=(node_id,)))
    return out


def _partition_events(
    table: str, old_parts: tuple[PartitionInfo, ...], new_parts: tuple[PartitionInfo, ...]
) -> list[EventDraft]:
    moved: dict[tuple[int | None, int | None], list[int]] = {}
    reassigned: list[tuple[PartitionInfo, PartitionInfo]] = []
    left_isr: dict[int, list[int]] = {}
    joined_isr: dict[int, list[int]] = {}
    for old, new in zip(old_parts, new_parts, strict=False):
        if old is new:
            continue
        if old.active != new.active:
            moved.setdefault((old.active, new.active), []).append(new.partition)
        if old.replicas != new.replicas or old.warmups != new.warmups:
            reassigned.append((old, new))
        for server in sorted(set(old.isr) - set(new.isr)):
            if server in new.replicas:  # a replica dropped from the partition is told by `reassigned`
                left_isr.setdefault(server, []).append(new.partition)
        for server in sorted(set(new.isr) - set(old.isr)):
            joined_isr.setdefault(server, []).append(new.partition)
    out = []
    for (was, now), partitions in sorted(moved.items(), key=lambda item: (item[0][0] or 0, item[0][1] or 0)):
        where = f"{table} {_plural(len(partitions), 'partition')} {_listed(partitions)}"
        if now is None:
            message = f"{where}: no active (was server {was}); not writable until one is chosen"
        elif was is None:
            message = f"{where}: active is server {now}"
        else:
            message = f"{where}: active moved from server {was} to server {now}"
        servers = tuple(s for s in (was, now) if s is not None)
        out.append(EventDraft("active_moved", message, table, servers, tuple(partitions)))
    if reassigned:
        changes = [f"{new.partition}: {_replica_set(old)} → {_replica_set(new)}" for old, new in reassigned]
        shown = "; ".join(changes[:MAX_LISTED])
        if len(changes) > MAX_LISTED:
            shown += f"; and {len(changes) - MAX_LISTED} more"
        involved = sorted({s for old, new in reassigned for s in (*old.replicas, *new.replicas)})
        out.append(
            EventDraft(
                "reassigned",
                f"{table} replicas reassigned: {shown}",
                table,
                tuple(involved),
                tuple(new.partition for _, new in reassigned),
            )
        )
    for server, partitions in sorted(left_isr.items()):
        message = f"{table}: server {server} out of sync (left the ISR) for {_partitions(partitions)}"
        out.append(EventDraft("isr_shrunk", message, table, (server,), tuple(partitions)))
    for server, partitions in sorted(joined_isr.items()):
        message = f"{table}: server {server} in sync (joined the ISR) for {_partitions(partitions)}"
        out.append(EventDraft("isr_expanded", message, table, (server,), tuple(partitions)))
    return out


def _replica_set(part: PartitionInfo) -> str:
    named = [
        f"{r}{' (active)' if r == part.active else ' (warmup)' if r in part.warmups else ''}"
        for r in part.replicas
    ]
    return "[" + ", ".join(named) + "]"


def _partitions(partitions: list[int]) -> str:
    return f"{_plural(len(partitions), 'partition')} {_listed(partitions)}"


def _listed(items: list[int]) -> str:
    shown = ", ".join(str(i) for i in items[:MAX_LISTED])
    return shown if len(items) <= MAX_LISTED else f"{shown} and {len(items) - MAX_LISTED} more"


def _plural(count: int, word: str) -> str:
    return word if count == 1 else word + "s"


# ---------------------------------------------------------------------- quorum and heartbeats


def leader_events(last_leader: int | None, leader: int | None, epoch: int) -> list[EventDraft]:
    """A new controller leader once one is known (an election's leaderless moment is no event)."""
    if leader is None or leader == last_leader:
        return []
    was = "" if last_leader is None else f", was server {last_leader}"
    return [
        EventDraft(
            "controller_leader",
            f"controller leader is server {leader} (epoch {epoch}{was})",
            servers=(leader,),
        )
    ]


def liveness_events(before: Mapping[int, bool], after: Mapping[int, bool]) -> list[EventDraft]:
    """Peers whose heartbeat status flipped (a peer not seen before counts as up, as the detector
    starts it)."""
    out = []
    for node_id, alive in sorted(after.items()):
        if before.get(node_id, True) == alive:
            continue
        if alive:
            message = f"server {node_id} up: its heartbeats arrive again"
            out.append(EventDraft("server_up", message, servers=(node_id,)))
        else:
            message = f"server {node_id} down: no heartbeats from it"
            out.append(EventDraft("server_down", message, servers=(node_id,)))
    return out

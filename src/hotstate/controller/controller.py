"""The quorum controller: the logic that runs on the Raft leader and decides what records to write.

Sans-IO like the Raft core. The shell creates a `QuorumController` once its Raft leader has committed
the leader-change record of its epoch (so the committed image holds everything earlier leaders wrote),
feeds it requests and ticks, proposes the batches it returns, and releases each reply once everything
proposed up to that reply is committed. The controller keeps a *view*: the committed image plus its own
batches not yet committed, so that back-to-back requests see each other.

Every reply waits for a commit: a request that writes nothing proposes a NoOp. A deposed leader that
does not know it yet can then never answer from a stale view (linearizable reads and errors), at the
cost of one metadata commit per request — fine for metadata, and heartbeats are the exception.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from hotstate.assignor import Assignment, AssignorConfig, AssignorInternalError
from hotstate.controller.evidence import ProbeResult, fences_on_probe
from hotstate.controller.image import ImageBuilder, MetadataImage, PartitionInfo, TableInfo
from hotstate.controller.partition_rules import IsrRefusal, alter_isr, elect_after_fence, elect_on_unfence
from hotstate.controller.placement import PlacementJob, PreparedPlacement, placement_job
from hotstate.controller.reassign import Desired, ReassignJob, reassignment_records
from hotstate.controller.records import (
    WINDOW_KEY_TYPES,
    WINDOW_KINDS,
    CreateTable,
    DeleteTable,
    DrainServer,
    FenceServer,
    KeyColumn,
    MetadataBatch,
    MetadataRecord,
    NoOp,
    PartitionBlock,
    PartitionChange,
    RegisterServer,
    ReplaceTable,
    TableBatch,
    TableValueColumns,
    TableWindow,
    TableWriters,
    UnfenceServer,
    UnregisterServer,
    ValueColumn,
    staging_name,
)
from hotstate.controller.replace import LostCopies, ReplaceJob, Replacement, replacement_records
from hotstate.controller.requests import (
    AlterPartitionRequest,
    AlterPartitionResponse,
    CommitBatchRequest,
    CommitBatchResponse,
    ControllerError,
    ControllerRequest,
    ControllerResponse,
    CreateTableRequest,
    CreateTableResponse,
    DeleteTableRequest,
    DeleteTableResponse,
    ListTablesRequest,
    ListTablesResponse,
    RegisterServerRequest,
    RegisterServerResponse,
    RegisterWriterRequest,
    RegisterWriterResponse,
    RemoveServerRequest,
    RemoveServerResponse,
    ReplaceTableRequest,
    ReplaceTableResponse,
    ServerHeartbeatRequest,
    ServerHeartbeatResponse,
    SetValueColumnsRequest,
    SetValueColumnsResponse,
    StageTableRequest,
    StageTableResponse,
)
from hotstate.protocol.ttl import invalid_ttl, invalid_ttl_value_columns

log = logging.getLogger(__name__)

TABLE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# A table's partitions, as far as measured (bench/control_plane.py, docs/architecture.md "Scale"): a
# 100,000-partition table is placed off the event loop in seconds and written as one ~1 MB record; 1,000,000
# would be a ~10 MB record (the RPC frame limit is 16 MiB) that every server takes about 10 s to load.
MAX_PARTITIONS = 100_000
MAX_STANDBYS = 10
# A Spark schema's worth: its columns, and a nested type's name (a struct of structs is long).
MAX_VALUE_COLUMNS = 4096
MAX_VALUE_TYPE_CHARS = 16_384
MAX_RACK_CHARS = 255
MAX_WRITER_RACKS = 64


@dataclass(frozen=True, slots=True)
class ControllerConfig:
    session_timeout_ms: int = 2000
    assignor: AssignorConfig = field(default_factory=AssignorConfig)
    # How often the assignor may run to move existing partitions (0: never; placement of new tables only).
    reassign_interval_ms: int = 2000
    # A broker fenced this long is taken for gone: its replicas are placed elsewhere. A broker fenced for
    # less may be restarting, and nothing is reassigned meanwhile.
    broker_removal_delay_ms: int = 30_000
    # A generation staged for an overwrite and not swapped in this long after this controller first saw it
    # is dropped: its writer died (a failed Spark job drops its own at once). Long enough for a big load.
    staged_timeout_ms: int = 6 * 3600 * 1000
    # Ticks further apart than this mean the controller's own process was stalled (a big placement, an
    # image applied, a loaded machine): the heartbeats of that time are still unread in its sockets, so
    # the stall is not counted against any session. Without this a fence that stalls the active controller
    # at a million partitions makes it fence the brokers it did not hear meanwhile, one after the other.
    # 0: every tick counts (a test that jumps its clock to expire a session); servers use a quarter of
    # the session timeout (server/app.py).
    stall_grace_ms: int = 0


@dataclass(frozen=True, slots=True)
class Decision:
    """Batches to propose, in order, and the reply to send once they (and all before them) commit.

    `wait` False: reply at once (heartbeats, which need no linearizability)."""

    batches: tuple[MetadataBatch, ...]
    reply: ControllerResponse
    wait: bool = True


# A probe's verdict (evidence.fences_on_probe) and the new active on a fence (elect_after_fence): parameters
# so that the replication simulator's tests can break them on purpose.
FenceRule = Callable[..., bool]
ElectRule = Callable[..., PartitionChange | None]


class QuorumController:
    def __init__(
        self,
        image: MetadataImage,
        config: ControllerConfig,
        *,
        now: int,
        next_offset: int,
        fence_rule: FenceRule = fences_on_probe,
        elect_rule: ElectRule = elect_after_fence,
        voters: Iterable[int] = (),
    ) -> None:
        self.config = config
        # The metadata quorum's voters as the Raft leader has them (not in the image): the host sets them
        # before each request. A voter is not removed as a server (`_removal_problem`).
        self.voters = frozenset(voters)
        self._fence_rule = fence_rule
        self._elect_rule = elect_rule
        self._view = image
        self._builder = ImageBuilder(image)
        # A new active controller gives every server a fresh session before fencing anyone.
        self._sessions: dict[int, int] = {node_id: now for node_id in image.servers}
        self._shutting_down: set[int] = set()
        # Log end offsets the servers last reported per replica: (table id, partition, node) -> end.
        self._replica_ends: dict[tuple[int, int, int], int] = {}
        # Brokers that reported their replicas' ends to this controller: lags are known only for them.
        self._reported: set[int] = set()
        self._reported_keys: dict[int, list[tuple[int, int, int]]] = {}
        self._fenced_since: dict[int, int] = {}
        self._started_at = now
        self._last_reassign_at: int | None = None
        self._last_reassign_offset = -1
        # The view offset and gone brokers with no lost copy left to re-place (`replacement_job`): the
        # partitions are not scanned again until one of them changes.
        self._replaced: tuple[int, frozenset[int]] = (-1, frozenset())
        self._lost = LostCopies()
        self._next_offset = next_offset
        # Staged generations (table id) -> when this controller first saw them (staged_timeout_ms).
        self._staged_since: dict[int, int] = {}
        self._placed: PreparedPlacement | None = None
        self._last_tick_at = now
        # The partitions (the view's mapping, unchanged while no partition is) checked for the draining
        # servers that still hold replicas: a drain is not rechecked against every partition each tick.
        self._drain_checked: tuple[Mapping[int, tuple[PartitionInfo, ...]], frozenset[int]] | None = None
        # The staged tables of the tables mapping they were found in: every tick asks, tables rarely change.
        self._staged_checked: tuple[Mapping[str, TableInfo], dict[int, TableInfo]] | None = None

    @property
    def view(self) -> MetadataImage:
        return self._view

    # ------------------------------------------------------------------ inputs
    def handle(
        self,
        request: ControllerRequest,
        now: int,
        next_offset: int,
        *,
        placed: PreparedPlacement | None = None,
    ) -> Decision:
        """Decide on one request. `next_offset` is the offset the next proposal will get. `placed`: a new
        table's placement computed off the loop from `placement_job(request)`; used if it still fits the
        view, else the table is placed here."""
        self._next_offset = next_offset
        self._placed = placed
        match request:
            case RegisterServerRequest():
                return self._register(request, now)
            case ServerHeartbeatRequest():
                return self._heartbeat(request, now)
            case CreateTableRequest():
                return self._create_table(request)
            case DeleteTableRequest():
                return self._delete_table(request)
            case ListTablesRequest():
                batch = self._propose((NoOp(),))
                return Decision(
                    (batch,), ListTablesResponse(ControllerError.NONE, "", tuple(self._view.tables_listed()))
                )
            case AlterPartitionRequest():
                return self._alter_partition(request)
            case RegisterWriterRequest():
                return self._register_writer(request)
            case CommitBatchRequest():
                return self._commit_batch(request)
            case SetValueColumnsRequest():
                return self._set_value_columns(request)
            case StageTableRequest():
                return self._stage_table(request)
            case ReplaceTableRequest():
                return self._replace_table(request)
            case RemoveServerRequest():
                return self._remove_server(request)

    def placement_job(self, request: ControllerRequest) -> PlacementJob | None:
        """The placement a create (or stage) request needs, to run off the event loop before `handle`
        (which checks it still fits); None when the request places nothing or will be refused anyway."""
        match request:
            case CreateTableRequest():
                if _invalid_table(request) is not None or request.name in self._view.tables:
                    return None
                record = self._create_record(request, request.name, "")
            case StageTableRequest():
                name = staging_name(request.name, self._view.next_table_id)
                record = self._create_record(request, name, request.name)
            case _:
                return None
        if not self._view.placement_brokers():
            return None
        return placement_job(self._view, TableInfo.created(record), self.config.assignor)

    def _create_record(
        self, request: CreateTableRequest | StageTableRequest, name: str, staging_for: str
    ) -> CreateTable:
        assert request.standby_replicas is not None  # _invalid_table refuses None
        return CreateTable(
            name,
            self._view.next_table_id,
            request.partitions,
            request.standby_replicas,
            request.key_columns,
            request.acceptable_lag,
            () if request.writer_rack is None else (request.writer_rack,),
            staging_for=staging_for,
            window=request.window,
            ttl=request.ttl,
        )

    def _place(self, table: TableInfo) -> PreparedPlacement:
        job = placement_job(self._view, table, self.config.assignor)
        placed, self._placed = self._placed, None
        if placed is not None and job.fits(self._view, placed):
            return placed
        return job.run()

    def tick(self, now: int, next_offset: int, *, reassign: bool = True) -> list[MetadataBatch]:
        """Fence every server whose session expired, moving its actives away, one batch per server; then,
        when the cluster is settled, one step towards the assignor's placement of existing partitions.

        `reassign=False` leaves that step to the caller (`reassignment_job`, then `apply_reassignment`),
        which may run the assignor on another thread."""
        self._next_offset = next_offset
        self._forgive_stall(now)
        batches = []
        drained = self._drained()
        for node_id, server in sorted(self._view.servers.items()):
            if node_id in drained:
                batches.append(self._propose(self._unregister_records(node_id)))
                continue
            if server.fenced:
                self._fenced_since.setdefault(node_id, now)
                continue
            self._fenced_since.pop(node_id, None)
            last = self._sessions.setdefault(node_id, now)
            if now - last > self.config.session_timeout_ms:
                batches.append(self._propose(self._fence_records(node_id, "session expired")))
        expired = self._expired_stagings(now)
        if expired:
            batches.append(self._propose(expired))
        if reassign:
            replace = self.replacement_job(now)
            if replace is not None:
                batch = self.apply_replacement(replace, replace.run(), self._next_offset)
                if batch is not None:
                    batches.append(batch)
        job = self.reassignment_job(now) if reassign else None
        if job is not None:
            desired: Assignment | Exception
            try:
                desired = job.run()
            except (ValueError, AssignorInternalError) as error:
                desired = error
            batch = self.apply_reassignment(job, desired, now, self._next_offset)
            if batch is not None:
                batches.append(batch)
        return batches

    def _forgive_stall(self, now: int) -> None:
        gap = now - self._last_tick_at
        self._last_tick_at = now
        grace = self.config.stall_grace_ms
        if grace > 0 and gap > grace:
            log.warning("controller stalled %d ms: sessions extended by as much", gap)
            for node_id in self._sessions:
                self._sessions[node_id] += gap

    def _drained(self) -> frozenset[int]:
        """The draining servers that hold no replica any more (to unregister)."""
        draining = [n for n, s in self._view.servers.items() if s.draining]
        if not draining:
            return frozenset()
        partitions = self._view.partitions
        checked = self._drain_checked
        if checked is None or checked[0] is not partitions:
            holding = frozenset(n for n in draining if self._view.holds_replicas(n))
            self._drain_checked = checked = (partitions, holding)
        return frozenset(n for n in draining if n not in checked[1])

    def on_probe(
        self, node_id: int, incarnation_id: str, result: ProbeResult, next_offset: int
    ) -> MetadataBatch | None:
        """The result of a probe of `node_id`'s RPC address (started while `incarnation_id` was registered):
        a refusal fences the server and moves its actives now (`evidence.fences_on_probe`), without waiting
        for its session to expire. A server fenced this way that is alive after all heartbeats and is
        unfenced as after any fence: the cost of a wrong probe is a move, never a loss."""
        self._next_offset = next_offset
        server = self._view.servers.get(node_id)
        if not self._fence_rule(
            result,
            probed_incarnation=incarnation_id,
            registered_incarnation=None if server is None else server.incarnation_id,
            fenced=server is not None and server.fenced,
        ):
            return None
        log.info("server %d refuses connections: fenced without waiting for its session", node_id)
        return self._propose(self._fence_records(node_id, "connection refused"))

    def _gone(self, now: int) -> frozenset[int]:
        """Brokers fenced for `broker_removal_delay_ms`, or removed by an operator while fenced."""
        return frozenset(
            node_id
            for node_id, server in self._view.servers.items()
            if server.is_broker
            and server.fenced
            and (
                server.draining
                or now - self._fenced_since.get(node_id, now) >= self.config.broker_removal_delay_ms
            )
        )

    def replacement_job(self, now: int) -> ReplaceJob | None:
        """The inputs for re-placing the copies gone brokers held (`replace.ReplaceJob`), when there are any:
        only those partitions change, each getting new standbys on live brokers against their load."""
        gone = self._gone(now)
        if not gone or (self._view.offset, gone) == self._replaced:
            return None
        if not self._lost.any(self._view, gone):
            self._replaced = (self._view.offset, gone)
            return None
        return ReplaceJob(self._view, tuple(self._view.placement_brokers()), gone, self.config.assignor)

    def apply_replacement(
        self, job: ReplaceJob, wanted: Replacement | Exception, next_offset: int
    ) -> MetadataBatch | None:
        """A job's answer (or the error it raised) written for the partitions still as the job saw them."""
        self._next_offset = next_offset
        if isinstance(wanted, Exception):
            log.error("re-placing lost copies failed: %s", wanted)
            return None
        if any(n in self._view.servers and not self._view.servers[n].fenced for n in job.gone):
            return None  # one came back while the job ran: its copies are not lost
        records = replacement_records(self._view, job, wanted)
        if not records:
            return None
        log.info(
            "server(s) %s taken for gone: %d partition(s) get new standbys, nothing else moves",
            sorted(job.gone),
            len(records),
        )
        return self._propose(tuple(records))

    def reassignment_job(self, now: int) -> ReassignJob | None:
        """The assignor's inputs, when a reassignment step is due: at most every `reassign_interval_ms`,
        with the cluster settled, and only if the metadata changed since the last run (a warmup that caught
        up joins the ISR, which is such a change; without one the answer would be the same)."""
        interval = self.config.reassign_interval_ms
        if interval <= 0 or not self._view.tables:
            return None
        if self._last_reassign_at is not None and now - self._last_reassign_at < interval:
            return None
        # A server shutting down is fenced with its actives moved in the same batch: from then on it counts as
        # any fenced broker (nothing moves until it is back, or gone for broker_removal_delay_ms).
        if not self._settled(now):
            return None
        # Lost copies are re-placed first, alone (`replacement_job`): the whole assignor would move others.
        if self._lost.any(self._view, self._gone(now)):
            return None
        # Without a metadata change the answer would be the same: lags decide only through the ISR (a
        # replica joining it is a metadata change), never through the reports' own timing.
        if self._view.offset == self._last_reassign_offset:
            return None
        self._last_reassign_at = now
        self._last_reassign_offset = self._view.offset
        brokers = tuple(self._view.placement_brokers())
        return ReassignJob(self._view, brokers, dict(self._replica_ends), self.config.assignor)

    def apply_reassignment(
        self, job: ReassignJob, desired: Assignment | Desired | Exception, now: int, next_offset: int
    ) -> MetadataBatch | None:
        """One safe step per partition from the current view towards `desired` (a job's result, or the
        error it raised). Each step checks the partition as it is now, so a result computed from a slightly
        older view is still safe to apply; one computed before the cluster unsettled is dropped."""
        self._next_offset = next_offset
        if isinstance(desired, Exception):
            log.error("reassignment skipped: the assignor failed: %s", desired)
            return None
        if not self._settled(now):
            return None
        # What committed while the job ran was not seen by it: then the next interval runs it again.
        seen_all = self._view.offset == job.image.offset
        records = reassignment_records(self._view, desired)
        if not records:
            return None
        moved = sum(1 for r in records if r.active != self._active_of(r.table_id, r.partition))
        if isinstance(desired, Desired):
            strategy, cost = desired.strategy, desired.active_cost
        else:
            strategy, cost = desired.explanation.strategy, desired.explanation.cost.active
        log.info(
            "reassignment: %d partition(s) change, %d active(s) move (strategy %s, cost %d)",
            len(records),
            moved,
            strategy,
            cost,
        )
        batch = self._propose(tuple(records))
        if seen_all:
            # The batch changes the view: the next run must see its effect before deciding again.
            self._last_reassign_offset = self._view.offset
        return batch

    def _settled(self, now: int) -> bool:
        """Every broker is live and has told this controller where its replicas are, or has been fenced
        for so long that it is taken for gone."""
        if now - self._started_at < self.config.session_timeout_ms:
            return False  # a new controller first hears from every server
        live = False
        for node_id, server in self._view.servers.items():
            if not server.is_broker:
                continue
            if server.fenced:
                since = self._fenced_since.get(node_id, now)
                # An operator removing a dead server says it is gone for good: no need to wait.
                if not server.draining and now - since < self.config.broker_removal_delay_ms:
                    return False
            elif node_id not in self._reported:
                return False
            else:
                live = True
        return live

    def _active_of(self, table_id: int, partition: int) -> int | None:
        parts = self._view.partitions.get(table_id, ())
        return parts[partition].active if partition < len(parts) else None

    # ------------------------------------------------------------------ servers
    def _register(self, request: RegisterServerRequest, now: int) -> Decision:
        if request.node_id in self._view.removed:
            return self._error(
                RegisterServerResponse(ControllerError.SERVER_REMOVED, _removed_message(request.node_id), -1)
            )
        record = RegisterServer(
            request.node_id,
            request.incarnation_id,
            request.rpc,
            request.http,
            request.rack,
            request.tags,
            request.roles,
        )
        offset = self._next_offset
        existing = self._view.servers.get(request.node_id)
        records: list[MetadataRecord] = [record]
        if existing is not None and not existing.fenced:
            # A restarted server must not keep serving as its old self: fence, move its actives.
            records = [*self._fence_records(request.node_id, "re-registered"), record]
        batch = self._propose(tuple(records))
        self._sessions[request.node_id] = now
        self._shutting_down.discard(request.node_id)
        # Back: not on its way to being taken for gone (broker_removal_delay_ms counts from its next fence).
        self._fenced_since.pop(request.node_id, None)
        return Decision((batch,), RegisterServerResponse(ControllerError.NONE, "", offset))

    def _heartbeat(self, request: ServerHeartbeatRequest, now: int) -> Decision:
        server = self._view.servers.get(request.node_id)
        if server is None and request.node_id in self._view.removed:
            message = _removed_message(request.node_id)
            reply = ServerHeartbeatResponse(ControllerError.SERVER_REMOVED, message, True, False)
            return Decision((), reply, wait=False)
        if server is None:
            reply = ServerHeartbeatResponse(ControllerError.UNKNOWN_SERVER, "register first", True, False)
            return Decision((), reply, wait=False)
        if server.incarnation_id != request.incarnation_id:
            reply = ServerHeartbeatResponse(
                ControllerError.STALE_INCARNATION,
                f"current incarnation is {server.incarnation_id}",
                True,
                False,
            )
            return Decision((), reply, wait=False)
        self._sessions[request.node_id] = now
        self._reported.add(request.node_id)
        # The report is complete: a replica it no longer lists has been removed from that server.
        for key in self._reported_keys.pop(request.node_id, ()):
            self._replica_ends.pop(key, None)
        keys = []
        for table_id, partition, end in request.replica_ends:
            key = (table_id, partition, request.node_id)
            self._replica_ends[key] = end
            keys.append(key)
        self._reported_keys[request.node_id] = keys
        if request.want_shutdown:
            if request.node_id in self._shutting_down or server.fenced:
                self._shutting_down.add(request.node_id)
                # Ready once the records moving its actives away are committed: the shell waits for that.
                return Decision((), ServerHeartbeatResponse(ControllerError.NONE, "", True, True), wait=True)
            self._shutting_down.add(request.node_id)
            batch = self._propose(self._fence_records(request.node_id, "controlled shutdown"))
            return Decision((batch,), ServerHeartbeatResponse(ControllerError.NONE, "", True, True))
        if server.fenced and request.metadata_offset > server.changed_at:
            batch = self._propose(self._unfence_records(request.node_id))
            return Decision((batch,), ServerHeartbeatResponse(ControllerError.NONE, "", False, False))
        return Decision(
            (), ServerHeartbeatResponse(ControllerError.NONE, "", server.fenced, False), wait=False
        )

    def renew_session(self, node_id: int, now: int) -> None:
        """What a heartbeat does when it repeats the server's previous one (same incarnation, metadata
        offset and replica ends, no shutdown asked) on the same view, that one answered without error or
        batch: only the session is renewed. The replication simulator heartbeats every server after every
        event and takes this shortcut for the repeats; a change of `_heartbeat` must keep it true."""
        self._sessions[node_id] = now

    def _fence_records(self, node_id: int, reason: str) -> tuple[MetadataRecord, ...]:
        records: list[MetadataRecord] = [FenceServer(node_id, reason)]
        fenced = {n for n, s in self._view.servers.items() if s.fenced} | {node_id}
        for parts in self._view.partitions.values():
            for part in parts:
                if node_id in part.replicas or node_id in part.isr:
                    change = self._elect_rule(part, node_id, fenced, self._replica_ends)
                    if change is not None:
                        records.append(change)
        return tuple(records)

    def _remove_server(self, request: RemoveServerRequest) -> Decision:
        """Drain the server (or unregister it at once when it holds nothing), after checking that what
        is left can hold every table and that no partition depends on it alone."""
        node_id = request.node_id
        server = self._view.servers.get(node_id)
        if server is None:
            if node_id in self._view.removed:
                return self._error(RemoveServerResponse(ControllerError.NONE, "", "removed"))
            unknown = RemoveServerResponse(ControllerError.UNKNOWN_SERVER, f"no server {node_id}", "")
            return self._error(unknown)
        problem = self._removal_problem(node_id)
        if problem is not None:
            return self._error(RemoveServerResponse(ControllerError.INVALID_REQUEST, problem, ""))
        if not self._view.holds_replicas(node_id):
            batch = self._propose(self._unregister_records(node_id))
            return Decision((batch,), RemoveServerResponse(ControllerError.NONE, "", "removed"))
        if server.draining:
            return self._error(RemoveServerResponse(ControllerError.NONE, "", "draining"))
        log.info("server %d draining: its replicas move to the other servers", node_id)
        batch = self._propose((DrainServer(node_id),))
        return Decision((batch,), RemoveServerResponse(ControllerError.NONE, "", "draining"))

    def _removal_problem(self, node_id: int) -> str | None:
        server = self._view.servers[node_id]
        if node_id in self.voters:
            # Not done for the operator: leaving the quorum changes how many failures it survives (3
            # voters to 2), which deserves its own decision, and a replacement voter should join first.
            return (
                f"server {node_id} is a voter of the metadata quorum: take it out of the quorum first "
                f"(`hotstate cluster voters remove {node_id}`, or DELETE /v1/cluster/voters/{node_id}; add "
                "a replacement voter before if the quorum should keep its size), then remove the server"
            )
        holds = self._view.holds_replicas(node_id)
        if holds and self.config.reassign_interval_ms <= 0:
            return (
                f"server {node_id} holds replicas and reassign.interval.ms=0 moves none: "
                "turn reassignment on to drain it"
            )
        brokers = self._view.placement_brokers()
        # A dead server that holds nothing takes no capacity away: the others hold its share already.
        takes_capacity = holds or any(b.node_id == node_id for b in brokers)
        left = [b for b in brokers if b.node_id != node_id]
        for table in sorted(self._view.tables.values(), key=lambda t: t.table_id):
            needed = 1 + table.standby_replicas
            if takes_capacity and len(left) < needed:
                return (
                    f"removing server {node_id} would leave {len(left)} live broker(s) "
                    f"({', '.join(str(b.node_id) for b in left) or 'none'}); table {table.name!r} needs "
                    f"{needed} (1 active + {table.standby_replicas} standby(s)): add a server first"
                )
            for part in self._view.partitions.get(table.table_id, ()):
                # Live, it hands such a partition over (a copy elsewhere catches up first); dead, it
                # holds the only copy of every committed record.
                if server.fenced and part.isr == (node_id,):
                    return (
                        f"partition {table.name}/{part.partition} has no in-sync replica but server "
                        f"{node_id}: removing it would lose that partition's data; bring it back first"
                    )
        return None

    def _unregister_records(self, node_id: int) -> tuple[MetadataRecord, ...]:
        self._sessions.pop(node_id, None)
        self._shutting_down.discard(node_id)
        self._fenced_since.pop(node_id, None)
        self._reported.discard(node_id)
        for key in self._reported_keys.pop(node_id, ()):
            self._replica_ends.pop(key, None)
        log.info("server %d removed from the cluster", node_id)
        return (UnregisterServer(node_id),)

    def _unfence_records(self, node_id: int) -> tuple[MetadataRecord, ...]:
        records: list[MetadataRecord] = [UnfenceServer(node_id)]
        for parts in self._view.partitions.values():
            for part in parts:
                change = elect_on_unfence(part, node_id)
                if change is not None:
                    records.append(change)
        return tuple(records)

    # ------------------------------------------------------------------ partitions
    def _alter_partition(self, request: AlterPartitionRequest) -> Decision:
        parts = self._view.partitions.get(request.table_id, ())
        if not 0 <= request.partition < len(parts):
            return self._error(
                AlterPartitionResponse(
                    ControllerError.UNKNOWN_TABLE, f"no partition {request.table_id}/{request.partition}"
                )
            )
        part = parts[request.partition]
        fenced = {n for n, s in self._view.servers.items() if s.fenced}
        change = alter_isr(
            part,
            node_id=request.node_id,
            leader_epoch=request.leader_epoch,
            partition_epoch=request.partition_epoch,
            isr=request.isr,
            unavailable=fenced | self._shutting_down,
        )
        if isinstance(change, IsrRefusal):
            error = ControllerError.STALE_PARTITION_STATE if change.stale else ControllerError.INVALID_REQUEST
            return self._error(AlterPartitionResponse(error, change.reason))
        return Decision((self._propose((change,)),), AlterPartitionResponse(ControllerError.NONE, ""))

    # ------------------------------------------------------------------ tables
    def _create_table(self, request: CreateTableRequest) -> Decision:
        problem = _invalid_table(request)
        if problem is not None:
            return self._error(CreateTableResponse(ControllerError.INVALID_REQUEST, problem, -1))
        if request.name in self._view.tables:
            existing = self._view.tables[request.name]
            return self._error(
                CreateTableResponse(
                    ControllerError.TABLE_EXISTS, f"table {request.name!r} exists", existing.table_id
                )
            )
        if not self._view.placement_brokers():
            return self._error(
                CreateTableResponse(ControllerError.NO_LIVE_BROKERS, "no live broker can host partitions", -1)
            )
        table_id = self._view.next_table_id
        create = self._create_record(request, request.name, "")
        try:
            placed = self._place(TableInfo.created(create))
        except (ValueError, AssignorInternalError) as error:
            log.error("cannot place table %r: %s", request.name, error)
            return self._error(
                CreateTableResponse(ControllerError.INVALID_REQUEST, f"cannot place the table: {error}", -1)
            )
        batch = self._propose((create, *placed.records), built=placed.parts)
        return Decision((batch,), CreateTableResponse(ControllerError.NONE, "", table_id))

    def _register_writer(self, request: RegisterWriterRequest) -> Decision:
        table = self._view.tables.get(request.table)
        if table is None:
            return self._error(
                RegisterWriterResponse(ControllerError.UNKNOWN_TABLE, f"no table {request.table!r}", ())
            )
        problem = _invalid_rack(request.rack)
        full = len(table.writer_racks) >= MAX_WRITER_RACKS
        if problem is None and request.rack not in table.writer_racks and full:
            problem = f"table {table.name!r} has {MAX_WRITER_RACKS} writer racks already"
        if problem is not None:
            return self._error(RegisterWriterResponse(ControllerError.INVALID_REQUEST, problem, ()))
        if request.rack in table.writer_racks:
            return self._error(RegisterWriterResponse(ControllerError.NONE, "", table.writer_racks))
        racks = tuple(sorted((*table.writer_racks, request.rack)))
        batch = self._propose((TableWriters(table.table_id, racks),))
        return Decision((batch,), RegisterWriterResponse(ControllerError.NONE, "", racks))

    def _set_value_columns(self, request: SetValueColumnsRequest) -> Decision:
        table = self._view.tables.get(request.table)
        if table is None:
            return self._error(
                SetValueColumnsResponse(ControllerError.UNKNOWN_TABLE, f"no table {request.table!r}")
            )
        problem = _invalid_value_columns(request.value_columns, table.key_columns) or (
            invalid_ttl_value_columns(table.ttl, table.key_columns, request.value_columns)
        )
        if problem is not None:
            return self._error(SetValueColumnsResponse(ControllerError.INVALID_REQUEST, problem))
        if request.value_columns == table.value_columns:
            return self._error(SetValueColumnsResponse(ControllerError.NONE, ""))
        batch = self._propose((TableValueColumns(table.table_id, request.value_columns),))
        return Decision((batch,), SetValueColumnsResponse(ControllerError.NONE, ""))

    def _commit_batch(self, request: CommitBatchRequest) -> Decision:
        """The table's last Spark batch and every partition's position, merged with what it had: positions
        never go back, so a query's min_batch is at least as strict as the batch asked for."""
        table = self._view.tables.get(request.table)
        # table_id -1: a batch that wrote nothing knows no id (its writers learn it from the metadata).
        if table is None or request.table_id not in (-1, table.table_id):
            return self._error(
                CommitBatchResponse(
                    ControllerError.UNKNOWN_TABLE, f"no table {request.table!r} with id {request.table_id}"
                )
            )
        problem = None
        if request.batch_id < 0:
            problem = f"batch_id={request.batch_id}: must be >= 0"
        elif any(not 0 <= p < table.partitions or position < 0 for p, position in request.positions):
            problem = f"positions must name partitions 0..{table.partitions - 1} with positions >= 0"
        if problem is not None:
            return self._error(CommitBatchResponse(ControllerError.INVALID_REQUEST, problem))
        positions = list(table.batch_positions or (0,) * table.partitions)
        for partition, position in request.positions:
            positions[partition] = max(positions[partition], position)
        record = TableBatch(table.table_id, request.batch_id, tuple(positions))
        return Decision((self._propose((record,)),), CommitBatchResponse(ControllerError.NONE, ""))

    def _delete_table(self, request: DeleteTableRequest) -> Decision:
        table = self._view.tables.get(request.name)
        if table is None:
            return self._error(
                DeleteTableResponse(ControllerError.UNKNOWN_TABLE, f"no table {request.name!r}")
            )
        # An overwrite being loaded into a deleted table is dropped with it (its swap then fails).
        staged = self._view.staged_for(table.name)
        records = tuple(DeleteTable(t.name, t.table_id) for t in (table, *staged))
        batch = self._propose(records)
        return Decision((batch,), DeleteTableResponse(ControllerError.NONE, ""))

    # ------------------------------------------------------------------ overwrites (table generations)
    def _stage_table(self, request: StageTableRequest) -> Decision:
        """A new, empty generation of the table, placed as a table of its own under its staging name."""
        create = CreateTableRequest(
            request.name,
            request.partitions,
            request.standby_replicas,
            request.key_columns,
            request.acceptable_lag,
            request.writer_rack,
            window=request.window,
            ttl=request.ttl,
        )
        problem = _invalid_table(create)
        current = self._view.tables.get(request.name)
        if problem is None and current is not None and current.key_columns != request.key_columns:
            problem = (
                f"table {request.name!r} has key {_keys(current.key_columns)}, the overwrite gives key "
                f"{_keys(request.key_columns)}: an overwrite keeps the table's key columns (delete the "
                "table to change them)"
            )
        if problem is not None:
            return self._error(StageTableResponse(ControllerError.INVALID_REQUEST, problem, -1, "", -1))
        if not self._view.live_brokers():
            return self._error(
                StageTableResponse(
                    ControllerError.NO_LIVE_BROKERS, "no live broker can host partitions", -1, "", -1
                )
            )
        table_id = self._view.next_table_id
        name = staging_name(request.name, table_id)
        record = self._create_record(request, name, request.name)
        try:
            placed = self._place(TableInfo.created(record))
        except (ValueError, AssignorInternalError) as error:
            log.error("cannot place a generation of table %r: %s", request.name, error)
            return self._error(
                StageTableResponse(
                    ControllerError.INVALID_REQUEST, f"cannot place the table: {error}", -1, "", -1
                )
            )
        # One overwrite at a time per table: the latest wins, and an earlier one's swap fails.
        superseded = tuple(DeleteTable(t.name, t.table_id) for t in self._view.staged_for(request.name))
        batch = self._propose((*superseded, record, *placed.records), built=placed.parts)
        replaced_id = -1 if current is None else current.table_id
        return Decision((batch,), StageTableResponse(ControllerError.NONE, "", table_id, name, replaced_id))

    def _replace_table(self, request: ReplaceTableRequest) -> Decision:
        current = self._view.tables.get(request.name)
        if current is not None and current.table_id == request.table_id:
            return self._error(ReplaceTableResponse(ControllerError.NONE, ""))  # a repeat: done already
        staged_now = self._view.staged_for(request.name)
        staged = next((t for t in staged_now if t.table_id == request.table_id), None)
        if staged is None:
            return self._error(
                ReplaceTableResponse(
                    ControllerError.UNKNOWN_TABLE,
                    f"generation {request.table_id} of table {request.name!r} is gone: dropped by a later "
                    "overwrite of the table, its deletion, or staged_timeout_ms; the table is unchanged",
                )
            )
        if current is not None and current.key_columns != staged.key_columns:
            return self._error(
                ReplaceTableResponse(
                    ControllerError.INVALID_REQUEST,
                    f"table {request.name!r} was recreated with key {_keys(current.key_columns)} during "
                    f"the overwrite, which has key {_keys(staged.key_columns)}",
                )
            )
        if any(not 0 <= p < staged.partitions or at < 0 for p, at in request.positions):
            return self._error(
                ReplaceTableResponse(
                    ControllerError.INVALID_REQUEST,
                    f"positions must name partitions 0..{staged.partitions - 1} with positions >= 0",
                )
            )
        positions = [0] * staged.partitions
        for partition, at in request.positions:
            positions[partition] = max(positions[partition], at)
        replaced_id = -1 if current is None else current.table_id
        record = ReplaceTable(request.name, staged.table_id, replaced_id, tuple(positions))
        batch = self._propose((record,))
        self._staged_since.pop(staged.table_id, None)
        return Decision((batch,), ReplaceTableResponse(ControllerError.NONE, ""))

    def _expired_stagings(self, now: int) -> tuple[MetadataRecord, ...]:
        """DeleteTable records for staged generations past staged_timeout_ms (their writer is gone)."""
        tables = self._view.tables
        checked = self._staged_checked
        if checked is None or checked[0] is not tables:
            checked = self._staged_checked = (tables, {t.table_id: t for t in tables.values() if t.staged})
        staged = checked[1]
        if not staged and not self._staged_since:
            return ()
        for table_id in [t for t in self._staged_since if t not in staged]:
            del self._staged_since[table_id]
        records: list[MetadataRecord] = []
        for table_id, table in sorted(staged.items()):
            since = self._staged_since.setdefault(table_id, now)
            if now - since > self.config.staged_timeout_ms:
                log.warning(
                    "overwrite of table %r: generation %d not swapped in after %d ms: dropped",
                    table.staging_for,
                    table_id,
                    now - since,
                )
                records.append(DeleteTable(table.name, table_id))
        return tuple(records)

    # ------------------------------------------------------------------ plumbing
    def _error(self, reply: ControllerResponse) -> Decision:
        # Errors read the view too: a NoOp commit proves the view was current when it was read.
        return Decision((self._propose((NoOp(),)),), reply)

    def _propose(
        self, records: tuple[MetadataRecord, ...], *, built: tuple[PartitionInfo, ...] | None = None
    ) -> MetadataBatch:
        """`built`: the partitions of the batch's PartitionBlocks (one table's, from partition 0), built
        already (off the loop)."""
        offset = self._next_offset
        self._next_offset += 1
        for record in records:
            part = None
            if built is not None and isinstance(record, PartitionBlock):
                part = built[record.first : record.first + len(record.actives)]
            self._builder.apply(record, offset, part)
        self._view = self._builder.build(self._next_offset)
        return MetadataBatch(records)


def _removed_message(node_id: int) -> str:
    return (
        f"server {node_id} was removed from the cluster (hotstate server remove): its node id is never "
        "used again; to join, start a new server with a new node.id and an empty data directory"
    )


def _invalid_table(request: CreateTableRequest) -> str | None:
    if not TABLE_NAME.fullmatch(request.name):
        return f"table name {request.name!r}: must match {TABLE_NAME.pattern}"
    if not 1 <= request.partitions <= MAX_PARTITIONS:
        return f"partitions={request.partitions}: must be 1..{MAX_PARTITIONS}"
    if request.standby_replicas is None:
        # The server that took the request fills in its num.standby.replicas; a controller never guesses.
        return "standby_replicas: not given (the server taking the request fills in num.standby.replicas)"
    if not 0 <= request.standby_replicas <= MAX_STANDBYS:
        return f"standby_replicas={request.standby_replicas}: must be 0..{MAX_STANDBYS}"
    if not request.key_columns:
        return "key_columns: at least one key column is needed"
    names = [c.name for c in request.key_columns]
    if len(set(names)) != len(names):
        return f"key_columns {names}: names must be distinct"
    if request.acceptable_lag is not None and request.acceptable_lag < 0:
        return f"acceptable_lag={request.acceptable_lag}: must be >= 0 or unset"
    problem = invalid_window(request.key_columns, request.window) or invalid_ttl(
        request.key_columns, request.window, request.ttl
    )
    if problem is not None:
        return problem
    if request.writer_rack is not None:
        return _invalid_rack(request.writer_rack)
    return None


def _keys(columns: tuple[KeyColumn, ...]) -> str:
    return "(" + ", ".join(f"{c.name} {c.type.name}" for c in columns) + ")"


def invalid_window(key_columns: tuple[KeyColumn, ...], window: TableWindow | None) -> str | None:
    """Why a table's window and key columns do not fit together: a window needs the key to end in exactly
    one WINDOW_START then one WINDOW_END column (what the partition hash leaves out), and no other."""
    types = [c.type for c in key_columns]
    bounds = [i for i, kind in enumerate(types) if kind in WINDOW_KEY_TYPES]
    if window is None:
        if bounds:
            return f"key column {key_columns[bounds[0]].name!r}: a window bound in a table without a window"
        return None
    if types[-2:] != list(WINDOW_KEY_TYPES) or len(bounds) != 2:
        return (
            "a windowed table's key ends in one WINDOW_START and then one WINDOW_END column, and has no other"
        )
    if window.kind not in WINDOW_KINDS:
        return f"window kind {window.kind!r}: must be one of {', '.join(WINDOW_KINDS)}"
    for name, value in (
        ("size", window.size_us),
        ("slide", window.slide_us),
        ("retention", window.retention_us),
    ):
        if value is not None and value <= 0:
            return f"window {name} {value} us: must be positive or unset"
    return None


def _invalid_value_columns(columns: tuple[ValueColumn, ...], key: tuple[KeyColumn, ...]) -> str | None:
    if len(columns) > MAX_VALUE_COLUMNS:
        return f"{len(columns)} value columns: at most {MAX_VALUE_COLUMNS}"
    names = [c.name for c in columns]
    if len(set(names)) != len(names):
        return f"value columns {names}: names must be distinct"
    keys = {c.name for c in key} & set(names)
    if keys:
        return f"value columns {sorted(keys)}: key columns are not value columns"
    for column in columns:
        if not column.name or not column.type or len(column.type) > MAX_VALUE_TYPE_CHARS:
            return f"value column {column.name!r} of type {column.type[:80]!r}: needs a name and a type"
    return None


def _invalid_rack(rack: str) -> str | None:
    if not rack or len(rack) > MAX_RACK_CHARS or not rack.isprintable() or rack != rack.strip():
        return (
            f"writer rack {rack!r}: must be 1..{MAX_RACK_CHARS} printable characters, no surrounding spaces"
        )
    return None

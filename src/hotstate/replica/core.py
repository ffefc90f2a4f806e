"""The replication core of one partition replica: sans-IO, like the Raft core.

The metadata image decides the roles: the partition's *active* (leader) at a leader epoch, its in-sync
replicas (ISR) and every other replica (standbys, warmups), which follow by pulling with Fetch(offset, last
fetched epoch) and truncate where their log diverged (KRaft/Kafka). The active appends Produce batches,
tracks each follower's end offset and moves the high watermark (HW) to the smallest end offset over the ISR;
a Produce is acknowledged once the HW passes it (acks=all). ISR changes go through the controller: the core
asks (`Ready.isr_change`) and only the committed metadata changes the ISR, so the controller can always
elect a new active that holds every acknowledged record. Every store applies records up to the HW only.

Inputs: `set_metadata`, `produce`, `step(message)`, `tick`, `snapshot_installed`. Output: `ready()`:
1. apply `log_ops` to the partition log (and fsync when `must_sync` and the log is configured to);
2. send `messages`; hand `produce_results` back to the callers; send `isr_change` to the controller;
3. apply `committed` batches to the store, each with its end offset and epoch as the new position;
4. when `snapshot_needed` is set, rebuild the store from the active's snapshot and call
   `snapshot_installed`;
5. call `advance(ready)`.
No sockets, clocks or threads: `now` (ms) comes in with every call.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hotstate.log.batch import RecordBatch
from hotstate.log.divergence import DivergingEpoch, NeedsSnapshot, check_fetch, truncation_offset
from hotstate.replica.batchlog import BatchLog, batch_bytes
from hotstate.replica.messages import FetchRequest, FetchResponse, ReplicaError, ReplicaMessage


class ReplicaSafetyError(Exception):
    """The core was driven into something that would lose or corrupt committed data."""


class ReplicaRole(enum.Enum):
    LEADER = "leader"
    FOLLOWER = "follower"


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    fetch_max_wait_ms: int = 200  # long poll: an idle follower's fetch waits this long at the active
    # A fetch whose only news is a newer HW is held this long (at most fetch_max_wait_ms) for data to
    # travel with it; 0 answers at once. Under steady writes the HW then rides on the next batch's answer
    # instead of costing two more messages per batch, but a follower's store stays a write behind.
    fetch_hw_delay_ms: int = 0
    # A follower appends (and its active reads) a fetch answer in one piece on the event loop: 1 MiB, as
    # Kafka's replica.fetch.max.bytes (4 MiB answers were among a bulk load's longest loop stalls).
    fetch_max_bytes: int = 1024 * 1024
    fetch_timeout_ms: int = 1500  # no answer in this long: fetch again (the answer was lost)
    fetch_backoff_ms: int = 50  # after an error answer (stale metadata on either side)
    replica_lag_time_max_ms: int = 10_000  # an ISR member not caught up for this long is dropped
    isr_change_retry_ms: int = 1000
    min_insync_replicas: int = 1
    # Records kept in the log below the store's position (up to 1.5 times as many, since the start moves
    # in steps of half of it), for followers that fall a little behind; a follower further back gets a
    # store snapshot.
    log_retention_records: int = 100_000


@dataclass(frozen=True, slots=True)
class PartitionView:
    """This partition as the metadata image has it."""

    active: int | None
    leader_epoch: int
    isr: tuple[int, ...]
    replicas: tuple[int, ...]
    partition_epoch: int  # goes up with every change: the compare-and-set token of an ISR change


@dataclass(frozen=True, slots=True)
class AppendBatches:
    batches: tuple[RecordBatch, ...]


@dataclass(frozen=True, slots=True)
class TruncateTo:
    offset: int


@dataclass(frozen=True, slots=True)
class AdvanceStart:
    offset: int


@dataclass(frozen=True, slots=True)
class ResetLog:
    """Empty the log at `offset` (a follower that installed the active's store snapshot)."""

    offset: int
    epoch: int


LogOp = AppendBatches | TruncateTo | AdvanceStart | ResetLog


@dataclass(frozen=True, slots=True)
class ProduceResult:
    token: int
    error: ReplicaError
    base_offset: int
    end_offset: int


@dataclass(frozen=True, slots=True)
class IsrChange:
    leader_epoch: int
    partition_epoch: int
    isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class SnapshotNeeded:
    leader: int
    leader_epoch: int


@dataclass(frozen=True, slots=True)
class Ready:
    log_ops: tuple[LogOp, ...]
    messages: tuple[ReplicaMessage, ...]
    produce_results: tuple[ProduceResult, ...]
    committed: tuple[RecordBatch, ...]
    isr_change: IsrChange | None
    snapshot_needed: SnapshotNeeded | None
    log_end_offset: int  # the log end once `log_ops` are done
    high_watermark: int

    def is_empty(self) -> bool:
        return not (
            self.log_ops
            or self.messages
            or self.produce_results
            or self.committed
            or self.isr_change is not None
            or self.snapshot_needed is not None
        )


@dataclass(slots=True)
class _Follower:
    end_offset: int = -1  # unknown until it fetches in this epoch
    last_caught_up: int = 0
    last_fetch_at: int = 0
    last_fetch_leader_end: int = 0


@dataclass(slots=True)
class _PendingProduce:
    token: int
    base_offset: int
    end_offset: int
    deadline: int


@dataclass(slots=True)
class _Outbox:
    log_ops: list[LogOp] = field(default_factory=list)
    messages: list[ReplicaMessage] = field(default_factory=list)
    results: list[ProduceResult] = field(default_factory=list)
    isr_change: IsrChange | None = None
    snapshot_needed: SnapshotNeeded | None = None


class ReplicaCore:
    def __init__(
        self,
        node_id: int,
        table_id: int,
        partition: int,
        config: ReplicaConfig,
        *,
        log: BatchLog,
        store_position: int,
        store_epoch: int,
        now: int,
    ) -> None:
        self.id = node_id
        self.table_id = table_id
        self.partition = partition
        self.config = config
        self._now = now
        if store_position > log.end_offset or store_position < log.start_offset:
            # The store is ahead of the log (the log lost a tail) or the log starts above the store (should
            # not happen): the store is the truth, so the log restarts at its position.
            log.reset(store_position, store_epoch)
            self._reset_on_load: ResetLog | None = ResetLog(store_position, store_epoch)
        else:
            self._reset_on_load = None
        self._log = log
        self._applied = store_position  # the store's position; handed-out committed batches move it
        self._hw = store_position  # a store never holds a record above a HW
        self._durable_end = log.end_offset
        self._role = ReplicaRole.FOLLOWER
        self._view: PartitionView | None = None
        self._epoch = -1
        self._leader: int | None = None
        self._out = _Outbox()
        if self._reset_on_load is not None:
            self._out.log_ops.append(self._reset_on_load)
        # leader state
        self._followers: dict[int, _Follower] = {}
        self._epoch_start_offset = 0
        self._pending: list[_PendingProduce] = []
        self._next_token = 1
        self._parked: dict[int, tuple[FetchRequest, int]] = {}
        self._hw_delay = min(config.fetch_hw_delay_ms, config.fetch_max_wait_ms)
        self._isr_request: IsrChange | None = None
        self._isr_request_at = 0
        self._isr_retry_after = 0  # after a refusal, ask again no sooner than this
        # follower state
        self._next_fetch_id = 1
        self._fetch_in_flight: tuple[int, int] | None = None  # (fetch id, sent at)
        self._next_fetch_at = 0
        self._awaiting_snapshot = False
        self._leader_end_offset = log.end_offset  # newest log end the active reported

    # ------------------------------------------------------------------ queries
    @property
    def role(self) -> ReplicaRole:
        return self._role

    @property
    def leader_epoch(self) -> int:
        return self._epoch

    @property
    def leader(self) -> int | None:
        return self._leader

    @property
    def high_watermark(self) -> int:
        return self._hw

    @property
    def epoch_start_offset(self) -> int:
        """The log end when this replica became the active of its epoch (0 otherwise)."""
        return self._epoch_start_offset

    @property
    def position(self) -> int:
        """Offset of the last record applied to the store + 1 (once the shell applied what it was given)."""
        return self._applied

    @property
    def log_start_offset(self) -> int:
        return self._log.start_offset

    @property
    def log_end_offset(self) -> int:
        return self._log.end_offset

    def records_from(self, offset: int) -> list[RecordBatch]:
        """The log's records from `offset` (at least its start) to its end, as batches: what is appended
        but not applied to the store yet, for a caller that reads the store at `offset` and must know what
        will change it (the expiry sweep)."""
        start = max(offset, self._log.start_offset)
        return self._log.read_between(start, self._log.end_offset)

    @property
    def known_end_offset(self) -> int:
        """The partition's end as far as this replica knows: its own, or the active's last report."""
        return max(self._log.end_offset, self._leader_end_offset)

    @property
    def isr(self) -> tuple[int, ...]:
        return () if self._view is None else self._view.isr

    @property
    def awaiting_snapshot(self) -> bool:
        return self._awaiting_snapshot

    def follower_end_offsets(self) -> dict[int, int]:
        return {r: f.end_offset for r, f in self._followers.items()}

    # ------------------------------------------------------------------ inputs
    def set_metadata(self, view: PartitionView, now: int) -> None:
        self._now = now
        old = self._view
        if old is not None and (view.leader_epoch, view.partition_epoch) <= (
            old.leader_epoch,
            old.partition_epoch,
        ):
            return  # nothing new, or an older image than one already seen
        self._view = view
        if view.active == self.id:
            if self._role is not ReplicaRole.LEADER or view.leader_epoch != self._epoch:
                self._become_leader(view)
            else:
                self._on_isr_update(view)
        else:
            if (
                self._role is ReplicaRole.LEADER
                or view.leader_epoch != self._epoch
                or view.active != self._leader
            ):
                self._become_follower(view)
        self._maybe_advance_hw()

    def produce(
        self, records: Sequence[bytes], leader_epoch: int, now: int, timeout_ms: int
    ) -> ProduceResult | int:
        """Append `records` as one batch: a token whose result comes in a later Ready, or an error now."""
        self._now = now
        error = self._produce_error(leader_epoch)
        if error is not ReplicaError.NONE:
            return ProduceResult(0, error, -1, -1)
        if not records:
            return ProduceResult(0, ReplicaError.INVALID_REQUEST, -1, -1)
        batch = RecordBatch(self._log.end_offset, self._epoch, tuple(records))
        self._log.append(batch)
        self._out.log_ops.append(AppendBatches((batch,)))
        token = self._next_token
        self._next_token += 1
        self._pending.append(_PendingProduce(token, batch.base_offset, batch.next_offset, now + timeout_ms))
        self._answer_parked()
        return token

    def step(self, message: ReplicaMessage, now: int) -> None:
        self._now = now
        if isinstance(message, FetchRequest):
            self._on_fetch(message)
        else:
            self._on_fetch_response(message)

    def tick(self, now: int) -> None:
        self._now = now
        if self._role is ReplicaRole.LEADER:
            for src, (request, deadline) in list(self._parked.items()):
                if now >= deadline:
                    del self._parked[src]
                    self._send(self._fetch_answer(request))
            self._expire_produces()
            self._maybe_change_isr()
        else:
            self._maybe_fetch()

    def next_deadline(self) -> int | None:
        """When `tick` has something to do next (None: only an input can change anything)."""
        times: list[int] = []
        if self._role is ReplicaRole.LEADER:
            times.extend(deadline for _, deadline in self._parked.values())
            times.extend(p.deadline for p in self._pending)
            if self._view is not None and len(self._view.isr) > 1:
                times.append(self._now + self.config.replica_lag_time_max_ms // 4)
            if self._isr_request is not None:
                times.append(self._isr_request_at + self.config.isr_change_retry_ms)
        elif self._leader is not None and not self._awaiting_snapshot:
            if self._fetch_in_flight is None:
                times.append(self._next_fetch_at)
            else:
                times.append(self._fetch_in_flight[1] + self.config.fetch_timeout_ms)
        return min(times) if times else None

    def snapshot_installed(self, position: int, epoch: int, now: int) -> None:
        """The shell replaced the store with the active's snapshot, taken at `position` and `epoch`."""
        self._now = now
        if position < self._applied:
            raise ReplicaSafetyError(
                f"{self._name()}: snapshot at {position} is behind the store's position {self._applied}"
            )
        self._awaiting_snapshot = False
        self._log.reset(position, epoch)
        self._out.log_ops.append(ResetLog(position, epoch))
        self._applied = position
        self._hw = max(self._hw, position)
        self._durable_end = position
        self._next_fetch_at = now
        self._maybe_fetch()

    def snapshot_failed(self, now: int) -> None:
        """The snapshot transfer broke off: fetch again after a backoff (the active says what to do)."""
        self._now = now
        self._awaiting_snapshot = False
        self._next_fetch_at = now + self.config.fetch_backoff_ms

    def ready(self) -> Ready:
        committed: tuple[RecordBatch, ...] = ()
        if self._hw > self._applied:
            committed = tuple(self._log.read_between(self._applied, self._hw))
        out = self._out
        return Ready(
            tuple(out.log_ops),
            tuple(out.messages),
            tuple(out.results),
            committed,
            out.isr_change,
            out.snapshot_needed,
            self._log.end_offset,
            self._hw,
        )

    def advance(self, ready: Ready) -> None:
        """The shell did everything `ready` asked for."""
        out = self._out
        del out.log_ops[: len(ready.log_ops)]
        del out.messages[: len(ready.messages)]
        del out.results[: len(ready.produce_results)]
        if ready.isr_change is not None and out.isr_change is ready.isr_change:
            out.isr_change = None
        if ready.snapshot_needed is not None and out.snapshot_needed is ready.snapshot_needed:
            out.snapshot_needed = None
        if ready.committed:
            self._applied = max(self._applied, ready.committed[-1].next_offset)
            self._trim_log()
        if ready.log_ops:
            # A reset or truncation after ready() (a snapshot installed) may have cut the log below it.
            self._durable_end = min(ready.log_end_offset, self._log.end_offset)
            if self._role is ReplicaRole.LEADER:
                self._maybe_advance_hw()

    # ------------------------------------------------------------------ roles
    def _become_leader(self, view: PartitionView) -> None:
        self._fail_pending(ReplicaError.NOT_LEADER)
        self._role = ReplicaRole.LEADER
        self._epoch = view.leader_epoch
        self._leader = self.id
        self._awaiting_snapshot = False
        self._fetch_in_flight = None
        self._epoch_start_offset = self._log.end_offset
        # Every replica gets a full lag window in the new epoch before it can be dropped from the ISR.
        self._followers = {
            r: _Follower(last_caught_up=self._now, last_fetch_at=self._now)
            for r in view.replicas
            if r != self.id
        }
        # Fetches parked in the previous epoch: answer them, so their followers refetch in the new epoch
        # at once instead of after their fetch timeout.
        for request, _ in self._parked.values():
            self._send(self._empty_answer(request, ReplicaError.FENCED_EPOCH))
        self._parked.clear()
        self._isr_request = None

    def _become_follower(self, view: PartitionView) -> None:
        if self._role is ReplicaRole.LEADER:
            self._fail_pending(ReplicaError.NOT_LEADER)
            for request, _ in self._parked.values():
                self._send(self._empty_answer(request, ReplicaError.NOT_LEADER))
            self._parked.clear()
        self._role = ReplicaRole.FOLLOWER
        self._epoch = view.leader_epoch
        self._leader = view.active
        self._followers = {}
        self._isr_request = None
        self._fetch_in_flight = None
        self._next_fetch_at = self._now
        self._maybe_fetch()

    def _on_isr_update(self, view: PartitionView) -> None:
        for r in view.replicas:
            if r != self.id and r not in self._followers:
                self._followers[r] = _Follower(last_caught_up=self._now, last_fetch_at=self._now)
        for r in list(self._followers):
            if r not in view.replicas:
                del self._followers[r]
        # The partition changed, so an outstanding request was applied or can no longer apply (its
        # partition_epoch is stale now): decide afresh from the committed ISR.
        self._isr_request = None

    # ------------------------------------------------------------------ leader
    def _produce_error(self, leader_epoch: int) -> ReplicaError:
        if self._role is not ReplicaRole.LEADER:
            if leader_epoch > self._epoch:
                return ReplicaError.UNKNOWN_EPOCH
            return ReplicaError.FENCED_EPOCH if leader_epoch < self._epoch else ReplicaError.NOT_LEADER
        if leader_epoch < self._epoch:
            return ReplicaError.FENCED_EPOCH
        if leader_epoch > self._epoch:
            return ReplicaError.UNKNOWN_EPOCH
        if len(self.isr) < self.config.min_insync_replicas:
            return ReplicaError.NOT_ENOUGH_REPLICAS
        return ReplicaError.NONE

    def _on_fetch(self, request: FetchRequest) -> None:
        if self._role is not ReplicaRole.LEADER or request.leader_epoch != self._epoch:
            if request.leader_epoch < self._epoch:
                error = ReplicaError.FENCED_EPOCH
            elif request.leader_epoch > self._epoch:
                error = ReplicaError.UNKNOWN_EPOCH
            else:
                error = ReplicaError.NOT_LEADER
            self._send(self._empty_answer(request, error))
            return
        follower = self._followers.get(request.src)
        if follower is None:
            self._send(self._empty_answer(request, ReplicaError.NOT_REPLICA))
            return
        answer = self._fetch_answer(request)
        if answer.error is ReplicaError.NONE and answer.diverging is None:
            hw_before = self._hw
            self._note_follower(request.src, follower, request.fetch_offset)
            if self._hw != hw_before:
                # This fetch moved the HW: the answer carries the new one, which is news to the follower
                # (an answer with the old one would cost it another round trip to learn it).
                answer = _with(answer, high_watermark=self._hw)
            if not answer.batches and request.high_watermark >= self._hw:
                # Nothing new: hold the request until there is, or until the long poll runs out.
                self._parked[request.src] = (request, self._now + self.config.fetch_max_wait_ms)
                return
            if not answer.batches and self._hw_delay > 0:
                # Only the HW is news: hold it briefly for the next batch to carry it.
                self._parked[request.src] = (request, self._now + self._hw_delay)
                return
        self._parked.pop(request.src, None)
        self._send(answer)

    def _note_follower(self, replica: int, follower: _Follower, fetch_offset: int) -> None:
        leader_end = self._log.end_offset
        # Kafka's rule: caught up now if it asked for our end; caught up as of its previous fetch if it now
        # asks for what was our end back then.
        if fetch_offset >= leader_end:
            follower.last_caught_up = self._now
        elif fetch_offset >= follower.last_fetch_leader_end:
            follower.last_caught_up = max(follower.last_caught_up, follower.last_fetch_at)
        follower.last_fetch_at = self._now
        follower.last_fetch_leader_end = leader_end
        follower.end_offset = fetch_offset
        self._maybe_advance_hw()
        if (
            replica not in self._effective_isr()
            and fetch_offset >= self._hw
            and fetch_offset >= self._epoch_start_offset
        ):
            self._maybe_change_isr()

    def _fetch_answer(self, request: FetchRequest) -> FetchResponse:
        log = self._log
        base = self._empty_answer(request, ReplicaError.NONE)
        match check_fetch(log, request.fetch_offset, request.last_fetched_epoch):
            case NeedsSnapshot():
                return _with(base, error=ReplicaError.SNAPSHOT_NEEDED)
            case DivergingEpoch() as diverging:
                return base.with_diverging(diverging)
        max_bytes = min(request.max_bytes, self.config.fetch_max_bytes)
        return _with(base, batches=tuple(log.read(request.fetch_offset, max_bytes)))

    def _empty_answer(self, request: FetchRequest, error: ReplicaError) -> FetchResponse:
        """An answer to `request` with no batches: this replica's epoch, high watermark and log bounds."""
        return FetchResponse(
            self.id,
            request.src,
            self.table_id,
            self.partition,
            self._epoch,
            request.fetch_id,
            error,
            self._hw,
            self._log.start_offset,
            self._log.end_offset,
        )

    def _answer_parked(self) -> None:
        delay = self._hw_delay
        for src, (request, deadline) in list(self._parked.items()):
            answer = self._fetch_answer(request)
            hw_news = request.high_watermark < self._hw
            if answer.batches or answer.error is not ReplicaError.NONE or (hw_news and delay <= 0):
                del self._parked[src]
                self._send(answer)
            elif hw_news and deadline > self._now + delay:
                self._parked[src] = (request, self._now + delay)

    def _effective_isr(self) -> set[int]:
        """The committed ISR plus the replicas we asked to add: the HW waits for both (KIP-497)."""
        isr = set(self.isr)
        if self._isr_request is not None:
            isr |= set(self._isr_request.isr)
        return isr

    def _high_watermark_candidate(self) -> int:
        ends = [self._durable_end]
        for replica in self._effective_isr():
            if replica == self.id:
                continue
            follower = self._followers.get(replica)
            ends.append(follower.end_offset if follower is not None else -1)
        return min(ends)

    def _maybe_advance_hw(self) -> None:
        if self._role is not ReplicaRole.LEADER or self.id not in self.isr:
            return
        candidate = self._high_watermark_candidate()
        if candidate <= self._hw:
            return
        self._hw = candidate
        self._complete_produces()
        self._answer_parked()

    def _complete_produces(self) -> None:
        still = []
        for pending in self._pending:
            if pending.end_offset <= self._hw:
                error = (
                    ReplicaError.NONE
                    if len(self.isr) >= self.config.min_insync_replicas
                    else ReplicaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND
                )
                self._out.results.append(
                    ProduceResult(pending.token, error, pending.base_offset, pending.end_offset)
                )
            else:
                still.append(pending)
        self._pending = still

    def _expire_produces(self) -> None:
        still = []
        for pending in self._pending:
            if self._now >= pending.deadline:
                self._out.results.append(
                    ProduceResult(
                        pending.token, ReplicaError.TIMEOUT, pending.base_offset, pending.end_offset
                    )
                )
            else:
                still.append(pending)
        self._pending = still

    def _fail_pending(self, error: ReplicaError) -> None:
        for pending in self._pending:
            self._out.results.append(
                ProduceResult(pending.token, error, pending.base_offset, pending.end_offset)
            )
        self._pending = []

    def _desired_isr(self) -> tuple[int, ...]:
        view = self._view
        assert view is not None
        keep = []
        for replica in view.replicas:
            if replica == self.id:
                keep.append(replica)
                continue
            follower = self._followers.get(replica)
            if follower is None:
                continue
            if replica in view.isr:
                if self._now - follower.last_caught_up <= self.config.replica_lag_time_max_ms:
                    keep.append(replica)
            elif follower.end_offset >= max(self._hw, self._epoch_start_offset) and follower.end_offset >= 0:
                keep.append(replica)
        return tuple(keep)

    def isr_change_rejected(self, change: IsrChange, now: int) -> None:
        """The controller refused `change` for a reason other than a stale `partition_epoch` (so it was never
        applied): stop counting its additions. A stale refusal means the metadata moved: wait for it."""
        self._now = now
        if self._isr_request == change:
            self._isr_request = None
            self._isr_retry_after = now + self.config.isr_change_retry_ms
            # Its additions no longer hold the HW back: it may pass now, not only at the next fetch.
            self._maybe_advance_hw()

    def _maybe_change_isr(self) -> None:
        view = self._view
        if view is None or self._role is not ReplicaRole.LEADER:
            return
        if self._isr_request is not None:
            # Outstanding until the metadata answers: the controller may have applied it already, so its
            # additions keep counting towards the HW, and the same request goes again (it is idempotent
            # through partition_epoch).
            if self._now - self._isr_request_at >= self.config.isr_change_retry_ms:
                self._isr_request_at = self._now
                self._out.isr_change = self._isr_request
            return
        if self._now < self._isr_retry_after:
            return
        desired = self._desired_isr()
        if set(desired) == set(view.isr):
            return
        change = IsrChange(self._epoch, view.partition_epoch, desired)
        self._isr_request = change
        self._isr_request_at = self._now
        self._out.isr_change = change

    def _trim_log(self) -> None:
        retention = self.config.log_retention_records
        target = self._applied - retention
        # The start moves in steps of half the retention: each move rewrites the log's start-offset and
        # epoch files, which cost 15% of a server's CPU when done after every applied batch.
        if target - self._log.start_offset < max(1, retention // 2):
            return
        old_start = self._log.start_offset
        new_start = self._log.advance_start(target)
        if new_start > old_start:  # the target can fall inside the first batch: then nothing moved
            self._out.log_ops.append(AdvanceStart(new_start))

    # ------------------------------------------------------------------ follower
    def _maybe_fetch(self) -> None:
        if self._role is ReplicaRole.LEADER or self._leader is None or self._awaiting_snapshot:
            return
        if self._fetch_in_flight is not None:
            _, sent_at = self._fetch_in_flight
            if self._now - sent_at < self.config.fetch_timeout_ms:
                return
        elif self._now < self._next_fetch_at:
            return
        self._send_fetch()

    def _send_fetch(self) -> None:
        assert self._leader is not None
        fetch_id = self._next_fetch_id
        self._next_fetch_id += 1
        self._fetch_in_flight = (fetch_id, self._now)
        self._send(
            FetchRequest(
                self.id,
                self._leader,
                self.table_id,
                self.partition,
                self._epoch,
                fetch_id,
                self._log.end_offset,
                self._log.last_epoch,
                self._hw,
                self.config.fetch_max_bytes,
            )
        )

    def _on_fetch_response(self, response: FetchResponse) -> None:
        if (
            self._role is ReplicaRole.LEADER
            or self._fetch_in_flight is None
            or response.fetch_id != self._fetch_in_flight[0]
            or response.src != self._leader
        ):
            return  # late, duplicated, or from a replica that is no longer our active
        self._fetch_in_flight = None
        if response.error is not ReplicaError.NONE:
            if response.error is ReplicaError.SNAPSHOT_NEEDED and response.leader_epoch == self._epoch:
                self._awaiting_snapshot = True
                self._out.snapshot_needed = SnapshotNeeded(response.src, self._epoch)
                return
            self._next_fetch_at = self._now + self.config.fetch_backoff_ms
            return
        if response.leader_epoch != self._epoch:
            self._next_fetch_at = self._now + self.config.fetch_backoff_ms
            return
        log = self._log
        self._leader_end_offset = response.log_end_offset
        diverging = response.diverging
        if diverging is not None:
            self._truncate(truncation_offset(log, diverging))
        else:
            appended = []
            for batch in response.batches:
                if batch.next_offset <= log.end_offset:
                    continue
                if batch.base_offset != log.end_offset:
                    break  # not contiguous with what we hold: fetch again from our end
                log.append(batch)
                appended.append(batch)
            if appended:
                self._out.log_ops.append(AppendBatches(tuple(appended)))
            self._hw = max(self._hw, min(response.high_watermark, log.end_offset))
        self._next_fetch_at = self._now
        self._send_fetch()

    def _truncate(self, offset: int) -> None:
        if offset < self._hw or offset < self._applied:
            raise ReplicaSafetyError(
                f"{self._name()} told to truncate to {offset}, below its HW {self._hw} "
                f"or its position {self._applied}"
            )
        if offset < self._log.start_offset:
            raise ReplicaSafetyError(f"{self._name()} told to truncate to {offset}, below its log start")
        self._log.truncate_to(offset)
        self._durable_end = min(self._durable_end, offset)
        self._out.log_ops.append(TruncateTo(offset))

    # ------------------------------------------------------------------ plumbing
    def _send(self, message: ReplicaMessage) -> None:
        self._out.messages.append(message)

    def _name(self) -> str:
        return f"replica {self.id} of {self.table_id}/{self.partition}"


def _with(base: FetchResponse, **changes: Any) -> FetchResponse:
    return dataclasses.replace(base, **changes)


__all__ = [
    "AdvanceStart",
    "AppendBatches",
    "IsrChange",
    "LogOp",
    "PartitionView",
    "ProduceResult",
    "Ready",
    "ReplicaConfig",
    "ReplicaCore",
    "ReplicaRole",
    "ReplicaSafetyError",
    "ResetLog",
    "SnapshotNeeded",
    "TruncateTo",
    "batch_bytes",
]

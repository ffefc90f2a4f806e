"""The KRaft consensus core: a sans-IO state machine stepped with messages and ticks (etcd-io/raft style).

Inputs: `step(message, now)`, `tick(now)`, `propose(data, now)`, `take_snapshot(...)`. Output: `ready()`,
a `Ready` listing what to persist, what to send once persisted and what became committed; the shell does
that work and calls `advance(ready)`. Nothing here reads a clock, opens a socket or starts a thread, and
the only randomness comes from a generator seeded by the caller, so a run is a pure function of its inputs.

Protocol (KIP-595, KIP-630): leader epochs; Vote with the candidate's last epoch and end offset; a new
leader sends BeginQuorumEpoch and writes a leader-change record in its own epoch; followers and observers
pull with Fetch(offset, last fetched epoch) and truncate on a diverging-epoch answer; a fetcher below the
leader's log start gets the snapshot id and pulls it with FetchSnapshot in chunks; the HW is the end offset
of a majority of voters, once a record of the leader's epoch is in it.

Membership (KIP-853, Raft's single-server change): the voter set is a VOTERS entry of the log, in effect
on each member from the moment the member appends it, committed or not; with no such entry in the log or
its snapshot, the voters are the bootstrap set the shell passes in (`controller.quorum.voters`). The
leader adds or removes one voter at a time (`add_voter`, `remove_voter`), never while an earlier change is
uncommitted or before an entry of its own epoch is committed, and only adds an observer that has caught
up; a leader that removed itself leads until the removal commits, then steps down.

The rules that keep it safe each sit in a small method of their own (`_candidate_log_ok`,
`_majority_end_offset`, `_may_commit`, `_quorum_state_to_persist`, `_voters_in_effect`,
`_reconfiguration_problem`) so that the simulator's tests can break one at a time and show that the
invariant checks notice.
"""

from __future__ import annotations

import dataclasses
import enum
import random
from collections.abc import Iterable, Sequence

from hotstate.log.divergence import DivergingEpoch, NeedsSnapshot, check_fetch, truncation_offset
from hotstate.raft.config import RaftConfig
from hotstate.raft.memlog import RaftLog
from hotstate.raft.messages import (
    BeginQuorumEpoch,
    BeginQuorumEpochResponse,
    ErrorCode,
    Fetch,
    FetchResponse,
    FetchSnapshot,
    FetchSnapshotResponse,
    Message,
    Vote,
    VoteResponse,
)
from hotstate.raft.quorum_state import QuorumState
from hotstate.raft.ready import AppendEntries, LogOp, Ready, SaveSnapshot, TruncateTo
from hotstate.raft.records import (
    Entry,
    EntryKind,
    Snapshot,
    SnapshotId,
    decode_voters,
    encode_voters,
)


class RaftRole(enum.Enum):
    UNATTACHED = "unattached"
    FOLLOWER = "follower"
    CANDIDATE = "candidate"
    LEADER = "leader"


class NotLeaderError(Exception):
    """A proposal reached a member that does not lead; `leader_id` is who does, when known."""

    def __init__(self, node_id: int, epoch: int, leader_id: int | None) -> None:
        hint = f"the leader is {leader_id}" if leader_id is not None else "no leader is known"
        super().__init__(f"member {node_id} does not lead epoch {epoch}; {hint}")
        self.epoch = epoch
        self.leader_id = leader_id


class ProposalRejectedError(Exception):
    """The leader holds too many unflushed proposals (back-pressure)."""


class ReconfigurationError(Exception):
    """The leader refused an AddVoter or RemoveVoter; the message says why (and whether to retry)."""


class RaftSafetyError(Exception):
    """The core was asked for what only a broken protocol asks for (e.g. to drop a committed entry)."""


def majority(count: int) -> int:
    return count // 2 + 1


class RaftNode:
    def __init__(
        self,
        node_id: int,
        voters: Iterable[int],
        config: RaftConfig | None = None,
        *,
        seed: int,
        now: int,
        quorum_state: QuorumState | None = None,
        snapshot: Snapshot | None = None,
        entries: Sequence[Entry] = (),
    ) -> None:
        self.id = node_id
        self._bootstrap_voters = frozenset(voters)
        if not self._bootstrap_voters:
            raise ValueError("controller.quorum.voters is empty: a quorum needs at least one voter")
        self.voters = self._bootstrap_voters
        self.is_voter = node_id in self.voters
        self.config = config or RaftConfig()
        self._rng = random.Random(seed)
        self._now = now

        state = quorum_state or QuorumState()
        self._epoch = state.epoch
        self._voted_id = state.voted_id
        self._leader_id = state.leader_id

        self._snapshot = snapshot
        self._log = RaftLog(snapshot.id if snapshot else None, entries)
        # The voter set below the log start (the snapshot's), and every VOTERS entry in the log, in order.
        self._base_voters: frozenset[int] | None = snapshot.voters if snapshot else None
        self._voter_changes: list[tuple[int, frozenset[int]]] = []
        self._note_voter_entries(self._log.read_between(self._log.start_offset, self._log.end_offset))
        # Whatever a snapshot holds was committed; the shell loads it before the core replays the rest.
        self._hw = self._log.start_offset
        self._applied = self._log.start_offset
        self._persisted_end = self._log.end_offset

        # Outputs gathered until the shell asks for them.
        self._out_messages: list[Message] = []
        self._out_ops: list[LogOp] = []
        self._out_state_dirty = False
        self._out_snapshot_to_load: Snapshot | None = None

        # Timers (absolute times on the caller's clock); None when not running.
        self._election_deadline: int | None = None
        self._backoff_deadline: int | None = None
        self._fetch_deadline: int | None = None
        self._request_deadline: int | None = None

        # Candidate state.
        self._votes_granted: set[int] = set()
        self._votes_rejected: set[int] = set()
        self._election_retries = 0

        # Follower / observer state.
        self._snapshot_fetch: tuple[SnapshotId, bytearray] | None = None
        self._fetch_target: int | None = None

        # Leader state.
        self._epoch_start_offset = 0
        self._progress: dict[int, int] = {}
        self._last_fetch_at: dict[int, int] = {}
        self._begin_epoch_acked: set[int] = set()
        self._begin_epoch_resend_at = 0
        self._parked_fetches: dict[int, tuple[Fetch, int]] = {}
        self._pending: list[tuple[bytes, EntryKind]] = []
        self._linger_deadline: int | None = None
        # Observers' latest fetch: (fetch offset, when, whether it was at or above the HW then).
        self._observer_fetches: dict[int, tuple[int, int, bool]] = {}

        self._refresh_voters()
        self._role = RaftRole.UNATTACHED
        if self._leader_id == self.id:
            # A restarted leader has lost its view of the followers; it resigns and lets the quorum move on.
            self._leader_id = None
            self._out_state_dirty = True
            self._enter_unattached_timers()
        elif self._leader_id is not None:
            self._become_follower(self._epoch, self._leader_id)
        else:
            self._enter_unattached_timers()

    # ------------------------------------------------------------------ observation
    @property
    def role(self) -> RaftRole:
        return self._role

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def leader_id(self) -> int | None:
        return self._leader_id

    @property
    def voted_id(self) -> int | None:
        return self._voted_id

    @property
    def high_watermark(self) -> int:
        return self._hw

    @property
    def log(self) -> RaftLog:
        return self._log

    @property
    def snapshot(self) -> Snapshot | None:
        return self._snapshot

    @property
    def voter_change_pending(self) -> bool:
        """Whether the latest VOTERS entry in the log is not yet committed."""
        return bool(self._voter_changes) and self._voter_changes[-1][0] >= self._hw

    def observer_progress(self) -> dict[int, tuple[int, int, bool]]:
        """On the leader: each observer's latest fetch (offset, time, whether it had caught up then)."""
        return dict(self._observer_fetches)

    @property
    def pending_proposals(self) -> int:
        """Proposals accepted but not yet in the log (lingering): the next one gets end_offset + this."""
        return len(self._pending)

    def next_deadline(self) -> int | None:
        """The earliest time at which `tick` has work to do (for shells that sleep instead of polling)."""
        times = [
            t
            for t in (
                self._election_deadline,
                self._backoff_deadline,
                self._fetch_deadline,
                self._request_deadline,
                self._linger_deadline,
            )
            if t is not None
        ]
        if self._role is RaftRole.LEADER:
            times.append(self._begin_epoch_resend_at)
            times.append(self._check_quorum_deadline())
            times.extend(deadline for _, deadline in self._parked_fetches.values())
        return min(times) if times else None

    # ------------------------------------------------------------------ inputs
    def tick(self, now: int) -> None:
        self._now = max(self._now, now)
        now = self._now
        if self._role is RaftRole.LEADER:
            self._tick_leader(now)
        elif self._role is RaftRole.CANDIDATE:
            if self._backoff_deadline is not None and now >= self._backoff_deadline:
                self._become_candidate()
            elif self._election_deadline is not None and now >= self._election_deadline:
                self._start_backoff()
        elif self._role is RaftRole.FOLLOWER:
            if self._fetch_deadline is not None and now >= self._fetch_deadline:
                if self._may_stand():
                    self._become_candidate()
                else:
                    self._become_unattached(self._epoch)
            elif self._request_deadline is not None and now >= self._request_deadline:
                self._send_fetch()
        else:
            if self._may_stand():
                if self._election_deadline is None:  # it became a member again after its removal was lost
                    self._election_deadline = now + self._random_election_timeout()
                elif now >= self._election_deadline:
                    self._become_candidate()
            elif self._request_deadline is None or now >= self._request_deadline:
                self._send_fetch()

    def leader_gone(self, leader_id: int, now: int) -> None:
        """The shell has proof that `leader_id`'s process is gone (its port refuses connections): a follower
        of it stands now instead of waiting out its fetch timeout. Standing early is always safe in Raft
        (only votes elect); proof rather than a hunch keeps a live leader from being disturbed."""
        self._now = max(self._now, now)
        if (
            self._role is RaftRole.FOLLOWER
            and self._leader_id == leader_id
            and self._fetch_deadline is not None
        ):
            # Every follower hears of the death at about the same moment; standing all at once splits the
            # vote and costs a backoff round. So they stand in turn, by node id: the first at once, each next
            # one a fifth of an election timeout later, by when the first one's Vote has usually reached it.
            rank = sorted(self.voters - {leader_id}).index(self.id) if self.id in self.voters else 0
            stagger = rank * max(1, self.config.election_timeout_ms // 5)
            self._fetch_deadline = min(self._fetch_deadline, self._now + stagger)
            self.tick(self._now)

    def propose(self, data: bytes, now: int) -> int:
        """Queue `data` for the log; returns the offset it will have if this leader's epoch commits it.

        The caller learns the outcome from the committed entries: the entry at that offset with this epoch
        means success, a different epoch there means the proposal was lost with the leadership.
        """
        self._now = max(self._now, now)
        if self._role is not RaftRole.LEADER:
            raise NotLeaderError(self.id, self._epoch, self._leader_id)
        if len(self._pending) >= self.config.max_pending_proposals:
            raise ProposalRejectedError(
                f"{len(self._pending)} proposals wait for the log (limit {self.config.max_pending_proposals})"
            )
        offset = self._log.end_offset + len(self._pending)
        self._pending.append((data, EntryKind.DATA))
        if self.config.append_linger_ms == 0:
            self._flush_pending()
        elif self._linger_deadline is None:
            self._linger_deadline = self._now + self.config.append_linger_ms
        return offset

    def add_voter(self, node_id: int, now: int) -> int:
        """KIP-853 AddVoter: append a VOTERS entry with `node_id` added; returns its offset. It is in effect
        at once (the new voter counts toward the HW from now on); the change is done when it commits."""
        self._now = max(self._now, now)
        self._require_leader()
        if node_id in self.voters:
            raise ReconfigurationError(f"node {node_id} is already a voter")
        problem = self._reconfiguration_problem() or self._catch_up_problem(node_id)
        if problem is not None:
            raise ReconfigurationError(f"cannot add voter {node_id}: {problem}")
        offset = self._append_voters(self.voters | {node_id})
        fetch_offset, _, _ = self._observer_fetches[node_id]
        self._progress[node_id] = fetch_offset
        # Counted fresh from now: the check-quorum timer must not make the leader resign at once.
        self._last_fetch_at[node_id] = self._now
        return offset

    def remove_voter(self, node_id: int, now: int) -> int:
        """KIP-853 RemoveVoter: append a VOTERS entry without `node_id`; returns its offset. The leader may
        remove itself: it keeps leading (without counting itself) until the removal commits."""
        self._now = max(self._now, now)
        self._require_leader()
        if node_id not in self.voters:
            raise ReconfigurationError(f"node {node_id} is not a voter")
        if len(self.voters) == 1:
            raise ReconfigurationError(f"node {node_id} is the only voter; add another one first")
        problem = self._reconfiguration_problem()
        if problem is not None:
            raise ReconfigurationError(f"cannot remove voter {node_id}: {problem}")
        offset = self._append_voters(self.voters - {node_id})
        self._progress.pop(node_id, None)
        self._last_fetch_at.pop(node_id, None)
        self._begin_epoch_acked.discard(node_id)
        self._update_high_watermark()  # a smaller majority may commit more at once
        return offset

    def _require_leader(self) -> None:
        if self._role is not RaftRole.LEADER:
            raise NotLeaderError(self.id, self._epoch, self._leader_id)

    def _append_voters(self, voters: frozenset[int]) -> int:
        self._flush_pending()
        offset = self._log.end_offset
        self._pending.append((encode_voters(voters), EntryKind.VOTERS))
        self._flush_pending()
        return offset

    def take_snapshot(self, end_offset: int, data: bytes) -> SnapshotId:
        """Record that the state machine's state after applying every entry below `end_offset` is `data`.

        The snapshot is kept to serve FetchSnapshot and the log below it is dropped (a SaveSnapshot op).
        """
        if not self._log.start_offset < end_offset <= self._applied:
            raise ValueError(
                f"snapshot at {end_offset}: must be above the log start {self._log.start_offset} and at most "
                f"the applied offset {self._applied}"
            )
        snapshot_id = SnapshotId(end_offset, self._log.epoch_at(end_offset - 1))
        below = [voters for offset, voters in self._voter_changes if offset < end_offset]
        self._base_voters = below[-1] if below else self._base_voters
        self._voter_changes = [(o, v) for o, v in self._voter_changes if o >= end_offset]
        self._snapshot = Snapshot(snapshot_id, data, self._base_voters)
        self._log.advance_start(snapshot_id)
        self._out_ops.append(SaveSnapshot(self._snapshot))
        return snapshot_id

    def step(self, message: Message, now: int) -> None:
        self._now = max(self._now, now)
        if message.dst != self.id:
            return
        match message:
            case Vote():
                self._on_vote(message)
            case VoteResponse():
                self._on_vote_response(message)
            case BeginQuorumEpoch():
                self._on_begin_quorum_epoch(message)
            case BeginQuorumEpochResponse():
                self._on_begin_quorum_epoch_response(message)
            case Fetch():
                self._on_fetch(message)
            case FetchResponse():
                self._on_fetch_response(message)
            case FetchSnapshot():
                self._on_fetch_snapshot(message)
            case FetchSnapshotResponse():
                self._on_fetch_snapshot_response(message)

    # ------------------------------------------------------------------ outputs
    def has_ready(self) -> bool:
        return bool(
            self._out_messages
            or self._out_ops
            or self._out_state_dirty
            or self._out_snapshot_to_load is not None
            or self._hw > self._applied
        )

    def ready(self) -> Ready:
        """Hand out the work gathered since the last call (the core forgets it: do it, then `advance`)."""
        committed: tuple[Entry, ...] = ()
        if self._hw > self._applied:
            committed = tuple(self._log.read_between(self._applied, self._hw))
            self._applied = self._hw
        ready = Ready(
            quorum_state=self._quorum_state_to_persist() if self._out_state_dirty else None,
            log_ops=tuple(_merge_appends(self._out_ops)),
            messages=tuple(self._out_messages),
            committed=committed,
            snapshot_to_load=self._out_snapshot_to_load,
            high_watermark=self._hw,
            log_end_offset=self._log.end_offset,
        )
        self._out_messages = []
        self._out_ops = []
        self._out_state_dirty = False
        self._out_snapshot_to_load = None
        return ready

    def advance(self, ready: Ready) -> None:
        """The shell has made `ready` durable and sent its messages."""
        if ready.log_ops:
            self._persisted_end = min(ready.log_end_offset, self._log.end_offset)
        if self._role is RaftRole.LEADER:
            self._update_high_watermark()

    # ------------------------------------------------------------------ the safety rules
    def _candidate_log_ok(self, last_epoch: int, end_offset: int) -> bool:
        """A vote goes only to a candidate whose log is at least as up to date as ours."""
        return (last_epoch, end_offset) >= (self._log.last_epoch, self._log.end_offset)

    def _majority_end_offset(self) -> int:
        """The largest offset that a majority of voters (the leader's durable log included) hold."""
        ends = sorted(
            (
                self._persisted_end if voter == self.id else self._progress.get(voter, 0)
                for voter in self.voters
            ),
            reverse=True,
        )
        return ends[majority(len(ends)) - 1]

    def _may_commit(self, high_watermark: int) -> bool:
        """Only a record of the leader's own epoch commits what lies below it (Raft §5.4.2)."""
        return high_watermark > self._epoch_start_offset

    def _quorum_state_to_persist(self) -> QuorumState:
        return QuorumState(self._epoch, self._voted_id, self._leader_id)

    def _voters_in_effect(self) -> frozenset[int]:
        """The latest voter set in the log, committed or not (Raft §4.1: a server always uses the latest
        configuration in its log); the snapshot's below it; the bootstrap set when neither has one."""
        if self._voter_changes:
            return self._voter_changes[-1][1]
        return self._base_voters if self._base_voters is not None else self._bootstrap_voters

    def _reconfiguration_problem(self) -> str | None:
        """Why the leader may not start a membership change now, or None. One change at a time: with two
        uncommitted, the majorities of the oldest and the newest set need not overlap. And not before an
        entry of this epoch commits: otherwise a change of an earlier leader, still uncommitted and later
        lost, could overlap this one the same way (the bug Ongaro found in single-server changes)."""
        if self.voter_change_pending:
            offset = self._voter_changes[-1][0]
            return f"the voter change at offset {offset} is not committed yet; retry when it is"
        if self._hw <= self._epoch_start_offset:
            return f"leader {self.id} has not committed an entry of epoch {self._epoch} yet; retry shortly"
        return None

    def _catch_up_problem(self, node_id: int) -> str | None:
        """A new voter must be an observer that fetches from this leader and has the committed log: added
        while far behind, it would count toward the majority without holding what it counts for, and the
        quorum could stall until it caught up."""
        seen = self._observer_fetches.get(node_id)
        if seen is None:
            return (
                f"node {node_id} has not fetched from leader {self.id} in epoch {self._epoch}; start it "
                "(as an observer) and let it catch up first"
            )
        offset, at, caught_up = seen
        if self._now - at > self.config.fetch_timeout_ms:
            return f"node {node_id} has not fetched for {self._now - at} ms; is it running?"
        if not caught_up and offset < self._hw:
            return (
                f"node {node_id} is not caught up: it fetches from offset {offset}, the high watermark "
                f"is {self._hw}; retry when it has caught up"
            )
        return None

    # ------------------------------------------------------------------ the voter set
    def _note_voter_entries(self, entries: Iterable[Entry]) -> None:
        for entry in entries:
            if entry.kind is EntryKind.VOTERS:
                self._voter_changes.append((entry.offset, decode_voters(entry.data)))

    def _append_to_log(self, entries: Sequence[Entry]) -> None:
        self._log.append(entries)
        self._note_voter_entries(entries)
        self._refresh_voters()

    def _refresh_voters(self) -> None:
        voters = self._voters_in_effect()
        if voters == self.voters:
            return
        self.voters = voters
        self.is_voter = self.id in voters
        for gone in [n for n in self._progress if n not in voters]:
            del self._progress[gone]

    def _may_stand(self) -> bool:
        """A voter stands for election; so does a member whose own removal is the latest voter change and
        not committed as far as it knows (its vote does not count for itself). Otherwise, when every member
        with the newest log has such a removal (a leader removed itself and lost office before it
        committed), nobody could be elected to commit or drop it."""
        if self.is_voter:
            return True
        if not self._voter_changes or self._voter_changes[-1][0] < self._hw:
            return False
        return self.id in self._voters_before_latest_change()

    def _voters_before_latest_change(self) -> frozenset[int]:
        if len(self._voter_changes) >= 2:
            return self._voter_changes[-2][1]
        return self._base_voters if self._base_voters is not None else self._bootstrap_voters

    def _step_down_if_removed(self) -> None:
        """A leader that removed itself resigns once the removal is committed (KIP-853): until then it
        must stay to commit it, since the new voters may not have it yet."""
        if self._role is RaftRole.LEADER and not self.is_voter and not self.voter_change_pending:
            self._voted_id = self.id  # it voted for itself in this epoch: it must not vote again
            self._become_unattached(self._epoch)

    # ------------------------------------------------------------------ role changes
    def _fetch_timeout(self) -> int:
        """The fetch timeout plus up to half an election timeout of jitter: followers whose last answers
        came together would otherwise all stand at once and split the vote."""
        return self.config.fetch_timeout_ms + self._rng.randrange(
            max(1, self.config.election_timeout_ms // 2)
        )

    def _random_election_timeout(self) -> int:
        timeout = self.config.election_timeout_ms
        return timeout + self._rng.randrange(timeout)

    def _enter_unattached_timers(self) -> None:
        self._role = RaftRole.UNATTACHED
        self._clear_leader_state()
        self._fetch_deadline = None
        self._backoff_deadline = None
        self._snapshot_fetch = None
        self._fetch_target = None
        if self._may_stand():
            self._election_deadline = self._now + self._random_election_timeout()
            self._request_deadline = None
        else:
            self._election_deadline = None
            self._request_deadline = self._now

    def _become_unattached(self, epoch: int) -> None:
        if epoch != self._epoch:
            self._voted_id = None
        self._epoch = epoch
        self._leader_id = None
        self._out_state_dirty = True
        self._enter_unattached_timers()

    def _become_follower(self, epoch: int, leader_id: int) -> None:
        if epoch != self._epoch:
            self._voted_id = None
        self._epoch = epoch
        self._leader_id = leader_id
        self._out_state_dirty = True
        self._role = RaftRole.FOLLOWER
        self._clear_leader_state()
        self._election_deadline = None
        self._backoff_deadline = None
        self._snapshot_fetch = None
        self._election_retries = 0
        self._fetch_target = leader_id
        self._fetch_deadline = self._now + self._fetch_timeout()
        self._send_fetch()

    def _become_candidate(self) -> None:
        if not self._may_stand():
            return
        self._epoch += 1
        self._voted_id = self.id
        self._leader_id = None
        self._out_state_dirty = True
        self._role = RaftRole.CANDIDATE
        self._clear_leader_state()
        self._fetch_deadline = None
        self._request_deadline = None
        self._backoff_deadline = None
        self._snapshot_fetch = None
        self._votes_granted = {self.id}
        self._votes_rejected = set()
        self._election_deadline = self._now + self._random_election_timeout()
        for voter in sorted(self.voters - {self.id}):
            self._send(
                Vote(
                    src=self.id,
                    dst=voter,
                    epoch=self._epoch,
                    last_epoch=self._log.last_epoch,
                    last_epoch_end_offset=self._log.end_offset,
                )
            )
        self._check_election()

    def _start_backoff(self) -> None:
        """A lost election waits a random, exponentially growing time so that rivals stop colliding."""
        self._election_retries += 1
        cap = min(self.config.election_backoff_max_ms, 50 * (1 << min(self._election_retries, 10)))
        self._election_deadline = None
        self._backoff_deadline = self._now + 1 + self._rng.randrange(cap)

    def _check_election(self) -> None:
        needed = majority(len(self.voters))
        if len(self._votes_granted & self.voters) >= needed:
            self._become_leader()
        elif len(self._votes_rejected) >= len(self.voters) - needed + 1 and self._backoff_deadline is None:
            self._start_backoff()

    def _become_leader(self) -> None:
        self._role = RaftRole.LEADER
        self._leader_id = self.id
        self._out_state_dirty = True
        self._election_deadline = None
        self._backoff_deadline = None
        self._fetch_deadline = None
        self._request_deadline = None
        self._election_retries = 0
        self._progress = {}
        self._last_fetch_at = {voter: self._now for voter in self.voters}
        self._begin_epoch_acked = set()
        self._parked_fetches = {}
        self._epoch_start_offset = self._log.end_offset
        self._pending = [(b"", EntryKind.LEADER_CHANGE)]
        self._flush_pending()
        self._send_begin_quorum_epoch()
        self._update_high_watermark()

    def _clear_leader_state(self) -> None:
        self._progress = {}
        self._observer_fetches = {}
        self._last_fetch_at = {}
        self._parked_fetches = {}
        self._pending = []
        self._linger_deadline = None

    def _observe_epoch(self, epoch: int, leader_id: int | None) -> None:
        """Move to a newer epoch, or learn the leader of ours, from anything a member said."""
        if epoch > self._epoch:
            if leader_id is not None and leader_id != self.id:
                self._become_follower(epoch, leader_id)
            else:
                self._become_unattached(epoch)
        elif (
            epoch == self._epoch
            and leader_id is not None
            and leader_id != self.id
            and self._role is not RaftRole.FOLLOWER
        ):
            if self._role is RaftRole.LEADER:
                raise RaftSafetyError(f"member {self.id} leads epoch {epoch} but {leader_id} claims it too")
            self._become_follower(epoch, leader_id)

    # ------------------------------------------------------------------ elections
    def _on_vote(self, request: Vote) -> None:
        if not self._may_stand() and not self._candidate_log_ok(
            request.last_epoch, request.last_epoch_end_offset
        ):
            # A candidate whose voter set is stale (it missed a change) may count us, a removed voter, and
            # could never win. A quick refusal would let it stand again at once, epoch after epoch, ahead of
            # the voter that holds the newer log and set: left unanswered, it waits out its election
            # timeout like everyone else, and the better candidate gets its turn (dropping is always safe).
            return
        if request.epoch > self._epoch:
            # A candidate we may not vote for must not postpone our own candidacy, or a voter with a short
            # log that keeps standing would stop the others from ever standing (a livelock).
            pending = [
                t
                for t in (self._election_deadline, self._backoff_deadline, self._fetch_deadline)
                if t is not None
            ]
            self._become_unattached(request.epoch)
            if pending and self._election_deadline is not None:
                self._election_deadline = min(self._election_deadline, min(pending))
        granted = (
            request.epoch == self._epoch
            and self._role is RaftRole.UNATTACHED
            and self._leader_id is None
            and self._voted_id in (None, request.src)
            and self._candidate_log_ok(request.last_epoch, request.last_epoch_end_offset)
        )
        if granted:
            self._voted_id = request.src
            self._out_state_dirty = True
            # Give the candidate its chance before we stand ourselves.
            self._election_deadline = self._now + self._random_election_timeout()
        self._send(VoteResponse(self.id, request.src, self._epoch, granted, self._leader_id))

    def _on_vote_response(self, response: VoteResponse) -> None:
        if response.epoch > self._epoch or (response.epoch == self._epoch and response.leader_id is not None):
            self._observe_epoch(response.epoch, response.leader_id)
            return
        if self._role is not RaftRole.CANDIDATE or response.epoch != self._epoch:
            return
        if response.granted:
            self._votes_granted.add(response.src)
        else:
            self._votes_rejected.add(response.src)
        self._check_election()

    def _on_begin_quorum_epoch(self, request: BeginQuorumEpoch) -> None:
        if request.epoch < self._epoch:
            self._send(
                BeginQuorumEpochResponse(self.id, request.src, self._epoch, ErrorCode.FENCED_LEADER_EPOCH)
            )
            return
        self._observe_epoch(request.epoch, request.src)
        self._send(BeginQuorumEpochResponse(self.id, request.src, self._epoch, ErrorCode.NONE))

    def _on_begin_quorum_epoch_response(self, response: BeginQuorumEpochResponse) -> None:
        if response.epoch > self._epoch:
            self._observe_epoch(response.epoch, None)
        elif self._role is RaftRole.LEADER and response.epoch == self._epoch:
            self._begin_epoch_acked.add(response.src)

    # ------------------------------------------------------------------ leader
    def _send_begin_quorum_epoch(self) -> None:
        for voter in sorted(self.voters - {self.id} - self._begin_epoch_acked):
            self._send(BeginQuorumEpoch(self.id, voter, self._epoch))
        self._begin_epoch_resend_at = self._now + self.config.request_timeout_ms

    def _check_quorum_deadline(self) -> int:
        """When the leader must resign unless more voters fetch: 1.5x the fetch timeout after the majority-th
        most recent fetch (the leader itself counts as fresh)."""
        times = sorted(
            (self._now if voter == self.id else self._last_fetch_at.get(voter, 0) for voter in self.voters),
            reverse=True,
        )
        return times[majority(len(times)) - 1] + (3 * self.config.fetch_timeout_ms) // 2

    def _tick_leader(self, now: int) -> None:
        if now >= self._check_quorum_deadline():
            # Partitioned from a majority: stop claiming leadership so clients go elsewhere.
            self._voted_id = self.id
            self._become_unattached(self._epoch)
            return
        if self._linger_deadline is not None and now >= self._linger_deadline:
            self._flush_pending()
        for replica_id, (request, deadline) in sorted(self._parked_fetches.items()):
            if now >= deadline:
                del self._parked_fetches[replica_id]
                self._send(self._fetch_answer(request))
        if now >= self._begin_epoch_resend_at:
            self._send_begin_quorum_epoch()

    def _flush_pending(self) -> None:
        self._linger_deadline = None
        if not self._pending:
            return
        start = self._log.end_offset
        entries = tuple(
            Entry(start + i, self._epoch, data, kind) for i, (data, kind) in enumerate(self._pending)
        )
        self._pending = []
        self._append_to_log(entries)
        self._out_ops.append(AppendEntries(entries))
        self._answer_parked_fetches()

    def _answer_parked_fetches(self) -> None:
        for replica_id in sorted(self._parked_fetches):
            request, _ = self._parked_fetches[replica_id]
            self._send(self._fetch_answer(request))
        self._parked_fetches = {}

    def _update_high_watermark(self) -> None:
        candidate = self._majority_end_offset()
        if candidate > self._hw and self._may_commit(candidate):
            self._hw = candidate
            self._answer_parked_fetches()  # followers learn the new HW without waiting out the long poll
            self._refresh_voters()
            self._step_down_if_removed()

    def _on_fetch(self, request: Fetch) -> None:
        if request.epoch > self._epoch:
            self._observe_epoch(request.epoch, None)
        if self._role is not RaftRole.LEADER or request.epoch != self._epoch:
            error = ErrorCode.FENCED_LEADER_EPOCH if request.epoch < self._epoch else ErrorCode.NOT_LEADER
            self._send(
                FetchResponse(
                    self.id,
                    request.src,
                    self._epoch,
                    self._leader_id,
                    error,
                    request.fetch_offset,
                    request.last_fetched_epoch,
                )
            )
            return
        answer = self._fetch_answer(request)
        if answer.diverging is None and answer.snapshot_id is None:
            if request.src in self.voters:
                self._progress[request.src] = request.fetch_offset
                self._last_fetch_at[request.src] = self._now
                self._begin_epoch_acked.add(request.src)
                self._update_high_watermark()
                if self.role is not RaftRole.LEADER:
                    return  # that fetch committed this leader's own removal
            else:
                caught_up = request.fetch_offset >= self._hw
                self._observer_fetches[request.src] = (request.fetch_offset, self._now, caught_up)
            if not answer.entries and request.high_watermark >= self._hw:
                # Nothing new: hold the request until there is, or until the long poll runs out.
                self._parked_fetches[request.src] = (request, self._now + self.config.fetch_max_wait_ms)
                return
        elif request.src in self.voters:
            self._last_fetch_at[request.src] = self._now
            self._begin_epoch_acked.add(request.src)
        self._parked_fetches.pop(request.src, None)
        self._send(answer)

    def _fetch_answer(self, request: Fetch) -> FetchResponse:
        log = self._log
        base = FetchResponse(
            self.id,
            request.src,
            self._epoch,
            self.id,
            ErrorCode.NONE,
            request.fetch_offset,
            request.last_fetched_epoch,
            high_watermark=self._hw,
        )
        match check_fetch(log, request.fetch_offset, request.last_fetched_epoch):
            case NeedsSnapshot():
                snapshot_id = self._snapshot.id if self._snapshot is not None else None
                return dataclasses.replace(base, snapshot_id=snapshot_id)
            case DivergingEpoch() as diverging:
                return dataclasses.replace(base, diverging=diverging)
        entries = tuple(log.read(request.fetch_offset, min(request.max_bytes, self.config.fetch_max_bytes)))
        return dataclasses.replace(base, entries=entries)

    def _on_fetch_snapshot(self, request: FetchSnapshot) -> None:
        if request.epoch > self._epoch:
            self._observe_epoch(request.epoch, None)
        if self._role is not RaftRole.LEADER or request.epoch != self._epoch:
            error = ErrorCode.FENCED_LEADER_EPOCH if request.epoch < self._epoch else ErrorCode.NOT_LEADER
            self._send(
                FetchSnapshotResponse(
                    self.id,
                    request.src,
                    self._epoch,
                    self._leader_id,
                    error,
                    request.snapshot_id,
                    request.position,
                )
            )
            return
        if request.src in self.voters:
            self._last_fetch_at[request.src] = self._now
        snapshot = self._snapshot
        if snapshot is None or snapshot.id != request.snapshot_id or request.position > len(snapshot.data):
            self._send(
                FetchSnapshotResponse(
                    self.id,
                    request.src,
                    self._epoch,
                    self.id,
                    ErrorCode.SNAPSHOT_NOT_FOUND,
                    request.snapshot_id,
                    request.position,
                )
            )
            return
        size = min(request.max_bytes, self.config.snapshot_chunk_bytes)
        chunk = snapshot.data[request.position : request.position + size]
        self._send(
            FetchSnapshotResponse(
                self.id,
                request.src,
                self._epoch,
                self.id,
                ErrorCode.NONE,
                snapshot.id,
                request.position,
                chunk,
                len(snapshot.data),
                snapshot.voters,
            )
        )

    # ------------------------------------------------------------------ follower and observer
    def _send_fetch(self) -> None:
        target = self._fetch_target if self._role is RaftRole.FOLLOWER else None
        if target is None:
            # An observer (or a voter with no leader) asks any voter; the answer names the leader.
            others = sorted(self.voters - {self.id})
            if not others:
                return
            target = others[self._rng.randrange(len(others))]
        self._request_deadline = self._now + self.config.request_timeout_ms + self.config.fetch_max_wait_ms
        if self._snapshot_fetch is not None and self._role is RaftRole.FOLLOWER:
            snapshot_id, buffer = self._snapshot_fetch
            self._send(
                FetchSnapshot(
                    self.id, target, self._epoch, snapshot_id, len(buffer), self.config.snapshot_chunk_bytes
                )
            )
            return
        self._send(
            Fetch(
                src=self.id,
                dst=target,
                epoch=self._epoch,
                fetch_offset=self._log.end_offset,
                last_fetched_epoch=self._log.last_epoch,
                max_bytes=self.config.fetch_max_bytes,
                high_watermark=self._hw,
            )
        )

    def _is_current_leader_answer(self, src: int, epoch: int) -> bool:
        return self._role is RaftRole.FOLLOWER and src == self._leader_id and epoch == self._epoch

    def _on_fetch_response(self, response: FetchResponse) -> None:
        if response.epoch < self._epoch:
            return
        self._observe_epoch(response.epoch, response.leader_id)
        if response.error is not ErrorCode.NONE:
            if self._role is not RaftRole.FOLLOWER and not self.is_voter:
                # Ask another voter soon rather than hammering this one.
                self._request_deadline = self._now + self.config.request_timeout_ms // 4
            return
        if not self._is_current_leader_answer(response.src, response.epoch):
            return
        log = self._log
        if (
            self._snapshot_fetch is not None
            or response.fetch_offset != log.end_offset
            or response.last_fetched_epoch != log.last_epoch
        ):
            return  # a late or duplicated answer to a fetch we no longer have out
        self._fetch_deadline = self._now + self._fetch_timeout()
        if response.diverging is not None:
            self._truncate(truncation_offset(log, response.diverging))
        elif response.snapshot_id is not None:
            self._snapshot_fetch = (response.snapshot_id, bytearray())
        else:
            if response.entries:
                self._append_to_log(response.entries)
                self._out_ops.append(AppendEntries(response.entries))
            self._hw = max(self._hw, min(response.high_watermark, log.end_offset))
            self._refresh_voters()
        self._send_fetch()

    def _truncate(self, offset: int) -> None:
        if offset < self._hw:
            raise RaftSafetyError(
                f"member {self.id} told to truncate to {offset}, below its high watermark {self._hw}"
            )
        self._log.truncate_to(offset)
        self._voter_changes = [(o, v) for o, v in self._voter_changes if o < offset]
        self._refresh_voters()
        self._out_ops.append(TruncateTo(offset))

    def _on_fetch_snapshot_response(self, response: FetchSnapshotResponse) -> None:
        if response.epoch < self._epoch:
            return
        self._observe_epoch(response.epoch, response.leader_id)
        if not self._is_current_leader_answer(response.src, response.epoch) or self._snapshot_fetch is None:
            return
        snapshot_id, buffer = self._snapshot_fetch
        if response.snapshot_id != snapshot_id:
            return
        if response.error is ErrorCode.SNAPSHOT_NOT_FOUND:
            self._snapshot_fetch = None  # the leader has a newer one; a plain fetch will name it
            self._send_fetch()
            return
        if response.error is not ErrorCode.NONE or response.position != len(buffer):
            return
        self._fetch_deadline = self._now + self._fetch_timeout()
        buffer.extend(response.chunk)
        if len(buffer) >= response.total_size:
            snapshot = Snapshot(snapshot_id, bytes(buffer), response.voters)
            self._snapshot_fetch = None
            self._snapshot = snapshot
            self._log.reset(snapshot_id)
            self._base_voters = snapshot.voters
            self._voter_changes = []
            self._out_ops.append(SaveSnapshot(snapshot, reset_log=True))
            self._out_snapshot_to_load = snapshot
            self._hw = max(self._hw, snapshot_id.end_offset)
            self._applied = max(self._applied, snapshot_id.end_offset)
            self._refresh_voters()
        self._send_fetch()

    # ------------------------------------------------------------------ plumbing
    def _send(self, message: Message) -> None:
        self._out_messages.append(message)


def _merge_appends(ops: list[LogOp]) -> list[LogOp]:
    merged: list[LogOp] = []
    for op in ops:
        previous = merged[-1] if merged else None
        if isinstance(op, AppendEntries) and isinstance(previous, AppendEntries):
            merged[-1] = AppendEntries(previous.entries + op.entries)
        else:
            merged.append(op)
    return merged

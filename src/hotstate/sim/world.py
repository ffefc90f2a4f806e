"""The deterministic Raft simulator: Raft cores, a seeded network, disks that tear, and a simulated clock.

It runs on the simulator kernel (`sim/kernel.py`): everything a run does is drawn from one seed, events
are ordered by (time, sequence), and no wall clock, thread or socket is involved, so a seed replays
exactly. After every event the invariant checker looks at the members the event touched; the first
violation stops the run with the command that replays it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hotstate.raft.messages import Message, VoteResponse
from hotstate.raft.node import (
    NotLeaderError,
    ProposalRejectedError,
    RaftNode,
    RaftRole,
    RaftSafetyError,
    ReconfigurationError,
)
from hotstate.raft.ready import Ready
from hotstate.sim.disk import SimDisk
from hotstate.sim.invariants import Checker, InvariantViolation
from hotstate.sim.kernel import (
    CALM,
    CRASH,
    DELIVER,
    DISK_DONE,
    EVENT_KINDS_USED,
    HEAL,
    PARTITION,
    RESTART,
    TICK,
    Kernel,
    Link,
    SimFailure,
)
from hotstate.sim.profile import FaultProfile
from hotstate.sim.state_machine import HashChainStateMachine

NodeFactory = Callable[..., RaftNode]

# A member sleeps until its core's next deadline, but never longer than this (as a real shell would).
MAX_SLEEP_MS = 100

(
    _PROPOSE,
    _CONVERGED,
    _CRASH_MEMBER,
    _CRASH_LEADER,
    _LEADER_GONE,
    _RECONFIGURE,
) = range(EVENT_KINDS_USED, EVENT_KINDS_USED + 6)

# Proposals go on this long into the calm period, so that recovery is also tested under load.
PROPOSALS_INTO_CALM_MS = 500


# A run broke an invariant (or a core raised): the kernel's failure, with the command that replays it.
SimulationFailure = SimFailure


@dataclass
class Member:
    id: int
    is_voter: bool
    disk: SimDisk = field(default_factory=SimDisk)
    core: RaftNode | None = None
    machine: HashChainStateMachine = field(default_factory=HashChainStateMachine)
    incarnation: int = 0
    writing: Ready | None = None  # a Ready whose fsync is under way
    backlog: deque[tuple[int, Any]] = field(default_factory=deque)
    tick_at: int | None = None  # the time of the one live tick event
    down_since: int | None = None

    @property
    def up(self) -> bool:
        return self.core is not None


@dataclass
class RunStats:
    seed: int
    events: int = 0
    messages: int = 0
    elections_won: int = 0
    max_epoch: int = 0
    committed: int = 0
    proposals: int = 0
    leader_crashes: int = 0
    voter_changes: int = 0  # AddVoter/RemoveVoter the leader accepted
    # Simulated ms from a leader's crash to the next leader (of a higher epoch) being elected.
    failover_ms: list[int] = field(default_factory=list)
    log: list[str] = field(default_factory=list)


class World:
    def __init__(
        self,
        seed: int,
        profile: FaultProfile,
        *,
        node_factory: NodeFactory = RaftNode,
        replay: str | None = None,
        trace: bool = False,
        check_liveness: bool = True,
    ) -> None:
        self.seed = seed
        self.profile = profile
        self.node_factory = node_factory
        self.replay = (
            replay
            or "python -m hotstate.sim"
            + f" --seed {seed} --voters {profile.voters} --observers {profile.observers}"
        )
        self.trace = trace
        self.check_liveness = check_liveness
        self.kernel = Kernel(seed, "world", self.replay)
        self.rng = self.kernel.rng
        # Its own stream: a seed without leader_gone probes runs exactly as it did before they existed.
        self.probe_rng = self.kernel.stream("world-probes")
        # Membership changes draw from their own stream too: until the first change lands, a seed runs as
        # it did with a fixed quorum.
        self.voters_rng = self.kernel.stream("world-voters")
        voter_ids = list(range(1, profile.voters + 1))
        observer_ids = list(range(profile.voters + 1, profile.voters + profile.observers + 1))
        self.voters = frozenset(voter_ids)
        self.members = {i: Member(i, i in self.voters) for i in voter_ids + observer_ids}
        self.checker = Checker(self.voters)
        self.stats = RunStats(seed)
        self._calm = False
        self._crashed_leader_at: int | None = None
        self._crashed_leader_epoch = 0
        self._proposal_counter = 0
        self._converged = False

    # ------------------------------------------------------------------ running
    def run(self) -> RunStats:
        profile = self.profile
        for member in self.members.values():
            self._start(member)
        end = profile.chaos_ms + profile.calm_ms
        self.kernel.schedule(profile.chaos_ms, CALM, 0, None)
        self.kernel.schedule(self.rng.randrange(1, 20), _PROPOSE, 0, None)
        if profile.crash_every_ms:
            self.kernel.schedule(self.kernel.gap(profile.crash_every_ms), CRASH, 0, None)
        if profile.partition_every_ms:
            self.kernel.schedule(self.kernel.gap(profile.partition_every_ms), PARTITION, 0, None)
        if profile.reconfigure_every_ms:
            self.kernel.schedule(self._reconfigure_gap(), _RECONFIGURE, 0, None)
        try:
            self.kernel.run(end, self._handle, stop=lambda: self._converged)
            self.stats.events = self.kernel.events_run
            if self.check_liveness and not self._converged:
                self._check_recovered()
        except (InvariantViolation, RaftSafetyError, AssertionError) as error:
            raise self.kernel.failure(error) from error
        self.stats.committed = len(self.checker.committed)
        return self.stats

    @property
    def now(self) -> int:
        return self.kernel.now

    def crash_leader_at(self, time_ms: int, down_ms: int) -> None:
        """Script a crash of whoever leads at `time_ms` (for the demo and the failover benchmark)."""
        self.kernel.schedule(time_ms, _CRASH_LEADER, 0, down_ms)

    def _handle(self, kind: int, target: int, payload: Any) -> None:
        if kind == DELIVER:
            self._deliver(payload)
        elif kind == TICK:
            member = self.members[target]
            if member.up and member.tick_at == self.now:
                member.tick_at = None
                self._input(member, TICK, None)
                self._arm_tick(member)
        elif kind == DISK_DONE:
            member = self.members[target]
            if member.up and member.incarnation == payload:
                self._finish_write(member)
        elif kind == CRASH:
            if self._calm:
                return
            self._crash_someone()
            if not self._calm:
                self.kernel.schedule(self.now + self.kernel.gap(self.profile.crash_every_ms), CRASH, 0, None)
        elif kind == _CRASH_MEMBER:
            member = self.members[target]
            incarnation, down_ms = payload
            if not self._calm and member.up and member.incarnation == incarnation:
                self._crash(member, down_ms)
        elif kind == _CRASH_LEADER:
            leader = self._current_leader()
            if leader is not None:
                self._crash(leader, payload)
        elif kind == RESTART:
            member = self.members[target]
            if not member.up:
                self._start(member)
        elif kind == _LEADER_GONE:
            member = self.members[target]
            # The probe is refused only while the crashed leader is still down.
            if member.up and not self.members[payload].up:
                self._input(member, _LEADER_GONE, payload)
        elif kind == PARTITION:
            if self._calm:
                return
            self._make_partition()
            if not self._calm:
                self.kernel.schedule(
                    self.now + self.kernel.gap(self.profile.partition_every_ms), PARTITION, 0, None
                )
        elif kind == HEAL:
            if self.kernel.partition is not None and self.kernel.partition is payload:
                self._log("network healed")
                self.kernel.partition = None
        elif kind == _PROPOSE:
            self._propose()
            if self.now < self.profile.chaos_ms + PROPOSALS_INTO_CALM_MS:
                self.kernel.schedule(
                    self.now + self.rng.randint(1, self.profile.propose_every_ms), _PROPOSE, 0, None
                )
        elif kind == _RECONFIGURE:
            if self._calm:
                return
            self._reconfigure()
            self.kernel.schedule(self.now + self._reconfigure_gap(), _RECONFIGURE, 0, None)
        elif kind == CALM:
            self._calm = True
            self.kernel.partition = None
            for member in self.members.values():
                if not member.up:
                    self._start(member)
            self._log("calm: network whole, everyone up")
            self.kernel.schedule(self.now + PROPOSALS_INTO_CALM_MS + 100, _CONVERGED, 0, None)
        elif kind == _CONVERGED:
            try:
                self._check_recovered()
            except InvariantViolation:
                self.kernel.schedule(self.now + 100, _CONVERGED, 0, None)
                return
            self._converged = True
            self._log("converged: one leader, every member caught up")

    # ------------------------------------------------------------------ members
    def _start(self, member: Member) -> None:
        disk = member.disk
        member.incarnation += 1
        member.core = self.node_factory(
            member.id,
            self.voters,
            self.profile.raft,
            seed=self.seed * 7919 + member.id * 104729 + member.incarnation,
            now=self.now,
            quorum_state=disk.quorum_state,
            snapshot=disk.snapshot,
            entries=list(disk.entries),
        )
        member.machine = HashChainStateMachine()
        if disk.snapshot is not None:
            member.machine.load(disk.snapshot)
        member.writing = None
        member.backlog.clear()
        member.tick_at = None
        member.down_since = None
        self.checker.restarted(member.id, member.core)
        if member.incarnation > 1:
            self._log(
                f"member {member.id} restarted (epoch {member.core.epoch}, end {member.core.log.end_offset})"
            )
        self._after_input(member)

    def _input(self, member: Member, kind: int, payload: Any) -> None:
        """Feed one input to a member's core; while its disk is busy the input waits, like a real shell's."""
        if member.writing is not None:
            member.backlog.append((kind, payload))
            return
        core = member.core
        assert core is not None
        if kind == TICK:
            core.tick(self.now)
        elif kind == DELIVER:
            core.step(payload, self.now)
        elif kind == _LEADER_GONE:
            core.leader_gone(payload, self.now)
        self._after_input(member)

    def _after_input(self, member: Member) -> None:
        core = member.core
        assert core is not None
        self.checker.check_core(member.id, core)
        if core.role is RaftRole.LEADER:
            self._note_leader(member, core)
        self._drain(member)
        self._arm_tick(member)

    def _note_leader(self, member: Member, core: RaftNode) -> None:
        if core.epoch > self.stats.max_epoch:
            self.stats.max_epoch = core.epoch
            self.stats.elections_won += 1
            end, hw = core.log.end_offset, core.high_watermark
            self._log(f"member {member.id} leads epoch {core.epoch} (end {end}, HW {hw})")
            if not self._calm and self.rng.random() < self.profile.crash_after_win:
                self.kernel.schedule(
                    self.now + self.rng.randint(0, 3 * self.profile.delay_max_ms + 5),
                    _CRASH_MEMBER,
                    member.id,
                    (member.incarnation, self.rng.randint(1, self.profile.down_max_ms)),
                )
            if self._crashed_leader_at is not None and core.epoch > self._crashed_leader_epoch:
                self.stats.failover_ms.append(self.now - self._crashed_leader_at)
                self._crashed_leader_at = None

    def _drain(self, member: Member) -> None:
        core = member.core
        while core is not None and member.writing is None and core.has_ready():
            ready = core.ready()
            if ready.must_sync:
                member.writing = ready
                self.kernel.schedule(
                    self.now + self.rng.randint(0, self.profile.disk_max_ms),
                    DISK_DONE,
                    member.id,
                    member.incarnation,
                )
                return
            self._complete(member, ready)

    def _finish_write(self, member: Member) -> None:
        ready = member.writing
        assert ready is not None
        changed = member.disk.write(ready)
        self.checker.check_disk(member.id, member.disk, changed)
        self.checker.check_durable_majority({m.id: m.disk for m in self.members.values()})
        member.writing = None
        self._complete(member, ready)
        while member.writing is None and member.backlog and member.up:
            kind, payload = member.backlog.popleft()
            self._input(member, kind, payload)
        if member.up and member.writing is None:
            self._drain(member)
            self._arm_tick(member)

    def _complete(self, member: Member, ready: Ready) -> None:
        core = member.core
        assert core is not None
        for message in ready.messages:
            self._send(message)
            if (
                isinstance(message, VoteResponse)
                and message.granted
                and not self._calm
                and self.rng.random() < self.profile.crash_after_vote
            ):
                self.kernel.schedule(
                    self.now + self.rng.randint(0, 2),
                    _CRASH_MEMBER,
                    member.id,
                    (member.incarnation, self.rng.randint(1, 5)),
                )
        machine = member.machine
        if ready.snapshot_to_load is not None:
            machine.load(ready.snapshot_to_load)
        for entry in ready.committed:
            machine.apply(entry)
        if ready.committed or ready.snapshot_to_load is not None:
            self.checker.check_applied(member.id, machine)
        core.advance(ready)
        every = self.profile.snapshot_every
        if every and machine.applied - core.log.start_offset >= every:
            core.take_snapshot(machine.applied, machine.snapshot_bytes())
        self.checker.check_core(member.id, core)
        if core.role is RaftRole.LEADER:
            self._note_leader(member, core)

    def _arm_tick(self, member: Member) -> None:
        core = member.core
        if core is None:
            return
        deadline = core.next_deadline()
        wake = (
            self.now + MAX_SLEEP_MS
            if deadline is None
            else min(max(deadline, self.now + 1), self.now + MAX_SLEEP_MS)
        )
        if member.tick_at is None or wake < member.tick_at:
            member.tick_at = wake
            self.kernel.schedule(wake, TICK, member.id, None)

    # ------------------------------------------------------------------ faults
    def _crash_someone(self) -> None:
        up = [m for m in self.members.values() if m.up]
        if not up:
            return
        leader = self._current_leader()
        if leader is not None and self.rng.random() < self.profile.crash_leader_bias:
            victim = leader
        else:
            victim = up[self.rng.randrange(len(up))]
        self._crash(victim, self.rng.randint(1, self.profile.down_max_ms))

    def _crash(self, victim: Member, down_ms: int) -> None:
        core = victim.core
        assert core is not None
        if core.role is RaftRole.LEADER:
            self.stats.leader_crashes += 1
            if self._crashed_leader_at is None:
                self._crashed_leader_at = self.now
                self._crashed_leader_epoch = core.epoch
            if self.profile.leader_gone_max_ms:
                for other in self.members.values():
                    if other is not victim and other.up:
                        later = self.now + self.probe_rng.randint(1, self.profile.leader_gone_max_ms)
                        self.kernel.schedule(later, _LEADER_GONE, other.id, victim.id)
        if victim.writing is not None:
            changed = victim.disk.write_torn(victim.writing, self.rng)
            self.checker.check_disk(victim.id, victim.disk, changed)
        self._log(f"member {victim.id} crashed ({core.role.value}, epoch {core.epoch})")
        victim.core = None
        victim.writing = None
        victim.backlog.clear()
        victim.down_since = self.now
        self.checker.check_durable_majority({m.id: m.disk for m in self.members.values()})
        self.kernel.schedule(self.now + down_ms, RESTART, victim.id, None)

    def _make_partition(self) -> None:
        ids = sorted(self.members)
        leaders = [
            m.id for m in self.members.values() if m.core is not None and m.core.role is RaftRole.LEADER
        ]
        if leaders and self.rng.random() < self.profile.isolate_leader:
            # Jepsen's classic: the leader alone keeps appending what can never commit, the rest elect anew.
            isolated = leaders[self.rng.randrange(len(leaders))]
            sides = {member: int(member == isolated) for member in ids}
        else:
            sides = {member: self.rng.randrange(2) for member in ids}
        self.kernel.partition = sides
        left = [m for m in ids if sides[m] == 0]
        right = [m for m in ids if sides[m] == 1]
        self._log(f"network split {left} | {right}")
        self.kernel.schedule(self.now + self.rng.randint(1, self.profile.partition_max_ms), HEAL, 0, sides)

    def _send(self, message: Message) -> None:
        self.stats.messages += 1
        profile = self.profile
        # Calm: a fast, reliable LAN, so laggards can catch up.
        link = (
            Link(None, None, profile.delay_min_ms, 2)
            if self._calm
            else Link(profile.drop, profile.duplicate, profile.delay_min_ms, profile.delay_max_ms)
        )
        self.kernel.send(message.src, message.dst, DELIVER, message.dst, message, link)

    def _deliver(self, message: Message) -> None:
        member = self.members.get(message.dst)
        if member is None or not member.up or self.kernel.cut(message.src, message.dst):
            return
        self._input(member, DELIVER, message)

    # ------------------------------------------------------------------ workload and liveness
    def _propose(self) -> None:
        leader = self._current_leader()
        if leader is None:
            return
        core = leader.core
        assert core is not None
        self._proposal_counter += 1
        try:
            core.propose(f"{self.seed}/{self._proposal_counter}".encode(), self.now)
        except (NotLeaderError, ProposalRejectedError):
            return
        self.stats.proposals += 1
        if leader.writing is None:
            self._after_input(leader)

    def _reconfigure_gap(self) -> int:
        return 1 + int(self.voters_rng.expovariate(1 / self.profile.reconfigure_every_ms))

    def _reconfigure(self) -> None:
        """Ask the leader to add an observer or remove a voter (itself included), sometimes twice in a row:
        the second must be refused while the first is uncommitted. Refusals are part of the workload."""
        leader = self._current_leader()
        if leader is None:
            return
        core = leader.core
        assert core is not None
        rng = self.voters_rng
        # Between 2 (3 for a 5-voter shape) and every member; a 1-voter quorum stalls on any crash.
        fewest = 2 if self.profile.voters <= 3 else 3
        for _ in range(2 if rng.random() < 0.3 else 1):
            voters = sorted(core.voters)
            others = sorted(set(self.members) - core.voters)
            add = bool(others) and (len(voters) <= fewest or rng.random() < 0.5)
            if not add and len(voters) <= fewest:
                return
            node_id = others[rng.randrange(len(others))] if add else voters[rng.randrange(len(voters))]
            try:
                offset = (core.add_voter if add else core.remove_voter)(node_id, self.now)
            except (NotLeaderError, ReconfigurationError):
                return
            self.stats.voter_changes += 1
            self._log(
                f"leader {leader.id} {'adds' if add else 'removes'} voter {node_id} at {offset}: "
                f"voters {sorted(core.voters)}"
            )
            if leader.writing is None:
                self._after_input(leader)
            if leader.core is not core or core.role is not RaftRole.LEADER:
                return

    def _current_leader(self) -> Member | None:
        """The up member leading the highest epoch (a deposed leader may not know it yet)."""
        leaders = [m for m in self.members.values() if m.core is not None and m.core.role is RaftRole.LEADER]
        return max(leaders, key=lambda m: m.core.epoch if m.core else -1, default=None)

    def _check_recovered(self) -> None:
        """After the calm period the quorum must have a leader and every member must have caught up."""
        leader = self._current_leader()
        if leader is None:
            raise InvariantViolation(
                f"no leader {self.now - self.profile.chaos_ms} ms after the faults stopped"
            )
        lcore = leader.core
        assert lcore is not None
        if lcore.high_watermark < lcore.log.end_offset:
            raise InvariantViolation(
                f"leader {leader.id} of epoch {lcore.epoch} has HW {lcore.high_watermark} below its end "
                f"{lcore.log.end_offset} after the calm period"
            )
        for member in self.members.values():
            core = member.core
            assert core is not None
            if core.high_watermark < lcore.high_watermark or core.epoch != lcore.epoch:
                raise InvariantViolation(
                    f"member {member.id} ({core.role.value}, epoch {core.epoch}, HW {core.high_watermark}) "
                    "has "
                    f"not caught up with leader {leader.id} (epoch {lcore.epoch}, HW {lcore.high_watermark}) "
                    "after the calm period"
                )

    def _log(self, line: str) -> None:
        text = f"{self.now:>7} ms  {line}"
        self.stats.log.append(text)
        if self.trace:
            print(text)

"""Safety invariants of the quorum, checked by the simulator after every event.

- at most one leader per epoch;
- a member's persisted epoch never decreases;
- a member's HW never decreases (within one incarnation: a restarted member relearns it);
- committed entries are identical wherever a member counts them as committed, every new leader's log holds
  all of them, and every state machine's digest equals the reference digest at its applied offset;
- every majority of the voters includes a member that holds every committed entry on disk, so no crash
  can take one back (with an odd number of voters: a majority of them hold it). The voters are those of the
  latest committed VOTERS entry (the bootstrap set before any): while a change of one voter is uncommitted,
  the leader counts with the new set, and any majority of the new set meets every majority of the old one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import msgpack

from hotstate.raft.node import RaftNode, RaftRole
from hotstate.raft.records import Entry, EntryKind, Snapshot, decode_voters
from hotstate.sim.disk import SimDisk
from hotstate.sim.state_machine import GENESIS, HashChainStateMachine, chain


class InvariantViolation(Exception):
    pass


@dataclass
class MemberWatch:
    """What the checker remembers about one member across its incarnations."""

    max_disk_epoch: int = 0
    hw: int = 0  # highest HW seen in this incarnation
    hw_checked: int = 0  # committed entries below this offset were compared with the reference
    leader_epoch_checked: int = -1
    disk_match_end: int = 0  # the durable log matches the committed prefix below this offset


@dataclass
class Checker:
    voters: frozenset[int]
    leaders: dict[int, int] = field(default_factory=dict)
    committed: list[Entry] = field(default_factory=list)
    digests: list[bytes] = field(default_factory=list)
    watches: dict[int, MemberWatch] = field(default_factory=dict)

    def watch(self, member: int) -> MemberWatch:
        return self.watches.setdefault(member, MemberWatch())

    def digest_at(self, end_offset: int) -> bytes:
        return GENESIS if end_offset == 0 else self.digests[end_offset - 1]

    def restarted(self, member: int, core: RaftNode) -> None:
        watch = self.watch(member)
        watch.hw = core.high_watermark
        # A restarted member relearns its HW; what its durable log holds is compared again as it does.
        watch.hw_checked = core.log.start_offset

    # ------------------------------------------------------------------ after a member handled an event
    def check_core(self, member: int, core: RaftNode) -> None:
        watch = self.watch(member)
        if core.role is RaftRole.LEADER:
            holder = self.leaders.setdefault(core.epoch, member)
            if holder != member:
                raise InvariantViolation(f"two leaders in epoch {core.epoch}: {holder} and {member}")
            if watch.leader_epoch_checked != core.epoch:
                watch.leader_epoch_checked = core.epoch
                self._check_leader_completeness(member, core)
        hw = core.high_watermark
        if hw < watch.hw:
            raise InvariantViolation(f"member {member}'s HW moved back from {watch.hw} to {hw}")
        watch.hw = hw
        if hw > watch.hw_checked:
            self._check_committed(member, core, watch)

    def _check_leader_completeness(self, member: int, core: RaftNode) -> None:
        log = core.log
        if log.end_offset < len(self.committed):
            raise InvariantViolation(
                f"leader {member} of epoch {core.epoch} ends at {log.end_offset} but {len(self.committed)} "
                "entries are committed"
            )
        for offset in range(log.start_offset, len(self.committed)):
            if log.entry(offset) != self.committed[offset]:
                raise InvariantViolation(
                    f"leader {member} of epoch {core.epoch} holds {log.entry(offset)} where "
                    f"{self.committed[offset]} was committed"
                )
        if core.snapshot is not None:
            self._check_snapshot(member, core.snapshot)

    def _check_committed(self, member: int, core: RaftNode, watch: MemberWatch) -> None:
        log = core.log
        start = watch.hw_checked
        if start < log.start_offset:
            if core.snapshot is None:
                raise InvariantViolation(
                    f"member {member}'s log starts at {log.start_offset} with no snapshot"
                )
            self._check_snapshot(member, core.snapshot)
            start = log.start_offset
        for offset in range(start, core.high_watermark):
            entry = log.entry(offset)
            if offset < len(self.committed):
                if entry != self.committed[offset]:
                    raise InvariantViolation(
                        f"member {member} counts {entry} as committed where {self.committed[offset]} was"
                    )
            elif offset == len(self.committed):
                self.committed.append(entry)
                self.digests.append(chain(self.digest_at(offset), entry))
                if entry.kind is EntryKind.VOTERS:
                    self.voters = decode_voters(entry.data)
            else:
                raise InvariantViolation(f"member {member} committed offset {offset} past a gap")
        watch.hw_checked = core.high_watermark

    def _check_snapshot(self, member: int, snapshot: Snapshot) -> None:
        end = snapshot.id.end_offset
        if end > len(self.committed):
            raise InvariantViolation(
                f"member {member} holds a snapshot at {end} beyond the commit {len(self.committed)}"
            )
        applied, digest = msgpack.unpackb(snapshot.data)
        if applied != end or digest != self.digest_at(end):
            raise InvariantViolation(
                f"member {member}'s snapshot at {end} differs from the committed history"
            )

    def check_applied(self, member: int, machine: HashChainStateMachine) -> None:
        if machine.applied > len(self.committed):
            raise InvariantViolation(
                f"member {member} applied up to {machine.applied}; only {len(self.committed)} are committed"
            )
        if machine.digest != self.digest_at(machine.applied):
            raise InvariantViolation(
                f"member {member}'s state at {machine.applied} differs from the committed one"
            )

    # ------------------------------------------------------------------ after a member's disk changed
    def check_disk(self, member: int, disk: SimDisk, changed_from: int) -> None:
        watch = self.watch(member)
        epoch = disk.quorum_state.epoch
        if epoch < watch.max_disk_epoch:
            raise InvariantViolation(
                f"member {member}'s persisted epoch went back from {watch.max_disk_epoch} to {epoch}"
            )
        watch.max_disk_epoch = epoch
        watch.disk_match_end = min(watch.disk_match_end, changed_from)
        self._extend_disk_match(member, disk)

    def _extend_disk_match(self, member: int, disk: SimDisk) -> None:
        watch = self.watch(member)
        match = watch.disk_match_end
        limit = len(self.committed)
        if match < disk.start_offset and disk.snapshot is not None and disk.start_offset <= limit:
            _, digest = msgpack.unpackb(disk.snapshot.data)
            if digest == self.digest_at(disk.start_offset):
                match = disk.start_offset
        if match >= disk.start_offset:
            end = min(disk.end_offset, limit)
            while match < end and disk.entry(match) == self.committed[match]:
                match += 1
        watch.disk_match_end = match

    def check_durable_majority(self, disks: dict[int, SimDisk]) -> None:
        limit = len(self.committed)
        holders = 0
        for member in sorted(self.voters):
            watch = self.watch(member)
            if watch.disk_match_end < limit:
                self._extend_disk_match(member, disks[member])
            if watch.disk_match_end >= limit:
                holders += 1
        count = len(self.voters)
        if holders <= count - (count // 2 + 1):
            raise InvariantViolation(
                f"only {holders} of {count} voters hold the {limit} committed entries on disk"
            )

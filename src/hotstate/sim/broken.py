"""Raft cores with one safety rule broken each, to show that the simulator's checks catch such bugs."""

from __future__ import annotations

from hotstate.raft.node import RaftNode
from hotstate.raft.quorum_state import QuorumState


class GrantsShorterLog(RaftNode):
    """Votes for any candidate, however far behind its log is."""

    def _candidate_log_ok(self, last_epoch: int, end_offset: int) -> bool:
        return True


class CommitsWithoutMajority(RaftNode):
    """Advances the HW to its own end offset, as if every follower had it."""

    def _majority_end_offset(self) -> int:
        return self._persisted_end


class SkipsOwnEpochRule(RaftNode):
    """Commits entries of earlier epochs by counting replicas alone (Raft paper, figure 8)."""

    def _may_commit(self, high_watermark: int) -> bool:
        return True


class ForgetsVote(RaftNode):
    """Never writes whom it voted for, so a restart lets it vote again in the same epoch."""

    def _quorum_state_to_persist(self) -> QuorumState:
        state = super()._quorum_state_to_persist()
        return QuorumState(
            state.epoch, None if state.voted_id != self.id else state.voted_id, state.leader_id
        )


class ConcurrentVoterChanges(RaftNode):
    """Starts a membership change while another is uncommitted, or before its own epoch has committed:
    the majorities of the sets at either end need not overlap."""

    def _reconfiguration_problem(self) -> str | None:
        return None


class VotersAtCommit(RaftNode):
    """Uses a VOTERS entry only once it is committed (not when appended): the leader counts a change's own
    commit with the old set, and a new voter learns it counts only after the others do."""

    def _voters_in_effect(self) -> frozenset[int]:
        committed = [voters for offset, voters in self._voter_changes if offset < self._hw]
        if committed:
            return committed[-1]
        return self._base_voters if self._base_voters is not None else self._bootstrap_voters


# The membership rules (KIP-853 in raft/node.py); the runner passes them seeds that reconfigure.
BROKEN_VOTER_RULES: dict[str, type[RaftNode]] = {
    "concurrent-voter-changes": ConcurrentVoterChanges,
    "voters-at-commit": VotersAtCommit,
}

BROKEN_RULES: dict[str, type[RaftNode]] = {
    "grant-shorter-log": GrantsShorterLog,
    "hw-without-majority": CommitsWithoutMajority,
    "skip-own-epoch-rule": SkipsOwnEpochRule,
    "forget-vote": ForgetsVote,
    **BROKEN_VOTER_RULES,
}

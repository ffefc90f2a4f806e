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


BROKEN_RULES: dict[str, type[RaftNode]] = {
    "grant-shorter-log": GrantsShorterLog,
    "hw-without-majority": CommitsWithoutMajority,
    "skip-own-epoch-rule": SkipsOwnEpochRule,
    "forget-vote": ForgetsVote,
}

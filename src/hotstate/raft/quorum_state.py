"""The part of a member's state that must survive a crash before it is acted on."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class QuorumState:
    """KRaft's `quorum-state` file: the epoch, whom we voted for in it, and the leader we know in it.

    Written atomically (tmp, fsync, rename) before a vote is sent or a new epoch is acted on: a member that
    forgot its vote could vote twice in one epoch and elect two leaders.
    """

    epoch: int = 0
    voted_id: int | None = None
    leader_id: int | None = None

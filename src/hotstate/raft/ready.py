"""What the core hands its shell after a step: what to persist, then what to send, then what to apply."""

from __future__ import annotations

from dataclasses import dataclass

from hotstate.raft.messages import Message
from hotstate.raft.quorum_state import QuorumState
from hotstate.raft.records import Entry, Snapshot


@dataclass(frozen=True, slots=True)
class AppendEntries:
    entries: tuple[Entry, ...]


@dataclass(frozen=True, slots=True)
class TruncateTo:
    """Drop every persisted entry at or above `offset` (a follower whose log diverged from the leader's)."""

    offset: int


@dataclass(frozen=True, slots=True)
class SaveSnapshot:
    """Make the snapshot durable, then drop the entries below its end offset.

    With `reset_log` (a follower installing the leader's snapshot) drop the whole log: whatever it held past
    the snapshot came from a diverged history.
    """

    snapshot: Snapshot
    reset_log: bool = False


LogOp = AppendEntries | TruncateTo | SaveSnapshot


@dataclass(frozen=True, slots=True)
class Ready:
    """One batch of work for the shell, to be done in this order:

    1. write `quorum_state` atomically (tmp, fsync, rename) when it is set;
    2. apply `log_ops` to the log in order;
    3. when `must_sync`, fsync all of it: only then may `messages` leave, since a vote or an acknowledged
       fetch that a crash could take back breaks the protocol;
    4. send `messages`;
    5. load `snapshot_to_load` into the state machine when it is set, then apply `committed` in order;
    6. call `RaftNode.advance(ready)`.
    """

    quorum_state: QuorumState | None
    log_ops: tuple[LogOp, ...]
    messages: tuple[Message, ...]
    committed: tuple[Entry, ...]
    snapshot_to_load: Snapshot | None
    high_watermark: int
    # The log end once `log_ops` are durable: the leader counts only durable entries towards the HW.
    log_end_offset: int

    @property
    def must_sync(self) -> bool:
        return self.quorum_state is not None or bool(self.log_ops)

    def is_empty(self) -> bool:
        return not (
            self.quorum_state is not None
            or self.log_ops
            or self.messages
            or self.committed
            or self.snapshot_to_load is not None
        )

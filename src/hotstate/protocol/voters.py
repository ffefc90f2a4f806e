"""Quorum membership requests (KIP-853's AddRaftVoter, RemoveRaftVoter and a DescribeQuorum-like list), for
the admin client, the HTTP API and servers forwarding to the metadata leader (server/voters.py)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class VotersOp(IntEnum):
    LIST = 0
    ADD = 1
    REMOVE = 2


class VotersError(IntEnum):
    NONE = 0
    # No leader, or it moved: nothing was applied; ask again (any server).
    NOT_LEADER = 1
    # The leader refused the change (the message says why: not caught up, a change in flight, ...).
    REFUSED = 2
    # The change was appended but did not commit in time: it may still commit, or be lost.
    TIMEOUT = 3


@dataclass(frozen=True, slots=True)
class VotersRequest:
    op: VotersOp
    node_id: int = 0  # for ADD and REMOVE
    # Set by a server passing the request to the leader; a forwarded request is never forwarded again.
    forwarded: bool = False


@dataclass(frozen=True, slots=True)
class ObserverProgress:
    """An observer of the metadata log as the leader saw it at its latest fetch."""

    node_id: int
    fetch_offset: int
    caught_up: bool  # at or above the HW when it fetched, and it fetched within the fetch timeout
    last_fetch_ms_ago: int


@dataclass(frozen=True, slots=True)
class VotersResponse:
    error: VotersError
    message: str
    leader_id: int | None = None
    epoch: int = 0
    voters: tuple[int, ...] = ()
    change_pending: bool = False  # the latest voter change is not committed yet
    high_watermark: int = 0
    observers: tuple[ObserverProgress, ...] = ()
    change_offset: int | None = None  # for ADD and REMOVE: the offset of the VOTERS entry

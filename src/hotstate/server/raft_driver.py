"""The asyncio shell around the Raft core: clock, disk and network for one quorum member.

It owns the `RaftNode` and its `RaftStorage`. Inputs (messages from peers, proposals) are handled one at
a time between Readies; each Ready is written to disk (in a worker thread, fsync included) before its
messages leave, exactly in the order `Ready` documents. Committed entries go to the *applier*, a task of
their own that hands them to `prepare_commit` then `on_committed`, in commit order: applying a big commit
(a 100,000-partition table takes seconds, in steps) must not hold up the quorum. While the leader's shell
waited on it, no Fetch was answered and the followers stood for election (measured: an election during
every 100,000-partition create in a 3-voter quorum).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from hotstate.raft.config import RaftConfig
from hotstate.raft.messages import Message
from hotstate.raft.node import RaftNode, RaftRole
from hotstate.raft.records import Entry, Snapshot
from hotstate.raft.storage import RaftStorage

log = logging.getLogger(__name__)

# Sleep at most this long between ticks even when the core expects nothing sooner.
MAX_SLEEP_S = 0.1


def monotonic_ms() -> int:
    return int(time.monotonic() * 1000)


CommitCallback = Callable[[Sequence[Entry], Snapshot | None], None]


class RaftDriver:
    def __init__(
        self,
        node_id: int,
        voters: Sequence[int],
        config: RaftConfig,
        storage: RaftStorage,
        *,
        send: Callable[[Message], None],
        on_committed: CommitCallback,
        prepare_commit: Callable[[Sequence[Entry], Snapshot | None], Awaitable[None]] | None = None,
        on_role_change: Callable[[RaftNode], None] | None = None,
        on_disk_failure: Callable[[str], None] | None = None,
        on_apply_failure: Callable[[str], None] | None = None,
        clock: Callable[[], int] = monotonic_ms,
        seed: int | None = None,
    ) -> None:
        self._storage = storage
        self._on_disk_failure = on_disk_failure
        self._on_apply_failure = on_apply_failure
        self._send = send
        self._on_committed = on_committed
        self._prepare_commit = prepare_commit
        self._on_role_change = on_role_change
        self._clock = clock
        loaded = storage.load()
        self.initial_snapshot = loaded.snapshot
        self.node = RaftNode(
            node_id,
            voters,
            config,
            seed=seed if seed is not None else time.monotonic_ns(),
            now=clock(),
            quorum_state=loaded.quorum_state,
            snapshot=loaded.snapshot,
            entries=loaded.entries,
        )
        self._inbox: asyncio.Queue[Message] = asyncio.Queue()
        self._gone_leaders: list[int] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._last_role: tuple[RaftRole, int, int | None] = (
            self.node.role,
            self.node.epoch,
            self.node.leader_id,
        )
        self._stopping = False
        # (offset, epoch, future): resolved with whether the entry at offset committed with that epoch.
        self._commit_waiters: list[tuple[int, int, asyncio.Future[bool]]] = []
        # Commits handed out by the core, not yet applied; and the end of what has been applied.
        self._to_apply: asyncio.Queue[tuple[Sequence[Entry], Snapshot | None]] = asyncio.Queue()
        self._applied_end = self.node.log.start_offset
        self._applier: asyncio.Task[None] | None = None
        self._in_apply = 0  # 1 while the applier holds a commit it took from the queue

    # ------------------------------------------------------------------ inputs from the rest of the server
    def deliver(self, message: Message) -> None:
        self._inbox.put_nowait(message)
        self._wake.set()

    def propose(self, data: bytes) -> tuple[int, int]:
        """Queue `data`: the (offset, epoch) it commits at if this leadership lasts. Raises NotLeaderError."""
        offset = self.node.propose(data, self._clock())
        self._wake.set()
        return offset, self.node.epoch

    def leader_gone(self, leader_id: int) -> None:
        """Proof that `leader_id`'s process is gone (server.suspects): a follower of it stands now."""
        # An input like a message: handled by the loop between Readies, never in the middle of one.
        self._gone_leaders.append(leader_id)
        self._wake.set()

    def add_voter(self, node_id: int) -> tuple[int, int]:
        """KIP-853 AddVoter on the leader: the (offset, epoch) of the VOTERS entry. Raises NotLeaderError or
        ReconfigurationError (with the reason)."""
        offset = self.node.add_voter(node_id, self._clock())
        self._wake.set()
        return offset, self.node.epoch

    def remove_voter(self, node_id: int) -> tuple[int, int]:
        offset = self.node.remove_voter(node_id, self._clock())
        self._wake.set()
        return offset, self.node.epoch

    async def committed(self, offset: int, epoch: int) -> bool:
        """Wait until the entry at `offset` is committed and applied: True if it is the one of `epoch` (not
        lost to another leader). False when a snapshot covers it (the outcome is unknown)."""
        if self._applied_end > offset:
            if self.node.log.start_offset <= offset:
                return self.node.log.entry(offset).epoch == epoch
            return False
        future: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._commit_waiters.append((offset, epoch, future))
        return await future

    def next_proposal_offset(self) -> int:
        return self.node.log.end_offset + self.node.pending_proposals

    def take_snapshot(self, end_offset: int, data: bytes) -> None:
        self.node.take_snapshot(end_offset, data)
        self._wake.set()

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"raft-{self.node.id}")
        self._applier = asyncio.create_task(self._apply(), name=f"raft-apply-{self.node.id}")

    @property
    def applying(self) -> int:
        """Commits handed out by the core and not applied yet (0 when the image is up to date)."""
        return self._to_apply.qsize() + self._in_apply

    async def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        for task in (self._task, self._applier):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        try:
            self._storage.close()
        except OSError as error:  # the disk failed: leave the log as a crash would, to be validated
            log.warning("metadata log %s not closed cleanly: %s", self._storage.directory, error)
            self._storage.log.abandon()

    async def _run(self) -> None:
        node = self.node
        while not self._stopping:
            now = self._clock()
            while not self._inbox.empty():
                node.step(self._inbox.get_nowait(), now)
            while self._gone_leaders:
                node.leader_gone(self._gone_leaders.pop(), now)
            node.tick(now)
            await self._drain()
            self._notice_role()
            deadline = node.next_deadline()
            sleep = (
                MAX_SLEEP_S
                if deadline is None
                else max(0.0, min(MAX_SLEEP_S, (deadline - self._clock()) / 1000))
            )
            self._wake.clear()
            if self._inbox.empty() and not node.has_ready():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._wake.wait(), timeout=sleep)

    async def _drain(self) -> None:
        node = self.node
        while node.has_ready():
            ready = node.ready()
            if ready.must_sync:
                # fsync off the event loop; inputs arriving meanwhile wait in the inbox, as the core expects.
                try:
                    await asyncio.to_thread(self._storage.write, ready)
                except OSError as error:
                    # Nothing of this Ready may leave (a vote or an ack for what is not on disk): the member
                    # stops here, and the server shuts down.
                    self._stopping = True
                    log.critical("metadata log %s: write failed: %s", self._storage.directory, error)
                    if self._on_disk_failure is not None:
                        self._on_disk_failure(f"metadata log write failed: {error}")
                    return
            for message in ready.messages:
                self._send(message)
            if ready.committed or ready.snapshot_to_load is not None:
                self._to_apply.put_nowait((ready.committed, ready.snapshot_to_load))
            node.advance(ready)

    async def _apply(self) -> None:
        """The applier (module docstring): one commit at a time, in order, while the quorum goes on."""
        while True:
            committed, snapshot = await self._to_apply.get()
            self._in_apply = 1
            try:
                if self._prepare_commit is not None:
                    # Big commits are decoded off the event loop or in steps first.
                    await self._prepare_commit(committed, snapshot)
                self._on_committed(committed, snapshot)
            except Exception as error:
                # The image can no longer follow the log: this member stops (a bug, never a wrong image).
                log.critical("metadata commit could not be applied: %r", error, exc_info=True)
                self._stopping = True
                self._wake.set()
                if self._on_apply_failure is not None:
                    self._on_apply_failure(f"metadata commit could not be applied: {error!r}")
                return
            if snapshot is not None:
                self._applied_end = max(self._applied_end, snapshot.id.end_offset)
            if committed:
                self._applied_end = max(self._applied_end, committed[-1].offset + 1)
            self._in_apply = 0
            if self._commit_waiters:
                self._release_commit_waiters(committed, snapshot)

    def _release_commit_waiters(self, committed: Sequence[Entry], snapshot: Snapshot | None) -> None:
        epochs = {entry.offset: entry.epoch for entry in committed}
        still = []
        for offset, epoch, future in self._commit_waiters:
            if future.done():
                continue
            if offset in epochs:
                future.set_result(epochs[offset] == epoch)
            elif snapshot is not None and snapshot.id.end_offset > offset:
                future.set_result(False)
            else:
                still.append((offset, epoch, future))
        self._commit_waiters = still

    def _notice_role(self) -> None:
        current = (self.node.role, self.node.epoch, self.node.leader_id)
        if current != self._last_role:
            self._last_role = current
            log.info(
                "metadata quorum: %s in epoch %d (leader %s)",
                self.node.role.value,
                self.node.epoch,
                self.node.leader_id,
            )
            if self._on_role_change is not None:
                self._on_role_change(self.node)

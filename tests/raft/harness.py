"""A hand-driven cluster for unit tests: messages move only when a test says so."""

from __future__ import annotations

from dataclasses import dataclass, field

from hotstate.raft.config import RaftConfig
from hotstate.raft.messages import Message
from hotstate.raft.node import RaftNode
from hotstate.raft.ready import Ready
from hotstate.sim.disk import SimDisk

CONFIG = RaftConfig(
    election_timeout_ms=100,
    fetch_timeout_ms=200,
    election_backoff_max_ms=100,
    append_linger_ms=0,
    request_timeout_ms=100,
    fetch_max_wait_ms=50,
)


@dataclass
class Cluster:
    voters: tuple[int, ...]
    observers: tuple[int, ...] = ()
    config: RaftConfig = CONFIG
    now: int = 0
    nodes: dict[int, RaftNode] = field(default_factory=dict)
    disks: dict[int, SimDisk] = field(default_factory=dict)
    inflight: list[Message] = field(default_factory=list)
    applied: dict[int, list[bytes]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for node_id in self.voters + self.observers:
            self.disks[node_id] = SimDisk()
            self.start(node_id)

    def start(self, node_id: int) -> RaftNode:
        disk = self.disks[node_id]
        node = RaftNode(
            node_id,
            self.voters,
            self.config,
            seed=node_id,
            now=self.now,
            quorum_state=disk.quorum_state,
            snapshot=disk.snapshot,
            entries=list(disk.entries),
        )
        self.nodes[node_id] = node
        self.applied[node_id] = []
        return node

    def crash(self, node_id: int) -> None:
        del self.nodes[node_id]
        self.inflight = [m for m in self.inflight if m.dst != node_id]

    def flush(self, node_id: int) -> Ready | None:
        """Persist and send what the node has ready."""
        node = self.nodes[node_id]
        last = None
        while node.has_ready():
            ready = node.ready()
            self.disks[node_id].write(ready)
            self.inflight.extend(ready.messages)
            self.applied[node_id].extend(e.data for e in ready.committed)
            node.advance(ready)
            last = ready
        return last

    def flush_all(self) -> None:
        for node_id in list(self.nodes):
            self.flush(node_id)

    def tick(self, node_id: int, now: int | None = None) -> None:
        if now is not None:
            self.now = now
        self.nodes[node_id].tick(self.now)
        self.flush(node_id)

    def take(
        self, *, src: int | None = None, dst: int | None = None, kind: type | None = None
    ) -> list[Message]:
        taken = [
            m
            for m in self.inflight
            if (src is None or m.src == src)
            and (dst is None or m.dst == dst)
            and (kind is None or isinstance(m, kind))
        ]
        self.inflight = [m for m in self.inflight if m not in taken]
        return taken

    def deliver(self, messages: list[Message]) -> None:
        for message in messages:
            node = self.nodes.get(message.dst)
            if node is not None:
                node.step(message, self.now)
                self.flush(message.dst)

    def deliver_all(self, rounds: int = 50, *, drop_to: frozenset[int] = frozenset()) -> None:
        for _ in range(rounds):
            if not self.inflight:
                return
            batch, self.inflight = self.inflight, []
            self.deliver([m for m in batch if m.dst not in drop_to and m.src not in drop_to])

    def elect(self, node_id: int) -> None:
        """Make `node_id` stand and win, then let every member catch up."""
        self.now += 1000
        self.nodes[node_id].tick(self.now)
        self.flush(node_id)
        self.deliver_all()

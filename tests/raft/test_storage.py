"""The core's durable state on a real disk: write Readies, crash (drop everything in memory), reload."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotstate.raft.messages import Message
from hotstate.raft.node import RaftNode, RaftRole
from hotstate.raft.quorum_state import QuorumState
from hotstate.raft.ready import AppendEntries, LogOp, Ready, SaveSnapshot
from hotstate.raft.records import Entry, EntryKind, Snapshot, SnapshotId
from hotstate.raft.storage import QUORUM_STATE_FILE, RaftStorage, StorageError

from .harness import CONFIG


class DiskCluster:
    """Real RaftStorage under every member; messages move in-process, instantly."""

    def __init__(self, root: Path, voters: tuple[int, ...]) -> None:
        self.root = root
        self.voters = voters
        self.now = 0
        self.nodes: dict[int, RaftNode] = {}
        self.stores: dict[int, RaftStorage] = {}
        self.applied: dict[int, list[Entry]] = {}
        self.inflight: list[Message] = []
        for node_id in voters:
            self.start(node_id)

    def start(self, node_id: int) -> RaftNode:
        store = RaftStorage(self.root / f"member-{node_id}")
        loaded = store.load()
        node = RaftNode(
            node_id,
            self.voters,
            CONFIG,
            seed=node_id,
            now=self.now,
            quorum_state=loaded.quorum_state,
            snapshot=loaded.snapshot,
            entries=loaded.entries,
        )
        self.stores[node_id], self.nodes[node_id], self.applied[node_id] = store, node, []
        return node

    def crash(self, node_id: int) -> None:
        self.stores.pop(node_id).close()
        del self.nodes[node_id]

    def flush(self, node_id: int) -> None:
        node = self.nodes[node_id]
        while node.has_ready():
            ready = node.ready()
            self.stores[node_id].write(ready)
            self.inflight.extend(ready.messages)
            self.applied[node_id].extend(ready.committed)
            node.advance(ready)

    def run(self, rounds: int = 200) -> None:
        for _ in range(rounds):
            for node_id in list(self.nodes):
                self.flush(node_id)
            if not self.inflight:
                return
            batch, self.inflight = self.inflight, []
            for message in batch:
                if message.dst in self.nodes:
                    self.nodes[message.dst].step(message, self.now)

    def tick_all(self, now: int) -> None:
        self.now = now
        for node in self.nodes.values():
            node.tick(now)
        self.run()

    def leader(self) -> RaftNode:
        (leader,) = [n for n in self.nodes.values() if n.role is RaftRole.LEADER]
        return leader


def _elect(cluster: DiskCluster, start: int) -> RaftNode:
    # Fine steps keep the randomized election timeouts apart, as a shell ticking at next_deadline() does.
    for step in range(1, 400):
        cluster.tick_all(start + step * 10)
        leaders = [n for n in cluster.nodes.values() if n.role is RaftRole.LEADER]
        if leaders:
            return leaders[0]
    raise AssertionError("no leader")


def test_committed_entries_survive_a_whole_cluster_restart(tmp_path: Path) -> None:
    cluster = DiskCluster(tmp_path, (1, 2, 3))
    leader = _elect(cluster, 0)
    for i in range(50):
        leader.propose(f"v{i}".encode(), cluster.now)
    cluster.run()
    committed = [e.data for e in cluster.applied[leader.id] if e.kind is EntryKind.DATA]
    assert committed == [f"v{i}".encode() for i in range(50)]
    epoch = leader.epoch
    for node_id in (1, 2, 3):
        cluster.crash(node_id)
    for node_id in (1, 2, 3):
        node = cluster.start(node_id)
        assert node.epoch == epoch
        assert [e.data for e in node.log.read_between(0, node.log.end_offset) if e.kind is EntryKind.DATA][
            :50
        ] == committed
    new_leader = _elect(cluster, 10_000)
    assert new_leader.epoch > epoch
    new_leader.propose(b"after", cluster.now)
    cluster.run()
    data = [e.data for e in cluster.applied[new_leader.id] if e.kind is EntryKind.DATA]
    assert data == [*committed, b"after"]


def test_quorum_state_is_replaced_atomically_and_read_back(tmp_path: Path) -> None:
    store = RaftStorage(tmp_path)
    store.write(_ready(quorum_state=QuorumState(7, 2, None)))
    assert not list(tmp_path.glob("*.tmp"))
    store.close()
    assert RaftStorage(tmp_path).load().quorum_state == QuorumState(7, 2, None)


def test_an_unreadable_quorum_state_refuses_to_start(tmp_path: Path) -> None:
    RaftStorage(tmp_path).close()
    (tmp_path / QUORUM_STATE_FILE).write_bytes(b"\xc1garbage")
    with pytest.raises(StorageError, match="forgets its vote"):
        RaftStorage(tmp_path).load()


def test_snapshot_compacts_the_log_and_reloads_with_the_tail(tmp_path: Path) -> None:
    store = RaftStorage(tmp_path)
    entries = tuple(Entry(i, 1 + i // 4, bytes([i])) for i in range(10))
    store.write(_ready(ops=(_append(entries),)))
    snapshot = Snapshot(SnapshotId(6, 2), b"state@6")
    store.write(_ready(ops=(SaveSnapshot(snapshot),)))
    assert store.log.start_offset == 6
    store.close()
    loaded = RaftStorage(tmp_path).load()
    assert loaded.snapshot == snapshot
    assert loaded.entries == list(entries[6:])


def test_a_crash_between_saving_a_snapshot_and_resetting_the_log_is_repaired(tmp_path: Path) -> None:
    store = RaftStorage(tmp_path)
    diverged = tuple(Entry(i, 1, b"old") for i in range(8))
    store.write(_ready(ops=(_append(diverged),)))
    # The snapshot file reaches the disk, then the process dies before the log is reset.
    store._write_snapshot(Snapshot(SnapshotId(5, 3), b"leader-state"), reset_log=True)
    store.close()
    loaded = RaftStorage(tmp_path).load()
    assert loaded.snapshot is not None and loaded.snapshot.id == SnapshotId(5, 3)
    assert loaded.entries == []  # the diverged tail past the snapshot is gone too


def test_only_the_latest_snapshot_is_kept(tmp_path: Path) -> None:
    store = RaftStorage(tmp_path)
    store.write(_ready(ops=(_append(tuple(Entry(i, 1, b"x") for i in range(10))),)))
    store.write(_ready(ops=(SaveSnapshot(Snapshot(SnapshotId(3, 1), b"a")),)))
    store.write(_ready(ops=(SaveSnapshot(Snapshot(SnapshotId(7, 1), b"b")),)))
    assert len(list(tmp_path.glob("snapshot-*"))) == 1


def _append(entries: tuple[Entry, ...]) -> AppendEntries:
    return AppendEntries(entries)


def _ready(*, quorum_state: QuorumState | None = None, ops: tuple[LogOp, ...] = ()) -> Ready:
    return Ready(
        quorum_state=quorum_state,
        log_ops=ops,
        messages=(),
        committed=(),
        snapshot_to_load=None,
        high_watermark=0,
        log_end_offset=0,
    )


def test_segments_wholly_below_a_snapshot_are_deleted(tmp_path: Path) -> None:
    store = RaftStorage(tmp_path, segment_bytes=600)
    for base in range(0, 200, 10):
        store.write(_ready(ops=(_append(tuple(Entry(i, 1, b"x" * 40) for i in range(base, base + 10))),)))
    before = sorted((tmp_path / "log").glob("*.log"))
    assert len(before) > 5
    store.write(_ready(ops=(SaveSnapshot(Snapshot(SnapshotId(150, 1), b"state@150")),)))
    after = sorted((tmp_path / "log").glob("*.log"))
    assert len(after) < len(before)
    bases = [int(p.stem) for p in after]
    # Only the segment holding offset 150 may start below it; every segment wholly below is gone.
    assert bases[0] <= 150 and all(base > 150 for base in bases[1:])
    store.close()
    loaded = RaftStorage(tmp_path, segment_bytes=600).load()
    assert loaded.entries[0].offset == 150 and loaded.entries[-1].offset == 199


def _committed_cluster(tmp_path: Path) -> tuple[DiskCluster, list[bytes]]:
    cluster = DiskCluster(tmp_path, (1, 2, 3))
    leader = _elect(cluster, 0)
    for i in range(20):
        leader.propose(f"v{i}".encode(), cluster.now)
        cluster.run()  # one batch per proposal: damage can sit in the middle
    return cluster, [e.data for e in cluster.applied[leader.id] if e.kind is EntryKind.DATA]


def test_a_damaged_middle_of_the_metadata_log_refuses_to_start(tmp_path: Path) -> None:
    cluster, _ = _committed_cluster(tmp_path)
    follower = next(n for n in cluster.nodes.values() if n.role is not RaftRole.LEADER).id
    cluster.crash(follower)
    [segment] = sorted((tmp_path / f"member-{follower}" / "log").glob("*.log"))
    data = bytearray(segment.read_bytes())
    data[30] ^= 0xFF  # inside the first batch; valid ones follow
    segment.write_bytes(bytes(data))
    with pytest.raises(StorageError, match=f"metadata log damaged: corrupt log data in {segment}"):
        RaftStorage(tmp_path / f"member-{follower}").load()


def test_a_torn_tail_of_the_metadata_log_is_cut_and_fetched_again(tmp_path: Path) -> None:
    cluster, committed = _committed_cluster(tmp_path)
    follower = next(n for n in cluster.nodes.values() if n.role is not RaftRole.LEADER).id
    cluster.crash(follower)
    [segment] = sorted((tmp_path / f"member-{follower}" / "log").glob("*.log"))
    segment.write_bytes(segment.read_bytes()[:-5])
    node = cluster.start(follower)
    before = [e.data for e in node.log.read_between(0, node.log.end_offset) if e.kind is EntryKind.DATA]
    assert before == committed[: len(before)] and len(before) < len(committed)
    cluster.tick_all(cluster.now + 10)
    leader = cluster.leader()
    leader.propose(b"after", cluster.now)
    cluster.run()
    after = [e.data for e in node.log.read_between(0, node.log.end_offset) if e.kind is EntryKind.DATA]
    assert after == [*committed, b"after"]

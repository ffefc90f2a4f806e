"""Quorum reconfiguration (KIP-853 AddVoter/RemoveVoter, Raft's single-server change), rule by rule."""

from __future__ import annotations

import dataclasses

import pytest

from hotstate.raft.messages import FetchSnapshot, FetchSnapshotResponse, Vote, VoteResponse
from hotstate.raft.node import NotLeaderError, RaftNode, RaftRole, ReconfigurationError
from hotstate.raft.records import EntryKind, decode_voters
from hotstate.raft.storage import RaftStorage

from .harness import CONFIG, Cluster


def role(node: RaftNode) -> RaftRole:
    """Read through a call: mypy keeps an asserted attribute narrowed across the steps that change it."""
    return node.role


def pending(node: RaftNode) -> bool:
    return node.voter_change_pending


def is_voter(node: RaftNode) -> bool:
    return node.is_voter


def caught_up_observer() -> Cluster:
    """Voters 1-3 led by 1, observer 4 fetching and caught up."""
    cluster = Cluster(voters=(1, 2, 3), observers=(4,))
    cluster.elect(1)
    cluster.nodes[1].propose(b"x", cluster.now)
    cluster.flush(1)
    cluster.tick(4, now=cluster.now + 1)
    cluster.deliver_all()
    assert cluster.nodes[4].high_watermark == cluster.nodes[1].high_watermark
    return cluster


def test_an_added_voter_counts_as_soon_as_the_entry_is_appended() -> None:
    cluster = caught_up_observer()
    leader = cluster.nodes[1]
    offset = leader.add_voter(4, cluster.now)
    # In effect on the leader before anyone has it: the HW now needs 3 of 4.
    assert leader.voters == {1, 2, 3, 4} and leader.voter_change_pending
    entry = leader.log.entry(offset)
    assert entry.kind is EntryKind.VOTERS and decode_voters(entry.data) == {1, 2, 3, 4}
    cluster.flush(1)
    cluster.deliver_all(drop_to=frozenset({2, 3}))
    # 4 appended it, so 4 is a voter already, though only 1 and 4 hold it: not committed.
    assert cluster.nodes[4].is_voter and cluster.nodes[4].voters == {1, 2, 3, 4}
    assert leader.high_watermark <= offset
    cluster.tick(2, now=cluster.now + CONFIG.request_timeout_ms + CONFIG.fetch_max_wait_ms)
    cluster.deliver_all()
    assert leader.high_watermark > offset and not pending(leader)
    cluster.tick(3)
    cluster.deliver_all()
    assert all(cluster.nodes[n].voters == {1, 2, 3, 4} for n in (1, 2, 3, 4))


def test_the_new_voter_can_then_be_elected_and_vote() -> None:
    cluster = caught_up_observer()
    cluster.nodes[1].add_voter(4, cluster.now)
    cluster.flush(1)
    cluster.deliver_all()
    cluster.crash(1)
    cluster.elect(4)
    assert cluster.nodes[4].role is RaftRole.LEADER
    assert any(m for m in cluster.inflight if isinstance(m, Vote)) or cluster.nodes[4].epoch > 1


def test_add_voter_refuses_a_node_that_never_fetched_or_lags_and_says_why() -> None:
    cluster = Cluster(voters=(1, 2, 3), observers=(4,))
    cluster.crash(4)
    cluster.elect(1)
    leader = cluster.nodes[1]
    with pytest.raises(ReconfigurationError, match="has not fetched from leader 1"):
        leader.add_voter(4, cluster.now)
    # 4 fetches from the start while 10 committed entries wait for it: not caught up.
    for i in range(10):
        leader.propose(f"e{i}".encode(), cluster.now)
    cluster.flush(1)
    cluster.deliver_all()
    cluster.start(4)
    cluster.tick(4, now=cluster.now + 1)
    # Let 4 find the leader, and hold the leader's first answer to it.
    while 4 not in leader.observer_progress():
        cluster.deliver(cluster.take())
    cluster.take(src=1, dst=4)
    with pytest.raises(ReconfigurationError, match="not caught up: it fetches from offset 0"):
        leader.add_voter(4, cluster.now)
    # Once it has fetched everything, it is; a node that stops fetching is refused again.
    cluster.tick(4, now=cluster.now + CONFIG.request_timeout_ms + CONFIG.fetch_max_wait_ms)
    cluster.deliver_all()
    assert cluster.nodes[4].high_watermark == leader.high_watermark
    cluster.now += CONFIG.fetch_timeout_ms * 3
    with pytest.raises(ReconfigurationError, match="has not fetched for"):
        leader.add_voter(4, cluster.now)


def test_one_uncommitted_change_at_a_time() -> None:
    cluster = caught_up_observer()
    leader = cluster.nodes[1]
    offset = leader.add_voter(4, cluster.now)
    with pytest.raises(ReconfigurationError, match=f"change at offset {offset} is not committed"):
        leader.remove_voter(3, cluster.now)
    cluster.flush(1)
    cluster.deliver_all()
    leader.remove_voter(3, cluster.now)
    assert leader.voters == {1, 2, 4}


def test_no_change_before_an_entry_of_the_leaders_epoch_commits() -> None:
    cluster = Cluster(voters=(1, 2, 3))
    cluster.now += 1000
    cluster.tick(1)
    cluster.deliver(cluster.take(kind=Vote))
    cluster.deliver(cluster.take(kind=VoteResponse))
    leader = cluster.nodes[1]
    assert leader.role is RaftRole.LEADER and leader.high_watermark == 0
    with pytest.raises(ReconfigurationError, match="has not committed an entry of epoch"):
        leader.remove_voter(3, cluster.now)


def test_a_follower_cannot_reconfigure_and_the_last_voter_stays() -> None:
    cluster = Cluster(voters=(1, 2, 3))
    cluster.elect(1)
    with pytest.raises(NotLeaderError):
        cluster.nodes[2].remove_voter(3, cluster.now)
    single = Cluster(voters=(1,))
    single.tick(1, now=500)
    with pytest.raises(ReconfigurationError, match="only voter"):
        single.nodes[1].remove_voter(1, single.now)
    with pytest.raises(ReconfigurationError, match="already a voter"):
        single.nodes[1].add_voter(1, single.now)


def test_a_removed_follower_becomes_an_observer_and_the_majority_shrinks() -> None:
    cluster = Cluster(voters=(1, 2, 3))
    cluster.elect(1)
    leader = cluster.nodes[1]
    offset = leader.remove_voter(3, cluster.now)
    cluster.flush(1)
    cluster.deliver_all()
    removed = cluster.nodes[3]
    assert not removed.is_voter and removed.role is RaftRole.FOLLOWER
    # With 3 gone for good, 1 and 2 still commit.
    cluster.crash(3)
    leader.propose(b"after", cluster.now)
    cluster.flush(1)
    cluster.deliver_all()
    assert cluster.applied[2][-1] == b"after"
    # A removed member that knows its removal committed never stands, even with no leader.
    cluster.start(3)
    cluster.tick(3, now=cluster.now + 1)
    cluster.deliver_all()
    removed = cluster.nodes[3]
    assert removed.high_watermark > offset and removed.leader_id == 1
    cluster.crash(1)
    for step in range(1, 10):
        cluster.tick(3, now=cluster.now + step * 1000)
        assert role(removed) is not RaftRole.CANDIDATE


def test_a_leader_that_removes_itself_leads_until_the_removal_commits_then_steps_down() -> None:
    cluster = Cluster(voters=(1, 2, 3))
    cluster.elect(1)
    leader = cluster.nodes[1]
    offset = leader.remove_voter(1, cluster.now)
    cluster.flush(1)
    assert leader.role is RaftRole.LEADER and not leader.is_voter
    # Its own copy does not count: 2 and 3 must both hold the removal (2 of 2).
    cluster.deliver_all(drop_to=frozenset({3}))
    assert leader.role is RaftRole.LEADER and leader.high_watermark <= offset
    cluster.tick(3, now=cluster.now + CONFIG.request_timeout_ms + CONFIG.fetch_max_wait_ms)
    cluster.deliver_all()
    assert role(leader) is not RaftRole.LEADER and leader.high_watermark > offset
    cluster.elect(2)
    assert cluster.nodes[2].role is RaftRole.LEADER and cluster.nodes[2].voters == {2, 3}
    cluster.nodes[2].propose(b"next", cluster.now)
    cluster.flush(2)
    cluster.deliver_all()
    cluster.tick(1, now=cluster.now + CONFIG.request_timeout_ms + CONFIG.fetch_max_wait_ms)
    cluster.deliver_all()
    assert cluster.applied[1][-1] == b"next"  # the old leader follows as an observer


def test_truncating_an_uncommitted_change_restores_the_previous_voter_set() -> None:
    cluster = caught_up_observer()
    leader = cluster.nodes[1]
    offset = leader.add_voter(4, cluster.now)
    cluster.flush(1)
    cluster.deliver_all(drop_to=frozenset({2, 3}))
    observer = cluster.nodes[4]
    assert observer.is_voter and observer.log.end_offset == offset + 1
    # The leader dies with the change on 1 and 4 only; 2 and 3 are a majority of the old set.
    cluster.crash(1)
    cluster.elect(2)
    assert cluster.nodes[2].role is RaftRole.LEADER and cluster.nodes[2].voters == {1, 2, 3}
    cluster.tick(4, now=cluster.now + CONFIG.fetch_timeout_ms * 3)
    cluster.deliver_all()
    # 4 truncated the lost change: it is an observer again, and a fresh AddVoter is possible.
    assert observer.log.end_offset > offset and observer.log.entry(offset).kind is EntryKind.LEADER_CHANGE
    assert observer.voters == {1, 2, 3} and not is_voter(observer)
    cluster.nodes[2].add_voter(4, cluster.now)


def test_snapshots_carry_the_voter_set_to_disk_and_to_fetchers(tmp_path: object) -> None:
    config = dataclasses.replace(CONFIG, snapshot_chunk_bytes=4)
    cluster = Cluster(voters=(1, 2, 3), observers=(4,), config=config)
    cluster.crash(4)
    cluster.elect(1)
    leader = cluster.nodes[1]
    leader.remove_voter(3, cluster.now)
    cluster.flush(1)
    cluster.deliver_all()
    leader.propose(b"y", cluster.now)
    cluster.flush(1)
    cluster.deliver_all()
    end = leader.high_watermark
    leader.take_snapshot(end, b"state-at-end")
    cluster.flush(1)
    assert leader.snapshot is not None and leader.snapshot.voters == frozenset({1, 2})
    # A restart from the snapshot alone keeps the voter set (its config still says 1, 2, 3).
    cluster.crash(1)
    restarted = cluster.start(1)
    assert restarted.voters == {1, 2} and not restarted.log.read_between(0, end)
    cluster.elect(1)
    # A fetcher below the log start gets the set with the snapshot.
    cluster.start(4)
    cluster.tick(4, now=cluster.now + 1)
    cluster.deliver_all()
    disk = cluster.disks[4]
    assert disk.snapshot is not None and disk.snapshot.voters == frozenset({1, 2})
    assert cluster.nodes[4].voters == {1, 2}
    # And the real storage writes and reads it back.
    storage = RaftStorage(f"{tmp_path}/meta")
    from hotstate.raft.ready import Ready, SaveSnapshot

    storage.write(Ready(None, (SaveSnapshot(disk.snapshot, reset_log=True),), (), (), None, end, end))
    storage.close()
    loaded = RaftStorage(f"{tmp_path}/meta").load()
    assert loaded.snapshot == disk.snapshot


def test_snapshot_chunks_name_the_voters() -> None:
    leader = RaftNode(1, (1,), CONFIG, seed=0, now=0)
    leader.tick(1000)
    leader.advance(leader.ready())
    leader.ready()
    snapshot_id = leader.take_snapshot(1, b"s")
    assert leader.snapshot is not None and leader.snapshot.voters is None  # still the bootstrap set
    leader.step(FetchSnapshot(9, 1, leader.epoch, snapshot_id, position=0, max_bytes=100), 1000)
    (answer,) = leader.ready().messages
    assert isinstance(answer, FetchSnapshotResponse) and answer.voters is None


def test_a_leader_that_lost_office_before_its_removal_committed_may_still_stand() -> None:
    # Voters 1 and 2; 1 removes itself and crashes before 2 has the entry. 2 cannot win (1 holds the better
    # log), so unless 1 may stand (not counting its own vote), nobody is ever elected (sim seed 992).
    cluster = Cluster(voters=(1, 2))
    cluster.elect(1)
    offset = cluster.nodes[1].remove_voter(1, cluster.now)
    cluster.flush(1)
    cluster.take()
    cluster.crash(1)
    restarted = cluster.start(1)
    assert not restarted.is_voter and restarted.log.end_offset == offset + 1
    cluster.elect(1)
    # Elected by 2 alone, 1 led without being a voter until its removal committed, then stepped down.
    assert role(restarted) is not RaftRole.LEADER and restarted.high_watermark > offset
    for _ in range(5):
        cluster.now += 1000
        cluster.tick(2)
        cluster.deliver_all()
    # Then 2 wins its one-voter quorum.
    assert cluster.nodes[2].role is RaftRole.LEADER and cluster.nodes[2].voters == frozenset({2})
    assert role(restarted) is not RaftRole.LEADER and restarted.high_watermark > offset

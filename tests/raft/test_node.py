"""One test per protocol rule of the KRaft core, driven by hand."""

from __future__ import annotations

import dataclasses

import pytest

from hotstate.raft.config import RaftConfig
from hotstate.raft.messages import (
    BeginQuorumEpoch,
    Fetch,
    FetchResponse,
    FetchSnapshot,
    FetchSnapshotResponse,
    Vote,
    VoteResponse,
)
from hotstate.raft.node import NotLeaderError, RaftNode, RaftRole
from hotstate.raft.quorum_state import QuorumState
from hotstate.raft.records import Entry, EntryKind

from .harness import CONFIG, Cluster


def role(node: RaftNode) -> RaftRole:
    """Read through a call: mypy keeps an asserted `node.role` narrowed across the steps that change it."""
    return node.role


def test_single_voter_elects_itself_and_commits() -> None:
    cluster = Cluster(voters=(1,))
    cluster.tick(1, now=500)
    node = cluster.nodes[1]
    assert node.role is RaftRole.LEADER and node.epoch == 1
    node.propose(b"a", cluster.now)
    node.propose(b"b", cluster.now)
    cluster.flush(1)
    assert cluster.applied[1] == [b"", b"a", b"b"]  # the leader-change record, then the proposals


def test_three_voters_elect_replicate_and_apply_the_same_entries() -> None:
    cluster = Cluster(voters=(1, 2, 3))
    cluster.elect(1)
    assert [cluster.nodes[i].role for i in (1, 2, 3)] == [
        RaftRole.LEADER,
        RaftRole.FOLLOWER,
        RaftRole.FOLLOWER,
    ]
    for data in (b"x", b"y", b"z"):
        cluster.nodes[1].propose(data, cluster.now)
    cluster.flush(1)
    cluster.deliver_all()
    assert cluster.applied[1] == cluster.applied[2] == cluster.applied[3] == [b"", b"x", b"y", b"z"]
    assert {cluster.nodes[i].high_watermark for i in (1, 2, 3)} == {4}


def test_proposal_on_a_follower_names_the_leader() -> None:
    cluster = Cluster(voters=(1, 2, 3))
    cluster.elect(1)
    with pytest.raises(NotLeaderError, match="the leader is 1"):
        cluster.nodes[2].propose(b"x", cluster.now)


def test_first_election_timeout_is_random_in_t_to_2t() -> None:
    timeout = CONFIG.election_timeout_ms
    seen = set()
    for seed in range(40):
        node = RaftNode(1, (1, 2, 3), CONFIG, seed=seed, now=0)
        deadline = node.next_deadline()
        assert deadline is not None and timeout <= deadline < 2 * timeout
        seen.add(deadline)
    assert len(seen) > 10


def _voter(epoch: int = 0, voted: int | None = None, entries: tuple[Entry, ...] = ()) -> RaftNode:
    return RaftNode(
        1, (1, 2, 3), CONFIG, seed=0, now=0, quorum_state=QuorumState(epoch, voted), entries=entries
    )


def _vote_answer(node: RaftNode, request: Vote) -> VoteResponse:
    node.step(request, 0)
    ready = node.ready()
    (answer,) = ready.messages
    assert isinstance(answer, VoteResponse)
    return answer


def test_vote_for_an_older_epoch_is_refused() -> None:
    node = _voter(epoch=5)
    assert not _vote_answer(node, Vote(2, 1, epoch=4, last_epoch=0, last_epoch_end_offset=0)).granted


def test_one_vote_per_epoch() -> None:
    node = _voter()
    assert _vote_answer(node, Vote(2, 1, epoch=1, last_epoch=0, last_epoch_end_offset=0)).granted
    assert not _vote_answer(node, Vote(3, 1, epoch=1, last_epoch=0, last_epoch_end_offset=0)).granted
    # The same candidate asking again (a duplicated request) gets the same answer.
    assert _vote_answer(node, Vote(2, 1, epoch=1, last_epoch=0, last_epoch_end_offset=0)).granted


def test_vote_needs_a_log_at_least_as_up_to_date() -> None:
    entries = (Entry(0, 1, b""), Entry(1, 2, b""), Entry(2, 2, b"a"))
    # A lower last epoch loses even with a longer log.
    assert not _vote_answer(
        _voter(2, None, entries), Vote(2, 1, 3, last_epoch=1, last_epoch_end_offset=9)
    ).granted
    # Same last epoch, shorter log: refused; equal or longer: granted.
    assert not _vote_answer(
        _voter(2, None, entries), Vote(2, 1, 3, last_epoch=2, last_epoch_end_offset=2)
    ).granted
    assert _vote_answer(
        _voter(2, None, entries), Vote(2, 1, 3, last_epoch=2, last_epoch_end_offset=3)
    ).granted
    assert _vote_answer(
        _voter(2, None, entries), Vote(2, 1, 3, last_epoch=3, last_epoch_end_offset=1)
    ).granted


def test_a_granted_vote_is_persisted_in_the_same_ready_as_the_answer() -> None:
    node = _voter()
    node.step(Vote(2, 1, epoch=1, last_epoch=0, last_epoch_end_offset=0), 0)
    ready = node.ready()
    assert ready.quorum_state == QuorumState(epoch=1, voted_id=2, leader_id=None)
    assert ready.must_sync  # the shell fsyncs it before the answer leaves


def test_a_lost_election_backs_off_then_stands_in_a_new_epoch() -> None:
    node = RaftNode(1, (1, 2, 3), CONFIG, seed=3, now=0)
    node.tick(10_000)
    assert node.role is RaftRole.CANDIDATE and node.epoch == 1
    node.ready()
    for voter in (2, 3):
        node.step(VoteResponse(voter, 1, epoch=1, granted=False, leader_id=None), 10_000)
    deadline = node.next_deadline()
    assert deadline is not None and 10_000 < deadline <= 10_000 + CONFIG.election_backoff_max_ms + 1
    node.tick(deadline)
    assert node.role is RaftRole.CANDIDATE and node.epoch == 2


def test_new_leader_sends_begin_quorum_epoch_and_writes_a_leader_change_record() -> None:
    cluster = Cluster(voters=(1, 2, 3))
    cluster.now = 1000
    cluster.tick(1)
    cluster.deliver(cluster.take(kind=Vote))
    cluster.deliver(cluster.take(kind=VoteResponse))
    leader = cluster.nodes[1]
    assert leader.role is RaftRole.LEADER
    assert {m.dst for m in cluster.take(kind=BeginQuorumEpoch)} == {2, 3}
    assert cluster.disks[1].entries == [Entry(0, 1, b"", EntryKind.LEADER_CHANGE)]
    assert cluster.disks[1].quorum_state == QuorumState(1, 1, 1)


def test_follower_with_a_diverged_tail_truncates_and_catches_up() -> None:
    cluster = Cluster(voters=(1, 2, 3))
    cluster.elect(1)
    # Member 3 misses everything of epoch 1 from here on; then 1 writes entries only it has.
    cluster.crash(3)
    cluster.nodes[1].propose(b"only-on-1", cluster.now)
    cluster.flush(1)
    cluster.take()
    cluster.crash(1)
    cluster.crash(2)
    for node_id in (2, 3):
        cluster.start(node_id)
    cluster.elect(2)  # 2 and 3 form a majority without 1's tail
    cluster.nodes[2].propose(b"on-2", cluster.now)
    cluster.flush(2)
    cluster.deliver_all()
    assert cluster.disks[1].entries[-1].data == b"only-on-1"
    cluster.start(1)
    cluster.nodes[1].step(BeginQuorumEpoch(2, 1, cluster.nodes[2].epoch), cluster.now)
    cluster.flush(1)
    cluster.deliver_all()
    assert [e.data for e in cluster.disks[1].entries] == [e.data for e in cluster.disks[2].entries]
    assert b"only-on-1" not in [e.data for e in cluster.disks[1].entries]
    assert cluster.nodes[1].high_watermark == cluster.nodes[2].high_watermark


def test_hw_waits_for_a_record_of_the_leaders_own_epoch() -> None:
    # Member 1 holds an entry of epoch 1 that no one else has; it becomes leader of epoch 2 and member 2's
    # fetch carries only that old entry. The HW must not cover it until the epoch-2 record is replicated.
    config = dataclasses.replace(CONFIG, fetch_max_bytes=1)
    old = (Entry(0, 1, b"", EntryKind.LEADER_CHANGE), Entry(1, 1, b"old"))
    leader = RaftNode(1, (1, 2, 3), config, seed=0, now=0, quorum_state=QuorumState(1, 1, None), entries=old)
    leader.tick(1000)
    leader.ready()
    leader.step(VoteResponse(2, 1, 2, granted=True, leader_id=None), 1000)
    assert leader.role is RaftRole.LEADER
    leader.advance(leader.ready())  # the leader-change record of epoch 2 is at offset 2, durable
    leader.step(Fetch(2, 1, epoch=2, fetch_offset=0, last_fetched_epoch=0, max_bytes=1), 1000)
    leader.ready()
    leader.step(Fetch(2, 1, epoch=2, fetch_offset=2, last_fetched_epoch=1, max_bytes=1), 1000)
    assert leader.high_watermark == 0  # a majority has offsets 0-1, but they are of epoch 1
    leader.ready()
    leader.step(Fetch(2, 1, epoch=2, fetch_offset=3, last_fetched_epoch=2, max_bytes=1), 1000)
    assert leader.high_watermark == 3


def test_leader_without_fetches_from_a_majority_resigns() -> None:
    cluster = Cluster(voters=(1, 2, 3))
    cluster.elect(1)
    cluster.take()
    leader = cluster.nodes[1]
    cluster.tick(1, now=cluster.now + (3 * CONFIG.fetch_timeout_ms) // 2 - 1)
    assert leader.role is RaftRole.LEADER
    cluster.tick(1, now=cluster.now + 2)
    assert role(leader) is RaftRole.UNATTACHED
    with pytest.raises(NotLeaderError):
        leader.propose(b"x", cluster.now)


def test_restarted_leader_resigns_and_does_not_vote_again_in_its_epoch() -> None:
    node = RaftNode(1, (1, 2, 3), CONFIG, seed=0, now=0, quorum_state=QuorumState(4, 1, 1))
    assert node.role is RaftRole.UNATTACHED and node.epoch == 4 and node.leader_id is None
    assert not _vote_answer(node, Vote(2, 1, epoch=4, last_epoch=9, last_epoch_end_offset=99)).granted


def test_observer_finds_the_leader_through_any_voter_and_never_stands() -> None:
    cluster = Cluster(voters=(1, 2, 3), observers=(4,))
    cluster.elect(1)
    cluster.nodes[1].propose(b"x", cluster.now)
    cluster.flush(1)
    cluster.tick(4, now=cluster.now + 1)
    cluster.deliver_all()
    observer = cluster.nodes[4]
    assert observer.role is RaftRole.FOLLOWER and observer.leader_id == 1
    assert cluster.applied[4] == [b"", b"x"]
    # It never stands, however long it goes without a leader.
    cluster.crash(1)
    for step in range(1, 20):
        cluster.tick(4, now=cluster.now + step * 1000)
        assert role(observer) is not RaftRole.CANDIDATE
        assert not cluster.take(src=4, kind=Vote)
    # Asked (only a candidate whose voter set names it asks: it was added, and may not know yet), it votes
    # as a voter would, on the candidate's log (KIP-853; refusing could stall a quorum that counts it).
    assert _vote_answer(observer, Vote(2, 4, epoch=99, last_epoch=9, last_epoch_end_offset=99)).granted


def test_follower_below_the_log_start_pulls_the_snapshot_in_chunks() -> None:
    config = dataclasses.replace(CONFIG, snapshot_chunk_bytes=7)
    cluster = Cluster(voters=(1, 2, 3), observers=(4,), config=config)
    cluster.crash(4)
    cluster.elect(1)
    leader = cluster.nodes[1]
    for i in range(10):
        leader.propose(f"e{i}".encode(), cluster.now)
    cluster.flush(1)
    cluster.deliver_all()
    state = b"state-after-11-entries-" * 3
    leader.take_snapshot(11, state)
    cluster.flush(1)
    assert cluster.disks[1].start_offset == 11 and cluster.disks[1].snapshot is not None
    cluster.start(4)
    cluster.tick(4, now=cluster.now + 1)
    cluster.deliver_all()
    chunks = [m for m in cluster.inflight if isinstance(m, FetchSnapshotResponse)]
    assert not chunks  # all delivered
    observer_disk = cluster.disks[4]
    assert observer_disk.snapshot is not None and observer_disk.snapshot.data == state
    assert observer_disk.start_offset == 11
    assert cluster.nodes[4].high_watermark == leader.high_watermark


def test_snapshot_is_fetched_in_chunks_of_the_configured_size() -> None:
    config = dataclasses.replace(CONFIG, snapshot_chunk_bytes=5)
    leader = RaftNode(1, (1,), config, seed=0, now=0)
    leader.tick(1000)
    for i in range(3):
        leader.propose(bytes([i]), 1000)
    ready = leader.ready()
    leader.advance(ready)
    leader.ready()
    snapshot_id = leader.take_snapshot(4, b"0123456789ab")
    leader.ready()
    leader.step(FetchSnapshot(9, 1, leader.epoch, snapshot_id, position=5, max_bytes=100), 1000)
    (answer,) = leader.ready().messages
    assert isinstance(answer, FetchSnapshotResponse)
    assert answer.chunk == b"56789" and answer.total_size == 12


def test_fetch_below_the_log_start_is_answered_with_the_snapshot_id() -> None:
    leader = RaftNode(1, (1,), CONFIG, seed=0, now=0)
    leader.tick(1000)
    leader.propose(b"a", 1000)
    leader.advance(leader.ready())
    leader.ready()
    snapshot_id = leader.take_snapshot(2, b"s")
    leader.ready()
    leader.step(Fetch(9, 1, leader.epoch, fetch_offset=0, last_fetched_epoch=0, max_bytes=100), 1000)
    (answer,) = leader.ready().messages
    assert isinstance(answer, FetchResponse) and answer.snapshot_id == snapshot_id and not answer.entries


def test_stale_epoch_fetch_is_fenced() -> None:
    cluster = Cluster(voters=(1, 2, 3))
    cluster.elect(1)
    cluster.take()
    leader = cluster.nodes[1]
    leader.step(Fetch(2, 1, epoch=leader.epoch - 1, fetch_offset=0, last_fetched_epoch=0, max_bytes=100), 0)
    (answer,) = leader.ready().messages
    assert isinstance(answer, FetchResponse) and answer.error.name == "FENCED_LEADER_EPOCH"
    assert answer.epoch == leader.epoch and answer.leader_id == 1


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("election_timeout_ms", 0, "controller.quorum.election.timeout.ms=0"),
        ("fetch_max_wait_ms", 5000, "controller.quorum.fetch.max.wait.ms=5000"),
        ("append_linger_ms", -1, "controller.quorum.append.linger.ms=-1"),
    ],
)
def test_bad_config_is_named(field: str, value: int, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace(".", r"\.")):
        RaftConfig(**{field: value})


def test_empty_voter_set_is_refused() -> None:
    with pytest.raises(ValueError, match="voters is empty"):
        RaftNode(1, (), CONFIG, seed=0, now=0)


def test_a_follower_told_its_leader_is_gone_stands_at_once_and_wins() -> None:
    cluster = Cluster(voters=(1, 2, 3))
    cluster.elect(1)
    cluster.crash(1)
    follower = cluster.nodes[2]
    assert follower.role is RaftRole.FOLLOWER and follower.leader_id == 1
    follower.leader_gone(1, cluster.now + 1)  # long before its fetch timeout
    assert role(follower) is RaftRole.CANDIDATE and follower.epoch == 2
    cluster.flush_all()
    cluster.deliver_all(drop_to=frozenset({1}))
    assert role(follower) is RaftRole.LEADER and follower.epoch == 2


def test_leader_gone_about_another_node_or_on_a_leader_changes_nothing() -> None:
    cluster = Cluster(voters=(1, 2, 3))
    cluster.elect(1)
    follower = cluster.nodes[2]
    follower.leader_gone(3, cluster.now + 1)  # not its leader: hearsay about a peer is not its business
    assert follower.role is RaftRole.FOLLOWER and follower.epoch == 1
    leader = cluster.nodes[1]
    leader.leader_gone(1, cluster.now + 1)
    assert leader.role is RaftRole.LEADER and leader.epoch == 1


def test_followers_told_the_leader_is_gone_stand_in_turn_by_node_id() -> None:
    cluster = Cluster(voters=(1, 2, 3))
    cluster.elect(1)
    cluster.crash(1)
    second = cluster.nodes[3]  # rank 1 among the survivors {2, 3}
    second.leader_gone(1, cluster.now + 1)
    assert second.role is RaftRole.FOLLOWER  # waits its turn, so the two do not split the vote
    cluster.tick(3, now=cluster.now + 1 + CONFIG.election_timeout_ms // 5)
    assert role(second) is RaftRole.CANDIDATE

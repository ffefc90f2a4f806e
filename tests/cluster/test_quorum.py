"""The metadata quorum between real processes: failover, fencing, quorum loss, controlled shutdown."""

from __future__ import annotations

import asyncio
import signal
import time

from hotstate.client.admin import ClusterUnavailableError, OutcomeUnknownError
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError

from .conftest import StartCluster, present

KEY = (KeyColumn("user", KeyType.STRING),)


def test_kill_the_active_controller_a_new_leader_commits_within_2s_and_nothing_is_lost(
    start_cluster: StartCluster,
) -> None:
    running = start_cluster(3)

    async def scenario() -> float:
        async with running.cluster.admin(request_timeout_s=1.0) as admin:
            for i in range(5):
                reply = await admin.create_table(f"t{i}", partitions=3, standby_replicas=1, key_columns=KEY)
                assert reply.error is ControllerError.NONE, reply
            leader = present((await admin.describe()).leader_id)
            running.kill(leader)
            killed_at = time.monotonic()
            while True:
                try:
                    reply = await admin.create_table(
                        "after", partitions=1, standby_replicas=0, key_columns=KEY, deadline_s=10
                    )
                except OutcomeUnknownError:
                    await asyncio.sleep(0.01)  # sent to the dead leader before the client noticed: again
                    continue
                # "exists": an earlier attempt of ours committed after all. Either way the write is in.
                if reply.error in (ControllerError.NONE, ControllerError.TABLE_EXISTS):
                    break
                assert reply.error is ControllerError.TIMEOUT, reply
            took = time.monotonic() - killed_at
            tables = (await admin.list_tables()).tables
            assert set(tables) == {"t0", "t1", "t2", "t3", "t4", "after"}
            status = await admin.describe()
            assert status.leader_id not in (None, leader)
            running.restart(leader)
            # The killed server rejoins as a follower and catches up.
            for _ in range(200):
                views = await admin.describe_each()
                mine = views[leader - 1]
                if (
                    not isinstance(mine, Exception)
                    and mine.quorum_role == "follower"
                    and set(mine.tables) == set(tables)
                ):
                    break
                await asyncio.sleep(0.05)
            else:
                raise AssertionError(f"server {leader} did not rejoin: {views[leader - 1]}")
            return took

    took = running.run(scenario())
    assert took < 2.0, f"new leader committed {took:.2f} s after the kill"


def test_sigstop_past_the_session_timeout_fences_and_sigcont_unfences(start_cluster: StartCluster) -> None:
    running = start_cluster(3)
    leader = running.leader()
    victim = next(n for n in (1, 2, 3) if n != leader)

    async def fenced(node_id: int) -> bool:
        async with running.cluster.admin(request_timeout_s=1.0) as admin:
            status = await admin.describe()
            return next(s.fenced for s in status.servers if s.node_id == node_id)

    async def wait_until(node_id: int, want: bool, timeout_s: float) -> float:
        start = time.monotonic()
        while time.monotonic() - start < timeout_s:
            if await fenced(node_id) == want:
                return time.monotonic() - start
            await asyncio.sleep(0.1)
        raise AssertionError(f"server {node_id} fenced={not want} after {timeout_s} s")

    running.kill(victim, signal.SIGSTOP)
    try:
        running.run(wait_until(victim, True, 6.0))
    finally:
        running.kill(victim, signal.SIGCONT)
    running.run(wait_until(victim, False, 6.0))


def test_five_voters_commit_with_two_stopped_and_stop_committing_with_three(
    start_cluster: StartCluster,
) -> None:
    running = start_cluster(5)
    leader = running.leader()
    others = [n for n in range(1, 6) if n != leader]

    async def create(name: str, deadline_s: float) -> ControllerError | str:
        async with running.cluster.admin(request_timeout_s=1.0) as admin:
            try:
                reply = await admin.create_table(
                    name, partitions=1, standby_replicas=0, key_columns=KEY, deadline_s=deadline_s
                )
            except (ClusterUnavailableError, OutcomeUnknownError) as error:
                return type(error).__name__  # the leader resigned or nobody answered: not committed either
            return reply.error

    for node_id in others[:2]:
        running.kill(node_id, signal.SIGSTOP)
    assert running.run(create("with_three", 10.0)) is ControllerError.NONE
    running.kill(others[2], signal.SIGSTOP)
    try:
        assert running.run(create("with_two", 4.0)) is not ControllerError.NONE
    finally:
        for node_id in others[:3]:
            running.kill(node_id, signal.SIGCONT)
    # No split brain: once healed, one leader, and the table written without a quorum never appeared
    # unless the quorum committed it later.
    running.status(15.0)

    async def tables() -> tuple[str, ...]:
        async with running.cluster.admin() as admin:
            return (await admin.list_tables()).tables

    assert "with_three" in running.run(tables())


def test_sigterm_moves_every_active_away_before_the_server_exits(start_cluster: StartCluster) -> None:
    running = start_cluster(3)

    async def setup() -> None:
        async with running.cluster.admin() as admin:
            reply = await admin.create_table("t", partitions=6, standby_replicas=1, key_columns=KEY)
            assert reply.error is ControllerError.NONE

    running.run(setup())
    leader = running.leader()
    victim = next(n for n in (1, 2, 3) if n != leader)
    assert running.cluster.stop(running.server(victim), timeout_s=15.0), "did not exit by itself"

    async def check() -> None:
        async with running.cluster.admin() as admin:
            status = await admin.describe()
            gone = next(s for s in status.servers if s.node_id == victim)
            assert gone.fenced and gone.actives == 0
            assert sum(s.actives for s in status.servers) == 6

    running.run(check())

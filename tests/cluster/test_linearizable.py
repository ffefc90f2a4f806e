"""Concurrent clients create, delete and list tables while metadata leaders are killed; the recorded
history must be linearizable (checked with hotstate.sim.linearizability)."""

from __future__ import annotations

import asyncio
import random
import signal
import time

from hotstate.chaos.workload import table_operation
from hotstate.cli.local_cluster import LocalCluster
from hotstate.client.admin import AdminClient
from hotstate.sim.history import HistoryRecorder
from hotstate.sim.linearizability import TableInput, TableOutput, TableSetModel, check

from .conftest import StartCluster

NAMES = ("a", "b", "c", "d")
CLIENTS = 4
Recorder = HistoryRecorder[TableInput, TableOutput]
DURATION_S = 9.0
KILL_EVERY_S = 2.5


async def client(cluster: LocalCluster, client_id: int, recorder: Recorder, stop: float, seed: int) -> int:
    rng = random.Random(seed)
    done = 0
    async with AdminClient(
        cluster.addresses(), cluster_id=cluster.cluster_id, secret=cluster.secret, request_timeout_s=1.0
    ) as admin:
        while time.monotonic() < stop:
            roll = rng.random()
            name = rng.choice(NAMES)
            if roll < 0.4:
                op: tuple[str, ...] = ("create", name)
            elif roll < 0.75:
                op = ("delete", name)
            else:
                op = ("list",)
            token = recorder.invoke(client_id, op)
            outcome = await table_operation(admin, op, NAMES)
            if outcome is None:
                recorder.timeout(token)  # TIMEOUT, NOT_CONTROLLER after the deadline, lost answers: unknown
            else:
                recorder.ok(token, outcome)
                done += 1
    return done


def test_table_operations_are_linearizable_while_leaders_are_killed(start_cluster: StartCluster) -> None:
    running = start_cluster(3)
    cluster = running.cluster
    recorder: Recorder = HistoryRecorder()
    kills = []

    async def nemesis(stop: float) -> None:
        async with cluster.admin(request_timeout_s=0.5) as admin:
            while time.monotonic() + KILL_EVERY_S < stop:
                await asyncio.sleep(KILL_EVERY_S)
                leader = (await admin.describe(deadline_s=3.0)).leader_id
                if leader is None:
                    continue
                server = next(s for s in cluster.servers if s.node_id == leader)
                cluster.signal(server, signal.SIGKILL)
                kills.append(leader)
                while cluster.alive(server):
                    await asyncio.sleep(0.01)
                await asyncio.sleep(0.3)
                cluster.start(server)

    async def scenario() -> list[int]:
        stop = time.monotonic() + DURATION_S
        async with asyncio.TaskGroup() as group:
            group.create_task(nemesis(stop))
            clients = [group.create_task(client(cluster, i, recorder, stop, seed=i)) for i in range(CLIENTS)]
        return [c.result() for c in clients]

    completed = running.run(scenario())
    history = recorder.operations()
    result = check(TableSetModel(), history, timeout_s=120)
    assert len(kills) >= 2, f"the nemesis killed only {kills}"
    assert sum(completed) >= 50, f"too few operations completed ({completed}) to mean anything"
    assert result.ok is True, result.explanation

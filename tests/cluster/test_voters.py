"""Quorum reconfiguration between real processes (KIP-853): one of three controllers replaced by a fourth,
one voter at a time, through `hotstate cluster voters`, while writes and pull queries go on; none fails.
The old one, a combined controller+broker, is refused as a server while it is a voter, and once out of the
quorum is removed as a server (`server remove`: drained, unregistered, exit 78)."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

import hotstate
from hotstate.client.admin import AdminClient
from hotstate.client.writer import WriteError
from hotstate.controller.requests import ControllerError
from hotstate.protocol.voters import VotersError, VotersResponse

from .conftest import RunningCluster, StartCluster
from .test_replication import KEY, _create, _writer


def _cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hotstate.cli.main", "cluster", "voters", *args, "--dir", str(root)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env=dict(os.environ, COLUMNS="200"),
    )


async def _until_caught_up(admin: AdminClient, node_id: int, timeout_s: float = 30.0) -> VotersResponse:
    end = time.monotonic() + timeout_s
    while True:
        reply = await admin.list_voters()
        if any(o.node_id == node_id and o.caught_up for o in reply.observers):
            return reply
        assert time.monotonic() < end, f"server {node_id} never caught up: {reply}"
        await asyncio.sleep(0.1)


async def _until_registered(running: RunningCluster, node_id: int, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    async with running.cluster.admin(request_timeout_s=1.0) as admin:
        while True:
            status = await admin.describe()
            if any(s.node_id == node_id and not s.fenced for s in status.servers):
                return
            assert time.monotonic() < end, f"server {node_id} never registered"
            await asyncio.sleep(0.1)


def test_replace_one_of_three_controllers_under_writes_and_queries(start_cluster: StartCluster) -> None:
    running = start_cluster(4, hold=(4,), voters=3, broker_removal_delay_ms=4000)
    root = running.cluster.root
    http = running.cluster.http_addresses()

    async def scenario() -> None:
        await _create(running, "clicks", partitions=6, standbys=1)
        stop = asyncio.Event()
        failures: list[BaseException] = []
        done = {"writes": 0, "queries": 0}

        async def write_loop() -> None:
            writer = _writer(running, "clicks")
            value = 0
            try:
                while not stop.is_set():
                    value += 1
                    rows = [{"user": f"k{i}", "clicks": value} for i in range(20)]
                    try:
                        await writer.upsert(rows, deadline_s=20.0)
                        done["writes"] += 1
                    except WriteError as error:
                        failures.append(error)
                    await asyncio.sleep(0.01)
            finally:
                await writer.close()

        async def query_loop() -> None:
            # Servers 1 and 2 stay throughout; 3 goes away, 4 comes.
            async with hotstate.AsyncClient(http[:2], timeout_s=20.0) as client:
                while not stop.is_set():
                    try:
                        await client.query("SELECT * FROM clicks WHERE user = 'k1'", timeout_ms=10_000)
                        done["queries"] += 1
                    except Exception as error:
                        failures.append(error)
                    await asyncio.sleep(0.01)

        load = [asyncio.create_task(write_loop()), asyncio.create_task(query_loop())]
        await asyncio.sleep(1.0)
        async with running.cluster.admin(request_timeout_s=5.0) as admin:
            before = await admin.list_voters()
            assert before.voters == (1, 2, 3) and not before.change_pending
            # A server that never ran cannot be added; the answer says why.
            refused = await admin.add_voter(4)
            assert refused.error is VotersError.REFUSED and "not registered" in refused.message, refused

            running.restart(4)  # a controller missing from controller.quorum.voters: an observer
            await _until_registered(running, 4)
            await _until_caught_up(admin, 4)
            added = await asyncio.to_thread(_cli, root, "add", "4")
            assert added.returncode == 0, added.stderr
            assert "voter 4 added: voters [1, 2, 3, 4]" in added.stdout
            # A voter is not removed as a server: the refusal names the command that comes first.
            refused_removal = await admin.remove_server(3)
            assert refused_removal.error is ControllerError.INVALID_REQUEST, refused_removal
            assert "hotstate cluster voters remove 3" in refused_removal.message, refused_removal
            removed = await asyncio.to_thread(_cli, root, "remove", "3")
            assert removed.returncode == 0, removed.stderr
            listed = await asyncio.to_thread(_cli, root, "list")
            assert listed.returncode == 0, listed.stderr
            assert "voter (leader)" in listed.stdout, listed.stdout
            after = await admin.list_voters()
            assert after.voters == (1, 2, 4), after
            assert any(o.node_id == 3 for o in after.observers) or after.leader_id != 3
            # Over HTTP too (the same request, forwarded to the leader).
            async with httpx.AsyncClient() as web:
                answer = await web.get(f"{http[0]}/v1/cluster/voters")
                assert answer.status_code == 200 and answer.json()["voters"] == [1, 2, 4]
                twice = await web.post(f"{http[1]}/v1/cluster/voters", json={"node_id": 4})
                assert twice.status_code == 409 and "already a voter" in twice.json()["message"]

            # The old controller, combined with a broker and no longer a voter, is removed as a server, under
            # load: its replicas drain to the others, then it is unregistered and exits 78.
            draining = await admin.remove_server(3)
            assert draining.error is ControllerError.NONE, draining
            end = time.monotonic() + 40.0
            while running.cluster.alive(running.server(3)):
                assert time.monotonic() < end, "server 3 never left after its removal"
                await asyncio.sleep(0.1)
            log = (running.server(3).directory(root) / "server.log").read_text()
            assert "was removed from the cluster" in log and "exit code 78" in log, log[-2000:]
            assert 3 not in {s.node_id for s in (await admin.describe()).servers}
            stop.set()
            await asyncio.gather(*load)
            assert not failures, failures[:3]
            assert done["writes"] > 20 and done["queries"] > 20, done

            # The new voter counts: with 3 gone and another old voter stopped, 4 completes a majority.
            leader = (await admin.list_voters()).leader_id
            paused = 1 if leader != 1 else 2
            live = [
                (s.host, s.rpc_port) for s in running.cluster.servers if s.node_id in {1, 2, 4} - {paused}
            ]
            running.kill(paused, signal.SIGSTOP)
            try:
                cluster = running.cluster
                async with AdminClient(live, cluster_id=cluster.cluster_id, secret=cluster.secret) as few:
                    reply = await few.create_table("after", partitions=1, standby_replicas=0, key_columns=KEY)
                    assert reply.error is ControllerError.NONE, reply
            finally:
                running.kill(paused, signal.SIGCONT)

    running.run(scenario())

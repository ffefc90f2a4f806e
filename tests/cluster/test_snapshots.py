"""Metadata snapshots between real processes: taken by record count, old segments freed, a wiped or
far-behind server rebuilt from the leader's snapshot and the tail."""

from __future__ import annotations

import asyncio
import shutil
import signal
import time
from pathlib import Path

from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError
from hotstate.log import Log, LogError

from .conftest import StartCluster

KEY = (KeyColumn("k", KeyType.STRING),)


def test_a_wiped_server_is_rebuilt_from_the_snapshot_and_the_tail(start_cluster: StartCluster) -> None:
    running = start_cluster(3, snapshot_max_records=20)
    cluster = running.cluster
    leader = running.leader()
    victim = next(n for n in (1, 2, 3) if n != leader)
    running.kill(victim, signal.SIGKILL)

    async def create_many(prefix: str, count: int) -> None:
        async with cluster.admin() as admin:
            for i in range(count):
                reply = await admin.create_table(
                    f"{prefix}{i}", partitions=4, standby_replicas=1, key_columns=KEY
                )
                assert reply.error is ControllerError.NONE, reply

    running.run(create_many("t", 40))
    leader_dir = running.server(leader).directory(cluster.root) / "data" / "metadata"
    snapshots = list(leader_dir.glob("snapshot-*"))
    assert snapshots, "the leader took no snapshot"

    victim_dir = running.server(victim).directory(cluster.root) / "data"
    shutil.rmtree(victim_dir)  # a new, empty server under the same id
    running.restart(victim)

    async def caught_up() -> None:
        async with cluster.admin() as admin:
            want = set((await admin.list_tables()).tables)
            for _ in range(200):
                views = await admin.describe_each()
                mine = views[victim - 1]
                if not isinstance(mine, Exception) and set(mine.tables) == want:
                    return
                await asyncio.sleep(0.05)
            raise AssertionError(f"server {victim} did not catch up: {views[victim - 1]}")

    running.run(caught_up())
    # It got there through a snapshot: its own log starts past the beginning.
    running.kill(victim, signal.SIGKILL)
    log = _open_when_free(victim_dir / "metadata" / "log")
    try:
        assert log.start_offset > 0
    finally:
        log.close()
    assert list((victim_dir / "metadata").glob("snapshot-*"))


def _open_when_free(path: Path, timeout_s: float = 10.0) -> Log:
    """The killed server's lock goes with its process; wait for that, and name any holder if it lingers."""
    end = time.monotonic() + timeout_s
    while True:
        try:
            return Log.open(path)
        except LogError:
            if time.monotonic() > end:
                holders = [
                    fd.parent.parent.name
                    for fd in Path("/proc").glob("[0-9]*/fd/*")
                    if _points_into(fd, path)
                ]
                raise AssertionError(f"{path} still locked after {timeout_s} s by pids {holders}") from None
            time.sleep(0.05)


def _points_into(fd: Path, path: Path) -> bool:
    try:
        return str(fd.readlink()).startswith(str(path))
    except OSError:
        return False

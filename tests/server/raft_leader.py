"""A single-voter metadata quorum on a real log, led by its one member: the Raft driver under test."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from hotstate.raft.config import RaftConfig
from hotstate.raft.node import RaftNode, RaftRole
from hotstate.raft.storage import RaftStorage
from hotstate.server.raft_driver import RaftDriver


async def single_voter_leader(tmp_path: Path, **driver_args: Any) -> RaftDriver:
    """Node 1, the only voter, started and leading, its leader-change record committed. `driver_args`: the
    RaftDriver's keyword arguments (`send` and `on_committed` default to doing nothing)."""
    leads: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def on_role_change(node: RaftNode) -> None:
        if node.role is RaftRole.LEADER and not leads.done():
            leads.set_result(None)

    driver_args.setdefault("send", lambda message: None)
    driver_args.setdefault("on_committed", lambda entries, snapshot: None)
    driver = RaftDriver(
        1, [1], RaftConfig(), RaftStorage(tmp_path / "metadata"), on_role_change=on_role_change, **driver_args
    )
    driver.start()
    async with asyncio.timeout(10):
        await leads
        while driver.node.high_watermark <= 0:  # the leader-change record of its epoch
            await asyncio.sleep(0.01)
    return driver

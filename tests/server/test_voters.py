"""`VoterAdmin` (server/voters.py) over a real `RaftDriver`: who answers, what is refused and why, and a
change answered once its VOTERS entry commits."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import cast

from hotstate.controller.image import MetadataImage
from hotstate.protocol.voters import VotersError, VotersOp, VotersRequest, VotersResponse
from hotstate.raft.config import RaftConfig
from hotstate.raft.messages import BeginQuorumEpoch, Fetch, Message
from hotstate.raft.storage import RaftStorage
from hotstate.server.raft_driver import RaftDriver, monotonic_ms
from hotstate.server.voters import VoterAdmin

from .raft_leader import single_voter_leader


def _image(roles: dict[int, tuple[str, ...]]) -> Callable[[], MetadataImage]:
    image = SimpleNamespace(servers={n: SimpleNamespace(roles=r) for n, r in roles.items()})
    return lambda: cast(MetadataImage, image)


async def _leader(tmp_path: Path, sent: list[Message]) -> RaftDriver:
    return await single_voter_leader(tmp_path, send=sent.append)


def _fetch(driver: RaftDriver, src: int) -> None:
    node = driver.node
    driver.deliver(Fetch(src, 1, node.epoch, node.log.end_offset, node.log.last_epoch, 1 << 20))


def test_the_leader_refuses_with_reasons_and_answers_a_change_once_committed(tmp_path: Path) -> None:
    async def scenario() -> None:
        sent: list[Message] = []
        driver = await _leader(tmp_path, sent)

        async def no_forward(leader: int, request: VotersRequest) -> VotersResponse:
            raise AssertionError("the leader answers itself")

        image = _image({2: ("broker",), 3: ("broker", "controller")})
        admin = VoterAdmin(driver, image, forward=no_forward, clock=monotonic_ms)
        try:
            listed = await admin.handle(VotersRequest(VotersOp.LIST))
            assert (listed.error, listed.voters, listed.leader_id) == (VotersError.NONE, (1,), 1)
            for node_id, reason in (
                (9, "server 9 is not registered"),
                (2, "registered without the controller role"),
                (3, "has not fetched from leader 1"),
            ):
                reply = await admin.handle(VotersRequest(VotersOp.ADD, node_id))
                assert reply.error is VotersError.REFUSED and reason in reply.message, reply
            reply = await admin.handle(VotersRequest(VotersOp.REMOVE, 3))
            assert reply.error is VotersError.REFUSED and "not a voter" in reply.message
            # 3 fetches (an observer, caught up): it may be added; the answer waits for the commit, which
            # needs 3's next fetch (2 of {1, 3}).
            _fetch(driver, 3)
            while 3 not in driver.node.observer_progress():
                await asyncio.sleep(0.01)
            adding = asyncio.create_task(admin.handle(VotersRequest(VotersOp.ADD, 3)))
            while driver.node.voters != {1, 3}:
                await asyncio.sleep(0.01)
            await asyncio.sleep(0.05)
            assert not adding.done()
            async with asyncio.timeout(5):
                while not adding.done():  # 3 fetches on, as a follower does
                    _fetch(driver, 3)
                    await asyncio.sleep(0.02)
            added = adding.result()
            assert added.error is VotersError.NONE and added.voters == (1, 3), added
            assert added.change_offset is not None and not added.change_pending
        finally:
            await driver.stop()

    asyncio.run(scenario())


def test_a_follower_forwards_once_and_a_forwarded_request_is_not_forwarded_again(tmp_path: Path) -> None:
    async def scenario() -> None:
        driver = RaftDriver(
            2,
            [1, 2, 3],
            RaftConfig(),
            RaftStorage(tmp_path / "metadata"),
            send=lambda message: None,
            on_committed=lambda entries, snapshot: None,
        )
        forwarded: list[tuple[int, VotersRequest]] = []

        async def forward(leader: int, request: VotersRequest) -> VotersResponse:
            forwarded.append((leader, request))
            return VotersResponse(VotersError.NONE, "from the leader", leader)

        admin = VoterAdmin(driver, _image({}), forward=forward, clock=lambda: 0)
        reply = await admin.handle(VotersRequest(VotersOp.ADD, 4))
        assert reply.error is VotersError.NOT_LEADER and "no leader is known" in reply.message
        driver.node.step(BeginQuorumEpoch(1, 2, 1), 0)  # now it follows 1
        reply = await admin.handle(VotersRequest(VotersOp.ADD, 4))
        assert reply.message == "from the leader"
        assert forwarded == [(1, VotersRequest(VotersOp.ADD, 4, forwarded=True))]
        again = await admin.handle(VotersRequest(VotersOp.ADD, 4, forwarded=True))
        assert again.error is VotersError.NOT_LEADER and "the metadata leader is 1" in again.message
        await driver.stop()

    asyncio.run(scenario())

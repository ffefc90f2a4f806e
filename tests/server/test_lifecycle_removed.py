"""A server whose node id was removed from the cluster is told so and stops (server/lifecycle.py)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

from hotstate.controller.image import MetadataImage
from hotstate.controller.records import Endpoint
from hotstate.controller.requests import (
    ControllerError,
    ControllerRequest,
    ControllerResponse,
    RegisterServerRequest,
    RegisterServerResponse,
    ServerHeartbeatResponse,
)
from hotstate.server.lifecycle import ServerLifecycle


def lifecycle(replies: list[ControllerResponse], removed: list[str]) -> ServerLifecycle:
    async def send(request: ControllerRequest) -> ControllerResponse:
        return replies.pop(0)

    metadata: Any = SimpleNamespace(image=MetadataImage.empty())
    return ServerLifecycle(
        node_id=4,
        incarnation_id="i",
        rpc=Endpoint("127.0.0.1", 1),
        http=None,
        rack=None,
        tags=(),
        roles=("broker",),
        metadata=metadata,
        send=send,
        heartbeat_interval_ms=10,
        on_removed=removed.append,
    )


def test_a_heartbeat_answered_removed_stops_the_server_without_a_controlled_shutdown() -> None:
    removed: list[str] = []
    life = lifecycle(
        [
            RegisterServerResponse(ControllerError.NONE, "", 3),
            ServerHeartbeatResponse(ControllerError.SERVER_REMOVED, "server 4 was removed", True, False),
        ],
        removed,
    )

    async def go() -> bool:
        task = asyncio.create_task(life.run())
        while not removed:
            await asyncio.sleep(0.001)
        task.cancel()
        # Nobody is left to ask: the shutdown is immediate (no reply is queued for it).
        return await life.controlled_shutdown(5.0, leader_known=lambda: True)

    assert asyncio.run(go()) is True
    assert removed == ["server 4 was removed"] and life.removed and not life.registered.is_set()


def test_a_registration_refused_as_removed_is_reported_once() -> None:
    removed: list[str] = []
    refusal = RegisterServerResponse(ControllerError.SERVER_REMOVED, "server 4 was removed", -1)
    life = lifecycle([refusal, refusal], removed)

    async def go() -> None:
        assert not await life._register()
        assert not await life._register()

    asyncio.run(go())
    assert removed == ["server 4 was removed"]
    assert isinstance(life._registration, RegisterServerRequest)

"""A server's life as seen by the controller: register, heartbeat, and shut down in a controlled way."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Awaitable, Callable

from hotstate.controller.records import Endpoint
from hotstate.controller.requests import (
    ControllerError,
    ControllerRequest,
    ControllerResponse,
    RegisterServerRequest,
    RegisterServerResponse,
    ServerHeartbeatRequest,
    ServerHeartbeatResponse,
)
from hotstate.server.metadata import MetadataPublisher

log = logging.getLogger(__name__)

SendToController = Callable[[ControllerRequest], Awaitable[ControllerResponse]]

# With no metadata leader for this long, a controlled shutdown has nobody to ask: the quorum is gone.
QUORUM_GONE_S = 1.5


class ServerLifecycle:
    def __init__(
        self,
        *,
        node_id: int,
        incarnation_id: str,
        rpc: Endpoint,
        http: Endpoint | None,
        rack: str | None,
        tags: tuple[tuple[str, str], ...],
        roles: tuple[str, ...],
        metadata: MetadataPublisher,
        send: SendToController,
        heartbeat_interval_ms: int,
        replica_ends: Callable[[], tuple[tuple[int, int, int], ...]] = tuple,
        on_removed: Callable[[str], None] = lambda message: None,
    ) -> None:
        """`on_removed`: the controller says this node id was removed from the cluster (its message)."""
        self._replica_ends = replica_ends
        self._on_removed = on_removed
        self.removed = False
        self._registration = RegisterServerRequest(node_id, incarnation_id, rpc, http, rack, tags, roles)
        self._metadata = metadata
        self._send = send
        self._interval_s = heartbeat_interval_ms / 1000
        self.registered = asyncio.Event()
        self.fenced = True
        self._shutting_down = False
        self.shutdown_ready = asyncio.Event()

    async def run(self) -> None:
        """Register, then heartbeat until cancelled; re-register whenever the controller forgot us."""
        backoff = self._interval_s
        while True:
            if not self.registered.is_set():
                if await self._register():
                    backoff = self._interval_s
                else:
                    await asyncio.sleep(backoff * (0.5 + random.random()))
                    backoff = min(backoff * 2, 2.0)
                    continue
            await self._heartbeat()
            await asyncio.sleep(self._interval_s)

    async def _register(self) -> bool:
        try:
            reply = await self._send(self._registration)
        except (OSError, TimeoutError, ConnectionError) as error:
            log.debug("registration failed: %s", error)
            return False
        assert isinstance(reply, RegisterServerResponse)
        if reply.error is ControllerError.SERVER_REMOVED:
            self._removed(reply.message)
            return False
        if reply.error is not ControllerError.NONE:
            log.debug("registration refused: %s %s", reply.error.name, reply.message)
            return False
        log.info("registered with the controller (record at metadata offset %d)", reply.registered_at)
        self.registered.set()
        return True

    async def _heartbeat(self) -> None:
        request = ServerHeartbeatRequest(
            self._registration.node_id,
            self._registration.incarnation_id,
            self._metadata.image.offset,
            self._shutting_down,
            self._replica_ends(),
        )
        try:
            reply = await self._send(request)
        except (OSError, TimeoutError, ConnectionError) as error:
            log.debug("heartbeat failed: %s", error)
            return
        assert isinstance(reply, ServerHeartbeatResponse)
        if reply.error is ControllerError.SERVER_REMOVED:
            self._removed(reply.message)
            return
        if reply.error in (ControllerError.STALE_INCARNATION, ControllerError.UNKNOWN_SERVER):
            log.warning(
                "the controller does not know this incarnation (%s): registering again", reply.message
            )
            self.registered.clear()
            return
        if reply.error is not ControllerError.NONE:
            return
        if reply.fenced != self.fenced:
            log.info("this server is now %s", "fenced" if reply.fenced else "unfenced")
        self.fenced = reply.fenced
        if self._shutting_down and reply.shutdown_ready:
            self.shutdown_ready.set()

    def _removed(self, message: str) -> None:
        if not self.removed:
            self.removed = True
            self.registered.clear()
            log.critical("%s", message)
            self._on_removed(message)

    async def controlled_shutdown(self, timeout_s: float, *, leader_known: Callable[[], bool]) -> bool:
        """Ask the controller to move every active off this server and wait until that is committed.

        Gives up early when the metadata quorum is gone (no leader known for a while): nobody is left to
        move anything, as for the last servers of a cluster being shut down."""
        self._shutting_down = True
        if self.removed:
            return True  # nothing left to move, nobody to ask
        try:
            await asyncio.wait_for(self._shutdown_loop(leader_known), timeout_s)
        except TimeoutError:
            log.warning("controlled shutdown not confirmed within %.1f s; stopping anyway", timeout_s)
            return False
        return self.shutdown_ready.is_set()

    async def _shutdown_loop(self, leader_known: Callable[[], bool]) -> None:
        loop = asyncio.get_running_loop()
        last_leader = loop.time()
        while not self.shutdown_ready.is_set():
            if leader_known():
                last_leader = loop.time()
            elif loop.time() - last_leader > QUORUM_GONE_S:
                log.warning(
                    "no metadata leader for %.1f s: stopping without a controlled shutdown", QUORUM_GONE_S
                )
                return
            if self.registered.is_set():
                await self._heartbeat()
            if not self.shutdown_ready.is_set():
                await asyncio.sleep(self._interval_s / 2)

"""Quorum membership on a server: `VotersRequest` (KIP-853 AddVoter / RemoveVoter / list) from the admin
client, the HTTP API or another server.

The metadata leader answers; any other server passes the request to it once (a forwarded request is never
forwarded again) or says who leads. An AddVoter names a server registered with the controller role (the
others reach it at its registered RPC address); the Raft core then refuses it unless it is a caught-up
observer, or while another change is uncommitted, with the reason in the answer. A change is answered once
its VOTERS entry commits, or with TIMEOUT (outcome unknown) if it did not in time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable

from hotstate.controller.image import MetadataImage
from hotstate.protocol.voters import (
    ObserverProgress,
    VotersError,
    VotersOp,
    VotersRequest,
    VotersResponse,
)
from hotstate.raft.node import NotLeaderError, RaftRole, ReconfigurationError
from hotstate.server.raft_driver import RaftDriver

log = logging.getLogger(__name__)

COMMIT_TIMEOUT_S = 10.0
# A forwarded change waits for the leader's commit: longer than that.
VOTERS_FORWARD_TIMEOUT_S = COMMIT_TIMEOUT_S + 5.0

ForwardVoters = Callable[[int, VotersRequest], Awaitable[VotersResponse]]


class VoterAdmin:
    def __init__(
        self,
        driver: RaftDriver,
        image: Callable[[], MetadataImage],
        *,
        forward: ForwardVoters,
        clock: Callable[[], int],
        commit_timeout_s: float = COMMIT_TIMEOUT_S,
    ) -> None:
        self._driver = driver
        self._image = image
        self._forward = forward
        self._clock = clock
        self._commit_timeout_s = commit_timeout_s

    async def handle(self, request: VotersRequest) -> VotersResponse:
        node = self._driver.node
        if node.role is not RaftRole.LEADER:
            leader = node.leader_id
            if request.forwarded or leader is None or leader == node.id:
                hint = f"; the metadata leader is {leader}" if leader is not None else "; no leader is known"
                return VotersResponse(
                    VotersError.NOT_LEADER, f"server {node.id} does not lead{hint}", leader, node.epoch
                )
            return await self._forward(leader, dataclasses.replace(request, forwarded=True))
        if request.op is VotersOp.LIST:
            return self.describe(VotersError.NONE, "")
        if request.op is VotersOp.ADD:
            problem = self._registration_problem(request.node_id)
            if problem is not None:
                return self.describe(VotersError.REFUSED, f"cannot add voter {request.node_id}: {problem}")
        try:
            if request.op is VotersOp.ADD:
                offset, epoch = self._driver.add_voter(request.node_id)
            else:
                offset, epoch = self._driver.remove_voter(request.node_id)
        except NotLeaderError as error:
            return self.describe(VotersError.NOT_LEADER, str(error))
        except ReconfigurationError as error:
            return self.describe(VotersError.REFUSED, str(error))
        verb = "added" if request.op is VotersOp.ADD else "removed"
        log.info("metadata quorum: voter %d %s at offset %d (epoch %d)", request.node_id, verb, offset, epoch)
        try:
            applied = await asyncio.wait_for(self._driver.committed(offset, epoch), self._commit_timeout_s)
        except TimeoutError:
            applied = False
        if not applied:
            return self.describe(
                VotersError.TIMEOUT,
                f"the change of voter {request.node_id} at offset {offset} did not commit in epoch {epoch} "
                f"within {self._commit_timeout_s:.0f} s; list the voters to see whether it applied",
                offset,
            )
        return self.describe(VotersError.NONE, f"voter {request.node_id} {verb}", offset)

    def describe(self, error: VotersError, message: str, offset: int | None = None) -> VotersResponse:
        node = self._driver.node
        now = self._clock()
        fetch_timeout = node.config.fetch_timeout_ms
        observers = tuple(
            ObserverProgress(
                node_id,
                fetch_offset,
                (caught_up or fetch_offset >= node.high_watermark) and now - at <= fetch_timeout,
                now - at,
            )
            for node_id, (fetch_offset, at, caught_up) in sorted(node.observer_progress().items())
        )
        return VotersResponse(
            error,
            message,
            node.leader_id,
            node.epoch,
            tuple(sorted(node.voters)),
            node.voter_change_pending,
            node.high_watermark,
            observers,
            offset,
        )

    def _registration_problem(self, node_id: int) -> str | None:
        server = self._image().servers.get(node_id)
        if server is None:
            return (
                f"server {node_id} is not registered; start it with process.roles including controller "
                "(it follows the metadata log as an observer) and retry"
            )
        if "controller" not in server.roles:
            return f"server {node_id} is registered without the controller role ({','.join(server.roles)})"
        return None

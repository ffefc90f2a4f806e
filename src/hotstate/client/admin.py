"""Administrative client: cluster status and table management, over the servers' RPC port.

Any server answers: it forwards controller requests to the active controller. On a connection error or
NOT_CONTROLLER the client moves on to the next server, with backoff, until its deadline.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Sequence
from typing import cast

from hotstate.controller.records import KeyColumn, TableTtl, TableWindow, ValueColumn
from hotstate.controller.requests import (
    CommitBatchRequest,
    CommitBatchResponse,
    ControllerError,
    ControllerRequest,
    ControllerResponse,
    CreateTableRequest,
    CreateTableResponse,
    DeleteTableRequest,
    DeleteTableResponse,
    ListTablesRequest,
    ListTablesResponse,
    RegisterWriterRequest,
    RegisterWriterResponse,
    RemoveServerRequest,
    RemoveServerResponse,
    ReplaceTableRequest,
    ReplaceTableResponse,
    SetValueColumnsRequest,
    SetValueColumnsResponse,
    StageTableRequest,
    StageTableResponse,
)
from hotstate.protocol.cluster import DescribeClusterRequest, DescribeClusterResponse
from hotstate.protocol.voters import VotersError, VotersOp, VotersRequest, VotersResponse
from hotstate.protocol.wire import MESSAGES
from hotstate.rpc import NOT_SENT, PeerPool, RpcError, bootstrap_peer_id, bootstrap_peers
from hotstate.tls import TlsOption, to_client_context

# Clients are not cluster members; they identify as node 0 in the RPC handshake.
CLIENT_NODE_ID = 0
# Only errors that mean "not applied" are retried; TIMEOUT (outcome unknown) goes back to the caller.
RETRYABLE = (ControllerError.NOT_CONTROLLER,)


class ClusterUnavailableError(Exception):
    """No server could be reached at all: the request was certainly not applied."""


class OutcomeUnknownError(Exception):
    """A change was sent but its answer was lost (timeout, dropped connection): it may or may not have
    been applied. Not retried automatically, since a retry could report the client's own change back
    to it as "exists" or "missing"."""


class AdminClient:
    def __init__(
        self,
        servers: Sequence[tuple[str, int]],
        *,
        cluster_id: str,
        secret: str,
        request_timeout_s: float = 5.0,
        tls: TlsOption = None,
    ) -> None:
        """`tls`: the servers' RPC port uses TLS; the CA certificate file to trust, or an ssl.SSLContext
        (tls.client_context: with a client certificate when the servers require one)."""
        if not servers:
            raise ValueError("no servers to talk to")
        self._servers = list(servers)
        self._pool = PeerPool(CLIENT_NODE_ID, cluster_id, secret, MESSAGES, tls=to_client_context(tls))
        # Node ids are not known up front (the list may be any subset, in any order): bootstrap ids.
        self._pool.update(bootstrap_peers(self._servers))
        self._request_timeout_s = request_timeout_s
        self._preferred = 0

    async def close(self) -> None:
        await self._pool.close()

    async def __aenter__(self) -> AdminClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def describe(self, *, deadline_s: float = 5.0) -> DescribeClusterResponse:
        reply = await self._call(DescribeClusterRequest(), deadline_s, idempotent=True)
        assert isinstance(reply, DescribeClusterResponse)
        return reply

    async def describe_each(self) -> list[DescribeClusterResponse | Exception]:
        """Every server's own view (or the error reaching it)."""

        async def one(index: int) -> DescribeClusterResponse | Exception:
            try:
                reply = await self._pool.request(
                    bootstrap_peer_id(index), DescribeClusterRequest(), self._request_timeout_s
                )
            except Exception as error:
                return error
            assert isinstance(reply, DescribeClusterResponse)
            return reply

        return list(await asyncio.gather(*(one(i) for i in range(len(self._servers)))))

    async def create_table(
        self,
        name: str,
        *,
        partitions: int,
        standby_replicas: int | None = None,
        key_columns: tuple[KeyColumn, ...],
        acceptable_lag: int | None = None,
        writer_rack: str | None = None,
        window: TableWindow | None = None,
        ttl: TableTtl | None = None,
        deadline_s: float = 10.0,
    ) -> CreateTableResponse:
        """`standby_replicas` None: the `num.standby.replicas` of the server that takes the request."""
        request = CreateTableRequest(
            name, partitions, standby_replicas, key_columns, acceptable_lag, writer_rack, window, ttl
        )
        reply = await self._controller_call(request, deadline_s)
        assert isinstance(reply, CreateTableResponse)
        return reply

    async def register_writer(
        self, table: str, rack: str, *, deadline_s: float = 10.0
    ) -> RegisterWriterResponse:
        """Add `rack` to the table's writer racks (idempotent)."""
        reply = await self._controller_call(RegisterWriterRequest(table, rack), deadline_s, idempotent=True)
        assert isinstance(reply, RegisterWriterResponse)
        return reply

    async def commit_batch(
        self,
        table: str,
        table_id: int,
        batch_id: int,
        positions: tuple[tuple[int, int], ...],
        *,
        deadline_s: float = 10.0,
    ) -> CommitBatchResponse:
        """Record that Spark batch `batch_id` is in `table` at least at `positions` (idempotent)."""
        request = CommitBatchRequest(table, table_id, batch_id, positions)
        reply = await self._controller_call(request, deadline_s, idempotent=True)
        assert isinstance(reply, CommitBatchResponse)
        return reply

    async def set_value_columns(
        self, table: str, value_columns: tuple[ValueColumn, ...], *, deadline_s: float = 10.0
    ) -> SetValueColumnsResponse:
        """Declare `table`'s value columns (its writer's schema); they replace what it had (idempotent)."""
        request = SetValueColumnsRequest(table, value_columns)
        reply = await self._controller_call(request, deadline_s, idempotent=True)
        assert isinstance(reply, SetValueColumnsResponse)
        return reply

    async def stage_table(
        self,
        name: str,
        *,
        partitions: int,
        standby_replicas: int,
        key_columns: tuple[KeyColumn, ...],
        acceptable_lag: int | None = None,
        writer_rack: str | None = None,
        window: TableWindow | None = None,
        ttl: TableTtl | None = None,
        deadline_s: float = 10.0,
    ) -> StageTableResponse:
        """Stage a new, empty generation of `name` for an overwrite (the table keeps serving meanwhile)."""
        request = StageTableRequest(
            name, partitions, standby_replicas, key_columns, acceptable_lag, writer_rack, window, ttl
        )
        reply = await self._controller_call(request, deadline_s)
        assert isinstance(reply, StageTableResponse)
        return reply

    async def replace_table(
        self,
        name: str,
        table_id: int,
        positions: tuple[tuple[int, int], ...] = (),
        *,
        deadline_s: float = 10.0,
    ) -> ReplaceTableResponse:
        """Swap the staged generation `table_id`, loaded up to `positions` ((partition, position)), in as
        table `name` (idempotent)."""
        request = ReplaceTableRequest(name, table_id, positions)
        reply = await self._controller_call(request, deadline_s, idempotent=True)
        assert isinstance(reply, ReplaceTableResponse)
        return reply

    async def delete_table(self, name: str, *, deadline_s: float = 10.0) -> DeleteTableResponse:
        reply = await self._controller_call(DeleteTableRequest(name), deadline_s)
        assert isinstance(reply, DeleteTableResponse)
        return reply

    async def list_tables(self, *, deadline_s: float = 10.0) -> ListTablesResponse:
        reply = await self._controller_call(ListTablesRequest(), deadline_s, idempotent=True)
        assert isinstance(reply, ListTablesResponse)
        return reply

    async def remove_server(self, node_id: int, *, deadline_s: float = 10.0) -> RemoveServerResponse:
        """Remove broker `node_id` for good (idempotent): state "draining" while its replicas move away,
        "removed" once it is unregistered (docs/operations.md). Poll `describe` to see it go."""
        reply = await self._controller_call(RemoveServerRequest(node_id), deadline_s, idempotent=True)
        assert isinstance(reply, RemoveServerResponse)
        return reply

    # ------------------------------------------------------------------ quorum membership (KIP-853)
    async def list_voters(self, *, deadline_s: float = 10.0) -> VotersResponse:
        """The metadata leader's voters, whether a change is in flight, and its observers' progress."""
        return await self._voters_call(VotersRequest(VotersOp.LIST), deadline_s, idempotent=True)

    async def add_voter(self, node_id: int, *, deadline_s: float = 15.0) -> VotersResponse:
        """Make `node_id` (registered with the controller role, caught up as an observer) a voter; answered
        once the change commits. A refusal (error REFUSED) says why; TIMEOUT: the outcome is unknown."""
        return await self._voters_call(VotersRequest(VotersOp.ADD, node_id), deadline_s)

    async def remove_voter(self, node_id: int, *, deadline_s: float = 15.0) -> VotersResponse:
        """Take `node_id` out of the voters (the leader may remove itself: it steps down once committed)."""
        return await self._voters_call(VotersRequest(VotersOp.REMOVE, node_id), deadline_s)

    async def _voters_call(
        self, request: VotersRequest, deadline_s: float, *, idempotent: bool = False
    ) -> VotersResponse:
        end = time.monotonic() + deadline_s
        while True:
            reply = await self._call(request, max(0.1, end - time.monotonic()), idempotent=idempotent)
            assert isinstance(reply, VotersResponse)
            if reply.error is not VotersError.NOT_LEADER or time.monotonic() >= end:
                return reply
            self._preferred = (self._preferred + 1) % len(self._servers)
            await asyncio.sleep(0.05 * (0.5 + random.random()))

    async def _controller_call(
        self, request: ControllerRequest, deadline_s: float, *, idempotent: bool = False
    ) -> ControllerResponse:
        end = time.monotonic() + deadline_s
        backoff = 0.05
        while True:
            reply = await self._call(request, max(0.1, end - time.monotonic()), idempotent=idempotent)
            error = getattr(reply, "error", None)
            if error not in RETRYABLE or time.monotonic() >= end:
                return cast(ControllerResponse, reply)
            self._preferred = (self._preferred + 1) % len(self._servers)
            await asyncio.sleep(backoff * (0.5 + random.random()))
            backoff = min(backoff * 2, 0.1)  # failovers take ~1 s: retry often enough not to add to it

    async def _call(self, request: object, deadline_s: float, *, idempotent: bool) -> object:
        end = time.monotonic() + deadline_s
        last_error: Exception | None = None
        attempt = 0
        while time.monotonic() < end:
            index = (self._preferred + attempt) % len(self._servers)
            timeout = min(self._request_timeout_s, max(0.05, end - time.monotonic()))
            try:
                reply = await self._pool.request(bootstrap_peer_id(index), request, timeout)
            except NOT_SENT as error:  # refused, down, or between reconnects: certainly not sent
                last_error = error
                attempt += 1
                if attempt % len(self._servers) == 0:
                    await asyncio.sleep(0.05)
                continue
            except RpcError as error:
                # Next time start elsewhere: this server may be dead, and a dead connection can fail a
                # request at once, without the event loop ever running to notice it is gone.
                self._preferred = (index + 1) % len(self._servers)
                if not idempotent:
                    raise OutcomeUnknownError(
                        f"{type(request).__name__} sent to {self._servers[index]}, answer lost: {error}"
                    ) from error
                last_error = error
                attempt += 1
                continue
            self._preferred = index
            return reply
        raise ClusterUnavailableError(
            f"no server of {self._servers} answered {type(request).__name__} within {deadline_s:.1f} s"
            f" (last error: {last_error})"
        )

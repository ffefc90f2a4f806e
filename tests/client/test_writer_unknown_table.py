"""The writer against one real RPC server whose answers the test scripts (a peer that is not ours to
start: the answers a lagging server gives). A table the metadata knows but the active's image does not hold
yet is written again after a refresh; a table no server knows fails the write."""

from __future__ import annotations

import asyncio

import pytest

from hotstate.client.writer import TableWriter, WriteError
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.protocol.wire import MESSAGES
from hotstate.replica.messages import (
    PartitionMetadata,
    ProduceRequest,
    ProduceResponse,
    ReplicaError,
    ServerAddress,
    TableMetadataRequest,
    TableMetadataResponse,
)
from hotstate.rpc import PeerInfo, RpcServer

CLUSTER, SECRET = "writer-test", "a-secret-of-16-chars-or-more"


class Server:
    """Node 1, active of the table's one partition; answers Produce with `produce_errors` in turn, then
    NONE; answers TableMetadata with the table while `table_known`."""

    def __init__(self) -> None:
        self.produce_errors: list[ReplicaError] = []
        self.table_known = True
        self.produces = 0
        self.rpc = RpcServer("127.0.0.1", 0, CLUSTER, SECRET, 1, self.handle, MESSAGES)

    async def handle(self, peer: PeerInfo, message: object) -> object:
        if isinstance(message, TableMetadataRequest):
            if message.max_wait_ms:
                # A watch: nothing changes, so it is parked until the server closes.
                await asyncio.get_running_loop().create_future()
            if not self.table_known:
                return TableMetadataResponse(ReplicaError.UNKNOWN_TABLE, "no table 't'")
            return TableMetadataResponse(
                ReplicaError.NONE,
                "",
                7,
                (KeyColumn("k", KeyType.STRING),),
                None,
                (PartitionMetadata(0, 1, 3, (1,), (1,)),),
                (ServerAddress(1, "127.0.0.1", self.rpc.port, None, False),),
                10,
            )
        assert isinstance(message, ProduceRequest)
        self.produces += 1
        if self.produce_errors:
            error = self.produce_errors.pop(0)
            return ProduceResponse(error, f"{error.name} from the test", active=1, leader_epoch=3)
        return ProduceResponse(ReplicaError.NONE, "", 0, len(message.rows), 1, 3)


def test_an_unknown_table_at_the_active_is_written_again_while_the_metadata_holds_it() -> None:
    async def main() -> None:
        server = Server()
        await server.rpc.start()
        server.produce_errors = [ReplicaError.UNKNOWN_TABLE, ReplicaError.UNKNOWN_TABLE]
        try:
            async with TableWriter(
                [("127.0.0.1", server.rpc.port)], "t", cluster_id=CLUSTER, secret=SECRET
            ) as writer:
                result = await writer.upsert([{"k": "a", "v": 1}], deadline_s=10.0)
            assert result.rows == 1 and result.retries == 2 and server.produces == 3
        finally:
            await server.rpc.close()

    asyncio.run(main())


def test_a_table_no_server_knows_fails_the_write_with_unknown_table() -> None:
    async def main() -> None:
        server = Server()
        await server.rpc.start()
        try:
            async with TableWriter(
                [("127.0.0.1", server.rpc.port)], "t", cluster_id=CLUSTER, secret=SECRET
            ) as writer:
                await writer.metadata()
                server.table_known = False  # deleted meanwhile: the active and every image agree
                server.produce_errors = [ReplicaError.UNKNOWN_TABLE] * 100
                with pytest.raises(WriteError) as error:
                    await writer.upsert([{"k": "a", "v": 1}], deadline_s=30.0)
            assert error.value.error is ReplicaError.UNKNOWN_TABLE
            assert server.produces == 1  # not retried until the deadline
        finally:
            await server.rpc.close()

    asyncio.run(main())

"""How the writer groups Produce requests, against one real RPC server whose answers the test scripts (a
peer that is not ours to start: a server of an older version, one that answers each part differently).
One message per server carries every partition it leads; a server that does not know that message gets
one Produce per partition; a retriable error of one part is retried for that partition alone."""

from __future__ import annotations

import asyncio

from hotstate.client.writer import TableWriter
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.protocol.wire import MESSAGES
from hotstate.replica.messages import (
    PartitionMetadata,
    ProducePartitionsRequest,
    ProducePartitionsResponse,
    ProduceRequest,
    ProduceResponse,
    ReplicaError,
    ServerAddress,
    TableMetadataRequest,
    TableMetadataResponse,
)
from hotstate.rpc import PeerInfo, RpcServer
from hotstate.rpc.schema import TypeRegistry

CLUSTER, SECRET = "writer-test", "a-secret-of-16-chars-or-more"
PARTITIONS = 4


def _older_registry() -> TypeRegistry:
    """The messages of a server from before ProducePartitionsRequest."""
    registry = TypeRegistry("older")
    for type_id, cls in MESSAGES.registered().items():
        if type_id not in (174, 175, 176):
            version = 2 if type_id in (64, 162, 165, 168, 172) else 1  # as protocol/wire.py has them
            registry.register(type_id, cls, version=version)
    return registry


class Server:
    """Node 1, active of every partition of table 't'. `fail_once` partitions answer NOT_LEADER (naming
    this server, a newer epoch) the first time."""

    def __init__(self, registry: TypeRegistry = MESSAGES) -> None:
        self.fail_once: set[int] = set()
        self.requests: list[object] = []
        self.rpc = RpcServer("127.0.0.1", 0, CLUSTER, SECRET, 1, self.handle, registry)

    async def handle(self, peer: PeerInfo, message: object) -> object:
        if isinstance(message, TableMetadataRequest):
            if message.max_wait_ms:
                # A watch: nothing changes, so it is parked until the server closes.
                await asyncio.get_running_loop().create_future()
            return TableMetadataResponse(
                ReplicaError.NONE,
                "",
                7,
                (KeyColumn("k", KeyType.STRING),),
                None,
                tuple(PartitionMetadata(p, 1, 3, (1,), (1,)) for p in range(PARTITIONS)),
                (ServerAddress(1, "127.0.0.1", self.rpc.port, None, False),),
                10,
            )
        self.requests.append(message)
        if isinstance(message, ProduceRequest):
            return self._answer(message.partition, len(message.rows))
        assert isinstance(message, ProducePartitionsRequest)
        return ProducePartitionsResponse(tuple(self._answer(p.partition, len(p.rows)) for p in message.parts))

    def _answer(self, partition: int, rows: int) -> ProduceResponse:
        if partition in self.fail_once:
            self.fail_once.discard(partition)
            return ProduceResponse(ReplicaError.NOT_LEADER, "moved", active=1, leader_epoch=4)
        return ProduceResponse(ReplicaError.NONE, "", 0, rows, 1, 3)


async def _write(server: Server) -> TableWriter:
    await server.rpc.start()
    writer = TableWriter([("127.0.0.1", server.rpc.port)], "t", cluster_id=CLUSTER, secret=SECRET)
    result = await writer.upsert([{"k": f"key-{i}", "v": i} for i in range(100)], deadline_s=10.0)
    assert result.rows == 100
    await writer.close()
    await server.rpc.close()
    return writer


def test_every_partition_of_one_server_goes_in_one_message() -> None:
    server = Server()
    writer = asyncio.run(_write(server))
    (request,) = server.requests
    assert isinstance(request, ProducePartitionsRequest)
    assert sorted(p.partition for p in request.parts) == list(range(PARTITIONS))
    assert sum(len(p.rows) for p in request.parts) == 100
    assert (writer.stats.produce_messages, writer.stats.produce_requests) == (1, PARTITIONS)


def test_a_part_answered_with_an_error_is_retried_alone() -> None:
    server = Server()
    server.fail_once = {2}
    writer = asyncio.run(_write(server))
    first, retry = server.requests
    assert isinstance(first, ProducePartitionsRequest) and len(first.parts) == PARTITIONS
    # The hint named a newer epoch of the same server: the retry goes at once, for partition 2 only.
    assert isinstance(retry, ProduceRequest) and retry.partition == 2 and retry.leader_epoch == 4
    assert writer.stats.hints_used == 1


def test_a_server_that_does_not_know_the_message_gets_one_produce_per_partition() -> None:
    server = Server(_older_registry())
    writer = asyncio.run(_write(server))
    # The refused message never reached the handler; then one ProduceRequest per partition.
    assert all(isinstance(r, ProduceRequest) for r in server.requests)
    assert sorted(r.partition for r in server.requests if isinstance(r, ProduceRequest)) == list(
        range(PARTITIONS)
    )
    assert writer.stats.produce_messages == 1 + PARTITIONS

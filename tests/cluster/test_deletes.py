"""Deletes between real processes: a delete acknowledged by TableWriter is gone from every replica of its
partition (each server asked for its own replica's rows, as a coordinator forwards a partition), and a read
with the delete's consistency token, from any server, sees it gone. A tombstone that is not a key of the
table is refused naming it, writes nothing, and the server goes on taking writes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest

import hotstate
from hotstate.client.admin import CLIENT_NODE_ID
from hotstate.client.writer import Delete, TableWriter, WriteError
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError
from hotstate.protocol.keys import decode_key, encode_key, partition_for
from hotstate.protocol.rows import encode_tombstone
from hotstate.protocol.wire import MESSAGES
from hotstate.query.tokens import cluster_tag, decode
from hotstate.replica.messages import (
    PartitionQueryRequest,
    QueryPartitionsRequest,
    QueryPartitionsResponse,
    ReplicaError,
)
from hotstate.rpc import NOT_SENT, PeerPool, RpcError

KEY = (KeyColumn("k", KeyType.STRING),)
PARTITIONS = 2


def test_an_acknowledged_delete_is_gone_from_every_replica_and_from_token_reads(
    start_cluster: Callable[..., Any],
) -> None:
    running = start_cluster(3)
    cluster = running.cluster
    keys = [f"k{i}" for i in range(12)]
    deleted = {"k0", "k1", "k2", "k3", "k4"}

    async def write() -> tuple[str, int]:
        async with cluster.admin(request_timeout_s=2.0) as admin:
            # Two standbys: every server holds a replica of every partition.
            reply = await admin.create_table(
                "gone", partitions=PARTITIONS, standby_replicas=2, key_columns=KEY
            )
            assert reply.error is ControllerError.NONE, reply
        async with TableWriter(
            cluster.addresses(), "gone", cluster_id=cluster.cluster_id, secret=cluster.secret
        ) as writer:
            await writer.upsert([{"k": k, "v": 1} for k in keys])
            await writer.delete(["k0", ("k1",)])
            # Mixed, in order: k2 written again then deleted, k5 deleted then written again.
            await writer.write(
                [{"k": "k2", "v": 2}, Delete("k2"), Delete({"k": "k3"}), Delete("k5"), {"k": "k5", "v": 5}]
            )
            result = await writer.delete(["k4"])
            # A tombstone whose bytes are no STRING key: refused by the active, naming it; nothing written.
            bad = encode_key((7,))
            with pytest.raises(WriteError, match="delete 0 of gone: key column 'k' must be a str") as error:
                await writer.upsert_encoded({partition_for(bad, PARTITIONS): [encode_tombstone(bad)]})
            assert error.value.error is ReplicaError.INVALID_ROW
            healthy = await writer.write([{"k": "k6", "v": 6}])  # the server takes writes as before
            meta = await writer.metadata()
        return healthy.consistency_token or result.consistency_token, meta.table_id

    token, table_id = running.run(write())
    positions = decode(token, cluster_tag(cluster.cluster_id))
    expected = {k: 6 if k == "k6" else 5 if k == "k5" else 1 for k in keys if k not in deleted}

    async def replica_rows(node: int, partition: int, at_least: int) -> set[str]:
        """What `node`'s own replica of `partition` holds once it is at `at_least` (a partition query is
        answered from the local replica or refused, never forwarded)."""
        pool = PeerPool(CLIENT_NODE_ID, cluster.cluster_id, cluster.secret, MESSAGES)
        pool.update({node: cluster.addresses()[node - 1]})
        request = QueryPartitionsRequest(
            (PartitionQueryRequest("gone", partition, (), True, None, None, None, None, at_least),)
        )
        end = time.monotonic() + 20.0
        try:
            while True:
                try:
                    answer = await pool.request(node, request, 2.0)
                except (*NOT_SENT, RpcError):
                    answer = None
                if (
                    isinstance(answer, QueryPartitionsResponse)
                    and answer.answers[0].error is ReplicaError.NONE
                ):
                    return {str(decode_key(key)[0]) for key, _ in answer.answers[0].items}
                assert time.monotonic() < end, answer
                await asyncio.sleep(0.05)  # a standby still applying up to the token's position
        finally:
            await pool.close()

    for server in cluster.servers:
        for partition in range(PARTITIONS):
            at_least = positions.get((table_id, partition), 0)
            held = running.run(replica_rows(server.node_id, partition, at_least))
            mine = {k for k in expected if partition_for(encode_key((k,)), PARTITIONS) == partition}
            assert held == mine, (server.node_id, partition)

    for server in cluster.servers:
        client = hotstate.Client(f"127.0.0.1:{server.http_port}")
        answer = client.query("SELECT * FROM gone", consistency_token=token, timeout_ms=8000)
        assert {row["k"]: row["v"] for row in answer.dicts()} == expected, server.node_id
        for key in sorted(deleted):
            assert (
                client.query(f"SELECT * FROM gone WHERE k = '{key}'", consistency_token=token).dicts() == []
            )

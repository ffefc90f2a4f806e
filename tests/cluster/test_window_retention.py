"""Retention of a windowed table between real processes: the actives delete the windows that ended more
than the retention before the newest, and every replica drops them (tombstones through the log)."""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import Callable
from typing import Any

import hotstate
from hotstate.client.admin import CLIENT_NODE_ID
from hotstate.client.writer import TableWriter
from hotstate.controller.records import KeyColumn, KeyType, TableWindow
from hotstate.controller.requests import ControllerError
from hotstate.protocol.keys import decode_key
from hotstate.protocol.wire import MESSAGES
from hotstate.replica.messages import (
    PartitionQueryRequest,
    QueryPartitionsRequest,
    QueryPartitionsResponse,
    ReplicaError,
)
from hotstate.rpc import NOT_SENT, PeerPool, RpcError

KEY = (
    KeyColumn("user", KeyType.STRING),
    KeyColumn("WINDOWSTART", KeyType.WINDOW_START),
    KeyColumn("WINDOWEND", KeyType.WINDOW_END),
)
MINUTE = 60_000_000
T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)


def test_windows_past_the_retention_are_deleted_on_every_replica(start_cluster: Callable[..., Any]) -> None:
    running = start_cluster(3)
    cluster = running.cluster
    window = TableWindow("window", "TUMBLING", 5 * MINUTE, 5 * MINUTE, retention_us=10 * MINUTE)
    users = [f"u{i}" for i in range(6)]

    async def write() -> None:
        async with cluster.admin(request_timeout_s=2.0) as admin:
            reply = await admin.create_table(
                "w", partitions=2, standby_replicas=2, key_columns=KEY, window=window
            )
            assert reply.error is ControllerError.NONE, reply
        async with TableWriter(
            cluster.addresses(), "w", cluster_id=cluster.cluster_id, secret=cluster.secret
        ) as writer:
            await writer.upsert(
                [
                    {
                        "user": user,
                        "WINDOWSTART": T0 + dt.timedelta(minutes=m),
                        "WINDOWEND": T0 + dt.timedelta(minutes=m + 5),
                        "count": m,
                    }
                    for user in users
                    for m in range(0, 60, 5)
                ]
            )

    running.run(write())
    # Newest end 01:00, retention 10 minutes: the windows ending at 00:50, 00:55 and 01:00 stay.
    kept = {(user, m) for user in users for m in (45, 50, 55)}

    async def replica_windows(node: int, partition: int) -> set[tuple[str, int]]:
        """`node`'s own replica of `partition` (a partition query is never forwarded), once it holds no
        expired window, or as it is at the deadline."""
        pool = PeerPool(CLIENT_NODE_ID, cluster.cluster_id, cluster.secret, MESSAGES)
        pool.update({node: cluster.addresses()[node - 1]})
        request = QueryPartitionsRequest(
            (PartitionQueryRequest("w", partition, (), True, None, None, None, None),)
        )
        end = time.monotonic() + 20.0
        held: set[tuple[str, int]] = set()
        try:
            while time.monotonic() < end:
                try:
                    answer = await pool.request(node, request, 2.0)
                except (*NOT_SENT, RpcError):
                    answer = None
                if (
                    isinstance(answer, QueryPartitionsResponse)
                    and answer.answers[0].error is ReplicaError.NONE
                ):
                    held = set()
                    for key, _ in answer.answers[0].items:
                        user, start, _end = decode_key(key)
                        assert isinstance(user, str) and isinstance(start, dt.datetime)
                        held.add((user, int((start - T0.replace(tzinfo=None)).total_seconds()) // 60))
                    if held <= kept:
                        return held
                await asyncio.sleep(0.1)  # the actives sweep every half second
            return held
        finally:
            await pool.close()

    for server in cluster.servers:
        every = set().union(*(running.run(replica_windows(server.node_id, p)) for p in range(2)))
        assert every == kept, server.node_id
    with hotstate.Client(f"127.0.0.1:{cluster.servers[0].http_port}") as client:
        rows = client.query("SELECT user, WINDOWSTART FROM w WHERE user = 'u1'").dicts()
    assert [row["WINDOWSTART"][11:16] for row in rows] == ["00:45", "00:50", "00:55"]

"""Read-your-writes and monotonic reads with consistency tokens, between real processes: a writer's token
read back from every server, also right after a kill -9 of the partition's active."""

from __future__ import annotations

import time

import hotstate
from hotstate.client.writer import TableWriter
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError
from hotstate.protocol.keys import encode_key, partition_for

from .conftest import StartCluster


def test_a_writers_token_reads_its_write_back_from_every_server_and_after_a_kill(
    start_cluster: StartCluster,
) -> None:
    running = start_cluster(3)
    cluster = running.cluster
    key = "k-token"
    partition = partition_for(encode_key((key,)), 3)

    async def write(value: int) -> tuple[str, int]:
        async with cluster.admin(request_timeout_s=2.0) as admin:
            reply = await admin.create_table(
                "t", partitions=3, standby_replicas=1, key_columns=(KeyColumn("k", KeyType.STRING),)
            )
            assert reply.error in (ControllerError.NONE, ControllerError.TABLE_EXISTS), reply
        async with TableWriter(
            cluster.addresses(), "t", cluster_id=cluster.cluster_id, secret=cluster.secret
        ) as writer:
            result = await writer.upsert([{"k": key, "v": value}])
            meta = await writer.metadata(refresh=True)
        active = meta.partitions[partition].active
        assert active is not None
        return result.consistency_token, active

    def read_everywhere(token: str, expect: int, skip: int | None = None) -> str:
        last = token
        for server in cluster.servers:
            if server.node_id == skip:
                continue
            client = hotstate.Client(f"127.0.0.1:{server.http_port}")
            # max_lag=None: no staleness bound at all, so only the token can make the answer fresh. Right
            # after a kill, on a loaded machine, a server may judge a live peer down for a moment (a 503):
            # ask again; what matters is that no answer is older than the token.
            answer = None
            end = time.monotonic() + 20.0
            while answer is None:
                try:
                    answer = client.query(
                        f"SELECT * FROM t WHERE k = '{key}'", consistency_token=last, timeout_ms=8000
                    )
                except hotstate.Unavailable:
                    if time.monotonic() > end:
                        raise
                    time.sleep(0.1)
            assert answer.dicts() == [{"k": key, "v": expect}], (server.node_id, answer.raw)
            served = answer.partitions[0]
            assert served.position >= 1
            last = answer.consistency_token  # monotonic from here on
        return last

    token, active = running.run(write(1))
    assert token.startswith("hs1.")
    token = read_everywhere(token, 1)
    for value in range(2, 40):
        token, active = running.run(write(value))
    running.kill(active)
    # At once, before anyone has noticed much: the token holds the reads to the latest write.
    read_everywhere(token, 39, skip=active)

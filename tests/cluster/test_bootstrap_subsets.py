"""Every client works from any subset of the servers, in any order (a Kafka bootstrap list): the
addresses it is given are not node ids 1..N (issue 16 part 4)."""

from __future__ import annotations

from typing import TypedDict

import hotstate
from hotstate.client.admin import AdminClient
from hotstate.client.writer import TableWriter
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError
from hotstate.spark.api import parse_cluster

from .conftest import StartCluster

KEY = (KeyColumn("user", KeyType.STRING),)
ROWS = [{"user": f"u{i}", "clicks": i} for i in range(10)]


def test_admin_writer_and_query_clients_work_from_one_server_or_a_reversed_subset(
    start_cluster: StartCluster,
) -> None:
    running = start_cluster(3)
    cluster = running.cluster
    rpc = {s.node_id: ("127.0.0.1", s.rpc_port) for s in cluster.servers}
    # As `materialize(cluster=...)` gets it from the user: node 3 first, node 1 missing.
    reversed_subset = parse_cluster(f"127.0.0.1:{rpc[3][1]},127.0.0.1:{rpc[2][1]}")

    class Secrets(TypedDict):
        cluster_id: str
        secret: str

    async def go() -> None:
        secrets = Secrets(cluster_id=cluster.cluster_id, secret=cluster.secret)
        async with AdminClient([rpc[3]], **secrets) as only_third:
            status = await only_third.describe()
            assert status.node_id == 3 and len(status.servers) == 3, status
            created = await only_third.create_table(
                "clicks", partitions=4, standby_replicas=1, key_columns=KEY
            )
            assert created.error == ControllerError.NONE and created.table_id > 0, created
            assert (await only_third.list_tables()).tables == ("clicks",)
            (view,) = await only_third.describe_each()
            assert not isinstance(view, Exception) and view.node_id == 3, view

        async with AdminClient(reversed_subset, **secrets) as subset:
            assert (await subset.describe()).node_id in (2, 3)
            created = await subset.create_table("views", partitions=2, standby_replicas=1, key_columns=KEY)
            assert created.error == ControllerError.NONE, created
            assert sorted((await subset.list_tables()).tables) == ["clicks", "views"]
            views = await subset.describe_each()
            assert [v.node_id for v in views if not isinstance(v, Exception)] == [3, 2], views

        async with TableWriter([rpc[2]], "clicks", **secrets) as writer:
            result = await writer.upsert(ROWS)
            assert result.rows == len(ROWS), result

    running.run(go())
    http = {s.node_id: f"127.0.0.1:{s.http_port}" for s in cluster.servers}
    with hotstate.Client(http[3]) as client:
        rows = client.query("SELECT user, clicks FROM clicks", max_lag=0, standby_reads=False).rows
    assert sorted(rows) == sorted([r["user"], r["clicks"]] for r in ROWS)

"""`POST /v1/tables` and `DELETE /v1/tables/{name}` against real server processes (issue 16 part 3): any
server creates and drops (forwarding to the active controller), every mistake gets its ksqlDB-shaped
error, and the server goes on answering."""

from __future__ import annotations

import datetime as dt
import decimal

import httpx
import pyarrow as pa

import hotstate
from hotstate.cli.local_cluster import LocalCluster
from hotstate.client.writer import TableWriter
from hotstate.controller.records import ValueColumn
from hotstate.controller.requests import ControllerError

from .conftest import StartCluster, present


def _error(response: httpx.Response, status: int, code: int, *texts: str) -> None:
    assert response.status_code == status, (response.status_code, response.text)
    body = response.json()
    assert set(body) == {"@type", "error_code", "message"}, body
    assert body["error_code"] == code, body
    for text in texts:
        assert text in body["message"], body


def test_create_list_drop_and_every_refusal_over_http(start_cluster: StartCluster) -> None:
    running = start_cluster(3)
    cluster = running.cluster
    bases = [f"http://127.0.0.1:{s.http_port}" for s in cluster.servers]
    leader = running.run(_leader(cluster))
    # A server that is not the metadata leader: its create is forwarded.
    base = next(b for b, s in zip(bases, cluster.servers, strict=True) if s.node_id != leader)
    with httpx.Client(base_url=base, timeout=10.0) as http:
        made = http.post(
            "/v1/tables",
            json={
                "name": "clicks",
                "key_columns": [{"name": "user", "type": "STRING"}, {"name": "day", "type": "bigint"}],
                "partitions": 4,
                "standby_replicas": 1,
                "acceptable_lag": 50,
            },
        )
        assert made.status_code == 201, made.text
        described = made.json()
        assert described["name"] == "clicks" and described["partitions"] == 4
        assert described["key_columns"] == [
            {"name": "user", "type": "STRING"},
            {"name": "day", "type": "BIGINT"},
        ]
        assert described["acceptable_lag"] == 50 and described["standby_replicas"] == 1
        # Placed at once: every partition has an active and a standby on another server.
        assert [p["partition"] for p in described["placement"]] == [0, 1, 2, 3]
        for part in described["placement"]:
            assert part["active"] is not None and len(part["standbys"]) == 1
            assert part["active"] not in part["standbys"]
        # Defaults: 8 partitions, 1 standby.
        views = http.post(
            "/v1/tables", json={"name": "views", "key_columns": [{"name": "p", "type": "STRING"}]}
        )
        assert views.status_code == 201 and views.json()["partitions"] == 8, views.text

        # The same server lists both at once (the answer waited for its own image).
        listed = http.get("/v1/tables").json()["tables"]
        assert [t["name"] for t in listed] == ["clicks", "views"]
        assert listed[0] == described

        # Writable and queryable as a table made by the CLI or the sink.
        # Read with the write's token: a standby within the table's acceptable lag may not have the row yet.
        token = running.run(_write(cluster, [{"user": "u1", "day": 3, "clicks": 7}]))
        rows = http.post(
            "/v1/query",
            json={"sql": "SELECT * FROM clicks WHERE user = 'u1' AND day = 3", "consistency_token": token},
        )
        assert rows.status_code == 200 and rows.json()["rows"] == [["u1", 3, 7]], rows.text

        def create(**fields: object) -> httpx.Response:
            return http.post("/v1/tables", json=fields)

        key = [{"name": "k", "type": "STRING"}]
        _error(create(name="clicks", key_columns=key), 409, 40900, "'clicks' exists")
        _error(http.post("/v1/tables", content=b"{not json"), 400, 40000, "not JSON")
        _error(http.post("/v1/tables", json=["clicks"]), 400, 40000, "JSON object")
        _error(create(key_columns=[]), 400, 40000, "name: Field required")
        _error(
            create(name="t", key_columns=key, partitons=2),
            *(400, 40000, "unknown field 'partitons'", "partitions, standby_replicas"),
        )
        _error(create(name="t", key_columns=key, partitions="2"), 400, 40000, "partitions: Input should be")
        _error(create(name="t", key_columns=[{"name": "k", "type": "UUID"}]), 400, 40000, "'UUID'", "BIGINT")
        # Refused by the controller's own rules, with its message.
        _error(create(name="t", key_columns=key, partitions=0), 400, 40001, "partitions=0")
        _error(create(name="bad name", key_columns=key), 400, 40001, "table name 'bad name'")
        _error(create(name="t", key_columns=[]), 400, 40001, "at least one key column")
        _error(http.post("/v1/tables", content=b" " * 70_000), 413, 41300, "at most 65,536 bytes")
        _error(http.delete("/v1/tables/nosuch"), 404, 40400, "nosuch")

        dropped = http.delete("/v1/tables/views")
        assert dropped.status_code == 200 and dropped.json() == {"dropped": "views"}, dropped.text
        assert [t["name"] for t in http.get("/v1/tables").json()["tables"]] == ["clicks"]
        gone = http.post("/v1/query", json={"sql": "SELECT * FROM views"})
        assert gone.status_code == 404, gone.text
        # Every other server sees the same, and all still answer.
        for other in bases:
            assert [t["name"] for t in httpx.get(f"{other}/v1/tables").json()["tables"]] == ["clicks"]

        # OpenAPI documents the admin routes and the create body.
        spec = http.get("/openapi.json").json()
        assert {"get", "post"} <= set(spec["paths"]["/v1/tables"])
        assert "delete" in spec["paths"]["/v1/tables/{name}"]
        body = spec["paths"]["/v1/tables"]["post"]["requestBody"]["content"]["application/json"]["schema"]
        assert {"name", "key_columns", "partitions"} <= set(body["properties"])


async def _leader(cluster: LocalCluster) -> int:
    async with cluster.admin() as admin:
        status = await admin.describe()
    return present(status.leader_id)


async def _write(cluster: LocalCluster, rows: list[dict[str, object]], table: str = "clicks") -> str:
    """The rows written; their consistency token."""
    async with TableWriter(
        cluster.addresses(), table, cluster_id=cluster.cluster_id, secret=cluster.secret
    ) as writer:
        return (await writer.upsert(rows)).consistency_token


def test_a_query_answer_converts_to_arrow_and_pandas_with_the_tables_key_types(
    start_cluster: StartCluster,
) -> None:
    running = start_cluster(3)
    cluster = running.cluster
    servers = [f"127.0.0.1:{s.http_port}" for s in cluster.servers]
    key = [{"name": "at", "type": "TIMESTAMP"}, {"name": "blob", "type": "BYTES"}]
    made = httpx.post(
        f"http://{servers[0]}/v1/tables", json={"name": "events", "key_columns": key}, timeout=10
    )
    assert made.status_code == 201, made.text
    at = dt.datetime(2024, 3, 1, 12, 30, 15, 250_000)
    rows = [
        {
            "at": at + dt.timedelta(minutes=i),
            "blob": bytes([i, 255]),
            "count": i,
            "ratio": i / 4,
            "price": decimal.Decimal(f"{i}.25"),
            "day": dt.date(2024, 3, i + 1),
        }
        for i in range(5)
    ]
    running.run(_write(cluster, rows, table="events"))
    # As a Spark sink declares its DataFrame's schema: GET /v1/tables shows it, answers carry it.
    declared = tuple(
        ValueColumn(name, kind)
        for name, kind in (
            ("count", "bigint"),
            ("ratio", "double"),
            ("price", "decimal(10,2)"),
            ("day", "date"),
        )
    )
    running.run(_declare(cluster, "events", declared))
    listed = httpx.get(f"http://{servers[2]}/v1/tables", timeout=10).json()["tables"]
    assert listed[0]["value_columns"] == [{"name": c.name, "type": c.type} for c in declared]
    # ksqlDB's streaming endpoint names the declared types (and infers the undeclared blob's).
    stream = httpx.post(
        f"http://{servers[0]}/query-stream",
        json={"sql": "SELECT * FROM events"},
        headers={"Accept": "application/json"},
        timeout=10,
    )
    header = stream.json()[0]
    assert dict(zip(header["columnNames"], header["columnTypes"], strict=True)) == {
        "at": "TIMESTAMP",
        "blob": "BYTES",
        "count": "BIGINT",
        "ratio": "DOUBLE",
        "price": "DECIMAL(10, 2)",
        "day": "DATE",
    }, header
    with hotstate.Client(servers[1:]) as client:
        result = client.query("SELECT * FROM events")
    frame = result.to_pandas().sort_values("count")
    assert str(frame["at"].dtype) == "datetime64[us, UTC]" and str(frame["count"].dtype) == "int64"
    assert [t.to_pydatetime() for t in frame["at"]] == [
        (at + dt.timedelta(minutes=i)).replace(tzinfo=dt.UTC) for i in range(5)
    ]
    assert frame["blob"].tolist() == [r["blob"] for r in rows]
    assert frame["ratio"].tolist() == [r["ratio"] for r in rows]
    assert frame["price"].tolist() == [r["price"] for r in rows] and frame["day"].tolist() == [
        r["day"] for r in rows
    ]
    table = result.to_arrow()
    assert table.schema.field("blob").type == pa.binary() and table.num_rows == 5
    assert (
        table.schema.field("price").type == pa.decimal128(10, 2)
        and table.schema.field("day").type == pa.date32()
    )


async def _declare(cluster: LocalCluster, table: str, columns: tuple[ValueColumn, ...]) -> None:
    async with cluster.admin() as admin:
        reply = await admin.set_value_columns(table, columns)
    assert reply.error is ControllerError.NONE, reply

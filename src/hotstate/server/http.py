"""The HTTP API: ksqlDB-compatible (`POST /query`, `/info`, `/healthcheck`, `/clusterStatus`) and native
(`POST /v1/query`, `/v1/tables`, `/v1/lag`, `/metrics`), FastAPI on uvicorn in the server's event loop.

The caller's mistakes get a 4xx with a ksqlDB-shaped error (`@type`, `error_code`, `message`); 503 only
when no replica can serve; never a stack trace in a body.
"""

from __future__ import annotations

import base64
import contextlib
import datetime as dt
import decimal
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field

from hotstate import __version__
from hotstate.controller.image import MetadataImage
from hotstate.controller.records import KeyType
from hotstate.server.liveness import Liveness
from hotstate.server.metrics import Metrics
from hotstate.server.queries import QueryError, QueryResult, QueryService
from hotstate.server.raft_driver import monotonic_ms
from hotstate.server.replicas import ReplicaManager

log = logging.getLogger(__name__)

# ksqlDB's error codes (io.confluent.ksql.rest.Errors).
BAD_REQUEST = 40000
BAD_STATEMENT = 40001
NOT_FOUND = 40400
SERVER_ERROR = 50000
UNAVAILABLE = 50300

_KIND = {
    "bad_request": (400, "statement_error", BAD_STATEMENT),
    "not_found": (404, "statement_error", NOT_FOUND),
    "unavailable": (503, "generic_error", UNAVAILABLE),
    "timeout": (503, "generic_error", UNAVAILABLE),
}
_KEY_SQL_TYPES = {
    KeyType.STRING: "STRING",
    KeyType.INT: "BIGINT",
    KeyType.FLOAT: "DOUBLE",
    KeyType.BOOL: "BOOLEAN",
    KeyType.BYTES: "BYTES",
    KeyType.TIMESTAMP: "TIMESTAMP",
}


class KsqlRequest(BaseModel):
    ksql: str = Field(description="The pull query, e.g. SELECT * FROM t WHERE k = 'x';")
    streamsProperties: dict[str, Any] = Field(default_factory=dict)
    properties: dict[str, Any] = Field(default_factory=dict)


class NativeQuery(BaseModel):
    sql: str
    max_lag: int | None = Field(default=None, ge=0, description="staleness bound in records")
    timeout_ms: int | None = Field(default=None, ge=1)
    standby_reads: bool = Field(default=True, description="false: only actives serve (KLIP-12 off)")


@dataclass
class HttpContext:
    node_id: int
    cluster_id: str
    image: Callable[[], MetadataImage]
    queries: QueryService
    liveness: Liveness
    replicas: ReplicaManager | None
    metrics: Metrics
    leader_id: Callable[[], int | None]


def build_app(ctx: HttpContext) -> FastAPI:
    app = FastAPI(
        title="hotstate",
        version=__version__,
        description="Pull queries on tables materialized from PySpark; ksqlDB-compatible and native APIs.",
    )

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> JSONResponse:
        if any(e.get("type") == "json_invalid" for e in error.errors()):
            detail = next(e for e in error.errors() if e.get("type") == "json_invalid")
            where = detail.get("loc", ("body", "?"))[-1]
            reason = detail.get("ctx", {}).get("error", "invalid JSON")
            return _error(400, "generic_error", BAD_REQUEST, f"malformed JSON at position {where}: {reason}")
        if any(tuple(e.get("loc", ())) == ("body",) for e in error.errors()):
            return _error(
                400,
                "generic_error",
                BAD_REQUEST,
                'malformed request: the body must be a JSON object, e.g. {"ksql": "SELECT * FROM t;"}',
            )
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e.get('loc', ()) if p != 'body') or 'body'}: {e.get('msg')}"
            for e in error.errors()
        )
        return _error(400, "generic_error", BAD_REQUEST, f"malformed request: {problems}")

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> JSONResponse:
        log.exception("unexpected error answering %s", request.url.path)
        return _error(500, "generic_error", SERVER_ERROR, f"internal error: {type(error).__name__}")

    @app.post("/query", summary="ksqlDB-compatible pull query")
    async def ksql_query(body: KsqlRequest) -> Response:
        properties = {**body.properties, **body.streamsProperties}
        try:
            result = await _run(ctx, body.ksql, properties)
        except QueryError as error:
            return _query_error(error, body.ksql)
        header = {"header": {"queryId": result.query_id, "schema": _schema(result)}}
        rows = [{"row": {"columns": [_json(v) for v in row]}} for row in result.rows]
        return JSONResponse([header, *rows])

    @app.post("/v1/query", summary="Pull query with per-partition serving details")
    async def native_query(body: NativeQuery) -> Response:
        properties: dict[str, object] = {}
        if body.max_lag is not None:
            properties["max_lag"] = body.max_lag
        if body.timeout_ms is not None:
            properties["timeout_ms"] = body.timeout_ms
        properties["standby_reads"] = body.standby_reads
        try:
            result = await _run(ctx, body.sql, properties)
        except QueryError as error:
            return _query_error(error, body.sql)
        return JSONResponse(
            {
                "query_id": result.query_id,
                "table": result.table.name,
                "columns": result.columns,
                "rows": [[_json(v) for v in row] for row in result.rows],
                "partitions": [
                    {
                        "partition": p.partition,
                        "served_by": p.served_by,
                        "state": p.state,
                        "offset_lag": p.offset_lag,
                        "position": p.position,
                    }
                    for p in result.partitions
                ],
                "served_locally": ctx.node_id,
                "took_ms": round(result.took_ms, 3),
            }
        )

    @app.get("/v1/tables", summary="Tables, their keys and placement")
    async def tables() -> Response:
        image = ctx.image()
        out = []
        for table in sorted(image.tables.values(), key=lambda t: t.name):
            parts = image.partitions.get(table.table_id, ())
            out.append(
                {
                    "name": table.name,
                    "key_columns": [
                        {"name": c.name, "type": _KEY_SQL_TYPES[c.type]} for c in table.key_columns
                    ],
                    "partitions": table.partitions,
                    "standby_replicas": table.standby_replicas,
                    "acceptable_lag": table.acceptable_lag,
                    "writer_racks": list(table.writer_racks),
                    "placement": [
                        {
                            "partition": p.partition,
                            "active": p.active,
                            "standbys": list(p.standbys),
                            "warmups": list(p.warmups),
                            "isr": list(p.isr),
                            "leader_epoch": p.leader_epoch,
                        }
                        for p in parts
                    ],
                }
            )
        return JSONResponse({"tables": out})

    @app.get("/v1/lag", summary="The lags this server knows, per server and partition (KIP-535)")
    async def lags() -> Response:
        view = ctx.liveness.lags.snapshot()
        body = {
            str(node): {
                table: {
                    str(partition): {
                        "current_offset_position": lag.position,
                        "end_offset_position": lag.end,
                        "offset_lag": lag.offset_lag,
                        "state": lag.state,
                        "age_ms": monotonic_ms() - lag.reported_at_ms,
                    }
                    for partition, lag in partitions.items()
                }
                for table, partitions in tables.items()
            }
            for node, tables in view.items()
        }
        return JSONResponse({"server": ctx.node_id, "lags": body})

    @app.get("/info", summary="ksqlDB-compatible server info")
    async def info() -> Response:
        return JSONResponse(
            {
                "KsqlServerInfo": {
                    "version": __version__,
                    "kafkaClusterId": ctx.cluster_id,
                    "ksqlServiceId": f"hotstate-{ctx.cluster_id}",
                    "serverStatus": "RUNNING",
                    "serverId": ctx.node_id,
                }
            }
        )

    @app.get("/healthcheck", summary="ksqlDB-compatible health check")
    async def healthcheck() -> Response:
        metadata_ok = ctx.leader_id() is not None
        replicas_ok = ctx.replicas is not None
        healthy = metadata_ok
        body = {
            "isHealthy": healthy,
            "details": {
                "metastore": {"isHealthy": metadata_ok},
                "kafka": {"isHealthy": metadata_ok},
                "replicas": {"isHealthy": replicas_ok},
            },
            "ksqlServiceId": f"hotstate-{ctx.cluster_id}",
        }
        return JSONResponse(body, status_code=200 if healthy else 503)

    @app.get("/clusterStatus", summary="ksqlDB-compatible cluster status, as this server sees it")
    async def cluster_status() -> Response:
        return JSONResponse({"clusterStatus": _cluster_status(ctx)})

    @app.get("/metrics", summary="Prometheus metrics")
    async def metrics() -> Response:
        _refresh_gauges(ctx)
        return Response(ctx.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


async def _run(ctx: HttpContext, sql: str, properties: dict[str, object]) -> QueryResult:
    started = time.perf_counter()
    try:
        result = await ctx.queries.execute(sql, properties)
    except QueryError as error:
        ctx.metrics.queries.labels(error.kind).inc()
        ctx.metrics.failures.labels(error.kind).inc()
        raise
    finally:
        ctx.metrics.latency.observe(time.perf_counter() - started)
    ctx.metrics.queries.labels("ok").inc()
    return result


def _query_error(error: QueryError, statement: str) -> JSONResponse:
    status, kind, code = _KIND.get(error.kind, (400, "statement_error", BAD_STATEMENT))
    body = {
        "@type": kind,
        "error_code": code,
        "message": error.message,
        "statementText": statement,
        "entities": [],
    }
    return JSONResponse(body, status_code=status)


def _error(status: int, kind: str, code: int, message: str) -> JSONResponse:
    return JSONResponse({"@type": kind, "error_code": code, "message": message}, status_code=status)


def _schema(result: QueryResult) -> str:
    key_types = {c.name.lower(): _KEY_SQL_TYPES[c.type] for c in result.table.key_columns}
    parts = []
    for index, name in enumerate(result.columns):
        sql_type = key_types.get(name.lower())
        if sql_type is None:
            sql_type = next(
                (_sql_type(row[index]) for row in result.rows if row[index] is not None), "STRING"
            )
        suffix = " KEY" if name.lower() in key_types else ""
        parts.append(f"`{name}` {sql_type}{suffix}")
    return ", ".join(parts)


def _sql_type(value: object) -> str:
    if isinstance(value, bool):
        return "BOOLEAN"
    if isinstance(value, int):
        return "BIGINT"
    if isinstance(value, float):
        return "DOUBLE"
    if isinstance(value, dt.datetime):
        return "TIMESTAMP"
    if isinstance(value, dt.date):
        return "DATE"
    if isinstance(value, decimal.Decimal):
        return "DECIMAL"
    if isinstance(value, bytes):
        return "BYTES"
    if isinstance(value, list):
        return "ARRAY"
    if isinstance(value, dict):
        return "MAP"
    return "STRING"


def _json(value: object) -> object:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, list | tuple):
        return [_json(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _json(v) for k, v in value.items()}
    return str(value)


def _wall_ms(monotonic_value: int) -> int:
    return int(time.time() * 1000) - (monotonic_ms() - monotonic_value)


def _cluster_status(ctx: HttpContext) -> dict[str, object]:
    image = ctx.image()
    statuses = ctx.liveness.status.status()
    out: dict[str, object] = {}
    for node_id, server in sorted(image.servers.items()):
        address = f"{server.http.host}:{server.http.port}" if server.http else f"server-{node_id}"
        if node_id == ctx.node_id:
            alive, updated = True, monotonic_ms()
        else:
            status = statuses.get(node_id)
            alive = status.alive if status is not None else False
            updated = status.last_status_update_ms if status is not None else monotonic_ms()
        per_table: dict[str, object] = {}
        lags: dict[str, object] = {}
        for table in image.tables.values():
            parts = image.partitions.get(table.table_id, ())
            active = [p.partition for p in parts if p.active == node_id]
            standby = [p.partition for p in parts if node_id in p.replicas and p.active != node_id]
            if not active and not standby:
                continue
            per_table[table.name] = {
                "activeStores": [table.name] if active else [],
                "activePartitions": [{"topic": table.name, "partition": p} for p in active],
                "standByStores": [table.name] if standby else [],
                "standByPartitions": [{"topic": table.name, "partition": p} for p in standby],
            }
            by_partition = {}
            for partition in active + standby:
                lag = ctx.liveness.lags.lag(node_id, table.table_id, partition)
                if lag is not None:
                    by_partition[str(partition)] = {
                        "currentOffsetPosition": lag.position,
                        "endOffsetPosition": lag.end,
                        "offsetLag": lag.offset_lag,
                    }
            lags[table.name] = {"lagByPartition": by_partition, "size": len(by_partition)}
        out[address] = {
            "hostAlive": alive,
            "lastStatusUpdateMs": _wall_ms(updated),
            "serverId": node_id,
            "rack": server.rack,
            "activeStandbyPerQuery": per_table,
            "hostStoreLags": {"stateStoreLags": lags, "updateTimeMs": int(time.time() * 1000)},
        }
    return out


def _refresh_gauges(ctx: HttpContext) -> None:
    metrics = ctx.metrics
    metrics.replica_lag.clear()
    metrics.replica_position.clear()
    if ctx.replicas is not None:
        for info in ctx.replicas.lag_info():
            metrics.replica_lag.labels(info.table, str(info.partition), info.state).set(info.offset_lag)
            metrics.replica_position.labels(info.table, str(info.partition)).set(info.current_offset_position)
    metrics.peer_alive.clear()
    for peer, status in ctx.liveness.status.status().items():
        metrics.peer_alive.labels(str(peer)).set(1 if status.alive else 0)


class _QuietServer(uvicorn.Server):
    """uvicorn inside our process: the server, not uvicorn, owns SIGTERM (controlled shutdown)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def http_server(app: FastAPI, host: str, port: int) -> uvicorn.Server:
    config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False, lifespan="off")
    return _QuietServer(config)

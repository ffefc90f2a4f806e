"""The HTTP API: ksqlDB-compatible (`POST /query`, `/info`, `/healthcheck`, `/clusterStatus`) and native
(`POST /v1/query`, `/v1/tables`, `/v1/lag`, `/metrics`), FastAPI on uvicorn in the server's event loop,
with the two query endpoints answered in front of FastAPI (http/queries.py) for speed.

The caller's mistakes get a 4xx with a ksqlDB-shaped error (`@type`, `error_code`, `message`); 503 only
when no replica can serve, or while this server is starting (its metadata image has not caught up since
it started, server/metadata.py: error_code 50302, "server N is starting: ...", so a client asks another
server instead of being told a table does not exist); never a stack trace in a body.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass

import uvicorn
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response

from hotstate import __version__
from hotstate.controller.image import MetadataImage
from hotstate.server.console.http import ConsoleContext, console_router
from hotstate.server.coordinator import Coordinator
from hotstate.server.feeds import FeedHub
from hotstate.server.http.auth import HttpAuth
from hotstate.server.http.changes import ChangeEndpoints
from hotstate.server.http.direct_lane import limited_protocol
from hotstate.server.http.endpoints import EVENTS_ENDPOINTS, POST_ENDPOINTS, QueryRoutes
from hotstate.server.http.limits import HttpLimits
from hotstate.server.http.metrics import Metrics
from hotstate.server.http.openapi import documented_body
from hotstate.server.http.queries import (
    DELIMITED,
    Answer,
    BadRequest,
    Endpoint,
    QueryEndpoints,
    answer_request,
    internal_error,
)
from hotstate.server.http.servers import add_server_routes
from hotstate.server.http.tables import Controller, TableContext, add_table_routes
from hotstate.server.http.voters import Voters, add_voter_routes
from hotstate.server.liveness import Liveness
from hotstate.server.raft_driver import monotonic_ms
from hotstate.server.replicas import ReplicaManager

log = logging.getLogger(__name__)


@dataclass
class HttpContext:
    node_id: int
    cluster_id: str
    image: Callable[[], MetadataImage]
    queries: Coordinator
    liveness: Liveness
    replicas: ReplicaManager | None
    metrics: Metrics
    leader_id: Callable[[], int | None]
    # Why this server cannot answer yet (metadata not caught up since it started); None once it can.
    not_ready: Callable[[], str | None]
    # Hands a table create or drop to the active controller (http/tables.py).
    controller: Controller
    console: ConsoleContext | None = None  # the console's page and JSON (server/console/http.py)
    feeds: FeedHub | None = None  # push queries (server/feeds.py); None: refused
    auth: HttpAuth | None = None  # who may ask what (server/http/auth.py); None: anyone
    # The standbys of a table created over HTTP without a count (num.standby.replicas).
    default_standby_replicas: int = 1
    voters: Voters | None = None  # quorum membership (server/http/voters.py)


def build_app(ctx: HttpContext) -> QueryRoutes:
    changes = None
    if ctx.feeds is not None:
        changes = ChangeEndpoints(
            ctx.feeds, on_error=lambda error: ctx.metrics.failures.labels(error.kind).inc()
        )
    endpoints = QueryEndpoints(ctx.node_id, ctx.queries, ctx.metrics, changes)
    app = FastAPI(
        title="hotstate",
        version=__version__,
        description="Pull queries on tables materialized from PySpark; ksqlDB-compatible and native APIs.",
    )

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, error: RequestValidationError) -> Response:
        # A query parameter FastAPI checked (e.g. /v1/events?limit=): the API's error shape, not FastAPI's.
        problems = "; ".join(
            f"{'.'.join(str(part) for part in item['loc'])}: {item['msg']}" for item in error.errors()
        )
        return _json_response(BadRequest(problems or "invalid request").refusal())

    @app.exception_handler(Exception)
    async def _unexpected(request: Request, error: Exception) -> Response:
        log.exception("unexpected error answering %s", request.url.path)
        return _json_response(internal_error(error))

    def _route(endpoint: Endpoint) -> Callable[[Request], Awaitable[Response]]:
        async def answer(request: Request) -> Response:
            answer = await answer_request(endpoint, request.receive)
            return _json_response(
                answer or BadRequest("the body never arrived: the client went away").refusal()
            )

        return answer

    # Reached only where QueryRoutes does not answer first (it always does for these paths); here so that
    # OpenAPI documents them.
    for spec in POST_ENDPOINTS:
        app.add_api_route(
            spec.path,
            _route(spec.plain(endpoints)),
            methods=["POST"],
            summary=spec.summary,
            openapi_extra=documented_body(spec.body),
        )

    async def _events_route(table: str) -> Response:  # QueryRoutes answers these first
        return _json_response(internal_error(RuntimeError("an event stream reached FastAPI")))

    for events in EVENTS_ENDPOINTS:
        app.add_api_route(events.path, _events_route, methods=["GET"], summary=events.summary)

    table_context = TableContext(
        ctx.image,
        ctx.not_ready,
        ctx.controller,
        ctx.liveness.lags,
        ctx.liveness.alive,
        default_standby_replicas=ctx.default_standby_replicas,
    )
    add_table_routes(app, table_context)
    add_server_routes(app, table_context)

    if ctx.voters is not None:
        add_voter_routes(app, ctx.voters)

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
                    "serverStatus": "RUNNING" if ctx.not_ready() is None else "STARTING",
                    "serverId": ctx.node_id,
                }
            }
        )

    @app.get(
        "/healthcheck",
        summary="ksqlDB-compatible health check; 503 without a metadata leader or while starting",
    )
    async def healthcheck() -> Response:
        metadata_ok = ctx.leader_id() is not None
        replicas_ok = ctx.replicas is not None
        not_ready = ctx.not_ready()
        caught_up = not_ready is None
        healthy = metadata_ok and caught_up
        body: dict[str, object] = {
            "isHealthy": healthy,
            "details": {
                "metastore": {"isHealthy": metadata_ok},
                "kafka": {"isHealthy": metadata_ok},
                "replicas": {"isHealthy": replicas_ok},
                # The image holds this process's registration: queries and writes are answered.
                "metadataCaughtUp": {"isHealthy": caught_up},
            },
            "ksqlServiceId": f"hotstate-{ctx.cluster_id}",
        }
        if not_ready is not None:
            body["message"] = not_ready
        return JSONResponse(body, status_code=200 if healthy else 503)

    @app.get("/clusterStatus", summary="ksqlDB-compatible cluster status, as this server sees it")
    async def cluster_status() -> Response:
        return JSONResponse({"clusterStatus": _cluster_status(ctx)})

    @app.get("/metrics", summary="Prometheus metrics")
    async def metrics() -> Response:
        _refresh_gauges(ctx)
        return Response(ctx.metrics.render(), media_type="text/plain; version=0.0.4; charset=utf-8")

    if ctx.console is not None:
        app.include_router(console_router(ctx.console))
    return QueryRoutes(endpoints, app, ctx.auth)


def _json_response(answer: Answer) -> Response:
    status, payload = answer
    if not isinstance(payload, bytes | list):  # a stream: QueryRoutes always answers those first
        payload.close()
        return _json_response(internal_error(RuntimeError("a stream reached FastAPI")))
    if isinstance(payload, list):  # delimited lines (QueryRoutes sends them one by one)
        return Response(b"".join(payload), status_code=status, media_type=DELIMITED)
    return Response(payload, status_code=status, media_type="application/json")


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
            # Being removed: its replicas are moving away (docs/operations.md).
            "draining": server.draining,
            "activeStandbyPerQuery": per_table,
            "hostStoreLags": {"stateStoreLags": lags, "updateTimeMs": int(time.time() * 1000)},
        }
    return out


def _refresh_gauges(ctx: HttpContext) -> None:
    metrics = ctx.metrics
    if ctx.feeds is not None:
        metrics.push_subscriptions.set(len(ctx.feeds))
    metrics.scans_running.set(ctx.queries.reads.scans)
    copies = ctx.queries.reads.column_caches
    metrics.column_copies.set(0 if copies is None else len(copies))
    metrics.column_copy_bytes.set(0 if copies is None else copies.nbytes)
    metrics.replica_lag.clear()
    metrics.replica_position.clear()
    if ctx.replicas is not None:
        metrics.expired_rows.set(ctx.replicas.expired_rows)
        for info in ctx.replicas.lag_info():
            metrics.replica_lag.labels(info.table, str(info.partition), info.state).set(info.offset_lag)
            metrics.replica_position.labels(info.table, str(info.partition)).set(info.current_offset_position)
    metrics.peer_alive.clear()
    for peer, status in ctx.liveness.status.status().items():
        metrics.peer_alive.labels(str(peer)).set(1 if status.alive else 0)


DEFAULT_LIMITS = HttpLimits()


class _QuietServer(uvicorn.Server):
    """uvicorn inside our process: the server, not uvicorn, owns SIGTERM (controlled shutdown)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


def http_server(
    app: QueryRoutes,
    host: str,
    port: int,
    tls: ssl.SSLContext | None = None,
    limits: HttpLimits = DEFAULT_LIMITS,
    metrics: Metrics | None = None,
) -> uvicorn.Server:
    """`tls` (tls.server_context): HTTPS only; a plain-HTTP request is dropped by the TLS layer. `limits`:
    http/limits.py; `metrics` counts the connections refused over the cap."""
    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        ssl_context_factory=None if tls is None else lambda _config, _default: tls,
        http=limited_protocol(limits, metrics.connections_refused if metrics is not None else None, app),
        timeout_keep_alive=limits.idle_timeout_s,  # type: ignore[arg-type]  # seconds; a float works
        proxy_headers=False,  # no proxy is trusted; the middleware would cost every request
        server_header=False,
        log_level="warning",
        access_log=False,
        lifespan="off",
    )
    return _QuietServer(config)

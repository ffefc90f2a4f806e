"""The console: `GET /ui` (a page shipped in the package, server/console/) and the JSON it reads besides
`/v1/tables` and `/v1/lag`: `/v1/cluster` (servers, racks, fencing, heartbeat status, controller leader),
`/v1/events` (recent events, server/console/events.py), `/v1/rates` (this server's query and write rates) and
`/v1/cluster/rates` (every server's, gathered by this one). docs/console.md describes them.

The page is plain HTML, CSS and JavaScript, no build step and nothing fetched from elsewhere; its
Content-Security-Policy allows scripts, styles and requests from this server only.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.resources
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

from fastapi import APIRouter, Query
from fastapi.responses import Response
from pydantic import BaseModel, Field

from hotstate.controller.image import MetadataImage, ServerInfo
from hotstate.server.console.feed import ConsoleFeed, Rates, wall_ms
from hotstate.server.copy_counts import CountsCache
from hotstate.server.liveness import Liveness
from hotstate.server.raft_driver import monotonic_ms
from hotstate.tls import describe_tls_error

if TYPE_CHECKING:
    import httpx

# A peer slower than this to say its rates is shown without them, not waited for.
PEER_RATES_TIMEOUT_S = 1.0
MAX_EVENTS = 500
ASSETS = {
    "console.js": "text/javascript; charset=utf-8",
    "console.css": "text/css; charset=utf-8",
    "icon.svg": "image/svg+xml",
}
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Cache-Control": "no-cache",
}


class ServerView(BaseModel):
    node_id: int
    rack: str | None
    roles: list[str]
    state: Literal["up", "fenced", "down"] = Field(
        description="down: no heartbeats reach the answering server; fenced: heard from but fenced by the "
        "controller (it serves nothing); up: neither"
    )
    alive: bool = Field(description="heartbeat status as the answering server sees it (itself: true)")
    fenced: bool
    draining: bool = Field(
        default=False, description="being removed (hotstate server remove): its replicas move to others"
    )
    status_since_ms: int = Field(description="wall time (Unix ms) when `alive` last changed")
    controller_leader: bool
    rpc: str
    http: str | None
    actives: int
    standbys: int
    warmups: int


class ClusterView(BaseModel):
    server: int = Field(description="the server that answered")
    cluster_id: str
    ready: bool = Field(description="false while the answering server's metadata has not caught up")
    controller_leader: int | None
    controller_epoch: int
    metadata_offset: int
    time_ms: int = Field(description="the answering server's wall clock (Unix ms)")
    servers: list[ServerView]


class EventView(BaseModel):
    seq: int
    time_ms: int = Field(description="wall time (Unix ms) when the answering server saw it")
    metadata_offset: int | None
    kind: str
    message: str
    table: str | None
    servers: list[int]
    partitions: list[int]


class EventsView(BaseModel):
    server: int
    latest_seq: int = Field(description="ask again with after=latest_seq for what comes next")
    events: list[EventView] = Field(description="oldest first")


class RatesView(BaseModel):
    server: int
    queries_per_s: float | None = Field(description="pull queries received over HTTP (null: no rate yet)")
    rows_written_per_s: float | None = Field(description="records appended to this server's actives")
    tables: dict[str, float] = Field(description="rows_written_per_s by table")
    window_s: float
    error: str | None = Field(default=None, description="why the rates are missing (cluster rates only)")


class ClusterRatesView(BaseModel):
    server: int
    rates: list[RatesView]


@dataclass
class ConsoleContext:
    node_id: int
    cluster_id: str
    feed: ConsoleFeed
    image: Callable[[], MetadataImage]
    liveness: Liveness
    # (leader id, epoch) of the metadata quorum as this server knows it
    quorum: Callable[[], tuple[int | None, int]]
    not_ready: Callable[[], str | None]
    # With http.tls.*: other servers' HTTP API is called over HTTPS, their certificates checked with this.
    peer_tls: ssl.SSLContext | None = None
    # Sent with every call to another server's /v1/rates: the cluster's own credentials when HTTP
    # authentication is on (server/http/auth.py), never a user's.
    peer_headers: dict[str, str] = field(default_factory=dict)


def console_router(ctx: ConsoleContext) -> APIRouter:
    router = APIRouter()
    assets = {name: _asset(name) for name in ASSETS}
    page = _asset("index.html")
    peers = _PeerRates(ctx)
    # The page asks every second; the placement changes rarely.
    counts = CountsCache()

    @router.get("/ui", include_in_schema=False)
    async def ui() -> Response:
        return Response(page, media_type="text/html; charset=utf-8", headers=PAGE_HEADERS)

    @router.get("/ui/{name}", include_in_schema=False)
    async def ui_asset(name: str) -> Response:
        if name not in assets:
            return Response(b"no such file\n", status_code=404, media_type="text/plain")
        return Response(assets[name], media_type=ASSETS[name], headers=PAGE_HEADERS)

    @router.get(
        "/v1/cluster",
        response_model=ClusterView,
        summary="Servers (rack, fencing, heartbeat status, partitions) and the controller leader",
    )
    async def cluster() -> ClusterView:
        return cluster_view(ctx, counts)

    @router.get("/v1/events", response_model=EventsView, summary="Recent cluster events this server saw")
    async def events(
        after: int = Query(0, ge=0, description="only events numbered above this"),
        limit: int = Query(100, ge=1, le=MAX_EVENTS, description="at most this many (the newest)"),
    ) -> EventsView:
        log = ctx.feed.events
        return EventsView(
            server=ctx.node_id,
            latest_seq=log.latest_seq,
            events=[
                EventView(
                    seq=e.seq,
                    time_ms=e.time_ms,
                    metadata_offset=e.metadata_offset,
                    kind=e.kind,
                    message=e.message,
                    table=e.table,
                    servers=list(e.servers),
                    partitions=list(e.partitions),
                )
                for e in log.after(after, limit)
            ],
        )

    @router.get("/v1/rates", response_model=RatesView, summary="This server's query and write rates")
    async def rates() -> RatesView:
        return _rates_view(ctx.node_id, ctx.feed.rates())

    @router.get(
        "/v1/cluster/rates",
        response_model=ClusterRatesView,
        summary="Every server's query and write rates, gathered by this one",
    )
    async def cluster_rates() -> ClusterRatesView:
        return ClusterRatesView(server=ctx.node_id, rates=await peers.gather())

    return router


def cluster_view(ctx: ConsoleContext, counts: CountsCache) -> ClusterView:
    image = ctx.image()
    leader, epoch = ctx.quorum()
    statuses = ctx.liveness.status.status()
    copies = counts.now(image)
    now_wall = wall_ms()
    now_mono = monotonic_ms()
    servers = []
    for node_id, server in sorted(image.servers.items()):
        status = statuses.get(node_id)
        if node_id == ctx.node_id:
            alive, since = True, now_wall
        elif status is None:
            alive, since = False, now_wall
        else:
            alive, since = status.alive, now_wall - (now_mono - status.last_status_update_ms)
        state: Literal["up", "fenced", "down"] = "down" if not alive else "fenced" if server.fenced else "up"
        servers.append(
            ServerView(
                node_id=node_id,
                rack=server.rack,
                roles=list(server.roles),
                state=state,
                alive=alive,
                fenced=server.fenced,
                draining=server.draining,
                status_since_ms=since,
                controller_leader=node_id == leader,
                rpc=f"{server.rpc.host}:{server.rpc.port}",
                http=f"{server.http.host}:{server.http.port}" if server.http else None,
                actives=copies.actives[node_id],
                standbys=copies.standbys[node_id],
                warmups=copies.warmups[node_id],
            )
        )
    return ClusterView(
        server=ctx.node_id,
        cluster_id=ctx.cluster_id,
        ready=ctx.not_ready() is None,
        controller_leader=leader,
        controller_epoch=epoch,
        metadata_offset=image.offset,
        time_ms=now_wall,
        servers=servers,
    )


def _rates_view(node_id: int, rates: Rates, error: str | None = None) -> RatesView:
    return RatesView(
        server=node_id,
        queries_per_s=rates.queries_per_s,
        rows_written_per_s=rates.rows_written_per_s,
        tables=rates.tables,
        window_s=rates.window_s,
        error=error,
    )


class _PeerRates:
    """Asks every other server for its `/v1/rates` at once; one HTTP client for the server's life."""

    def __init__(self, ctx: ConsoleContext) -> None:
        self._ctx = ctx
        self._client: httpx.AsyncClient | None = None

    async def gather(self) -> list[RatesView]:
        ctx = self._ctx
        if self._client is None:
            # Imported here, off the event loop: with rich it is ~85 ms of CPU, which every server's start
            # paid for a request that most never get.
            httpx = await asyncio.to_thread(importlib.import_module, "httpx")
            verify: ssl.SSLContext | bool = ctx.peer_tls if ctx.peer_tls is not None else True
            self._client = httpx.AsyncClient(
                timeout=PEER_RATES_TIMEOUT_S, trust_env=False, verify=verify, headers=ctx.peer_headers
            )
        image = ctx.image()
        asks = [
            self._ask(node_id, server)
            for node_id, server in sorted(image.servers.items())
            if node_id != ctx.node_id
        ]
        peers = await asyncio.gather(*asks)
        own = _rates_view(ctx.node_id, ctx.feed.rates())
        return sorted([own, *peers], key=lambda r: r.server)

    async def _ask(self, node_id: int, server: ServerInfo) -> RatesView:
        if server.http is None:
            return _missing(node_id, "no HTTP listener")
        if not self._ctx.liveness.alive(node_id):
            return _missing(node_id, "down: no heartbeats from it")
        host = server.http.host
        if host in ("0.0.0.0", "::", ""):  # listening everywhere: reach it where its RPC is
            host = server.rpc.host
        scheme = "https" if self._ctx.peer_tls is not None else "http"
        url = f"{scheme}://{_bracketed(host)}:{server.http.port}/v1/rates"
        assert self._client is not None
        import httpx  # imported by gather already

        try:
            answer = await self._client.get(url)
            answer.raise_for_status()
            view = RatesView.model_validate(answer.json())
        except (httpx.HTTPError, ValueError) as error:
            described = describe_tls_error(error, url)
            return _missing(node_id, (described or f"{type(error).__name__}: {error}")[:200])
        if view.server != node_id:
            return _missing(node_id, f"{url} answered as server {view.server}")
        return view


def _missing(node_id: int, error: str) -> RatesView:
    return RatesView(
        server=node_id, queries_per_s=None, rows_written_per_s=None, tables={}, window_s=0, error=error
    )


def _bracketed(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def _asset(name: str) -> bytes:
    return (importlib.resources.files("hotstate.server.console") / name).read_bytes()

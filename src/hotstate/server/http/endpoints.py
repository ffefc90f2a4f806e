"""The query endpoints, once: the one table every door of the HTTP API reads.

A pull query reaches a server through four doors: the direct HTTP/1.1 lane (http/direct_lane.py), the ASGI
routes in front of FastAPI (`QueryRoutes`, below), HTTP/2 (http/http2.py, which runs those same ASGI routes)
and the FastAPI routes, kept so that OpenAPI documents the endpoints (api.py). Each builds what it needs
from `ENDPOINTS`, so a new endpoint is one entry here and one method of `QueryEndpoints`.

The request models are for the OpenAPI schema only: http/queries.py reads the bodies itself, for speed
and for ksqlDB-shaped errors.
"""

from __future__ import annotations

import logging
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field

from hotstate.query.execute import MAX_LAG_LIMIT, MAX_TIMEOUT_MS
from hotstate.server.http.asgi import ASGIApp, Receive, Scope, Send
from hotstate.server.http.queries import (
    MAX_ACCEPT_VALUES,
    QUERY_PRODUCES,
    STREAM_PRODUCES,
    Answer,
    Endpoint,
    NegotiatedEndpoint,
    QueryEndpoints,
    answer_request,
    internal_error,
    negotiate,
    send_json,
    send_lines,
)

log = logging.getLogger(__name__)


# The ASGI scope extension through which a stream may abort its connection (limits.py sets it).
ABORT_EXTENSION = "hotstate.abort"


def aborter(scope: Mapping[str, Any]) -> Callable[[], None] | None:
    """What aborts the request's connection (without flushing what is buffered for it), if known."""
    found = scope.get("extensions", {}).get(ABORT_EXTENSION)
    return found if callable(found) else None


async def send_answer(
    send: Send, receive: Receive, answer: Answer, abort: Callable[[], None] | None = None
) -> None:
    """An answer as ASGI messages: one JSON body, the delimited lines, or a stream (a push query's feed;
    `abort`: what drops its connection at once, for a client that reads nothing)."""
    payload = answer[1]
    if isinstance(payload, bytes):
        await send_json(send, answer[0], payload)
    elif isinstance(payload, list):
        await send_lines(send, payload)
    else:
        try:
            await payload.run(send, receive, abort)
        finally:
            payload.close()


class KsqlRequest(BaseModel):
    """What `POST /query` takes."""

    model_config = ConfigDict(extra="forbid")
    ksql: str = Field(description="The pull query, e.g. SELECT * FROM t WHERE k = 'x';")
    streamsProperties: dict[str, Any] = Field(
        default_factory=dict,
        description="max_lag / ksql.query.pull.max.allowed.offset.lag, standby_reads / "
        "ksql.query.pull.enable.standby.reads, timeout_ms, hedging, consistency_token; any other name is "
        "refused",
    )
    properties: dict[str, Any] = Field(default_factory=dict, description="the same as streamsProperties")
    sessionVariables: dict[str, Any] = Field(default_factory=dict, description="must be empty")
    commandSequenceNumber: int | None = Field(default=None, description="accepted and ignored")


class StreamRequest(BaseModel):
    """What `POST /query-stream` takes."""

    model_config = ConfigDict(extra="forbid")
    sql: str = Field(description="The pull query, e.g. SELECT * FROM t WHERE k = 'x';")
    properties: dict[str, Any] = Field(default_factory=dict, description="as /query's streamsProperties")
    streamsProperties: dict[str, Any] = Field(default_factory=dict, description="the same as properties")
    sessionVariables: dict[str, Any] = Field(default_factory=dict, description="must be empty")


class ChangesRequest(BaseModel):
    """What `POST /v1/changes` takes."""

    model_config = ConfigDict(extra="forbid")
    sql: str = Field(description="The push query, e.g. SELECT * FROM t WHERE k = 'x' EMIT CHANGES")
    from_token: str | None = Field(
        default=None, description="resume after these positions (a token the feed gave), per partition"
    )
    snapshot: bool | None = Field(
        default=None, description="without from_token: start with the current rows (default true)"
    )


class CloseQuery(BaseModel):
    """What `POST /close-query` takes."""

    model_config = ConfigDict(extra="forbid")
    queryId: str


class NativeQuery(BaseModel):
    """What `POST /v1/query` takes."""

    model_config = ConfigDict(extra="forbid")
    sql: str
    max_lag: int | None = Field(
        default=None, ge=0, le=MAX_LAG_LIMIT, description="staleness bound in records"
    )
    timeout_ms: int | None = Field(default=None, ge=1, le=MAX_TIMEOUT_MS)
    standby_reads: bool = Field(default=True, description="false: only actives serve (KLIP-12 off)")
    hedging: bool = Field(
        default=True, description="false: never send a slow forward's partitions to their next replica too"
    )
    consistency_token: str | None = Field(
        default=None,
        description="a token from an earlier answer or write: every partition is read from at least there",
    )
    min_batch: int | None = Field(
        default=None, ge=0, description="everything this Spark batch of the table's sink wrote is visible"
    )


@dataclass(frozen=True, slots=True)
class PostEndpoint:
    """A `POST` endpoint that takes a JSON body and answers from `QueryEndpoints`.

    `answer` picks the `QueryEndpoints` method, which takes the answer's media type as well when
    `produces` lists the types it can answer in (ksqlDB's content negotiation by the Accept header, the
    first when there is none). `direct`: the HTTP/1.1 lane may answer it itself, when its answer is one
    JSON body."""

    path: str
    summary: str
    body: type[BaseModel]
    answer: Callable[[QueryEndpoints], Endpoint] | None = None
    negotiated: Callable[[QueryEndpoints], NegotiatedEndpoint] | None = None
    produces: tuple[str, ...] = ()
    direct: bool = False

    def plain(self, endpoints: QueryEndpoints) -> Endpoint:
        """The endpoint answering in its first format whatever the Accept header says (FastAPI's door)."""
        if self.answer is not None:
            return self.answer(endpoints)
        assert self.negotiated is not None
        negotiated, media = self.negotiated(endpoints), self.produces[0]
        return lambda body: negotiated(body, media)


@dataclass(frozen=True, slots=True)
class EventsEndpoint:
    """A `GET` endpoint streaming Server-Sent Events, its one path parameter between `prefix` and `suffix`."""

    path: str
    summary: str
    prefix: str
    suffix: str

    def parameter(self, path: str) -> str | None:
        """The path parameter of `path` when it is this endpoint's, else None."""
        if path.startswith(self.prefix) and path.endswith(self.suffix):
            inner = path[len(self.prefix) : len(path) - len(self.suffix)]
            if inner and "/" not in inner:
                return urllib.parse.unquote(inner)
        return None


ENDPOINTS: tuple[PostEndpoint | EventsEndpoint, ...] = (
    PostEndpoint(
        "/query",
        "ksqlDB-compatible pull query",
        KsqlRequest,
        negotiated=lambda endpoints: endpoints.ksql,
        produces=QUERY_PRODUCES,
        direct=True,
    ),
    PostEndpoint(
        "/query-stream",
        "ksqlDB's streaming API for pull queries (HTTP/1.1 or HTTP/2); delimited or JSON by Accept",
        StreamRequest,
        negotiated=lambda endpoints: endpoints.stream,
        produces=STREAM_PRODUCES,
    ),
    PostEndpoint(
        "/close-query",
        "ksqlDB's close-query: a pull query is complete when answered (400, no such query)",
        CloseQuery,
        lambda endpoints: endpoints.close_query,
    ),
    PostEndpoint(
        "/v1/query",
        "Pull query with per-partition serving details",
        NativeQuery,
        lambda endpoints: endpoints.native,
        direct=True,
    ),
    PostEndpoint(
        "/v1/changes",
        "Push query (EMIT CHANGES): the feed as newline-delimited JSON events, resumable from a token",
        ChangesRequest,
        lambda endpoints: endpoints.changes,
    ),
    EventsEndpoint(
        "/v1/tables/{table}/changes",
        "A table's changes as Server-Sent Events (?where=, ?from=<token>, ?snapshot=; Last-Event-ID resumes)",
        "/v1/tables/",
        "/changes",
    ),
)
POST_ENDPOINTS = tuple(e for e in ENDPOINTS if isinstance(e, PostEndpoint))
EVENTS_ENDPOINTS = tuple(e for e in ENDPOINTS if isinstance(e, EventsEndpoint))


class Guard(Protocol):
    async def admit(self, scope: Scope, send: Send) -> bool: ...

    def admitted_now(self, method: str, path: str, headers: Iterable[tuple[bytes, bytes]]) -> str | None: ...


class QueryRoutes:
    """ASGI: the `ENDPOINTS` answered by `QueryEndpoints`, everything else by `app`; every request first
    passes `guard` when there is one (http/auth.py). The direct lane asks `direct` which it may answer."""

    def __init__(
        self,
        endpoints: QueryEndpoints,
        app: ASGIApp,
        guard: Guard | None = None,
        table: Iterable[PostEndpoint | EventsEndpoint] = ENDPOINTS,
    ) -> None:
        self._app = app
        self._guard = guard
        self._endpoints = endpoints
        everything = tuple(table)
        self._events = tuple(e for e in everything if isinstance(e, EventsEndpoint))
        posts = tuple(e for e in everything if isinstance(e, PostEndpoint))
        self._routes: dict[str, Endpoint] = {
            e.path: e.answer(endpoints) for e in posts if e.answer is not None
        }
        # Content-negotiated endpoints: what they produce, the first without an Accept header.
        self._negotiated: dict[str, tuple[NegotiatedEndpoint, tuple[str, ...]]] = {
            e.path: (e.negotiated(endpoints), e.produces) for e in posts if e.negotiated is not None
        }
        # The paths whose answers the HTTP/1.1 protocol may write itself, by their raw bytes.
        self._direct_paths = {e.path.encode(): e.path for e in posts if e.direct}
        # (path, Accept header) -> the endpoint bound to its answer's format, and whether that format is
        # one JSON body: a client sends the same Accept with every request, so it is read once (bounded:
        # a client may send anything).
        self._by_accept: dict[tuple[str, bytes | None], tuple[Endpoint, bool]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self._guard is not None and scope["type"] == "http" and not await self._guard.admit(scope, send):
            return
        if scope["type"] == "http" and scope["method"] == "POST":
            path = scope["path"]
            endpoint = self._routes.get(path)
            if endpoint is None and path in self._negotiated:
                endpoint = self._negotiated_endpoint(path, scope["headers"])[0]
            if endpoint is not None:
                try:
                    answer = await answer_request(endpoint, receive)
                except Exception as error:  # never a stack trace in a body
                    log.exception("unexpected error answering %s", path)
                    answer = internal_error(error)
                if answer is None:  # the client has gone
                    return
                await send_answer(send, receive, answer, aborter(scope))
                return
        if scope["type"] == "http" and scope["method"] == "GET" and self._events:
            path = scope["path"]
            for events in self._events:
                table = events.parameter(path)
                if table is not None:
                    opened = self._endpoints.changes_sse(table, scope["query_string"], scope["headers"])
                    answer = opened if isinstance(opened, tuple) else await opened
                    await send_answer(send, receive, answer, aborter(scope))
                    return
        await self._app(scope, receive, send)

    def direct(self, url: bytes, headers: list[tuple[bytes, bytes]]) -> tuple[Endpoint, str] | None:
        """For a POST to `url`: the endpoint and the user to run it as, when the HTTP/1.1 protocol may
        answer it itself, without ASGI (http/direct_lane.py): a query endpoint whose answer is one JSON body,
        and a request the guard admits without a wait. None: the request goes the ASGI way, as any other.
        The answer is the same either way; the direct way skips uvicorn's per-request work (a task, the
        scope, the ASGI messages), a fifth of a local lookup's CPU."""
        path = self._direct_paths.get(url)
        if path is None:
            return None
        user = ""
        if self._guard is not None:
            admitted = self._guard.admitted_now("POST", path, headers)
            if admitted is None:
                return None
            user = admitted
        endpoint = self._routes.get(path)
        if endpoint is not None:
            return endpoint, user
        endpoint, one_body = self._negotiated_endpoint(path, headers)
        return (endpoint, user) if one_body else None

    def _negotiated_endpoint(
        self, path: str, headers: Iterable[tuple[bytes, bytes]]
    ) -> tuple[Endpoint, bool]:
        accept = next((value for name, value in headers if name == b"accept"), None)
        found = self._by_accept.get((path, accept))
        if found is None:
            if len(self._by_accept) >= MAX_ACCEPT_VALUES:
                self._by_accept.clear()
            found = self._by_accept[path, accept] = negotiate(accept, *self._negotiated[path])
        return found

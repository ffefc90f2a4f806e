"""Pull queries over the HTTP API, from Python: `Client` (blocking) and `AsyncClient` (asyncio).

Any server answers any query (it routes each partition to a live replica), so a client only needs a list
of addresses to try. Each call goes to the last server that answered and moves on, round robin, when a
server cannot be reached or does not answer in time; every address is tried at most once per call, all
within the call's deadline. The caller's mistakes (4xx) are raised at once: another server would refuse
the same request. A 503 (no replica of some partition can serve) is tried on the other servers, since
each one judges liveness for itself, and raised once every server was asked. A server that has just
(re)started answers 503 with error code 50302 (SERVER_NOT_READY: its metadata has not caught up, so it
cannot yet tell whether a table exists) and the next server is asked; when no server could answer and
some said they are starting (a whole cluster restarting), they are all asked again after a short pause,
until the call's deadline. With `routing=True`, a lookup of one partition is first sent straight to a
server holding it (client/routing.py), and takes this walk if that fails.

    import hotstate

    with hotstate.Client(["127.0.0.1:8088", "127.0.0.1:8089"]) as client:
        result = client.query("SELECT * FROM clicks WHERE user = 'u1'", max_lag=100)
        for row in result.dicts():
            print(row["user"], row["clicks"])
        for p in result.partitions:
            print(p.partition, p.served_by, p.state, p.offset_lag)

    async with hotstate.AsyncClient("127.0.0.1:8088") as client:
        result = await client.query("SELECT * FROM clicks")
"""

from __future__ import annotations

import asyncio
import base64
import json
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import TYPE_CHECKING, Any, Final, Generic, TypeAlias, TypeVar

import httpx

from hotstate.client.subscribe import AsyncSubscription, FeedState, Subscription
from hotstate.protocol.http_api import DEFAULT_QUERY_TIMEOUT_MS, SERVER_NOT_READY
from hotstate.protocol.replica_state import ReplicaState, as_replica_state
from hotstate.tls import TlsOption, describe_tls_error, to_client_context

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

    from hotstate.client.routing import KeyRouter, Lookup, Routing, Send

__all__ = [
    "AsyncClient",
    "Client",
    "ClusterUnreachable",
    "PartitionServed",
    "QueryFailed",
    "QueryResult",
    "Unavailable",
    "parse_address",
]

# A server answers a query within its timeout_ms; the slack covers the HTTP exchange around it, so a
# slow-but-working server is not abandoned just before it answers.
ANSWER_SLACK_S = 2.0
# Status calls do no routing; a server that takes longer than this is treated as unreachable.
STATUS_TIMEOUT_S = 5.0
# When every server was unreachable or starting, the next round begins after about this long.
NOT_READY_PAUSE_S = 0.2

Servers: TypeAlias = str | Sequence[str]
T = TypeVar("T")


class QueryFailed(Exception):
    """The server refused the request (`status` 4xx, or 5xx when every server failed it); `error_code`
    and `message` are the server's ksqlDB-style error (`error_code` is `status * 100` when the body had
    none, as ksqlDB does)."""

    def __init__(self, status: int, error_code: int, message: str, *, server: str | None = None) -> None:
        super().__init__(f"{message} (HTTP {status}, error {error_code})")
        self.status = status
        self.error_code = error_code
        self.message = message
        self.server = server


class Unavailable(QueryFailed):
    """Every server answered 503: some partition has no live replica within the staleness bound."""


class ClusterUnreachable(Exception):
    """No server could be reached (or none answered in time)."""

    def __init__(self, servers: Sequence[str], last_error: BaseException | None) -> None:
        reason = f"{type(last_error).__name__}: {last_error}" if last_error is not None else "no time left"
        super().__init__(f"no hotstate server reachable at {', '.join(servers)} (last error: {reason})")
        self.servers = list(servers)
        self.last_error = last_error


@dataclass(frozen=True, slots=True)
class PartitionServed:
    """Which replica served one partition of a query, and how fresh it was."""

    partition: int
    served_by: int
    state: ReplicaState
    offset_lag: int
    position: int


@dataclass(frozen=True, slots=True)
class QueryResult:
    columns: list[str]
    rows: list[list[Any]]
    partitions: list[PartitionServed]
    query_id: str
    took_ms: float
    server: str
    """The address (as given to the client) of the server that answered."""
    table: str = ""
    coordinator: int | None = None
    """The node id of the server that planned the query and gathered its partitions."""
    raw: dict[str, Any] = field(default_factory=dict, repr=False, compare=False)
    """The /v1/query body as the server sent it."""
    consistency_token: str = ""
    """Where this answer read (and the token it was given): pass it to the next query for monotonic reads."""
    cursor: str | None = None
    """Set when the query's LIMIT cut the rows short: pass it as `after` to read the rows that follow."""
    key_columns: dict[str, str] = field(default_factory=dict)
    """The table's key columns and their SQL types (STRING, BIGINT, DOUBLE, BOOLEAN, BYTES, TIMESTAMP)."""
    value_columns: dict[str, str] = field(default_factory=dict)
    """The value columns' types as the table's writer declared them (Spark's names, e.g. bigint,
    timestamp, decimal(10,2), array<string>); empty when none did (a table not written by Spark)."""

    def dicts(self) -> list[dict[str, Any]]:
        """The rows as {column: value} maps."""
        return [dict(zip(self.columns, row, strict=True)) for row in self.rows]

    def to_arrow(self) -> pa.Table:
        """The rows as a pyarrow Table (needs pyarrow: `pip install 'hotstate[spark]'` brings it).

        Key columns have the table's key types, and value columns the types the table's writer declared
        (a Spark sink declares its DataFrame's): bytes are decoded from base64, timestamps and dates
        parsed, decimals read exactly, as the JSON answer cannot say what they were. Undeclared columns,
        and nested ones (arrays, maps, structs), are typed from their values as JSON gives them, where
        "NaN" and the infinities in a column of numbers become floats again; a column with no value but
        null is of Arrow's null type."""
        from hotstate.client.frames import arrow_table

        return arrow_table(self.columns, self.rows, self.key_columns | self.value_columns)

    def to_pandas(self) -> pd.DataFrame:
        """The rows as a pandas DataFrame (needs pandas and pyarrow), typed as `to_arrow` types them."""
        return self.to_arrow().to_pandas()

    @staticmethod
    def from_json(body: dict[str, Any], server: str) -> QueryResult:
        return QueryResult(
            columns=list(body["columns"]),
            rows=[list(row) for row in body["rows"]],
            partitions=[
                PartitionServed(
                    int(p["partition"]),
                    int(p["served_by"]),
                    as_replica_state(str(p["state"])),
                    int(p["offset_lag"]),
                    int(p["position"]),
                )
                for p in body.get("partitions", ())
            ],
            query_id=str(body["query_id"]),
            took_ms=float(body.get("took_ms", 0.0)),
            server=server,
            table=str(body.get("table", "")),
            coordinator=body.get("served_locally"),
            raw=body,
            consistency_token=str(body.get("consistency_token", "")),
            key_columns={str(c["name"]): str(c["type"]) for c in body.get("key_columns", ())},
            value_columns={str(c["name"]): str(c["type"]) for c in body.get("value_columns", ())},
            cursor=body.get("cursor"),
        )


def parse_address(address: str, scheme: str = "http") -> str:
    """`host:port` (reached with `scheme`) or a full http(s) URL -> the base URL requests are made against."""
    text = address.strip()
    if "://" not in text:
        host, sep, port = text.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise ValueError(f"server address {address!r}: must be HOST:PORT or http(s)://HOST[:PORT]")
        text = f"{scheme}://{text}"
    try:
        url = httpx.URL(text)
    except httpx.InvalidURL as error:
        raise ValueError(f"server address {address!r}: {error}") from error
    if url.scheme not in ("http", "https") or not url.host:
        raise ValueError(f"server address {address!r}: must be HOST:PORT or http(s)://HOST[:PORT]")
    return str(url).rstrip("/")


def _addresses(servers: Servers) -> list[str]:
    # A single string may hold a comma-separated list, as an environment variable would.
    items = servers.split(",") if isinstance(servers, str) else list(servers)
    items = [s.strip() for s in items if s.strip()]
    if not items:
        raise ValueError("no server addresses given")
    return items


@dataclass(frozen=True, slots=True)
class _Request(Generic[T]):
    """One call, without IO: what to send, how long one attempt may take, and what the answer becomes."""

    method: str
    path: str
    attempt_s: float
    body: object | None
    result: Callable[[Any, str], T]
    """(decoded body, address of the server that answered) -> the call's result; raises if malformed."""


@dataclass(frozen=True, slots=True)
class _Attempt:
    """Send the request to `url` after sleeping `pause` seconds, waiting at most `timeout`."""

    index: int
    url: str
    timeout: httpx.Timeout
    pause: float


class _Call(Generic[T]):
    """One call's walk over the servers (sans-IO, shared by both clients): which server to try next with
    how long an attempt may take, and what each outcome means. The clients only send and sleep."""

    def __init__(
        self,
        request: _Request[T],
        servers: list[str],
        urls: list[str],
        start: int,
        deadline: float,
        connect_timeout_s: float,
    ) -> None:
        self.request = request
        self.servers = servers
        self.urls = urls
        self.start = start
        self.order = self._round()
        self.deadline = deadline
        self.attempt_s = request.attempt_s
        self.connect_timeout_s = connect_timeout_s
        self.last_error: BaseException | None = None
        self.last_failure: QueryFailed | None = None
        # This round: some server said it is starting, and none gave any other 5xx.
        self.starting = False
        self.other_failure = False

    def _round(self) -> list[int]:
        return [(self.start + i) % len(self.servers) for i in range(len(self.servers))]

    def next(self) -> _Attempt | None:
        """The next attempt, or None: give up (then raise `give_up()`)."""
        pause = 0.0
        if not self.order and self.starting and not self.other_failure:
            # Servers were starting and none could answer: another round once they may have caught up.
            self.order = self._round()
            self.starting = False
            pause = NOT_READY_PAUSE_S * (0.5 + random.random())
        remaining = self.deadline - time.monotonic() - pause
        if not self.order or remaining <= 0:
            return None
        index = self.order.pop(0)
        timeout = min(self.attempt_s, remaining)
        return _Attempt(
            index,
            self.urls[index] + self.request.path,
            httpx.Timeout(timeout, connect=min(self.connect_timeout_s, timeout)),
            pause,
        )

    def unreachable(self, attempt: _Attempt, error: httpx.TransportError) -> None:
        self.last_error = unreachable_hint(error, self.urls[attempt.index])

    def answered(self, attempt: _Attempt, response: httpx.Response) -> T | None:
        """The call's result on success; None to move on to the next server; raises a 4xx."""
        server = self.servers[attempt.index]
        if response.status_code < 300:
            try:
                decoded = response.json()
            except ValueError as error:  # not a hotstate server, or a proxy's page
                self.last_error = error
                return None
            return self.request.result(decoded, server)
        failure = query_failure(response, server)
        if response.status_code < 500:
            raise failure
        if failure.status == 503 and failure.error_code == SERVER_NOT_READY:
            self.starting = True
            if self.last_failure is not None and self.last_failure.error_code != SERVER_NOT_READY:
                return None  # a real failure says more than a server that is starting
        else:
            self.other_failure = True
        self.last_failure = failure
        return None

    def give_up(self) -> Exception:
        # A server that answered 5xx says more about the cluster than one that could not be reached.
        if self.last_failure is not None:
            return self.last_failure
        return ClusterUnreachable(self.servers, self.last_error)


def query_failure(response: httpx.Response, server: str) -> QueryFailed:
    """The error a server's refusal of a query (status >= 300) raises: Unavailable for a 503. Public for
    client/subscribe.py, whose feeds are refused the same way."""
    status = response.status_code
    try:
        body = response.json()
    except ValueError:
        body = None
    if isinstance(body, dict) and "message" in body:
        message = str(body["message"])
        code = body.get("error_code")
        error_code = code if isinstance(code, int) else status * 100
    else:
        message = response.text.strip()[:500] or response.reason_phrase or f"HTTP {status}"
        error_code = status * 100
    kind = Unavailable if status == 503 else QueryFailed
    return kind(status, error_code, message, server=server)


def _query_body(
    sql: str,
    max_lag: int | None,
    timeout_ms: int | None,
    standby_reads: bool,
    hedging: bool,
    consistency_token: str | None,
    min_batch: int | None = None,
    partitions: Sequence[int] | None = None,
    after: str | None = None,
) -> dict[str, object]:
    body: dict[str, object] = {"sql": sql, "standby_reads": standby_reads}
    if partitions is not None:
        body["partitions"] = list(partitions)
    if after is not None:
        body["after"] = after
    if not hedging:
        body["hedging"] = False
    if consistency_token:
        body["consistency_token"] = consistency_token
    if min_batch is not None:
        body["min_batch"] = min_batch
    if max_lag is not None:
        body["max_lag"] = max_lag
    if timeout_ms is not None:
        body["timeout_ms"] = timeout_ms
    return body


def _query_attempt_s(timeout_ms: int | None) -> float:
    return (timeout_ms if timeout_ms is not None else DEFAULT_QUERY_TIMEOUT_MS) / 1000 + ANSWER_SLACK_S


def _expect_dict(body: Any, what: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise QueryFailed(200, 20000, f"unexpected {what} answer: {json.dumps(body)[:200]}")
    return body


def _query_request(
    sql: str,
    max_lag: int | None,
    timeout_ms: int | None,
    standby_reads: bool,
    hedging: bool,
    consistency_token: str | None,
    min_batch: int | None,
    partitions: Sequence[int] | None,
    after: str | None,
) -> _Request[QueryResult]:
    body = _query_body(
        sql, max_lag, timeout_ms, standby_reads, hedging, consistency_token, min_batch, partitions, after
    )
    return _Request(
        "POST",
        "/v1/query",
        _query_attempt_s(timeout_ms),
        body,
        lambda decoded, server: QueryResult.from_json(_expect_dict(decoded, "query"), server),
    )


def _tables(decoded: Any, server: str) -> list[dict[str, Any]]:
    return list(_expect_dict(decoded, "tables")["tables"])


def _cluster_status(decoded: Any, server: str) -> dict[str, Any]:
    return dict(_expect_dict(decoded, "clusterStatus")["clusterStatus"])


def _lags(decoded: Any, server: str) -> dict[str, Any]:
    return _expect_dict(decoded, "lag")


_TABLES: Final = _Request("GET", "/v1/tables", STATUS_TIMEOUT_S, None, _tables)
_CLUSTER_STATUS: Final = _Request("GET", "/clusterStatus", STATUS_TIMEOUT_S, None, _cluster_status)
_LAGS: Final = _Request("GET", "/v1/lag", STATUS_TIMEOUT_S, None, _lags)


def _lookup(step: Lookup) -> _Request[Any]:
    """A routing lookup, sent the usual way (any server answers it)."""
    return _Request("GET", step.path, STATUS_TIMEOUT_S, None, lambda decoded, server: decoded)


def unreachable_hint(error: httpx.TransportError, url: str) -> httpx.TransportError:
    """`error`, or one that says what went wrong with TLS, naming the server."""
    described = describe_tls_error(error, httpx.URL(url).netloc.decode())
    if described is not None:
        return httpx.ConnectError(described)
    if isinstance(error, httpx.RemoteProtocolError | httpx.ReadError) and url.startswith("http://"):
        # A TLS port drops a plain-HTTP request without an answer: closed, or reset when the TLS layer
        # closed the socket before reading all the request (which one is a matter of timing).
        hint = f"{error} (if the server's HTTP API uses TLS, use https:// addresses and give the CA)"
        return type(error)(hint)
    return error


def _headers(auth: tuple[str, str] | None, token: str | None) -> dict[str, str]:
    """Every request's headers: the credentials go in once, not through an httpx auth flow per request."""
    headers = {"user-agent": "hotstate-python"}
    if auth is not None and token is not None:
        raise ValueError("give auth=(user, password) or token=, not both")
    if auth is not None:
        user, password = auth
        if ":" in user:
            raise ValueError("a user name cannot contain ':' (HTTP Basic separates it from the password so)")
        headers["authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    elif token is not None:
        headers["authorization"] = f"Bearer {token}"
    return headers


class _Base:
    def __init__(
        self, servers: Servers, timeout_s: float, connect_timeout_s: float, tls: TlsOption, routing: bool
    ) -> None:
        self.servers = _addresses(servers)
        self._tls = to_client_context(tls)
        scheme = "http" if self._tls is None else "https"
        self._scheme = scheme
        self._router: KeyRouter | None = None
        self._holder_urls: dict[str, str] = {}  # a holder's advertised host:port -> its base URL
        if routing:
            # Imported only when asked for: the planner brings sqlglot (about a second to import).
            from hotstate.client.routing import KeyRouter

            self._router = KeyRouter()
        self._urls = [parse_address(s, scheme) for s in self.servers]
        if self._tls is not None and any(url.startswith("http://") for url in self._urls):
            raise ValueError("tls is given, so the server addresses must be HOST:PORT or https:// URLs")
        if timeout_s <= 0 or connect_timeout_s <= 0:
            raise ValueError("timeouts must be positive")
        self.timeout_s = timeout_s
        self.connect_timeout_s = connect_timeout_s
        self._preferred = 0  # the last server that answered

    @property
    def last_server(self) -> str:
        """The address of the server the next call tries first (the last one that answered)."""
        return self.servers[self._preferred]

    def _routing(self, request: _Request[QueryResult]) -> Routing | None:
        if self._router is None or not isinstance(request.body, dict):
            return None
        return self._router.start(request.body)

    def _send(self, step: Send, request: _Request[QueryResult]) -> tuple[str, httpx.Timeout] | None:
        """Where and how long to send a routed query; None if the holder's address is not one to use."""
        base = self._holder_urls.get(step.http)
        if base is None:
            try:
                base = self._holder_urls[step.http] = parse_address(step.http, self._scheme)
            except ValueError:
                return None
        timeout = httpx.Timeout(request.attempt_s, connect=min(self.connect_timeout_s, request.attempt_s))
        return base + request.path, timeout

    @staticmethod
    def _routed_answer(routing: Routing, step: Send, response: httpx.Response) -> QueryResult | None:
        """A holder's answer as the query's result; None (any failure: the query then goes the usual
        way, which words the error if there is one) forgets the holder's partition."""
        if response.status_code >= 300:
            routing.failed()
            return None
        try:
            result = QueryResult.from_json(_expect_dict(response.json(), "query"), step.http)
        except (ValueError, KeyError, TypeError, QueryFailed):
            routing.failed()
            return None
        routing.served(result.coordinator, {p.partition: p.served_by for p in result.partitions})
        return result

    def _call(self, request: _Request[T]) -> _Call[T]:
        # One full attempt always fits, even when a query's own timeout is longer than timeout_s.
        deadline = time.monotonic() + max(self.timeout_s, min(request.attempt_s, 3600.0))
        return _Call(request, self.servers, self._urls, self._preferred, deadline, self.connect_timeout_s)


class Client(_Base):
    """A blocking client of a hotstate cluster: pull queries and status, with failover between servers.

    `servers`: one address or several (`"host:port"` or `"http://host:port"`), or one comma-separated
    string. `timeout_s` bounds each call over all its attempts; `connect_timeout_s` bounds connecting to
    one server. Connections are kept alive and reused; `close()` (or `with`) releases them.
    `tls`: the servers' HTTP API uses TLS (http.tls.*): the CA certificate file to trust, or an
    ssl.SSLContext; `host:port` addresses are then reached over https, and host names are checked.
    With HTTP authentication on (docs/security.md), `auth=(user, password)` sends HTTP Basic, `token=` a
    bearer token; a refusal raises QueryFailed (401 or 403).
    `routing=True`: a query that reads one partition (a key lookup, or an IN list within one partition) is
    sent straight to a server holding that partition (the live active, else the freshest standby within
    the bound), learned from GET /v1/tables and /v1/tables/{table}/keys and cached (client/routing.py),
    so it is served without a forward hop; any other query, and any failure of the routed attempt, takes
    the usual walk over `servers`, so a stale map costs at most one extra hop. Off by default: the client
    then talks to servers it was not given, at the HTTP addresses they advertise, which a client behind NAT,
    a load balancer or a network namespace may not reach (each such attempt costs up to
    `connect_timeout_s` before its fallback), and a caller that names the server to ask (to test or
    measure it) keeps that; it also imports the query planner (sqlglot, about a second, once).
    """

    def __init__(
        self,
        servers: Servers,
        *,
        timeout_s: float = 30.0,
        connect_timeout_s: float = 2.0,
        transport: httpx.BaseTransport | None = None,
        tls: TlsOption = None,
        auth: tuple[str, str] | None = None,
        token: str | None = None,
        routing: bool = False,
    ) -> None:
        super().__init__(servers, timeout_s, connect_timeout_s, tls, routing)
        self._http = httpx.Client(
            transport=transport,
            headers=_headers(auth, token),
            verify=self._tls if self._tls is not None else True,
        )

    def query(
        self,
        sql: str,
        *,
        max_lag: int | None = None,
        timeout_ms: int | None = None,
        standby_reads: bool = True,
        hedging: bool = True,
        consistency_token: str | None = None,
        min_batch: int | None = None,
        partitions: Sequence[int] | None = None,
        after: str | None = None,
    ) -> QueryResult:
        """Run one pull query. `max_lag`: the most records a serving replica may be behind (default: the
        table's acceptable lag); `timeout_ms`: the server's time budget; `standby_reads=False`: only
        actives serve; `hedging=False`: a slow forward is never sent to a partition's next replica too;
        `consistency_token` (from an earlier answer or `TableWriter.upsert`): every partition is read from
        a replica at least that far (monotonic reads, read-your-writes; docs/queries.md); `min_batch`:
        everything the table's Spark sink wrote up to that micro-batch id is visible. `partitions`: read
        only these partitions of the table; `after`: only keys after the `cursor` of an earlier answer
        whose LIMIT cut it short (a table read in pages: same SQL, next `after`, until `cursor` is None).
        Raises QueryFailed (4xx), Unavailable (503 from every server), ClusterUnreachable."""
        return self._query(
            _query_request(
                sql,
                max_lag,
                timeout_ms,
                standby_reads,
                hedging,
                consistency_token,
                min_batch,
                partitions,
                after,
            )
        )

    def tables(self) -> list[dict[str, Any]]:
        """Every table with its key columns and placement (GET /v1/tables)."""
        return self._run(_TABLES)

    def cluster_status(self) -> dict[str, Any]:
        """Per server address: liveness as the answering server sees it, its partitions and their lags
        (GET /clusterStatus, ksqlDB's shape)."""
        return self._run(_CLUSTER_STATUS)

    def lags(self) -> dict[str, Any]:
        """The lags the answering server knows, per server, table and partition (GET /v1/lag):
        {"server": node id, "lags": {node: {table: {partition: {...}}}}}."""
        return self._run(_LAGS)

    def _query(self, request: _Request[QueryResult]) -> QueryResult:
        """With routing on, a lookup of one partition goes to a holder first (client/routing.py)."""
        routing = self._routing(request)
        while routing is not None and (step := routing.next(time.monotonic())) is not None:
            if step.kind != "send":
                try:
                    answer = self._run(_lookup(step))
                except (QueryFailed, ClusterUnreachable):
                    continue
                routing.learned(step, answer, time.monotonic())
                continue
            send = self._send(step, request)
            if send is None:
                break
            try:
                response = self._http.request("POST", send[0], json=request.body, timeout=send[1])
            except httpx.TransportError:
                routing.unreachable(time.monotonic())
                break
            result = self._routed_answer(routing, step, response)
            if result is not None:
                return result
            break
        return self._run(request)

    def _run(self, request: _Request[T]) -> T:
        call = self._call(request)
        while (attempt := call.next()) is not None:
            if attempt.pause:
                time.sleep(attempt.pause)
            try:
                response = self._http.request(
                    request.method, attempt.url, json=request.body, timeout=attempt.timeout
                )
            except httpx.TransportError as error:
                call.unreachable(attempt, error)
                continue
            if (result := call.answered(attempt, response)) is not None:
                self._preferred = attempt.index
                return result
        raise call.give_up()

    def subscribe(
        self,
        sql: str,
        *,
        from_token: str | None = None,
        snapshot: bool = True,
        resume_timeout_s: float | None = None,
    ) -> Subscription:
        """A push query's changes (`SELECT ... EMIT CHANGES`) as a blocking iterator of
        `hotstate.client.subscribe.Change`: the current rows first (`snapshot=False`: none), then every
        committed change; `from_token` (a subscription's `token`) resumes after where it was instead. It
        resumes by itself on the next server when its server dies or ends the stream, and delivers every
        change once; it raises QueryFailed for a 4xx, and ClusterUnreachable (or the last 503) when no
        server took it for `resume_timeout_s` (default: the client's timeout_s)."""
        state = FeedState(sql, from_token, snapshot, len(self.servers), self._preferred)
        return Subscription(self, state, resume_timeout_s or self.timeout_s)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class AsyncClient(_Base):
    """The asyncio twin of `Client`, with the same arguments (`routing` too) and methods (awaitable)."""

    def __init__(
        self,
        servers: Servers,
        *,
        timeout_s: float = 30.0,
        connect_timeout_s: float = 2.0,
        transport: httpx.AsyncBaseTransport | None = None,
        tls: TlsOption = None,
        auth: tuple[str, str] | None = None,
        token: str | None = None,
        routing: bool = False,
    ) -> None:
        super().__init__(servers, timeout_s, connect_timeout_s, tls, routing)
        self._http = httpx.AsyncClient(
            transport=transport,
            headers=_headers(auth, token),
            verify=self._tls if self._tls is not None else True,
        )

    async def query(
        self,
        sql: str,
        *,
        max_lag: int | None = None,
        timeout_ms: int | None = None,
        standby_reads: bool = True,
        hedging: bool = True,
        consistency_token: str | None = None,
        min_batch: int | None = None,
        partitions: Sequence[int] | None = None,
        after: str | None = None,
    ) -> QueryResult:
        """See `Client.query`."""
        return await self._query(
            _query_request(
                sql,
                max_lag,
                timeout_ms,
                standby_reads,
                hedging,
                consistency_token,
                min_batch,
                partitions,
                after,
            )
        )

    async def tables(self) -> list[dict[str, Any]]:
        return await self._run(_TABLES)

    async def cluster_status(self) -> dict[str, Any]:
        return await self._run(_CLUSTER_STATUS)

    async def lags(self) -> dict[str, Any]:
        return await self._run(_LAGS)

    async def _query(self, request: _Request[QueryResult]) -> QueryResult:
        """`Client._query`, awaiting the same steps."""
        routing = self._routing(request)
        while routing is not None and (step := routing.next(time.monotonic())) is not None:
            if step.kind != "send":
                try:
                    answer = await self._run(_lookup(step))
                except (QueryFailed, ClusterUnreachable):
                    continue
                routing.learned(step, answer, time.monotonic())
                continue
            send = self._send(step, request)
            if send is None:
                break
            try:
                response = await self._http.request("POST", send[0], json=request.body, timeout=send[1])
            except httpx.TransportError:
                routing.unreachable(time.monotonic())
                break
            result = self._routed_answer(routing, step, response)
            if result is not None:
                return result
            break
        return await self._run(request)

    async def _run(self, request: _Request[T]) -> T:
        """`Client._run`, awaiting the same steps."""
        call = self._call(request)
        while (attempt := call.next()) is not None:
            if attempt.pause:
                await asyncio.sleep(attempt.pause)
            try:
                response = await self._http.request(
                    request.method, attempt.url, json=request.body, timeout=attempt.timeout
                )
            except httpx.TransportError as error:
                call.unreachable(attempt, error)
                continue
            if (result := call.answered(attempt, response)) is not None:
                self._preferred = attempt.index
                return result
        raise call.give_up()

    def subscribe(
        self,
        sql: str,
        *,
        from_token: str | None = None,
        snapshot: bool = True,
        resume_timeout_s: float | None = None,
    ) -> AsyncSubscription:
        """`Client.subscribe` for `async for`."""
        state = FeedState(sql, from_token, snapshot, len(self.servers), self._preferred)
        return AsyncSubscription(self, state, resume_timeout_s or self.timeout_s)

    async def close(self) -> None:
        await self._http.aclose()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

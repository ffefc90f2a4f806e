"""The pull-query endpoints, `POST /v1/query` and ksqlDB's `POST /query` and `POST /query-stream` (and its
`POST /close-query`), on the hot path.

Every lookup pays for this code, so it is plain ASGI in front of the FastAPI app: the body is read as
bytes, checked by hand against the fields each endpoint takes (an unknown field is refused, naming the
known ones), and the answer is encoded with orjson. Every door to them (the direct HTTP/1.1 lane, the
ASGI routes HTTP/2 runs too, the FastAPI routes kept for OpenAPI) is built from one table,
`endpoints.ENDPOINTS`, and calls the same `QueryEndpoints` methods: `QueryRoutes` only saves the
framework's per-request cost (routing, dependency injection, model validation), a third of a lookup's CPU.

ksqlDB's endpoints answer in the format the `Accept` header picks among those the endpoint produces, as
ksqlDB's server does (its routes' `produces`): `/query` defaults to its JSON array of `{"header"}` and
`{"row"}` objects, `/query-stream` to the delimited format (a header object with `queryId`, `columnNames`
and `columnTypes`, then one JSON array per row, each on its own line and sent as its own chunk or HTTP/2
DATA frame); `application/json` on `/query-stream` is the same header and rows as one JSON array. All
three read their statement and properties with one parser and run it on the same Coordinator.

JSON has no number for NaN or the infinities: answers carry them as the strings "NaN", "Infinity" and
"-Infinity", as ksqlDB's JSON writer (Jackson) does. Decimals travel as strings, bytes as base64, dates
and timestamps as ISO-8601 strings.
"""

from __future__ import annotations

import base64
import datetime as dt
import decimal
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

import orjson

from hotstate.controller.image import TableInfo
from hotstate.controller.records import KEY_SQL_TYPES, KeyColumn, ValueColumn
from hotstate.protocol.http_api import SERVER_NOT_READY
from hotstate.query.execute import QueryError, QueryResult
from hotstate.query.pull_query import QueryError as PullQueryError
from hotstate.query.push import split_emit
from hotstate.server.coordinator import Coordinator
from hotstate.server.http.asgi import Receive, Send
from hotstate.server.http.metrics import Metrics

log = logging.getLogger(__name__)

# ksqlDB's error codes (io.confluent.ksql.rest.Errors).
BAD_REQUEST = 40000
BAD_STATEMENT = 40001
NOT_FOUND = 40400
TOO_LARGE = 41300
SERVER_ERROR = 50000
UNAVAILABLE = 50300

# A request body larger than this is refused unread: the biggest statement the parser takes
# (hotstate.query.sql.MAX_STATEMENT_CHARS) fits, with room for JSON escapes.
MAX_BODY_BYTES = 4 * 1024 * 1024

# The media types ksqlDB's query endpoints produce.
DELIMITED = "application/vnd.ksqlapi.delimited.v1"
JSON = "application/json"
KSQL_V1_JSON = "application/vnd.ksql.v1+json"
# Per endpoint, in ksqlDB's order of preference (the first is what no Accept header or */* gets).
QUERY_PRODUCES = (KSQL_V1_JSON, JSON, DELIMITED)
STREAM_PRODUCES = (DELIMITED, JSON, KSQL_V1_JSON)
NOT_ACCEPTABLE = 40600
MAX_ACCEPT_VALUES = 64

NATIVE_FIELDS = (
    "sql",
    "max_lag",
    "timeout_ms",
    "standby_reads",
    "hedging",
    "consistency_token",
    "min_batch",
    "partitions",
    "after",
)
# ksqlDB's KsqlRequest fields, and `properties` (hotstate's name for streamsProperties since the start).
KSQL_FIELDS = ("ksql", "streamsProperties", "properties", "sessionVariables", "commandSequenceNumber")
# ksqlDB's QueryStreamArgs; streamsProperties as on /query (ksqlDB's own curl example sends it there).
STREAM_FIELDS = ("sql", "properties", "streamsProperties", "sessionVariables")

_KIND = {
    "bad_request": (400, "statement_error", BAD_STATEMENT),
    "not_found": (404, "statement_error", NOT_FOUND),
    "unavailable": (503, "generic_error", UNAVAILABLE),
    "timeout": (503, "generic_error", UNAVAILABLE),
    "not_ready": (503, "generic_error", SERVER_NOT_READY),
}
_JSON_HEADERS = [(b"content-type", b"application/json")]
_DELIMITED_HEADERS = [(b"content-type", DELIMITED.encode())]
_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


class BadRequest(Exception):
    """A body that is not the request the endpoint takes; the message says what is wrong."""

    def __init__(self, message: str, status: int = 400, code: int = BAD_REQUEST) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        self.code = code

    def refusal(self) -> tuple[int, bytes]:
        return error_body(self.status, "generic_error", self.code, self.message)


class QueryEndpoints:
    """The query endpoints as functions of the body bytes (and the format Accept picked): (status, JSON
    bytes or the delimited format's lines)."""

    def __init__(
        self,
        node_id: int,
        queries: Coordinator,
        metrics: Metrics,
        changes: ChangesPort | None = None,
    ) -> None:
        self._node_id = node_id
        # Push queries (`... EMIT CHANGES`): http/changes.py; None: refused as any unsupported statement.
        self._changes = changes
        self._queries = queries
        self._metrics = metrics
        # Counters bound once: a label lookup per query costs more than the count itself.
        self._ok = metrics.queries.labels("ok")
        self._latency = metrics.latency

    # Each answers at once when the query needs no wait (Coordinator.start), else hands back a coroutine.
    def native(self, body: bytes) -> Answer | Awaitable[Answer]:
        return self._answer(body, _native_request, self._native_answer)

    def ksql(self, body: bytes, media: str = KSQL_V1_JSON) -> Answer | Awaitable[Answer]:
        return self._answer(body, _ksql_request, _SHAPES[media])

    def stream(self, body: bytes, media: str = DELIMITED) -> Answer | Awaitable[Answer]:
        if self._changes is None:
            return self._answer(body, _stream_request, _STREAM_SHAPES[media])
        try:
            statement, properties = _stream_request(json_object(body))
            push = split_emit(statement) is not None
        except BadRequest as error:
            return error.refusal()
        except PullQueryError as error:  # EMIT FINAL
            return query_error(QueryError("bad_request", str(error)), statement)
        if push:
            return self._changes.open(statement, properties, media)
        return self._run(statement, properties, _STREAM_SHAPES[media])

    def changes(self, body: bytes) -> Answer | Awaitable[Answer]:
        """`POST /v1/changes`: a push query's feed as newline-delimited JSON events (http/changes.py)."""
        if self._changes is None:
            return error_body(404, "generic_error", NOT_FOUND, "push queries are not served here")
        return self._changes.native(body)

    def changes_sse(
        self, table: str, query_string: bytes, headers: list[tuple[bytes, bytes]]
    ) -> Answer | Awaitable[Answer]:
        """`GET /v1/tables/{table}/changes`: a table's feed as Server-Sent Events."""
        if self._changes is None:
            return error_body(404, "generic_error", NOT_FOUND, "push queries are not served here")
        return self._changes.sse(table, query_string, headers)

    async def close_query(self, body: bytes) -> Answer:
        """ksqlDB's `/close-query`: a pull query's answer is complete when sent, so there is never a query
        to close; ksqlDB answers the same for a pull query's id (400, "No query with id ...")."""
        try:
            data = json_object(body)
            refuse_unknown_fields(data, ("queryId",))
            query_id = string_field(data, "queryId")
        except BadRequest as error:
            return error.refusal()
        return error_body(400, "generic_error", BAD_REQUEST, f"No query with id {query_id}")

    def _answer(
        self,
        body: bytes,
        read: Callable[[dict[str, Any]], tuple[str, dict[str, object]]],
        shape: Callable[[QueryResult, list[list[object]]], object],
    ) -> Answer | Awaitable[Answer]:
        try:
            statement, properties = read(json_object(body))
            push = self._changes is not None and split_emit(statement) is not None
        except BadRequest as error:
            return error.refusal()
        except PullQueryError as error:  # EMIT FINAL
            return query_error(QueryError("bad_request", str(error)), statement)
        if push:
            message = (
                "a push query (EMIT CHANGES) is served on POST /query-stream, POST /v1/changes and GET "
                "/v1/tables/{table}/changes, not here"
            )
            return query_error(QueryError("bad_request", message), statement)
        return self._run(statement, properties, shape)

    def _run(
        self,
        statement: str,
        properties: dict[str, object],
        shape: Callable[[QueryResult, list[list[object]]], object],
    ) -> Answer | Awaitable[Answer]:
        started = time.perf_counter()
        try:
            result = self._queries.start(statement, properties)
        except QueryError as error:
            return self._failed(error, statement, started)
        if isinstance(result, QueryResult):
            return self._answered(result, shape, started)
        return self._answer_later(result, statement, shape, started)

    async def _answer_later(
        self,
        pending: Awaitable[QueryResult],
        statement: str,
        shape: Callable[[QueryResult, list[list[object]]], object],
        started: float,
    ) -> Answer:
        try:
            result = await pending
        except QueryError as error:
            return self._failed(error, statement, started)
        return self._answered(result, shape, started)

    def _failed(self, error: QueryError, statement: str, started: float) -> Answer:
        self._latency.observe(time.perf_counter() - started)
        self._metrics.queries.labels(error.kind).inc()
        self._metrics.failures.labels(error.kind).inc()
        return query_error(error, statement)

    def _answered(
        self, result: QueryResult, shape: Callable[[QueryResult, list[list[object]]], object], started: float
    ) -> Answer:
        self._latency.observe(time.perf_counter() - started)
        self._ok.inc()
        self._metrics.table_queries.labels(result.table.name).inc()
        rows = _finite_rows(result.rows) if result.non_finite else result.rows
        answer = shape(result, rows)
        if isinstance(answer, Lines):
            return 200, [dumps(line) + b"\n" for line in answer.lines]
        return 200, dumps(answer)

    def _native_answer(self, result: QueryResult, rows: list[list[object]]) -> object:
        answer: dict[str, object] = {
            "query_id": result.query_id,
            "table": result.table.name,
            "columns": result.columns,
            # The key's types, as GET /v1/tables gives them: clients type these columns exactly (JSON
            # alone cannot tell a timestamp or bytes key from a string).
            "key_columns": _key_columns(result.table.key_columns),
            # The value columns' types as the table's writer declared them (Spark's names; []: none did).
            "value_columns": _value_columns(result.table.value_columns),
            "rows": rows,
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
            "served_locally": self._node_id,
            "took_ms": round(result.took_ms, 3),
            "consistency_token": result.consistency_token,
        }
        cursor = result.cursor
        if cursor is not None:  # the LIMIT cut the rows short: the next page's `after`
            answer["cursor"] = cursor
        return answer


class StreamingBody(Protocol):
    """An answer written as it is made (a push query's feed, http/changes.py)."""

    async def run(self, send: Send, receive: Receive, abort: Callable[[], None] | None = None) -> None:
        """`abort`: drops the connection at once (a client that reads nothing), where known."""

    def close(self) -> None: ...


class ChangesPort(Protocol):
    """The push-query endpoints (http/changes.py's ChangeEndpoints)."""

    def open(
        self, statement: str, properties: dict[str, object], media: str
    ) -> Answer | Awaitable[Answer]: ...

    def native(self, body: bytes) -> Answer | Awaitable[Answer]: ...

    def sse(
        self, table: str, query_string: bytes, headers: list[tuple[bytes, bytes]]
    ) -> Answer | Awaitable[Answer]: ...


# An answer's body: JSON, or the delimited format's lines (each sent as its own chunk or DATA frame), or a
# stream.
Answer = tuple[int, bytes | list[bytes] | StreamingBody]
# An endpoint answers at once when it can (a tuple), else gives what to await for the answer.
Endpoint = Callable[[bytes], Answer | Awaitable[Answer]]
NegotiatedEndpoint = Callable[[bytes, str], Answer | Awaitable[Answer]]


def negotiate(
    accept: bytes | None, endpoint: NegotiatedEndpoint, produces: tuple[str, ...]
) -> tuple[Endpoint, bool]:
    """The endpoint answering in the format `accept` picks, and whether that answer is one JSON body."""
    asked = None if accept is None else accept.decode("latin-1")
    media = produces[0] if asked is None else accepted(asked, produces)
    if media is None:
        message = f"cannot answer in {asked!r} (Accept); this endpoint produces {', '.join(produces)}"
        refusal = error_body(406, "generic_error", NOT_ACCEPTABLE, message)
        return (lambda body: refusal), True
    chosen = media
    return (lambda body: endpoint(body, chosen)), chosen != DELIMITED


def accepted(accept: str, produces: tuple[str, ...]) -> str | None:
    """The media type, of those an endpoint `produces` (its preferred first), that an Accept header asks
    for: by quality (q), then in the header's order; `*/*` and `type/*` take the first that fits. None when
    none is acceptable. An empty header accepts anything (RFC 9110 12.5.1)."""
    ranges: list[tuple[float, int, str]] = []
    for index, item in enumerate(accept.split(",")):
        media, *params = (part.strip() for part in item.split(";"))
        if not media:
            continue
        quality = 1.0
        for param in params:
            name, _, value = param.partition("=")
            if name.strip().lower() == "q":
                try:
                    quality = float(value)
                except ValueError:
                    quality = 0.0
        if quality > 0:
            ranges.append((-quality, index, media.lower()))
    if not ranges:
        return produces[0] if not accept.strip() else None
    for _, _, media in sorted(ranges):
        if media == "*/*":
            return produces[0]
        if media.endswith("/*"):
            prefix = media[:-1]
            found = next((p for p in produces if p.startswith(prefix)), None)
            if found is not None:
                return found
        elif media in produces:
            return media
    return None


async def answer_request(endpoint: Endpoint, receive: Receive) -> Answer | None:
    """The endpoint's (status, JSON or lines) for the request body `receive` gives; None when the client
    went away before it was read."""
    try:
        body = await read_body(receive)
    except BadRequest as error:
        return error.refusal()
    if body is None:
        return None
    answer = endpoint(body)
    # Not raced against the client's disconnect, as the direct lane does (a task and a wait per query
    # cost /query a third of its forwarded-lookup throughput, and it cancelled reliably only in tests of
    # the direct lane): a scan asked through these doors runs to its end.
    return answer if isinstance(answer, tuple) else await answer


async def read_body(receive: Receive, limit: int = MAX_BODY_BYTES) -> bytes | None:
    """The whole request body; None when the client went away first. Refuses (413) a body larger than
    `limit` bytes without keeping the rest."""
    chunks: list[bytes] = []
    size = 0
    more = True
    while more:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise body_too_large(limit)
        chunks.append(chunk)
        more = message.get("more_body", False)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def body_too_large(limit: int = MAX_BODY_BYTES) -> BadRequest:
    """The refusal (413) of a request body larger than `limit` bytes."""
    return BadRequest(f"request body larger than {limit} bytes", 413, TOO_LARGE)


async def send_json(send: Send, status: int, payload: bytes) -> None:
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [*_JSON_HEADERS, (b"content-length", str(len(payload)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": payload})


async def send_lines(send: Send, lines: list[bytes]) -> None:
    """The delimited format: chunked on HTTP/1.1, each line its own chunk (DATA frame on HTTP/2)."""
    await send({"type": "http.response.start", "status": 200, "headers": _DELIMITED_HEADERS})
    last = len(lines) - 1
    for index, line in enumerate(lines):
        await send({"type": "http.response.body", "body": line, "more_body": index < last})
    if not lines:
        await send({"type": "http.response.body", "body": b""})


def internal_error(error: Exception) -> tuple[int, bytes]:
    return error_body(500, "generic_error", SERVER_ERROR, f"internal error: {type(error).__name__}")


def error_body(status: int, kind: str, code: int, message: str) -> tuple[int, bytes]:
    return status, dumps({"@type": kind, "error_code": code, "message": message})


def query_error(error: QueryError, statement: str) -> tuple[int, bytes]:
    status, kind, code = _KIND.get(error.kind, (400, "statement_error", BAD_STATEMENT))
    body = {
        "@type": kind,
        "error_code": code,
        "message": error.message,
        "statementText": statement,
        "entities": [],
    }
    return status, dumps(body)


def dumps(value: object) -> bytes:
    try:
        return orjson.dumps(value, default=_default, option=orjson.OPT_NON_STR_KEYS)
    except TypeError:  # what orjson cannot write (text with lone surrogates, odd map keys): the slow way
        return orjson.dumps(plain_json(value))


def _default(value: object) -> object:
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(value).decode()
    raise TypeError(type(value).__name__)


def plain_json(value: object) -> object:
    """`value` as JSON types only, each the way `dumps` writes it."""
    if value is None or isinstance(value, bool | int | str):
        return value.encode("utf-8", "replace").decode() if isinstance(value, str) else value
    if isinstance(value, float):
        return value if math.isfinite(value) else _NON_FINITE.get(value, "NaN")
    if isinstance(value, dt.datetime | dt.date | dt.time):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(value).decode()
    if isinstance(value, list | tuple):
        return [plain_json(v) for v in value]
    if isinstance(value, dict):
        return {str(plain_json(k)): plain_json(v) for k, v in value.items()}
    return str(value)


def _finite_rows(rows: list[list[object]]) -> list[list[object]]:
    return [[_finite(value) for value in row] for row in rows]


def _finite(value: object) -> object:
    if type(value) is float:
        return value if math.isfinite(value) else _NON_FINITE.get(value, "NaN")
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    return value


# ---------------------------------------------------------------------------------------------- requests
def json_object(body: bytes) -> dict[str, Any]:
    """A request body that must be a JSON object (also POST /v1/changes's, in changes.py)."""
    try:
        data = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise BadRequest(f"malformed JSON at position {error.pos}: {error.msg}") from None
    if not isinstance(data, dict):
        raise BadRequest(
            'malformed request: the body must be a JSON object, e.g. {"ksql": "SELECT * FROM t;"}'
        )
    return data


def refuse_unknown_fields(data: dict[str, Any], known: tuple[str, ...]) -> None:
    unknown = [name for name in data if name not in known]
    if unknown:
        names = ", ".join(repr(name) for name in unknown)
        raise BadRequest(
            f"malformed request: unknown field{'s' if len(unknown) > 1 else ''} {names}; "
            f"known: {', '.join(known)}"
        )


def string_field(data: dict[str, Any], name: str) -> str:
    """A request's required string field (the statement, or a query id)."""
    value = data.get(name)
    if value is None:
        raise BadRequest(f"malformed request: {name}: Field required")
    if not isinstance(value, str):
        raise BadRequest(f"malformed request: {name}: must be a string")
    return value


def _native_request(data: dict[str, Any]) -> tuple[str, dict[str, object]]:
    if len(data) == 1 and "sql" in data:  # most requests: the statement alone
        return string_field(data, "sql"), {}
    refuse_unknown_fields(data, NATIVE_FIELDS)
    sql = string_field(data, "sql")
    properties: dict[str, object] = {}
    for name, least in (("max_lag", 0), ("timeout_ms", 1), ("min_batch", 0)):
        value = data.get(name)
        if value is None:
            continue
        if type(value) is not int or value < least:
            raise BadRequest(f"malformed request: {name}: must be an integer >= {least}, or null")
        properties[name] = value
    for flag in ("standby_reads", "hedging"):  # both on unless the body says otherwise
        if flag in data:
            value = data[flag]
            if type(value) is not bool:
                raise BadRequest(f"malformed request: {flag}: must be true or false")
            properties[flag] = value
    token = data.get("consistency_token")
    if token is not None:
        if not isinstance(token, str):
            raise BadRequest(
                "malformed request: consistency_token: must be a string (a token an answer gave)"
            )
        properties["consistency_token"] = token
    # A page of a table read a piece at a time: the query checks the values against the table.
    for name in ("partitions", "after"):
        if data.get(name) is not None:
            properties[name] = data[name]
    return sql, properties


def _ksql_request(data: dict[str, Any]) -> tuple[str, dict[str, object]]:
    # ksqlDB's clients send the statement with empty streamsProperties: nothing else to check.
    if "ksql" in data and (len(data) == 1 or (len(data) == 2 and data.get("streamsProperties") == {})):
        return string_field(data, "ksql"), {}
    refuse_unknown_fields(data, KSQL_FIELDS)
    sequence = data.get("commandSequenceNumber")
    if sequence is not None and type(sequence) is not int:
        raise BadRequest("malformed request: commandSequenceNumber: must be an integer")
    return string_field(data, "ksql"), _ksql_properties(data)


def _stream_request(data: dict[str, Any]) -> tuple[str, dict[str, object]]:
    refuse_unknown_fields(data, STREAM_FIELDS)
    return string_field(data, "sql"), _ksql_properties(data)


def _ksql_properties(data: dict[str, Any]) -> dict[str, object]:
    """The properties of a ksqlDB request (checked by Coordinator, the same for every endpoint)."""
    properties: dict[str, object] = {}
    for name in ("properties", "streamsProperties"):
        value = data.get(name)
        if value is None:
            continue
        if not isinstance(value, dict):
            raise BadRequest(f"malformed request: {name}: must be a JSON object")
        properties.update(value)
    variables = data.get("sessionVariables")
    if variables is not None and not isinstance(variables, dict):
        raise BadRequest("malformed request: sessionVariables: must be a JSON object")
    if variables:
        raise BadRequest("malformed request: sessionVariables: variable substitution is not supported")
    return properties


# ---------------------------------------------------------------------------------------------- answers
def _ksql_answer(result: QueryResult, rows: list[list[object]]) -> object:
    header = {"header": {"queryId": result.query_id, "schema": _schema(result)}}
    return [header, *({"row": {"columns": row}} for row in rows)]


class Lines:
    """An answer in the delimited format: each item is written as one line."""

    __slots__ = ("lines",)

    def __init__(self, lines: list[object]) -> None:
        self.lines = lines


def _stream_header(result: QueryResult) -> dict[str, object]:
    """ksqlDB's QueryResponseMetadata, the first item of a `/query-stream` answer."""
    types = _column_types(result)
    return {"queryId": result.query_id, "columnNames": result.columns, "columnTypes": [t for t, _ in types]}


def _delimited_answer(result: QueryResult, rows: list[list[object]]) -> Lines:
    return Lines([_stream_header(result), *rows])


def _json_stream_answer(result: QueryResult, rows: list[list[object]]) -> object:
    return [_stream_header(result), *rows]


def _schema(result: QueryResult) -> str:
    """ksqlDB's schema string (the same few per table, so each is built once)."""
    types = tuple(_column_types(result))
    key = (tuple(result.columns), types)
    schema = _SCHEMAS.get(key)
    if schema is None:
        if len(_SCHEMAS) >= 256:
            _SCHEMAS.clear()
        schema = _SCHEMAS[key] = ", ".join(
            f"`{name}` {sql_type} KEY" if is_key else f"`{name}` {sql_type}"
            for name, (sql_type, is_key) in zip(result.columns, types, strict=True)
        )
    return schema


_SCHEMAS: dict[tuple[tuple[str, ...], tuple[tuple[str, bool], ...]], str] = {}


def _column_types(result: QueryResult) -> list[tuple[str, bool]]:
    """Each column's SQL type, and whether it is a key column; a value column's type is the one its
    table's writer declared, else that of its first non-null value."""
    known = known_types(result.table)
    rows = result.rows
    types = []
    for index, name in enumerate(result.columns):
        found = known.get(name.lower())
        if found is None:
            found = ("STRING", False)
            for row in rows:  # the first non-null value's type
                value = row[index]
                if value is not None:
                    found = (_sql_type(value), False)
                    break
        types.append(found)
    return types


_T = TypeVar("_T")
_R = TypeVar("_R")


def _by_identity(build: Callable[[_T], _R]) -> Callable[[_T], _R]:
    """`build` remembered per argument object: a table's column tuples are the same objects in every
    metadata image until they change, and hashing a tuple of dataclasses for an lru_cache runs a Python
    __hash__ per column on every answer (up to 1.3 us). An entry holds its argument: its id stays unique."""
    memo: dict[int, tuple[_T, _R]] = {}

    def get(value: _T) -> _R:
        entry = memo.get(id(value))
        if entry is not None and entry[0] is value:
            return entry[1]
        if len(memo) >= 256:
            memo.clear()
        result = build(value)
        memo[id(value)] = (value, result)
        return result

    return get


@_by_identity
def _key_columns(key_columns: tuple[KeyColumn, ...]) -> list[dict[str, str]]:
    return [{"name": c.name, "type": KEY_SQL_TYPES[c.type]} for c in key_columns]


@_by_identity
def _value_columns(value_columns: tuple[ValueColumn, ...]) -> list[dict[str, str]]:
    return [{"name": c.name, "type": c.type} for c in value_columns]


@_by_identity
def known_types(table: TableInfo) -> dict[str, tuple[str, bool]]:
    """(SQL type, is a key column) by lower-case name: the declared value columns', then the key columns'
    (a key column's wins)."""
    known = {c.name.lower(): (ksql_type(c.type), False) for c in table.value_columns}
    return known | {c.name.lower(): (KEY_SQL_TYPES[c.type], True) for c in table.key_columns}


# Spark's name of a type (DataType.simpleString()) -> ksqlDB's; ints narrower than bigint are ksqlDB's INT.
_KSQL_NAMES = {
    "boolean": "BOOLEAN",
    "tinyint": "INTEGER",
    "smallint": "INTEGER",
    "int": "INTEGER",
    "bigint": "BIGINT",
    "float": "DOUBLE",
    "double": "DOUBLE",
    "string": "STRING",
    "binary": "BYTES",
    "date": "DATE",
    "timestamp": "TIMESTAMP",
    "timestamp_ntz": "TIMESTAMP",
}


def ksql_type(spark_type: str) -> str:
    """ksqlDB's name for a column declared with Spark's `spark_type` (e.g. array<struct<a:int>> ->
    ARRAY<STRUCT<`a` INTEGER>>); a type ksqlDB has no name for reads as STRING, as its values do."""
    text = spark_type.strip()
    lower = text.lower()
    if lower in _KSQL_NAMES:
        return _KSQL_NAMES[lower]
    if lower.startswith("decimal(") and lower.endswith(")"):
        return "DECIMAL(" + ", ".join(p.strip() for p in lower[8:-1].split(",")) + ")"
    for prefix in ("array<", "map<", "struct<"):
        if lower.startswith(prefix) and lower.endswith(">"):
            parts = _top_level(text[len(prefix) : -1])
            if prefix == "array<" and len(parts) == 1:
                return f"ARRAY<{ksql_type(parts[0])}>"
            if prefix == "map<" and len(parts) == 2:
                return f"MAP<{ksql_type(parts[0])}, {ksql_type(parts[1])}>"
            if prefix == "struct<":
                fields = [part.partition(":") for part in parts]
                if all(sep for _, sep, _ in fields):
                    return "STRUCT<" + ", ".join(f"`{n}` {ksql_type(t)}" for n, _, t in fields) + ">"
    return "STRING"


def _top_level(text: str) -> list[str]:
    """`text` split at the commas outside <> and ()."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        if char in "<(":
            depth += 1
        elif char in ">)":
            depth -= 1
        elif char == "," and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return [part.strip() for part in parts]


_SQL_TYPES: dict[type, str] = {
    bool: "BOOLEAN",
    int: "BIGINT",
    float: "DOUBLE",
    str: "STRING",
    dt.datetime: "TIMESTAMP",
    dt.date: "DATE",
    decimal.Decimal: "DECIMAL",
    bytes: "BYTES",
    list: "ARRAY",
    dict: "MAP",
}


def _sql_type(value: object) -> str:
    exact = _SQL_TYPES.get(type(value))
    if exact is not None:
        return exact
    # A subclass (an IntEnum, a pandas Timestamp): the first listed type it is an instance of (the table
    # lists bool before int and datetime before date).
    return next((name for kind, name in _SQL_TYPES.items() if isinstance(value, kind)), "STRING")


# The answer's shape for each media type ksqlDB's endpoints produce: application/json is /query's own
# format there, and the delimited format's header and rows as one JSON array on /query-stream.
_SHAPES: dict[str, Callable[[QueryResult, list[list[object]]], object]] = {
    KSQL_V1_JSON: _ksql_answer,
    JSON: _ksql_answer,
    DELIMITED: _delimited_answer,
}
_STREAM_SHAPES = {**_SHAPES, JSON: _json_stream_answer}

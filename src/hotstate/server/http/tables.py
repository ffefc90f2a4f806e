"""Table administration over HTTP: `GET /v1/tables`, `POST /v1/tables`, `DELETE /v1/tables/{name}`, and
where a key lives: `GET /v1/tables/{name}/keys/{key}` (http/key_location.py).

The same requests the admin client sends over RPC (`hotstate table create | list | describe | drop`): this
server hands them to the active controller (forwarding if it is not the one), so any server answers. A
create or drop is answered once this server's own metadata image shows it, so the caller's next request
to the same server sees the change.

Errors have ksqlDB's shape (`@type`, `error_code`, `message`): 400 for a body that is not a table
definition or a definition the controller refuses, 404 for an unknown table, 409 for a name taken, 503
when no controller answered (or this server is starting) and the change was certainly not made, 504 when
the change was sent and its outcome is unknown.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hotstate.controller.image import MetadataImage
from hotstate.controller.records import (
    KEY_SQL_TYPES,
    KEY_TYPE_NAMES,
    KeyColumn,
    TableTtl,
    TableWindow,
    key_type_named,
)
from hotstate.controller.requests import (
    ControllerError,
    ControllerRequest,
    ControllerResponse,
    CreateTableRequest,
    DeleteTableRequest,
)
from hotstate.protocol.http_api import SERVER_NOT_READY
from hotstate.protocol.ttl import format_duration, parse_duration
from hotstate.routing.lags import LagTable
from hotstate.server.http.key_location import KeyLocationError, encoded_key, locate
from hotstate.server.http.openapi import documented_body
from hotstate.server.http.queries import (
    BAD_REQUEST,
    BAD_STATEMENT,
    MAX_BODY_BYTES,
    NOT_FOUND,
    TOO_LARGE,
    UNAVAILABLE,
    BadRequest,
    error_body,
    read_body,
)

# A table definition is a few hundred bytes; anything near the query limit is not one.
MAX_TABLE_BODY_BYTES = min(MAX_BODY_BYTES, 64 * 1024)
# How long a create or drop waits for this server's image to show it once the controller committed it
# (it normally takes a metadata fetch, a few ms); after that the answer says so instead of waiting on.
VISIBLE_WAIT_S = 5.0
# A metadata election takes about a second; a create or drop waits this long for a controller.
CONTROLLER_WAIT_S = 5.0
# Not in ksqlDB's list: a create for a name that exists (ksqlDB answers 40001 with "already exists").
TABLE_EXISTS_CODE = 40900
OUTCOME_UNKNOWN_CODE = 50400

Controller = Callable[[ControllerRequest], Awaitable[ControllerResponse]]


class KeyColumnSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str = Field(description="the key column's name, as rows and WHERE clauses name it")
    type: str = Field(description=f"one of {KEY_TYPE_NAMES}", examples=["STRING"])


class CreateTableBody(BaseModel):
    """What `POST /v1/tables` takes: GET /v1/tables's entries, less what the cluster decides."""

    model_config = ConfigDict(extra="forbid", strict=True)
    name: str = Field(description="letters, digits and underscores; starts with a letter")
    key_columns: list[KeyColumnSpec] = Field(description="the key, in order (a compound key has several)")
    partitions: int = Field(default=8, description="how many partitions")
    standby_replicas: int | None = Field(
        default=None, description="standbys per partition; null: the server's num.standby.replicas"
    )
    acceptable_lag: int | None = Field(
        default=None,
        description="most records a replica may be behind and still serve; null: unset. "
        "`acceptable.offset.lag` is accepted for it (the anchors' name)",
    )
    writer_rack: str | None = Field(
        default=None, description="the rack its writers run in, for rack-aware placement (KIP-925)"
    )
    ttl: str | None = Field(
        default=None,
        description="time to live of a plain table's rows, e.g. 7d, 12h, 30m; null: kept until deleted",
        examples=["7d"],
    )
    ttl_column: str | None = Field(
        default=None,
        description="the TIMESTAMP column the ttl counts from (a key column, or a value column its "
        "writers declare timestamp); null: from each row's last write",
    )


@dataclass(frozen=True)
class TableContext:
    image: Callable[[], MetadataImage]
    # Why this server cannot answer yet (its metadata image has not caught up); None once it can.
    not_ready: Callable[[], str | None]
    controller: Controller
    # The lags and liveness this server knows, for where a key lives (http/key_location.py).
    lags: LagTable = field(default_factory=LagTable)
    alive: Callable[[int], bool] = lambda node: True
    # The standbys of a table created without a count (the server's num.standby.replicas).
    default_standby_replicas: int = 1


def add_table_routes(app: FastAPI, ctx: TableContext) -> None:
    @app.get("/v1/tables", summary="Tables, their keys and placement")
    async def tables() -> Response:
        reason = ctx.not_ready()
        if reason is not None:  # a stale image would list too few tables
            return _response(error_body(503, "generic_error", SERVER_NOT_READY, reason))
        image = ctx.image()
        described = [describe(image, name) for name in image.tables_listed()]
        return _response((200, orjson.dumps({"tables": described})))

    @app.post(
        "/v1/tables",
        summary="Create a table (its partitions are placed at once)",
        status_code=201,
        openapi_extra=documented_body(CreateTableBody),
    )
    async def create_table(request: Request) -> Response:
        # Read with the bound, so an oversized body is refused without being held whole.
        try:
            body = await read_body(request.receive, MAX_TABLE_BODY_BYTES)
        except BadRequest:
            limit = f"a table definition is at most {MAX_TABLE_BODY_BYTES:,} bytes"
            return _response(error_body(413, "generic_error", TOO_LARGE, limit))
        if body is None:
            return _response(_bad("the body never arrived: the client went away").answer)
        try:
            create = create_request(body, ctx.default_standby_replicas)
        except TableRequestRefused as refused:
            return _response(refused.answer)
        return _response(await _change(ctx, create, create.name))

    @app.get(
        "/v1/tables/{name}/keys/{key:path}",
        summary="Where a key of a one-column key lives: its partition, active and standbys with lags",
    )
    async def key_location(name: str, key: str) -> Response:
        return _response(_locate(ctx, name, key, {}))

    @app.get(
        "/v1/tables/{name}/keys",
        summary="Where a key lives, one query parameter per key column (KIP-535's queryMetadataForKey)",
    )
    async def compound_key_location(name: str, request: Request) -> Response:
        return _response(_locate(ctx, name, None, dict(request.query_params)))

    @app.delete("/v1/tables/{name}", summary="Drop a table and its rows on every server")
    async def drop_table(name: str) -> Response:
        return _response(await _change(ctx, DeleteTableRequest(name), name))


def window_json(window: TableWindow | None) -> dict[str, Any] | None:
    """A table's window as GET /v1/tables shows it (null: not windowed)."""
    if window is None:
        return None
    return {
        "column": window.column,
        "kind": window.kind,
        "size_us": window.size_us,
        "slide_us": window.slide_us,
        "retention_us": window.retention_us,
    }


def ttl_json(ttl: TableTtl | None) -> dict[str, Any] | None:
    """A table's TTL as GET /v1/tables shows it (null: none)."""
    if ttl is None:
        return None
    return {"ttl_us": ttl.ttl_us, "ttl": format_duration(ttl.ttl_us), "column": ttl.column}


def describe(image: MetadataImage, name: str) -> dict[str, Any]:
    """A table as GET /v1/tables lists it."""
    table = image.tables[name]
    return {
        "name": table.name,
        "key_columns": [{"name": c.name, "type": KEY_SQL_TYPES[c.type]} for c in table.key_columns],
        # Spark's names for the value columns' types, as the table's writer declared them ([]: none did).
        "value_columns": [{"name": c.name, "type": c.type} for c in table.value_columns],
        "partitions": table.partitions,
        "standby_replicas": table.standby_replicas,
        "acceptable_lag": table.acceptable_lag,
        "writer_racks": list(table.writer_racks),
        # A windowed table (its key ends in WINDOWSTART, WINDOWEND): kind, and size and slide where known.
        "window": window_json(table.window),
        # A plain table's time to live (null: none): ttl_us, and the column it counts from (null: from
        # each row's last write).
        "ttl": ttl_json(table.ttl),
        # The last Spark batch its sink committed (null: none yet): a query's min_batch.
        "last_batch": table.batch_id if table.batch_id >= 0 else None,
        # Its table id, which an overwrite changes (a new generation): a reader in pages compares it with
        # the one its answers' consistency tokens name.
        "generation": table.table_id,
        "placement": [
            {
                "partition": p.partition,
                "active": p.active,
                "standbys": list(p.standbys),
                "warmups": list(p.warmups),
                "isr": list(p.isr),
                "leader_epoch": p.leader_epoch,
            }
            for p in image.partitions.get(table.table_id, ())
        ],
    }


def _locate(ctx: TableContext, name: str, key: str | None, params: dict[str, str]) -> tuple[int, bytes]:
    reason = ctx.not_ready()
    if reason is not None:  # a stale image would place the key wrongly, or not know the table
        return error_body(503, "generic_error", SERVER_NOT_READY, reason)
    image = ctx.image()
    table = image.tables.get(name)
    if table is None:
        known = ", ".join(image.tables_listed()) or "none"
        return error_body(404, "statement_error", NOT_FOUND, f"no table {name!r} (tables: {known})")
    try:
        encoded = encoded_key(table, key, params)
    except KeyLocationError as error:
        return error_body(400, "statement_error", BAD_STATEMENT, str(error))
    return 200, orjson.dumps(locate(image, table, encoded, lags=ctx.lags, alive=ctx.alive))


class TableRequestRefused(Exception):
    """A table request refused before it reaches the controller; `answer` is the HTTP answer to send."""

    def __init__(self, answer: tuple[int, bytes]) -> None:
        super().__init__()
        self.answer = answer


def _bad(message: str) -> TableRequestRefused:
    return TableRequestRefused(error_body(400, "generic_error", BAD_REQUEST, message))


# The anchors' name for a table's acceptable lag (KIP-535's acceptable.offset.lag), as a body field.
ACCEPTABLE_LAG_ALIAS = "acceptable.offset.lag"


def create_request(body: bytes, default_standby_replicas: int = 1) -> CreateTableRequest:
    """The body of a `POST /v1/tables` as the controller's request; TableRequestRefused says what is wrong.
    `default_standby_replicas`: the count of a body without `standby_replicas`."""
    try:
        parsed = orjson.loads(body)
    except orjson.JSONDecodeError as error:
        raise _bad(f"the body is not JSON: {error}") from error
    if not isinstance(parsed, dict):
        raise _bad("the body must be a JSON object with name and key_columns")
    if ACCEPTABLE_LAG_ALIAS in parsed:
        alias = parsed.pop(ACCEPTABLE_LAG_ALIAS)
        if "acceptable_lag" in parsed and parsed["acceptable_lag"] != alias:
            raise _bad(
                f"acceptable_lag={parsed['acceptable_lag']!r} and {ACCEPTABLE_LAG_ALIAS}={alias!r}: "
                "the same bound under two names, with different values"
            )
        parsed["acceptable_lag"] = alias
    try:
        spec = CreateTableBody.model_validate(parsed)
    except ValidationError as error:
        raise _bad(_validation_message(error)) from error
    columns = []
    for column in spec.key_columns:
        key_type = key_type_named(column.type)
        if key_type is None:
            raise _bad(f"key column {column.name!r}: unknown type {column.type!r} (types: {KEY_TYPE_NAMES})")
        columns.append(KeyColumn(column.name, key_type))
    ttl = None
    if spec.ttl is not None:
        try:
            ttl = TableTtl(parse_duration(spec.ttl), spec.ttl_column)
        except ValueError as error:
            raise _bad(f"ttl: {error}") from error
    elif spec.ttl_column is not None:
        raise _bad(f'ttl_column {spec.ttl_column!r} without a ttl: give the ttl too, e.g. "ttl": "7d"')
    return CreateTableRequest(
        spec.name,
        spec.partitions,
        default_standby_replicas if spec.standby_replicas is None else spec.standby_replicas,
        tuple(columns),
        spec.acceptable_lag,
        spec.writer_rack,
        ttl=ttl,
    )


def _validation_message(error: ValidationError) -> str:
    problems = []
    for item in error.errors(include_url=False):
        where = ".".join(str(part) for part in item["loc"]) or "body"
        if item["type"] == "extra_forbidden":
            known = ", ".join(CreateTableBody.model_fields)
            problems.append(f"unknown field {where!r} (fields: {known})")
        else:
            problems.append(f"{where}: {item['msg']}")
    return "; ".join(problems)


STATUS = {
    ControllerError.INVALID_REQUEST: (400, "statement_error", BAD_STATEMENT),
    ControllerError.UNKNOWN_TABLE: (404, "statement_error", NOT_FOUND),
    ControllerError.TABLE_EXISTS: (409, "statement_error", TABLE_EXISTS_CODE),
    ControllerError.NOT_CONTROLLER: (503, "generic_error", UNAVAILABLE),
    ControllerError.NO_LIVE_BROKERS: (503, "generic_error", UNAVAILABLE),
    ControllerError.TIMEOUT: (504, "generic_error", OUTCOME_UNKNOWN_CODE),
}


async def _change(
    ctx: TableContext, request: CreateTableRequest | DeleteTableRequest, name: str
) -> tuple[int, bytes]:
    reason = ctx.not_ready()
    if reason is not None:
        return error_body(503, "generic_error", SERVER_NOT_READY, reason)
    reply = await ask_controller(ctx, request)
    error = getattr(reply, "error", ControllerError.NONE)
    if error is not ControllerError.NONE:
        status, kind, code = STATUS.get(error, (500, "generic_error", UNAVAILABLE))
        message = getattr(reply, "message", "") or error.name
        return error_body(status, kind, code, message)
    creating = isinstance(request, CreateTableRequest)
    if not await _visible(ctx, name, present=creating):
        return error_body(
            504,
            "generic_error",
            OUTCOME_UNKNOWN_CODE,
            f"the controller {'created' if creating else 'dropped'} table {name!r}, but this server's "
            f"metadata did not show it within {VISIBLE_WAIT_S:.0f} s",
        )
    if creating:
        return 201, orjson.dumps(describe(ctx.image(), name))
    return 200, orjson.dumps({"dropped": name})


async def ask_controller(ctx: TableContext, request: ControllerRequest) -> ControllerResponse:
    """The controller's answer; NOT_CONTROLLER (nothing applied: an election is under way, or the
    leader just moved) is asked again until CONTROLLER_WAIT_S, as the admin client does."""
    loop = asyncio.get_running_loop()
    end = loop.time() + CONTROLLER_WAIT_S
    while True:
        reply = await ctx.controller(request)
        if getattr(reply, "error", None) is not ControllerError.NOT_CONTROLLER or loop.time() >= end:
            return reply
        await asyncio.sleep(0.05)


async def _visible(ctx: TableContext, name: str, *, present: bool) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + VISIBLE_WAIT_S
    while (name in ctx.image().tables) != present:
        if loop.time() >= end:
            return False
        await asyncio.sleep(0.01)
    return True


def _response(answer: tuple[int, bytes]) -> Response:
    status, payload = answer
    return Response(payload, status_code=status, media_type="application/json")

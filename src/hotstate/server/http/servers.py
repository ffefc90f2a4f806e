"""Removing a server over HTTP: `POST /v1/servers/{node_id}/remove` (role `admin` when authentication is on).

The same request `hotstate server remove` and `AdminClient.remove_server` send: this server hands it to the
active controller (forwarding if it is not the one). 202 with `{"server": N, "state": "draining"}` while
the server's replicas move away, 200 with `"state": "removed"` once it is unregistered (at once for a dead
server that holds nothing); asking again is harmless. 404 for an unknown server, 400 with the reason for a
removal the controller refuses (a voter of the metadata quorum, too few brokers left, a partition that would
be lost), 503 when no controller answered, 504 when the outcome is unknown. docs/operations.md.
"""

from __future__ import annotations

import orjson
from fastapi import FastAPI
from fastapi.responses import Response

from hotstate.controller.requests import ControllerError, RemoveServerRequest, RemoveServerResponse
from hotstate.protocol.http_api import SERVER_NOT_READY
from hotstate.server.http.queries import NOT_FOUND, UNAVAILABLE, error_body
from hotstate.server.http.tables import STATUS, TableContext, ask_controller


def add_server_routes(app: FastAPI, ctx: TableContext) -> None:
    @app.post(
        "/v1/servers/{node_id}/remove",
        summary="Remove a broker for good: drain its replicas to the others, then unregister it",
    )
    async def remove_server(node_id: int) -> Response:
        status, body = await remove(ctx, node_id)
        return Response(body, status_code=status, media_type="application/json")


async def remove(ctx: TableContext, node_id: int) -> tuple[int, bytes]:
    reason = ctx.not_ready()
    if reason is not None:
        return error_body(503, "generic_error", SERVER_NOT_READY, reason)
    reply = await ask_controller(ctx, RemoveServerRequest(node_id))
    error = getattr(reply, "error", ControllerError.NONE)
    if error is ControllerError.UNKNOWN_SERVER:
        return error_body(404, "statement_error", NOT_FOUND, getattr(reply, "message", "") or error.name)
    if error is not ControllerError.NONE:
        status, kind, code = STATUS.get(error, (500, "generic_error", UNAVAILABLE))
        return error_body(status, kind, code, getattr(reply, "message", "") or error.name)
    assert isinstance(reply, RemoveServerResponse)
    return (200 if reply.state == "removed" else 202), orjson.dumps({"server": node_id, "state": reply.state})

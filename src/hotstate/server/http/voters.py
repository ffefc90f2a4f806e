"""Quorum membership over HTTP (KIP-853): `GET /v1/cluster/voters`, `POST /v1/cluster/voters` with
`{"node_id": N}` (AddVoter) and `DELETE /v1/cluster/voters/{node_id}` (RemoveVoter). The changes need the
`admin` role (http/auth.py). The same `VotersRequest` the admin client sends over RPC (`hotstate cluster
voters list | add | remove`); any server answers, passing it to the metadata leader (server/voters.py).

Answers: 200 with the voter set (after a change: once it committed); 409 when the leader refused the change
(not caught up, a change in flight, ...: the message says why); 503 when no leader answered within
LEADER_WAIT_S; 504 when a change did not commit in time (it may still apply: list the voters).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import orjson
from fastapi import FastAPI, Request
from fastapi.responses import Response
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from hotstate.protocol.voters import VotersError, VotersOp, VotersRequest, VotersResponse
from hotstate.server.http.openapi import documented_body
from hotstate.server.http.queries import (
    BAD_REQUEST,
    UNAVAILABLE,
    BadRequest,
    error_body,
    read_body,
)

Voters = Callable[[VotersRequest], Awaitable[VotersResponse]]

# A metadata election takes about a second: a request without a leader is asked again for this long.
LEADER_WAIT_S = 5.0
REFUSED_CODE = 40901
OUTCOME_UNKNOWN_CODE = 50400
MAX_BODY_BYTES = 1024


class AddVoterBody(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    node_id: int = Field(description="a server registered with the controller role, caught up as observer")


def add_voter_routes(app: FastAPI, voters: Voters) -> None:
    @app.get("/v1/cluster/voters", summary="The metadata quorum's voters and observers (KIP-853)")
    async def list_voters() -> Response:
        return _response(await _ask(voters, VotersRequest(VotersOp.LIST)))

    @app.post(
        "/v1/cluster/voters",
        summary="Add a voter to the metadata quorum (KIP-853 AddVoter); admin",
        openapi_extra=documented_body(AddVoterBody),
    )
    async def add_voter(request: Request) -> Response:
        try:
            body = await read_body(request.receive, MAX_BODY_BYTES)
        except BadRequest:
            return _answer(error_body(413, "generic_error", BAD_REQUEST, "expected a small {node_id} body"))
        try:
            parsed = AddVoterBody.model_validate_json(body or b"")
        except ValidationError as error:
            problem = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in error.errors())
            return _answer(error_body(400, "generic_error", BAD_REQUEST, f"expected {{node_id}}: {problem}"))
        return _response(await _ask(voters, VotersRequest(VotersOp.ADD, parsed.node_id)))

    @app.delete(
        "/v1/cluster/voters/{node_id}",
        summary="Remove a voter from the metadata quorum (KIP-853 RemoveVoter); admin",
    )
    async def remove_voter(node_id: int) -> Response:
        return _response(await _ask(voters, VotersRequest(VotersOp.REMOVE, node_id)))


async def _ask(voters: Voters, request: VotersRequest) -> VotersResponse:
    """NOT_LEADER means nothing was applied: ask again while an election may be under way."""
    loop = asyncio.get_running_loop()
    end = loop.time() + LEADER_WAIT_S
    while True:
        reply = await voters(request)
        if reply.error is not VotersError.NOT_LEADER or loop.time() >= end:
            return reply
        await asyncio.sleep(0.05)


def to_json(reply: VotersResponse) -> dict[str, Any]:
    return {
        "leader": reply.leader_id,
        "epoch": reply.epoch,
        "voters": list(reply.voters),
        "change_pending": reply.change_pending,
        "high_watermark": reply.high_watermark,
        "observers": [
            {
                "node_id": o.node_id,
                "fetch_offset": o.fetch_offset,
                "caught_up": o.caught_up,
                "last_fetch_ms_ago": o.last_fetch_ms_ago,
            }
            for o in reply.observers
        ],
        "change_offset": reply.change_offset,
        "message": reply.message,
    }


def _response(reply: VotersResponse) -> Response:
    if reply.error is VotersError.NONE:
        return _answer((200, orjson.dumps(to_json(reply))))
    status, code = {
        VotersError.REFUSED: (409, REFUSED_CODE),
        VotersError.NOT_LEADER: (503, UNAVAILABLE),
        VotersError.TIMEOUT: (504, OUTCOME_UNKNOWN_CODE),
    }[reply.error]
    return _answer(error_body(status, "generic_error", code, reply.message))


def _answer(answer: tuple[int, bytes]) -> Response:
    status, payload = answer
    return Response(payload, status_code=status, media_type="application/json")

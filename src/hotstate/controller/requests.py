"""Requests servers and clients send to the active controller, and its answers."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from hotstate.controller.records import Endpoint, KeyColumn


class ControllerError(IntEnum):
    NONE = 0
    NOT_CONTROLLER = 1  # this server is not the active controller; `leader_id` says who may be
    TABLE_EXISTS = 2
    UNKNOWN_TABLE = 3
    INVALID_REQUEST = 4
    STALE_INCARNATION = 5  # a heartbeat from a previous life of the server: register again
    UNKNOWN_SERVER = 6
    NO_LIVE_BROKERS = 7
    # The change was proposed but not seen committed: it may or may not take effect. Not safe to retry
    # blindly (unlike NOT_CONTROLLER, which means it was never applied).
    TIMEOUT = 8


@dataclass(frozen=True, slots=True)
class RegisterServerRequest:
    node_id: int
    incarnation_id: str
    rpc: Endpoint
    http: Endpoint | None
    rack: str | None
    tags: tuple[tuple[str, str], ...]
    roles: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RegisterServerResponse:
    error: ControllerError
    message: str
    registered_at: int  # offset of the registration record


@dataclass(frozen=True, slots=True)
class ServerHeartbeatRequest:
    node_id: int
    incarnation_id: str
    metadata_offset: int  # how far this server's image is
    want_shutdown: bool


@dataclass(frozen=True, slots=True)
class ServerHeartbeatResponse:
    error: ControllerError
    message: str
    fenced: bool
    shutdown_ready: bool


@dataclass(frozen=True, slots=True)
class CreateTableRequest:
    name: str
    partitions: int
    standby_replicas: int
    key_columns: tuple[KeyColumn, ...]
    acceptable_lag: int | None


@dataclass(frozen=True, slots=True)
class CreateTableResponse:
    error: ControllerError
    message: str
    table_id: int


@dataclass(frozen=True, slots=True)
class DeleteTableRequest:
    name: str


@dataclass(frozen=True, slots=True)
class DeleteTableResponse:
    error: ControllerError
    message: str


@dataclass(frozen=True, slots=True)
class ListTablesRequest:
    pass


@dataclass(frozen=True, slots=True)
class ListTablesResponse:
    error: ControllerError
    message: str
    tables: tuple[str, ...]


ControllerRequest = (
    RegisterServerRequest
    | ServerHeartbeatRequest
    | CreateTableRequest
    | DeleteTableRequest
    | ListTablesRequest
)
ControllerResponse = (
    RegisterServerResponse
    | ServerHeartbeatResponse
    | CreateTableResponse
    | DeleteTableResponse
    | ListTablesResponse
)


def error_response(request: ControllerRequest, error: ControllerError, message: str) -> ControllerResponse:
    """The answer of the right type carrying only an error (e.g. NOT_CONTROLLER, TIMEOUT)."""
    match request:
        case RegisterServerRequest():
            return RegisterServerResponse(error, message, -1)
        case ServerHeartbeatRequest():
            return ServerHeartbeatResponse(error, message, fenced=True, shutdown_ready=False)
        case CreateTableRequest():
            return CreateTableResponse(error, message, -1)
        case DeleteTableRequest():
            return DeleteTableResponse(error, message)
        case ListTablesRequest():
            return ListTablesResponse(error, message, ())

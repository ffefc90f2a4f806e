"""Requests servers and clients send to the active controller, and its answers."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from hotstate.controller.records import Endpoint, KeyColumn, TableTtl, TableWindow, ValueColumn


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
    # An ISR change based on a partition state that has changed since (or a leader epoch that is not the
    # current one): the requester learns the current state from its metadata image.
    STALE_PARTITION_STATE = 9
    # The node id was removed from the cluster (`hotstate server remove`): a server under it never serves
    # again; a new server joins under a new node id, with an empty data directory.
    SERVER_REMOVED = 10


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
    # (table id, partition, log end offset) of each local replica: the controller prefers the most
    # caught-up in-sync replica when it must pick a new active.
    replica_ends: tuple[tuple[int, int, int], ...] = ()


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
    # None (version 4): the `num.standby.replicas` of the server that takes the request, which fills it in
    # before the controller sees it, as it does for an HTTP create without one.
    standby_replicas: int | None
    key_columns: tuple[KeyColumn, ...]
    acceptable_lag: int | None
    # The creating writer's rack (a Spark sink's spark.hotstate.rack): placed with it in mind. Version 2.
    writer_rack: str | None = None
    # A windowed table (its key's last two columns are WINDOW_START, WINDOW_END). Version 3.
    window: TableWindow | None = None
    # A plain table's time to live (records.TableTtl). Version 4.
    ttl: TableTtl | None = None


@dataclass(frozen=True, slots=True)
class CreateTableResponse:
    error: ControllerError
    message: str
    table_id: int


@dataclass(frozen=True, slots=True)
class RegisterWriterRequest:
    """A writer of `table` (a Spark sink) runs in `rack`: the table's writer racks gain it."""

    table: str
    rack: str


@dataclass(frozen=True, slots=True)
class RegisterWriterResponse:
    error: ControllerError
    message: str
    writer_racks: tuple[str, ...]  # the table's writer racks now


@dataclass(frozen=True, slots=True)
class CommitBatchRequest:
    """A Spark sink's driver, once every task of micro-batch `batch_id` was acked: the batch is in `table`
    (whose id must still be `table_id`; -1 for a batch that wrote nothing), at least at these (partition,
    position) pairs."""

    table: str
    table_id: int
    batch_id: int
    positions: tuple[tuple[int, int], ...]


@dataclass(frozen=True, slots=True)
class CommitBatchResponse:
    error: ControllerError
    message: str


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


@dataclass(frozen=True, slots=True)
class AlterPartitionRequest:
    """An active asks for a new ISR of its partition (Kafka's AlterPartition)."""

    node_id: int
    table_id: int
    partition: int
    leader_epoch: int
    partition_epoch: int  # the state the request is based on: compare-and-set
    isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AlterPartitionResponse:
    error: ControllerError
    message: str


@dataclass(frozen=True, slots=True)
class SetValueColumnsRequest:
    """A writer of `table` (a Spark sink) declares its value columns: they replace the table's."""

    table: str
    value_columns: tuple[ValueColumn, ...]


@dataclass(frozen=True, slots=True)
class SetValueColumnsResponse:
    error: ControllerError
    message: str


@dataclass(frozen=True, slots=True)
class StageTableRequest:
    """An overwrite of `name` begins: stage a new, empty generation of it (created as `name` would be, the
    key columns the same as the table's if it exists), which the writer loads under the name the answer
    gives while `name` keeps serving its current generation. Generations staged for `name` before are
    dropped (a later overwrite supersedes an earlier one)."""

    name: str
    partitions: int
    standby_replicas: int
    key_columns: tuple[KeyColumn, ...]
    acceptable_lag: int | None
    writer_rack: str | None = None
    # A windowed table's windows (as CreateTableRequest.window); None: not windowed.
    window: TableWindow | None = None
    # A plain table's time to live (as CreateTableRequest.ttl). Version 2.
    ttl: TableTtl | None = None


@dataclass(frozen=True, slots=True)
class StageTableResponse:
    error: ControllerError
    message: str
    table_id: int  # the staged generation's
    staging_name: str  # what writers load it under
    replaced_id: int  # the generation the swap will replace (-1: no table yet)


@dataclass(frozen=True, slots=True)
class ReplaceTableRequest:
    """The overwrite's load is complete: generation `table_id` becomes table `name` in one metadata record
    (ReplaceTable). Repeating it after it took effect answers NONE."""

    name: str
    table_id: int
    # (partition, position): where the load's writes ended (its tasks' consistency tokens merged).
    positions: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True, slots=True)
class ReplaceTableResponse:
    error: ControllerError
    message: str


@dataclass(frozen=True, slots=True)
class RemoveServerRequest:
    """Remove broker `node_id` for good: drain it (its replicas move elsewhere, keeping every partition's
    standbys), then unregister it. A fenced (dead) server holding nothing is unregistered at once."""

    node_id: int


@dataclass(frozen=True, slots=True)
class RemoveServerResponse:
    error: ControllerError
    message: str
    state: str  # "draining" (its replicas are moving away) or "removed" (unregistered); "" on error


ControllerRequest = (
    RegisterServerRequest
    | ServerHeartbeatRequest
    | CreateTableRequest
    | DeleteTableRequest
    | ListTablesRequest
    | AlterPartitionRequest
    | RegisterWriterRequest
    | CommitBatchRequest
    | SetValueColumnsRequest
    | StageTableRequest
    | ReplaceTableRequest
    | RemoveServerRequest
)
ControllerResponse = (
    RegisterServerResponse
    | ServerHeartbeatResponse
    | CreateTableResponse
    | DeleteTableResponse
    | ListTablesResponse
    | AlterPartitionResponse
    | RegisterWriterResponse
    | CommitBatchResponse
    | SetValueColumnsResponse
    | StageTableResponse
    | ReplaceTableResponse
    | RemoveServerResponse
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
        case AlterPartitionRequest():
            return AlterPartitionResponse(error, message)
        case RegisterWriterRequest():
            return RegisterWriterResponse(error, message, ())
        case CommitBatchRequest():
            return CommitBatchResponse(error, message)
        case SetValueColumnsRequest():
            return SetValueColumnsResponse(error, message)
        case StageTableRequest():
            return StageTableResponse(error, message, -1, "", -1)
        case ReplaceTableRequest():
            return ReplaceTableResponse(error, message)
        case RemoveServerRequest():
            return RemoveServerResponse(error, message, "")

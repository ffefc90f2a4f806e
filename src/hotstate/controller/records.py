"""The records of the metadata log: everything the cluster knows is the replay of these, in order.

One Raft entry holds one `RecordBatch` of them, so a change that needs several records (a table with its
partitions, a controlled shutdown moving every active off a server) commits or vanishes as a whole.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum


class KeyType(IntEnum):
    STRING = 1
    INT = 2
    FLOAT = 3
    BOOL = 4
    BYTES = 5
    TIMESTAMP = 6
    # A windowed table's window bounds (Spark's `window` / `session_window` struct, split): timestamps in
    # the key order, always the last two key columns, and left out of the partition hash
    # (protocol.keys.window_suffix) so a key's windows share one partition and sit together in start order.
    WINDOW_START = 7
    WINDOW_END = 8


# The SQL name of each key type, as pull-query answers, GET /v1/tables and `hotstate table describe` show
# it (ksqlDB's names); key_type_named takes these back, and the enum's own names too.
KEY_SQL_TYPES = {
    KeyType.STRING: "STRING",
    KeyType.INT: "BIGINT",
    KeyType.FLOAT: "DOUBLE",
    KeyType.BOOL: "BOOLEAN",
    KeyType.BYTES: "BYTES",
    KeyType.TIMESTAMP: "TIMESTAMP",
    KeyType.WINDOW_START: "TIMESTAMP",
    KeyType.WINDOW_END: "TIMESTAMP",
}
WINDOW_KEY_TYPES = (KeyType.WINDOW_START, KeyType.WINDOW_END)
TIMESTAMP_KEY_TYPES = (KeyType.TIMESTAMP, *WINDOW_KEY_TYPES)
# A window's bounds are named by what made the table (TableWindow), never by a declared type name.
_KEY_TYPE_NAMES = {key_type.name: key_type for key_type in KeyType if key_type not in WINDOW_KEY_TYPES} | {
    name: key_type for key_type, name in KEY_SQL_TYPES.items() if key_type not in WINDOW_KEY_TYPES
}
KEY_TYPE_NAMES = ", ".join(_KEY_TYPE_NAMES)


def key_type_named(name: str) -> KeyType | None:
    """The key type a SQL or enum name (any case) stands for, e.g. BIGINT or INT; None if neither."""
    return _KEY_TYPE_NAMES.get(name.strip().upper())


@dataclass(frozen=True, slots=True)
class Endpoint:
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class RegisterServer:
    node_id: int
    # A new one every process start: tells a restarted server from a stale message of its previous life.
    incarnation_id: str
    rpc: Endpoint
    http: Endpoint | None
    rack: str | None
    tags: tuple[tuple[str, str], ...]
    roles: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class UnregisterServer:
    """The server is gone for good (`hotstate server remove`, once it holds no replica): it leaves every
    view, and its node id is refused from then on (a new server registers under a new id)."""

    node_id: int


@dataclass(frozen=True, slots=True)
class DrainServer:
    """An operator asked to remove the server: the assignor places nothing on it and moves its replicas
    away; the controller unregisters it once it holds none."""

    node_id: int


@dataclass(frozen=True, slots=True)
class FenceServer:
    node_id: int
    reason: str


@dataclass(frozen=True, slots=True)
class UnfenceServer:
    node_id: int


@dataclass(frozen=True, slots=True)
class KeyColumn:
    name: str
    type: KeyType


# What made a windowed table's windows (TableWindow.kind): ksqlDB's window types, and TIME for a window
# whose size Spark's plan does not tell (a window column computed some other way).
WINDOW_KINDS = ("TUMBLING", "HOPPING", "SESSION", "TIME")


@dataclass(frozen=True, slots=True)
class TableWindow:
    """A windowed table: its key ends in the WINDOW_START and WINDOW_END columns, split from the Spark struct
    column `column` (`window`, `session_window`) by its writer, which reads it back as that struct."""

    column: str
    kind: str  # one of WINDOW_KINDS
    size_us: int | None = None  # TUMBLING and HOPPING: the window's length; None when not known
    slide_us: int | None = None  # HOPPING: how far apart windows start (TUMBLING: size_us)
    # Windows that ended more than this before the newest window end seen are deleted; None: kept.
    retention_us: int | None = None


@dataclass(frozen=True, slots=True)
class TableTtl:
    """A plain (non-windowed) table's time to live: a row is deleted once `ttl_us` has passed since its
    timestamp column `column` (a TIMESTAMP key column, or a value column its writers declare `timestamp`),
    or, with no column, since it was last written (replica.retention; docs/operations.md, "Expiry")."""

    ttl_us: int
    column: str | None = None  # None: by write time


@dataclass(frozen=True, slots=True)
class CreateTable:
    name: str
    table_id: int
    partitions: int
    standby_replicas: int
    key_columns: tuple[KeyColumn, ...]
    acceptable_lag: int | None
    # Racks the table's writers (Spark sinks) run in: the assignor's traffic cost (KIP-925). Version 2.
    writer_racks: tuple[str, ...] = ()
    # Version 3. Not "": this is a staged generation of that table (an overwrite being loaded), hidden from
    # listings under `name` (staging_name) until a ReplaceTable swaps it in.
    staging_for: str = ""
    # Version 3. Where the load that made this generation ended, per partition (ReplaceTable.positions).
    loaded_positions: tuple[int, ...] = ()
    # A windowed table's windows (its last two key columns are their bounds); None: not windowed. Version 4.
    window: TableWindow | None = None
    # A plain table's time to live; None: rows are kept until deleted. Version 5.
    ttl: TableTtl | None = None


@dataclass(frozen=True, slots=True)
class ValueColumn:
    """A non-key column as its writer declared it: `type` is Spark's name for it (DataType.simpleString(),
    e.g. bigint, timestamp, decimal(10,2), array<string>). Rows are not checked against it: it tells
    readers what the JSON of an answer stood for."""

    name: str
    type: str


@dataclass(frozen=True, slots=True)
class TableValueColumns:
    """The table's value columns, as its latest writer declared them (the whole list)."""

    table_id: int
    value_columns: tuple[ValueColumn, ...]


@dataclass(frozen=True, slots=True)
class TableWriters:
    """The racks a table's writers report (the whole set, sorted): later placements keep actives near them."""

    table_id: int
    writer_racks: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class TableBatch:
    """The last Spark micro-batch its sink committed into a table, and where every partition was then:
    positions (offset after the last record) per partition, merged over every batch so far, so that the
    batch's writes, and all before it, are visible at least there (a query's `min_batch`)."""

    table_id: int
    batch_id: int
    positions: tuple[int, ...]  # one per partition, in partition order


@dataclass(frozen=True, slots=True)
class DeleteTable:
    name: str
    table_id: int


@dataclass(frozen=True, slots=True)
class ReplaceTable:
    """Generation `table_id` (a table staged for `name`, loaded while the table kept serving) becomes table
    `name`, in place of generation `replaced_id` (-1: there was none), whose partitions are dropped: one
    record, so every image has either the old generation or the new one under the name, never both or
    neither. Skipped unless both are still what the record names."""

    name: str
    table_id: int
    replaced_id: int
    # Where the load ended, one per partition of the new generation (() when unknown): no replica serves
    # the generation from a store before that, so a query sees all of it or waits.
    positions: tuple[int, ...] = ()


def staging_name(table: str, table_id: int) -> str:
    """The name a staged generation of `table` goes by until it is swapped in: "#" is no table name's
    character, so it never clashes with a table, and readers' SQL cannot name it."""
    return f"{table}#{table_id}"


@dataclass(frozen=True, slots=True)
class PartitionAssignment:
    """The whole replica set of a partition (written when a table is created or reassigned)."""

    table_id: int
    partition: int
    replicas: tuple[int, ...]  # every replica; the ones neither active nor warmups are standbys
    active: int | None  # None: no replica can take it (all fenced)
    warmups: tuple[int, ...]
    leader_epoch: int
    isr: tuple[int, ...]
    partition_epoch: int  # see PartitionInfo.partition_epoch


@dataclass(frozen=True, slots=True)
class PartitionBlock:
    """The replica sets of partitions `first`, `first + 1`, ... of a table, column by column: the same as one
    PartitionAssignment per partition, in one record (a new table's placement, a snapshot's partitions).
    Columns of plain ints encode and decode in C at msgpack speed, where a record per partition costs a
    generated decoder call each (100,000 partitions: 1.6 s to decode one by one, 2 cores under load)."""

    table_id: int
    first: int
    actives: tuple[int, ...]  # -1: no active
    leader_epochs: tuple[int, ...]
    partition_epochs: tuple[int, ...]
    replica_counts: tuple[int, ...]
    replicas: tuple[int, ...]  # every partition's replicas, one after the other (replica_counts long each)
    isr_counts: tuple[int, ...]
    isr: tuple[int, ...]
    warmup_counts: tuple[int, ...]
    warmups: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class PartitionChange:
    """A new active and/or ISR; the leader epoch goes up whenever the active changes (fencing), the
    partition epoch with every change."""

    table_id: int
    partition: int
    active: int | None
    leader_epoch: int
    isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class NoOp:
    pass


MetadataRecord = (
    RegisterServer
    | UnregisterServer
    | DrainServer
    | FenceServer
    | UnfenceServer
    | CreateTable
    | DeleteTable
    | ReplaceTable
    | TableWriters
    | TableBatch
    | TableValueColumns
    | PartitionAssignment
    | PartitionBlock
    | PartitionChange
    | NoOp
)


@dataclass(frozen=True, slots=True)
class MetadataBatch:
    records: tuple[MetadataRecord, ...]

"""The table a materialization writes to: its definition from a DataFrame, and create-or-check.

Creating a table that exists with the same definition is a no-op; with another definition it is an error
that shows both, so a job restarted with different settings never writes into a table it does not match.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import ssl
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, TypedDict

from pyspark.sql.types import (
    BinaryType,
    BooleanType,
    ByteType,
    DataType,
    DoubleType,
    FloatType,
    IntegerType,
    LongType,
    ShortType,
    StringType,
    StructType,
    TimestampNTZType,
    TimestampType,
)

from hotstate.client.admin import AdminClient, OutcomeUnknownError
from hotstate.client.writer import TableWriter
from hotstate.controller.records import KeyColumn, KeyType, TableTtl, TableWindow, ValueColumn, key_type_named
from hotstate.controller.requests import ControllerError, CreateTableResponse
from hotstate.protocol.cluster_token import cluster_token

__all__ = ["TableDefinition", "TableDefinitionError", "ensure_table", "key_columns_for", "value_columns_for"]

log = logging.getLogger(__name__)

# Spark type of a key column -> the table's key type (what protocol.keys encodes).
_KEY_TYPES: tuple[tuple[type[DataType], KeyType], ...] = (
    (StringType, KeyType.STRING),
    (LongType, KeyType.INT),
    (IntegerType, KeyType.INT),
    (ShortType, KeyType.INT),
    (ByteType, KeyType.INT),
    (DoubleType, KeyType.FLOAT),
    (FloatType, KeyType.FLOAT),
    (BooleanType, KeyType.BOOL),
    (BinaryType, KeyType.BYTES),
    (TimestampType, KeyType.TIMESTAMP),
    (TimestampNTZType, KeyType.TIMESTAMP),
)
_SUPPORTED = "string, bigint/int/smallint/tinyint, double/float, boolean, binary, timestamp, timestamp_ntz"


class TableDefinitionError(ValueError):
    """A key that cannot be a table key, or a table that exists with another definition."""


class TableRequestFields(TypedDict):
    """What AdminClient.create_table and stage_table take besides the name."""

    partitions: int
    standby_replicas: int
    key_columns: tuple[KeyColumn, ...]
    acceptable_lag: int | None
    writer_rack: str | None
    window: TableWindow | None
    ttl: TableTtl | None


@dataclass(frozen=True, slots=True)
class TableDefinition:
    name: str
    partitions: int
    standby_replicas: int | None  # None: not known (a server without HTTP answered)
    key_columns: tuple[KeyColumn, ...]
    acceptable_lag: int | None
    window: TableWindow | None = None
    # Like a window's retention, a setting of the table given when it is created, not part of its shape:
    # a later job's ttl neither changes nor contradicts it.
    ttl: TableTtl | None = None

    def matches(self, other: TableDefinition) -> bool:
        unknown = self.standby_replicas is None or other.standby_replicas is None
        return (
            self.name == other.name
            and self.partitions == other.partitions
            and (unknown or self.standby_replicas == other.standby_replicas)
            and self.key_columns == other.key_columns
            and self.acceptable_lag == other.acceptable_lag
            and _same_window(self.window, other.window)
        )

    def request_fields(self, writer_rack: str | None) -> TableRequestFields:
        """The definition as a create or a stage asks for it: an overwrite stages the table a create makes."""
        return TableRequestFields(
            partitions=self.partitions,
            standby_replicas=self.standby_replicas or 0,
            key_columns=self.key_columns,
            acceptable_lag=self.acceptable_lag,
            writer_rack=writer_rack,
            window=self.window,
            ttl=self.ttl,
        )

    def describe(self) -> str:
        keys = ", ".join(f"{c.name} {c.type.name}" for c in self.key_columns)
        window = "" if self.window is None else f", window={describe_window(self.window)}"
        return (
            f"(key: {keys}; partitions={self.partitions}, standby_replicas={self.standby_replicas}, "
            f"acceptable_lag={self.acceptable_lag}{window})"
        )


def _same_window(a: TableWindow | None, b: TableWindow | None) -> bool:
    # Retention is a setting of the table, not of its shape: a job may change it.
    if a is None or b is None:
        return a is b
    return (a.column, a.kind, a.size_us, a.slide_us) == (b.column, b.kind, b.size_us, b.slide_us)


def describe_window(window: TableWindow) -> str:
    """A window as `describe` shows it, e.g. HOPPING(size 10 minutes, slide 5 minutes) of `window`."""
    parts = []
    if window.size_us is not None:
        parts.append(f"size {_duration(window.size_us)}")
    if window.kind == "HOPPING" and window.slide_us is not None:
        parts.append(f"slide {_duration(window.slide_us)}")
    if window.retention_us is not None:
        parts.append(f"retention {_duration(window.retention_us)}")
    shown = f"({', '.join(parts)})" if parts else ""
    return f"{window.kind}{shown} of {window.column!r}"


def _duration(micros: int) -> str:
    for unit, size in (("day", 86_400_000_000), ("hour", 3_600_000_000), ("minute", 60_000_000)):
        if micros % size == 0:
            count = micros // size
            return f"{count} {unit}{'s' if count != 1 else ''}"
    return f"{micros / 1_000_000:g} seconds"


def key_columns_for(schema: StructType, key: str | Sequence[str]) -> tuple[KeyColumn, ...]:
    """The table's key columns for `key` (one name or several), typed from the DataFrame's schema."""
    names = [key] if isinstance(key, str) else list(key)
    if not names:
        raise TableDefinitionError("key: name at least one key column")
    if len(set(names)) != len(names):
        raise TableDefinitionError(f"key: {names} names a column twice")
    fields = {field.name: field for field in schema.fields}
    columns = []
    for name in names:
        field = fields.get(name)
        if field is None:
            raise TableDefinitionError(
                f"key column {name!r} is not a column of the DataFrame (columns: {', '.join(fields)})"
            )
        kind = next((k for spark_type, k in _KEY_TYPES if isinstance(field.dataType, spark_type)), None)
        if kind is None:
            if isinstance(field.dataType, StructType):
                raise TableDefinitionError(
                    f"key column {name!r} has type {field.dataType.simpleString()}: a struct key column "
                    "must be a window (window(...) or session_window(...))"
                )
            raise TableDefinitionError(
                f"key column {name!r} has type {field.dataType.simpleString()}, which cannot be a key "
                f"(supported: {_SUPPORTED})"
            )
        columns.append(KeyColumn(name, kind))
    return tuple(columns)


def value_columns_for(schema: StructType, key: str | Sequence[str]) -> tuple[ValueColumn, ...]:
    """The DataFrame's other columns with Spark's names for their types: what readers type answers by."""
    keys = {key} if isinstance(key, str) else set(key)
    return tuple(ValueColumn(f.name, f.dataType.simpleString()) for f in schema.fields if f.name not in keys)


def ensure_table(
    servers: Sequence[tuple[str, int]],
    cluster_id: str,
    secret: str,
    wanted: TableDefinition,
    *,
    rack: str | None = None,
    values: tuple[ValueColumn, ...] = (),
    tls: ssl.SSLContext | None = None,
) -> None:
    """Create the table, or check that the existing one has this definition (TableDefinitionError).

    `rack`: the writers' rack, added to the table's writer racks (the assignor places actives near it).
    `values`: the writer's value columns, which become the table's (a schema may grow between runs).
    `tls`: for servers whose RPC port uses TLS (tls.client_context)."""
    work = _ensure_table(servers, cluster_id, secret, wanted, rack, values, tls)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        asyncio.run(work)
        return
    # Called with an event loop running in this thread (a notebook): run on a thread of its own.
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        pool.submit(asyncio.run, work).result()


async def _ensure_table(
    servers: Sequence[tuple[str, int]],
    cluster_id: str,
    secret: str,
    wanted: TableDefinition,
    rack: str | None,
    values: tuple[ValueColumn, ...],
    tls: ssl.SSLContext | None = None,
) -> None:
    async with AdminClient(servers, cluster_id=cluster_id, secret=secret, tls=tls) as admin:
        try:
            reply = await _create(admin, wanted, rack)
        except OutcomeUnknownError:
            # Maybe created: ask again; a second create answers TABLE_EXISTS and the check below runs.
            reply = await _create(admin, wanted, rack)
        if reply.error is ControllerError.NONE:
            await _declare_values(admin, wanted.name, values)
            return
        if reply.error is not ControllerError.TABLE_EXISTS:
            raise TableDefinitionError(
                f"cannot create table {wanted.name!r}: {reply.error.name}: {reply.message}"
            )
        existing = await _existing(admin, servers, cluster_id, secret, wanted, tls)
        if not existing.matches(wanted):
            raise TableDefinitionError(
                f"table {wanted.name!r} exists with another definition: it is {existing.describe()}, "
                f"the materialization asks for {wanted.describe()}; delete the table or use another name"
            )
        await _declare_values(admin, wanted.name, values)
        if rack is not None:
            # The rack only steers placement: a job whose rack cannot be registered still writes.
            try:
                registered = await admin.register_writer(wanted.name, rack)
            except Exception as error:
                log.warning("table %r: writers' rack %r not registered: %s", wanted.name, rack, error)
            else:
                if registered.error is not ControllerError.NONE:
                    log.warning(
                        "table %r: writers' rack %r not registered: %s: %s",
                        wanted.name,
                        rack,
                        registered.error.name,
                        registered.message,
                    )


async def _declare_values(admin: AdminClient, table: str, values: tuple[ValueColumn, ...]) -> None:
    """Only readers' typing depends on it: a job whose value columns cannot be recorded still writes."""
    if not values:
        return
    try:
        reply = await admin.set_value_columns(table, values)
    except Exception as error:
        log.warning("table %r: value columns not recorded: %s", table, error)
        return
    if reply.error is not ControllerError.NONE:
        log.warning("table %r: value columns not recorded: %s: %s", table, reply.error.name, reply.message)


async def _existing(
    admin: AdminClient,
    servers: Sequence[tuple[str, int]],
    cluster_id: str,
    secret: str,
    wanted: TableDefinition,
    tls: ssl.SSLContext | None = None,
) -> TableDefinition:
    """The existing table's definition: from GET /v1/tables of a server that has HTTP (the only answer
    that names standby_replicas), else from the RPC table metadata, with the standby count unknown."""
    name = wanted.name
    status = await admin.describe()
    http = [f"{s.http_host}:{s.http_port}" for s in status.servers if s.http_host and s.http_port]
    if http:
        try:
            tables = await asyncio.to_thread(_http_tables, http, tls, cluster_token(secret))
        except Exception:
            tables = None
        if tables is not None:
            for table in tables:
                if table.get("name") == name:
                    return _from_http(table)
    async with TableWriter(servers, name, cluster_id=cluster_id, secret=secret, tls=tls) as writer:
        meta = await writer.metadata()
    # The RPC metadata has the key's types, not the window's shape: a windowed key is taken as the one wanted.
    windowed = bool(meta.key_columns) and meta.key_columns[-1].type is KeyType.WINDOW_END
    window = wanted.window if windowed else None
    return TableDefinition(name, len(meta.partitions), None, meta.key_columns, meta.acceptable_lag, window)


async def _create(admin: AdminClient, wanted: TableDefinition, rack: str | None) -> CreateTableResponse:
    return await admin.create_table(wanted.name, **wanted.request_fields(rack))


def _http_tables(servers: list[str], tls: ssl.SSLContext | None, token: str) -> list[dict[str, Any]]:
    """GET /v1/tables; with the RPC port's TLS (a cluster with TLS has it on HTTP too, from the same CA,
    as `hotstate cluster up --tls` makes it) over HTTPS first, else in clear. `token`: the cluster's own
    (protocol/cluster_token.py), for a cluster with HTTP authentication on."""
    from hotstate.client.query import Client

    last: Exception | None = None
    for context in (tls, None) if tls is not None else (None,):
        try:
            with Client(servers, timeout_s=5.0, tls=context, token=token) as client:
                return client.tables()
        except Exception as error:
            last = error
    assert last is not None
    raise last


def _from_http(table: dict[str, Any]) -> TableDefinition:
    keys = tuple(KeyColumn(c["name"], _key_type(c["type"])) for c in table["key_columns"])
    shown = table.get("window")
    window = None
    if shown is not None:
        window = TableWindow(
            shown["column"],
            shown["kind"],
            shown.get("size_us"),
            shown.get("slide_us"),
            shown.get("retention_us"),
        )
        # GET /v1/tables shows the bounds' SQL type (TIMESTAMP); a window's key ends in them.
        *others, start, end = keys
        keys = (*others, KeyColumn(start.name, KeyType.WINDOW_START), KeyColumn(end.name, KeyType.WINDOW_END))
    return TableDefinition(
        table["name"], table["partitions"], table["standby_replicas"], keys, table["acceptable_lag"], window
    )


def _key_type(name: str) -> KeyType:
    key_type = key_type_named(name)
    if key_type is None:  # a newer server's type: refuse rather than guess
        raise TableDefinitionError(f"the server reports key type {name!r}, which this client does not know")
    return key_type

"""Where a key lives (KIP-535's `queryMetadataForKey`, over HTTP): its partition and the servers holding it.

`GET /v1/tables/{table}/keys/{key}` for a table keyed by one column, `GET /v1/tables/{table}/keys?col=v&...`
for any key. The answer names the partition, its active and standbys (and warmups) with each one's HTTP
address, whether this server judges it alive, its state and lag as last reported, and the leader epoch:
what a client needs to send a lookup straight to a holder instead of paying a forward hop. The answer is
this server's view: the coordinator of a query sent elsewhere still routes it as usual.

`locate` is pure (image, lag table and liveness in, a JSON-able answer out); the route is in http/tables.py.
"""

from __future__ import annotations

import binascii
import datetime as dt
from collections.abc import Callable, Mapping
from typing import Any

from hotstate.controller.image import MetadataImage, TableInfo
from hotstate.controller.records import KEY_SQL_TYPES, KeyColumn, KeyType
from hotstate.protocol.keys import KeyValue, partition_for, window_suffix
from hotstate.query.plan import InvalidKeyValueError, key_component
from hotstate.routing.lags import LagTable


class KeyLocationError(ValueError):
    """The key the request names is not a key of the table: the message says why."""


def encoded_key(table: TableInfo, path_key: str | None, params: Mapping[str, str]) -> bytes:
    """The encoded key a request names: `path_key` for a one-column key, else one parameter per column.
    A value is the text a URL carries, read as the column's type (INT and FLOAT as numbers, BOOL as
    true/false, BYTES as hex, TIMESTAMP as ISO-8601). A windowed table's key may leave out the window's
    bounds: every window of a key lives where the key does (the partition hash leaves them out)."""
    columns = table.key_columns
    windowed = window_suffix(columns) > 0
    plain = columns[:-2] if windowed else columns
    if path_key is not None:
        if len(plain) != 1:
            names = ", ".join(c.name for c in columns)
            raise KeyLocationError(
                f"{table.name} has a compound key ({names}): name each column, "
                f"/v1/tables/{table.name}/keys?{'&'.join(f'{c.name}=...' for c in columns)}"
            )
        texts = {plain[0].name: path_key}
    else:
        texts = dict(params)
    unknown = sorted(set(texts) - {c.name for c in columns})
    if unknown:
        raise KeyLocationError(
            f"not key columns of {table.name}: {', '.join(unknown)} "
            f"(key: {', '.join(c.name for c in columns)})"
        )
    parts = []
    for column in columns:
        text = texts.get(column.name)
        if text is None and windowed and column not in plain:
            parts.append(key_component(column, _ANY_INSTANT))  # not hashed: any bound will do
            continue
        if text is None:
            raise KeyLocationError(f"key column {column.name!r} of {table.name} is missing")
        try:
            parts.append(key_component(column, _typed(column, text)))
        except InvalidKeyValueError as error:
            raise KeyLocationError(str(error)) from None
    return b"".join(parts)


_ANY_INSTANT = dt.datetime(1970, 1, 1)


def locate(
    image: MetadataImage,
    table: TableInfo,
    key: bytes,
    *,
    lags: LagTable,
    alive: Callable[[int], bool],
) -> dict[str, Any]:
    """Which partition holds `key`, and who holds that partition, as this server sees it now."""
    partition = partition_for(key, table.partitions, window_suffix(table.key_columns))
    parts = image.partitions.get(table.table_id, ())
    part = parts[partition] if partition < len(parts) else None

    def holder(node_id: int) -> dict[str, Any]:
        server = image.servers.get(node_id)
        http = server.http if server is not None else None
        known = lags.lag(node_id, table.table_id, partition)
        return {
            "server": node_id,
            "http": None if http is None else f"{http.host}:{http.port}",
            "rack": None if server is None else server.rack,
            "alive": alive(node_id),
            "state": None if known is None else known.state,
            "offset_lag": None if known is None else known.offset_lag,
        }

    return {
        "table": table.name,
        "partition": partition,
        "active": None if part is None or part.active is None else holder(part.active),
        "standbys": [] if part is None else [holder(n) for n in part.standbys],
        "warmups": [] if part is None else [holder(n) for n in part.warmups],
        "leader_epoch": None if part is None else part.leader_epoch,
        "in_sync": [] if part is None else list(part.isr),
    }


def _typed(column: KeyColumn, text: str) -> KeyValue:
    """A URL's text as a value of the column's type; the text itself where it does not read as one (the
    key encoder then names the column and the type it wants)."""
    kind = column.type
    try:
        if kind is KeyType.INT:
            return int(text)
        if kind is KeyType.FLOAT:
            return float(text)
        if kind is KeyType.BOOL:
            lowered = text.lower()
            return {"true": True, "false": False}.get(lowered, text)
        if kind is KeyType.BYTES:
            return bytes.fromhex(text)
    except (ValueError, binascii.Error):
        raise KeyLocationError(
            f"key column {column.name!r} is {KEY_SQL_TYPES[kind]}: {text!r} does not read as one"
        ) from None
    return text

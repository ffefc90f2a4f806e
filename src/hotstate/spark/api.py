"""`materialize`: keep a streaming DataFrame's result table in a hotstate cluster."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming.query import StreamingQuery

from hotstate.protocol.ttl import checked_ttl
from hotstate.spark.sink import (
    ENV_RACK,
    AfterWrite,
    batch_function,
    config_for_schema,
    delete_marker,
    without_column,
)
from hotstate.spark.table import TableDefinition, ensure_table
from hotstate.spark.windows import table_columns
from hotstate.tls import PemTexts, TlsFilesError

__all__ = ["last_batch", "materialize", "parse_cluster", "writer_rack"]

RACK_CONF = "spark.hotstate.rack"
ENV_CLUSTER = "HOTSTATE_CLUSTER"
ENV_CLUSTER_ID = "HOTSTATE_CLUSTER_ID"
ENV_SECRET = "HOTSTATE_CLUSTER_SECRET"
ENV_CA = "HOTSTATE_CLUSTER_CA"
ENV_CERT = "HOTSTATE_CLUSTER_CERT"
ENV_KEY = "HOTSTATE_CLUSTER_KEY"

Cluster = str | Sequence[str | tuple[str, int]]  # "h:p,h:p", or a list of "h:p" and (h, p) items
Trigger = str | Mapping[str, Any]


def materialize(
    df: DataFrame,
    table: str,
    key: str | Sequence[str],
    partitions: int,
    standby_replicas: int = 1,
    acceptable_lag: int | None = None,
    cluster: Cluster | None = None,
    checkpoint: str | None = None,
    trigger: Trigger | None = None,
    *,
    cluster_id: str | None = None,
    secret: str | None = None,
    tls_ca: str | os.PathLike[str] | None = None,
    tls_cert: str | os.PathLike[str] | None = None,
    tls_key: str | os.PathLike[str] | None = None,
    write_deadline_s: float = 60.0,
    query_name: str | None = None,
    delete_column: str | None = None,
    delete_when: tuple[str, bool | int | str] | None = None,
    retention: str | None = None,
    ttl: str | None = None,
    ttl_column: str | None = None,
    _after_write: AfterWrite | None = None,
) -> StreamingQuery:
    """Start a streaming query that keeps `df`'s result table in the hotstate table `table`.

    `df` is a streaming DataFrame; each micro-batch's changed rows (output mode "update") are upserted by
    `key` (a column name or several), executors sending straight to the partitions' actives. The table is
    created with `partitions`, `standby_replicas` and `acceptable_lag` if it does not exist; if it exists
    with the same definition it is used, else this raises TableDefinitionError showing both.

    `cluster`: RPC addresses, "host:port,host:port" or a sequence of "host:port" / (host, port) (default:
    env HOTSTATE_CLUSTER). `cluster_id` and `secret` default to env HOTSTATE_CLUSTER_ID and
    HOTSTATE_CLUSTER_SECRET. `tls_ca`: the CA certificate file (PEM) of servers whose RPC port uses TLS
    (default: env HOTSTATE_CLUSTER_CA); the driver reads it and the executors get its text, and every
    server's certificate and host name are checked. `tls_cert` and `tls_key`: a client certificate from
    the cluster's CA and its key, for servers that require one (rpc.tls.client.auth=required; default:
    env HOTSTATE_CLUSTER_CERT and HOTSTATE_CLUSTER_KEY), shipped to the executors the same way.
    `checkpoint`: the query's checkpoint directory
    (required: it is what lets a restarted query resume without losing or repeating a batch). `trigger`:
    None (as fast as possible), a processing-time interval like "5 seconds", or keyword arguments of
    DataStreamWriter.trigger such as {"availableNow": True}. `write_deadline_s`: how long one task keeps
    retrying before its batch fails. The writers' rack comes from the Spark conf spark.hotstate.rack, else
    env HOTSTATE_RACK.

    Deletes: `delete_column` names a boolean column; a row where it is true deletes its key (a null or
    false upserts the row), and the column itself is never stored. `delete_when=(column, value)` does the
    same for rows whose column equals `value` (a CDC feed's `op` column: `("op", "d")`; a str value needs a
    string column, an int an integer one, a bool a boolean one). A column that is missing, a key column or
    of another type is a DeleteColumnError naming it and its type, raised here, before the table is
    created or anything written.

    Windowed tables: a key column may be Spark's `window(...)` / `session_window(...)` struct; it is
    stored as the key columns WINDOWSTART and WINDOWEND, after the other keys (docs/spark.md).
    `retention`: for such a table, an interval such as "2 hours": windows that ended longer than that
    before the newest window end in their partition are deleted by the actives, a page at a time, and the
    deletes replicated. Set when the table is created (a later job's retention does not change it).

    TTL (plain tables): `ttl`, a duration such as "7d", "12h" or "30 minutes": a row is deleted once that
    long has passed since its `ttl_column` (a timestamp column, key or value), or, without one, since it
    was last written; the actives delete expired rows a page at a time and the deletes are replicated
    (docs/operations.md, "Expiry"). Set when the table is created. A bad duration, a windowed table
    (use `retention`), or a column that is missing or not a timestamp is a ValueError raised here.
    """
    if not df.isStreaming:
        raise ValueError("materialize needs a streaming DataFrame (spark.readStream...)")
    if checkpoint is None:
        raise ValueError("checkpoint: give the streaming query a checkpoint directory")
    servers = parse_cluster(cluster if cluster is not None else os.environ.get(ENV_CLUSTER))
    cluster_id = cluster_id or os.environ.get(ENV_CLUSTER_ID)
    secret = secret or os.environ.get(ENV_SECRET)
    if not cluster_id or not secret:
        raise ValueError(
            f"the cluster's id and secret are needed: pass cluster_id= and secret= or set {ENV_CLUSTER_ID} "
            f"and {ENV_SECRET}"
        )
    material = tls_texts(tls_ca, tls_cert, tls_key)
    tls = material.context()
    marker = delete_marker(df.schema, key, delete_column, delete_when)
    stored = without_column(df.schema, marker)
    key_columns, value_columns, window = table_columns(df, stored, key, retention)
    table_ttl = checked_ttl(ttl, ttl_column, key_columns, window, value_columns)
    definition = TableDefinition(
        table, partitions, standby_replicas, key_columns, acceptable_lag, window, table_ttl
    )
    rack = writer_rack(df.sparkSession)
    ensure_table(
        servers,
        cluster_id,
        secret,
        definition,
        rack=rack,
        values=value_columns,
        tls=tls,
    )
    config = config_for_schema(
        df.schema,
        servers=servers,
        table=table,
        cluster_id=cluster_id,
        secret=secret,
        rack=rack,
        deadline_s=write_deadline_s,
        tls=material,
        deletes=marker,
        window=None if window is None else window.column,
    )
    writer = (
        df.writeStream.outputMode("update")
        .foreachBatch(batch_function(config, _after_write))
        .option("checkpointLocation", checkpoint)
    )
    if query_name is not None:
        writer = writer.queryName(query_name)
    if isinstance(trigger, str):
        writer = writer.trigger(processingTime=trigger)
    elif trigger is not None:
        writer = writer.trigger(**trigger)
    return writer.start()


def tls_texts(
    ca: str | os.PathLike[str] | None,
    cert: str | os.PathLike[str] | None,
    key: str | os.PathLike[str] | None,
) -> PemTexts:
    """The sink's TLS files (else env HOTSTATE_CLUSTER_CA, _CERT, _KEY) read as text on the driver; a bad
    one is a ValueError naming it."""
    ca = ca if ca is not None else os.environ.get(ENV_CA) or None
    cert = cert if cert is not None else os.environ.get(ENV_CERT) or None
    key = key if key is not None else os.environ.get(ENV_KEY) or None
    try:
        return PemTexts.read(ca, cert, key)
    except TlsFilesError as error:
        raise ValueError(f"the sink's TLS files: {error}") from None


def last_batch(query: StreamingQuery) -> int | None:
    """The id of the last micro-batch `query` (from `materialize`) completed, None before the first.

    The sink records each batch in the cluster before Spark completes it, so a pull query with
    `min_batch=last_batch(query)` sees everything that batch and all before it wrote:

        query.processAllAvailable()
        client.query("SELECT ...", min_batch=hotstate.spark.last_batch(query))
    """
    progress = query.lastProgress
    if progress is None:
        return None
    batch_id = progress["batchId"]
    return int(batch_id) if batch_id is not None else None


def writer_rack(spark: SparkSession) -> str | None:
    """The rack the sink reports with the table's writers: spark.hotstate.rack, else env HOTSTATE_RACK."""
    rack = spark.conf.get(RACK_CONF, None) or os.environ.get(ENV_RACK) or ""
    return rack.strip() or None


def parse_cluster(cluster: Cluster | None) -> tuple[tuple[str, int], ...]:
    """RPC addresses from "h:p,h:p", ["h:p", ...] or [(h, p), ...]."""
    if cluster is None:
        raise ValueError(f'cluster: give the servers\' RPC addresses ("host:port,...") or set {ENV_CLUSTER}')
    items: Sequence[str | tuple[str, int]] = cluster.split(",") if isinstance(cluster, str) else cluster
    out = []
    for item in items:
        if isinstance(item, str):
            host, sep, port = item.strip().rpartition(":")
            if not sep or not host or not port.isdigit():
                raise ValueError(f"cluster: {item.strip()!r} is not host:port")
            out.append((host.strip("[]"), int(port)))
        else:
            out.append((str(item[0]), int(item[1])))
    if not out:
        raise ValueError("cluster: no server addresses")
    return tuple(out)

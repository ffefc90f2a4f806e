"""`df.write.format("hotstate").mode("overwrite")`: replace a table atomically, through a new generation.

On the driver, before any task runs, `begin_overwrite` asks the controller to stage a new, empty generation
of the table (StageTableRequest): a table of its own, placed like the table, under a hidden name
(`table#<id>`), while the table keeps serving its current generation. An overwrite whose key columns
differ from the table's is refused there, before anything is written. The tasks load the rows into the
staged generation with the sink's writer (acks=all, retried tasks upsert the same rows again); once
every task succeeded, `finish_overwrite` asks for the swap: one metadata record (ReplaceTable) makes the
staged generation the table and drops the old one, with where the load ended in every partition (the
tasks' consistency tokens merged): no replica serves the new generation from a store short of that. Each
pull query is planned against one generation and reads only that generation's replicas
(PartitionQueryRequest.table_id), so it sees the old table or the new one in full, never a mix.

A failed load leaves the old generation serving: Spark's abort (a task failed for good) drops the staged
generation at once (`abandon_overwrite`); a driver that dies leaves it to the controller, which drops it
when the table is overwritten again or deleted, or staged_timeout_ms (6 h) after it first saw it.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Sequence
from dataclasses import dataclass

from hotstate.client.admin import AdminClient
from hotstate.controller.records import ValueColumn
from hotstate.controller.requests import ControllerError
from hotstate.query.tokens import cluster_tag, decode, merge
from hotstate.spark.table import TableDefinition, TableDefinitionError

__all__ = ["Overwrite", "OverwriteError", "abandon_overwrite", "begin_overwrite", "finish_overwrite"]

log = logging.getLogger(__name__)


class OverwriteError(Exception):
    """The staged generation could not be swapped in: the table still serves its old generation."""


@dataclass(frozen=True, slots=True)
class Overwrite:
    """An overwrite under way: the staged generation the tasks load, and the table it will replace."""

    table: str
    table_id: int  # the staged generation's
    staging_name: str  # what the tasks write to
    replaced_id: int  # the generation being replaced (-1: the table does not exist yet)


@dataclass(frozen=True, slots=True)
class Cluster:
    """How the driver reaches the controller (picklable: Spark ships the writer to its commit)."""

    servers: tuple[tuple[str, int], ...]
    cluster_id: str
    secret: str


def begin_overwrite(
    cluster: Cluster,
    wanted: TableDefinition,
    *,
    rack: str | None,
    values: tuple[ValueColumn, ...],
    tls: ssl.SSLContext | None,
) -> Overwrite:
    """Stage a new generation of `wanted.name` for an overwrite; TableDefinitionError when the controller
    refuses it (other key columns than the table's, a bad definition), before anything is written."""

    async def stage() -> Overwrite:
        async with _admin(cluster, tls) as admin:
            reply = await admin.stage_table(wanted.name, **wanted.request_fields(rack))
            if reply.error is not ControllerError.NONE:
                raise TableDefinitionError(
                    f"cannot overwrite table {wanted.name!r}: {reply.error.name}: {reply.message}"
                )
            if values:
                # Swapped in with the generation: readers type the new table's answers by them.
                declared = await admin.set_value_columns(reply.staging_name, values)
                if declared.error is not ControllerError.NONE:
                    log.warning("overwrite of %r: value columns not recorded: %s", wanted.name, declared)
            return Overwrite(wanted.name, reply.table_id, reply.staging_name, reply.replaced_id)

    overwrite = asyncio.run(stage())
    log.info(
        "overwrite of table %r: loading generation %d (replaces %d)",
        overwrite.table,
        overwrite.table_id,
        overwrite.replaced_id,
    )
    return overwrite


def finish_overwrite(
    cluster: Cluster, overwrite: Overwrite, tls: ssl.SSLContext | None, tokens: Sequence[str] = ()
) -> None:
    """Swap the loaded generation in (one metadata record); OverwriteError if it was dropped meanwhile.

    `tokens`: the tasks' consistency tokens. Where they end becomes the least store position a replica
    serves the new generation from, so no query reads it before a store holds all of the load."""
    positions = merge(*(decode(token, cluster_tag(cluster.cluster_id)) for token in tokens if token))
    pairs = tuple(
        sorted((p, at) for (table_id, p), at in positions.items() if table_id == overwrite.table_id)
    )

    async def swap() -> None:
        async with _admin(cluster, tls) as admin:
            reply = await admin.replace_table(overwrite.table, overwrite.table_id, pairs)
        if reply.error is not ControllerError.NONE:
            raise OverwriteError(
                f"overwrite of table {overwrite.table!r} loaded but not swapped in: {reply.error.name}: "
                f"{reply.message}"
            )

    asyncio.run(swap())
    log.info("overwrite of table %r: generation %d serves", overwrite.table, overwrite.table_id)


def abandon_overwrite(cluster: Cluster, overwrite: Overwrite, tls: ssl.SSLContext | None) -> None:
    """Drop the staged generation of a failed load (the table keeps its old one). Best effort: what is
    left behind the controller drops later (the module's docstring says when)."""

    async def drop() -> None:
        async with _admin(cluster, tls) as admin:
            reply = await admin.delete_table(overwrite.staging_name)
        if reply.error not in (ControllerError.NONE, ControllerError.UNKNOWN_TABLE):
            log.warning(
                "overwrite of %r: generation %d not dropped: %s", overwrite.table, overwrite.table_id, reply
            )

    try:
        asyncio.run(drop())
    except Exception as error:
        log.warning(
            "overwrite of %r failed; its generation %d is left to the controller to drop: %s",
            overwrite.table,
            overwrite.table_id,
            error,
        )


def _admin(cluster: Cluster, tls: ssl.SSLContext | None) -> AdminClient:
    servers: Sequence[tuple[str, int]] = cluster.servers
    return AdminClient(servers, cluster_id=cluster.cluster_id, secret=cluster.secret, tls=tls)

"""Local reads: one partition answered from this server's replica, or refused; never forwarded.

Both the coordinator (for the partitions it reads here) and the RPC handler of `QueryPartitionsRequest`
(for a peer's coordinator) read through `LocalReads`. The replica's own server judges its lag against the
query's bound and its position against the query's token, so a replica without a lag report yet at the
coordinator is judged where its data is.

A read never opens, closes or rebuilds a store: a store that fails under it is reported through
`on_store_failure` and the partition is refused; the replica manager decides what becomes of the replica.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping

from hotstate.controller.image import MetadataImage
from hotstate.protocol.replica_state import ReplicaState
from hotstate.query.execute import MAX_ROWS
from hotstate.replica.messages import (
    PartitionQueryRequest,
    PartitionQueryResponse,
    QueryPartitionsRequest,
    QueryPartitionsResponse,
    ReplicaError,
)
from hotstate.replica.store import StoreError
from hotstate.routing.freshness import END_UNKNOWN, bound_refusal, served_lag, token_refusal
from hotstate.routing.lags import LagTable
from hotstate.server.replicas import LocalReplica, replica_state

log = logging.getLogger(__name__)

# What a local replica serves: (state, position, offset lag, items).
LocalRead = tuple[ReplicaState, int, int, tuple[tuple[bytes, bytes], ...]]


class LocalReads:
    def __init__(
        self,
        node_id: int,
        *,
        image: Callable[[], MetadataImage],
        replicas: Callable[[], Mapping[tuple[int, int], LocalReplica]],
        lags: LagTable,
        on_store_failure: Callable[[LocalReplica, StoreError], None],
    ) -> None:
        """`replicas`: this server's replicas by (table id, partition) now (none on a server that holds
        none); `on_store_failure`: told of a store that failed under a read, after the read refused."""
        self.node_id = node_id
        self._image = image
        self._replicas = replicas
        self._lags = lags
        self._on_store_failure = on_store_failure

    def serve_partitions(self, request: QueryPartitionsRequest) -> QueryPartitionsResponse:
        """Answer a coordinator's partitions from this server's replicas, each on its own."""
        if log.isEnabledFor(logging.DEBUG):
            parts = ", ".join(f"{p.table}/{p.partition}" for p in request.parts)
            log.debug("forwarded partition query for user %r: %s", request.user or "-", parts)
        return QueryPartitionsResponse(tuple(self.serve(part) for part in request.parts))

    def serve(self, request: PartitionQueryRequest) -> PartitionQueryResponse:
        """Answer one partition from this server's replica, or refuse."""
        read = self.read(request)
        if isinstance(read, PartitionQueryResponse):
            return read
        state, position, offset_lag, items = read
        return PartitionQueryResponse(ReplicaError.NONE, "", state, position, offset_lag, items)

    def read(self, request: PartitionQueryRequest) -> PartitionQueryResponse | LocalRead:
        """`serve`'s answer: its refusal, or what it serves as (state, position, offset lag, items), which
        the coordinator takes as it is for its own partitions (no message object in between)."""
        table_id = request.table_id
        if table_id < 0:
            table = self._image().tables.get(request.table)
            if table is None:
                return PartitionQueryResponse(ReplicaError.UNKNOWN_TABLE, f"no table {request.table!r} here")
            table_id = table.table_id
        # By the generation the query was planned against, whatever this server's image calls the name
        # now: during an overwrite's swap the old generation's replica serves until this server drops it,
        # and the new one's (staged under another name) from before this server hears of the swap.
        replica = self._replicas().get((table_id, request.partition))
        if replica is None:
            return PartitionQueryResponse(
                ReplicaError.UNKNOWN_PARTITION,
                f"server {self.node_id} holds no replica of it (generation {table_id} of the table)",
            )
        lag = served_lag(replica.core, replica.witness, self._lags, self.node_id)
        state, position = replica_state(replica), replica.core.position
        offset_lag = END_UNKNOWN if lag is None else lag
        refusal = bound_refusal(request.max_lag, lag)
        if refusal is not None:
            return PartitionQueryResponse(ReplicaError.LAG_OVER_BOUND, refusal, state, position, offset_lag)
        behind = token_refusal(replica.core, request.min_position)
        if behind is not None:
            return PartitionQueryResponse(*behind, state, position)
        store = replica.store
        items: tuple[tuple[bytes, bytes], ...]
        try:
            if request.scan:
                limit = MAX_ROWS + 1 if request.limit is None else min(request.limit, MAX_ROWS + 1)
                items = tuple(store.scan(request.start, request.end, limit=limit))
            elif len(request.keys) == 1:
                [key] = request.keys
                value = store.get(key)
                items = () if value is None else ((key, value),)
            else:
                values = store.get_many(request.keys)
                if None in values:
                    items = tuple((k, v) for k, v in zip(request.keys, values, strict=True) if v is not None)
                else:  # every key found (the common case): paired in C
                    items = tuple(zip(request.keys, values, strict=True))  # type: ignore[arg-type]
        except StoreError as error:
            # A damaged block or a failing disk: never a partial answer.
            self._on_store_failure(replica, error)
            return PartitionQueryResponse(
                ReplicaError.UNKNOWN_PARTITION, f"server {self.node_id}'s replica of it failed: {error}"
            )
        return state, position, offset_lag, items

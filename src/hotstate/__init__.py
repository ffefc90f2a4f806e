"""hotstate: highly available, queryable materialized tables for PySpark Structured Streaming."""

from __future__ import annotations

from typing import TYPE_CHECKING

__version__ = "0.1.0"

__all__ = [
    "AsyncClient",
    "Client",
    "ClusterUnreachable",
    "QueryFailed",
    "QueryResult",
    "Unavailable",
    "__version__",
]

if TYPE_CHECKING:
    from hotstate.client.query import (
        AsyncClient,
        Client,
        ClusterUnreachable,
        QueryFailed,
        QueryResult,
        Unavailable,
    )

# Importing httpx costs about 0.3 s, and every server, simulator and CLI process imports this package:
# the query client loads on first use of hotstate.Client and friends.
_LAZY = frozenset(
    {"AsyncClient", "Client", "ClusterUnreachable", "QueryFailed", "QueryResult", "Unavailable"}
)


def __getattr__(name: str) -> object:
    if name in _LAZY:
        from hotstate.client import query

        return getattr(query, name)
    raise AttributeError(f"module 'hotstate' has no attribute {name!r}")

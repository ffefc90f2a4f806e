"""What the HTTP query API's servers and clients agree on beyond the JSON shapes (docs/queries.md)."""

from __future__ import annotations

from typing import Final

__all__ = ["DEFAULT_QUERY_TIMEOUT_MS", "SERVER_NOT_READY"]

# A query without timeout_ms gets this long on the server; a client waits that long plus its slack.
DEFAULT_QUERY_TIMEOUT_MS: Final = 10_000
# The error code of a 503 from a server that has just started and whose metadata has not caught up with
# the cluster's (ksqlDB's ERROR_CODE_SERVER_NOT_READY): retriable, ask another server.
SERVER_NOT_READY: Final = 50302

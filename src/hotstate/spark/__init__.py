"""The PySpark side: `materialize(df, table, key, ...)` keeps a streaming query's result in a table.

import hotstate.spark as hs
query = hs.materialize(counts, table="clicks_per_user", key="user", partitions=8, standby_replicas=1,
                       cluster="127.0.0.1:9001,127.0.0.1:9002", checkpoint="chk/clicks",
                       cluster_id="...", secret="...")
"""

from __future__ import annotations

from hotstate.client.writer import WriteError
from hotstate.spark.api import last_batch, materialize, parse_cluster
from hotstate.spark.sink import BatchWriteError
from hotstate.spark.table import TableDefinitionError

__all__ = [
    "BatchWriteError",
    "TableDefinitionError",
    "WriteError",
    "last_batch",
    "materialize",
    "parse_cluster",
]

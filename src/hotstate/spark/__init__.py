"""The PySpark side: `materialize(df, table, key, ...)` keeps a streaming query's result in a table.

import hotstate.spark as hs
query = hs.materialize(counts, table="clicks_per_user", key="user", partitions=8, standby_replicas=1,
                       cluster="127.0.0.1:9001,127.0.0.1:9002", checkpoint="chk/clicks",
                       cluster_id="...", secret="...")

and `format("hotstate")` (spark/source.py), registered in the active session on import (else call
`hs.register(spark)`):

df = spark.read.format("hotstate").option("table", "clicks_per_user").option("servers", "h:8088").load()
counts.writeStream.format("hotstate").outputMode("complete").option("table", "t").option("key", "user")
    .option("partitions", 8).option("checkpointLocation", "chk/t").start()
features.write.format("hotstate").mode("overwrite").option("table", "t").option("key", "user")
    .option("partitions", 8).save()   # or mode("append"); overwrite swaps the table atomically
"""

from __future__ import annotations

from hotstate.client.writer import WriteError
from hotstate.spark.api import last_batch, materialize, parse_cluster
from hotstate.spark.overwrite import OverwriteError
from hotstate.spark.reading import HotstateReadError
from hotstate.spark.sink import BatchWriteError, DeleteColumnError
from hotstate.spark.source import OptionError, register
from hotstate.spark.table import TableDefinitionError

__all__ = [
    "BatchWriteError",
    "DeleteColumnError",
    "HotstateReadError",
    "OptionError",
    "OverwriteError",
    "TableDefinitionError",
    "WriteError",
    "last_batch",
    "materialize",
    "parse_cluster",
    "register",
]


def _register_in_active_session() -> None:
    from pyspark.sql import SparkSession

    if SparkSession.getActiveSession() is not None:
        register()


_register_in_active_session()

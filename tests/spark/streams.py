"""Helpers of the Spark tests: input files, the batch recomputation, the table read back."""

from __future__ import annotations

import itertools
import json
import os
import time
from pathlib import Path
from typing import Any

import hotstate

SCHEMA = "user STRING, n BIGINT"
_sequence = itertools.count()


def drop_file(directory: Path, events: list[dict[str, Any]]) -> None:
    """Write a JSON-lines file elsewhere, then rename it into the watched folder (the file source takes
    a file by its name, once)."""
    directory.mkdir(parents=True, exist_ok=True)
    name = f"part-{next(_sequence):06d}.json"
    staging = directory.parent / (directory.name + ".staging")
    staging.mkdir(exist_ok=True)
    path = staging / name
    path.write_text("".join(json.dumps(event) + "\n" for event in events))
    os.replace(path, directory / name)


def clicks(spark: Any, directory: Path) -> Any:
    """The streaming query under test: clicks, total and largest n per user."""
    from pyspark.sql import functions as F

    events = spark.readStream.schema(SCHEMA).json(str(directory))
    return events.groupBy("user").agg(
        F.count("*").alias("clicks"), F.sum("n").alias("total"), F.max("n").alias("largest")
    )


def recompute(spark: Any, directory: Path) -> dict[str, tuple[int, int, int]]:
    """The same aggregation as a batch job over the same files, collected on the driver."""
    from pyspark.sql import functions as F

    rows = (
        spark.read.schema(SCHEMA)
        .json(str(directory))
        .groupBy("user")
        .agg(F.count("*").alias("clicks"), F.sum("n").alias("total"), F.max("n").alias("largest"))
        .collect()
    )
    return {row["user"]: (row["clicks"], row["total"], row["largest"]) for row in rows}


def table(running: Any, name: str) -> dict[str, tuple[int, int, int]]:
    servers = [f"127.0.0.1:{s.http_port}" for s in running.cluster.servers]
    with hotstate.Client(servers, timeout_s=10.0) as client:
        result = client.query(f"SELECT * FROM {name}", max_lag=0)
    return {row["user"]: (row["clicks"], row["total"], row["largest"]) for row in result.dicts()}


def wait_equal(
    running: Any, name: str, expected: dict[str, tuple[int, int, int]], timeout_s: float = 15.0
) -> dict[str, tuple[int, int, int]] | None:
    """The table as read back, once it equals `expected` (replicas apply up to the HW a moment after
    the ack), or whatever it holds at the timeout."""
    end = time.monotonic() + timeout_s
    while True:
        try:
            got = table(running, name)
        except Exception:
            got = None
        if got == expected or time.monotonic() > end:
            return got
        time.sleep(0.2)

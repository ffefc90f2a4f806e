"""The Spark sink against a cluster with TLS: materialize(tls_ca=...) writes from the executors over TLS
(the executors get the CA's text, not its path), and the table reads back equal to a batch recomputation."""

from __future__ import annotations

from pathlib import Path

import pytest

import hotstate
import hotstate.spark as hs
from spark.streams import SCHEMA, drop_file, recompute

pytestmark = pytest.mark.xdist_group("spark")


def test_materialize_writes_over_tls_with_the_ca_from_the_driver(
    spark, start_cluster, tmp_path: Path
) -> None:
    running = start_cluster(1, tls=True)
    cluster = running.cluster
    assert cluster.tls is not None
    source = tmp_path / "in"
    drop_file(source, [{"user": f"u{i % 7}", "n": i} for i in range(50)])
    from pyspark.sql import functions as F

    df = (
        spark.readStream.schema(SCHEMA)
        .json(str(source))
        .groupBy("user")
        .agg(F.count("*").alias("clicks"), F.sum("n").alias("total"), F.max("n").alias("largest"))
    )
    rpc = ",".join(f"{host}:{port}" for host, port in cluster.addresses())
    with pytest.raises(ValueError, match=r"tls_ca '.*nowhere\.crt': not a readable PEM CA certificate"):
        hs.materialize(
            df,
            "clicks",
            "user",
            2,
            0,
            cluster=rpc,
            checkpoint=str(tmp_path / "x"),
            cluster_id=cluster.cluster_id,
            secret=cluster.secret,
            tls_ca=str(tmp_path / "nowhere.crt"),
        )
    query = hs.materialize(
        df,
        "clicks",
        "user",
        2,
        0,
        cluster=rpc,
        checkpoint=str(tmp_path / "chk"),
        cluster_id=cluster.cluster_id,
        secret=cluster.secret,
        tls_ca=str(cluster.tls.ca_file),
    )
    try:
        query.processAllAvailable()
        assert query.exception() is None
    finally:
        query.stop()
    with hotstate.Client(cluster.http_addresses(), tls=cluster.tls.ca_file) as client:
        rows = client.query("SELECT * FROM clicks", max_lag=0).dicts()
    got = {row["user"]: (row["clicks"], row["total"], row["largest"]) for row in rows}
    assert got == recompute(spark, source) and len(got) == 7

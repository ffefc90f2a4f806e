"""The Spark sink against a cluster with TLS that requires client certificates on RPC: materialize(tls_ca=,
tls_cert=, tls_key=) and the `hotstate` write format (tlsCa, tlsCert, tlsKey) write from the executors
over mutual TLS (the executors get the files' text, not their paths), and the table reads back equal to a
batch recomputation."""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import SparkSession

import hotstate
import hotstate.spark as hs
from cluster.conftest import StartCluster
from spark.streams import SCHEMA, drop_file, recompute

pytestmark = pytest.mark.xdist_group("spark")


def test_materialize_writes_over_tls_with_the_ca_from_the_driver(
    spark: SparkSession, start_cluster: StartCluster, tmp_path: Path
) -> None:
    running = start_cluster(1, tls=True, client_auth=True)
    cluster = running.cluster
    assert cluster.tls is not None
    cert, key = cluster.tls.client_files()
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
    with pytest.raises(ValueError, match=r"the sink's TLS files: '.*nowhere\.crt': not a readable PEM file"):
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
        tls_cert=str(cert),
        tls_key=str(key),
    )
    try:
        query.processAllAvailable()
        assert query.exception() is None
    finally:
        query.stop()
    # The write format, the same way (complete mode: Spark's Python stream writers take no update mode).
    hs.register(spark)
    written = (
        df.writeStream.format("hotstate")
        .outputMode("complete")
        .options(table="clicks2", key="user", partitions=2, standbyReplicas=0, cluster=rpc)
        .options(clusterId=cluster.cluster_id, secret=cluster.secret, tlsCa=str(cluster.tls.ca_file))
        .options(tlsCert=str(cert), tlsKey=str(key))
        .option("checkpointLocation", str(tmp_path / "chk2"))
        .start()
    )
    try:
        written.processAllAvailable()
        assert written.exception() is None
    finally:
        written.stop()
    with hotstate.Client(cluster.http_addresses(), tls=cluster.tls.ca_file) as client:
        rows = client.query("SELECT * FROM clicks", max_lag=0).dicts()
        rows2 = client.query("SELECT * FROM clicks2", max_lag=0).dicts()
    got = {row["user"]: (row["clicks"], row["total"], row["largest"]) for row in rows}
    assert got == recompute(spark, source) and len(got) == 7
    assert {row["user"]: (row["clicks"], row["total"], row["largest"]) for row in rows2} == got

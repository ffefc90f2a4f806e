"""The driver of tests/spark/test_standalone.py, as its own process (one SparkContext per process: the
tests' shared local session cannot also talk to a standalone master).

    python standalone_driver.py SPEC.json

SPEC: master (spark://...), source, checkpoint, table (and table + "_format", the same query written
with `format("hotstate")`), cluster ("h:p,..."), cluster_id, secret, and a
directory `control` where this writes `progress.json` (the last completed batch, after each) and reads
`stop`: once it appears, the query processes what is left, the driver recomputes the aggregation as a
batch job on the same cluster and writes `result.json` ({"expected": ..., "last_batch": ...}), then
exits. Any error ends in `result.json` too ({"error": ...}).

`hold`: when the test creates it, the first task that has written rows (acked by the cluster) takes it
(renamed; `held` then holds that executor's rack and batch) and sleeps, its batch not committed: the test
kills that executor with SIGKILL there, mid-batch."""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the tests' `spark.streams`


def main(spec_path: str) -> None:
    spec = json.loads(Path(spec_path).read_text())
    control = Path(spec["control"])
    try:
        run(spec, control)
    except BaseException:
        _write(control / "result.json", {"error": traceback.format_exc()})
        raise


def run(spec: dict[str, str], control: Path) -> None:
    import hotstate.spark as hs
    from hotstate.spark.pipeline import build_session
    from spark.streams import clicks, recompute

    spark, _ = build_session(
        spec["master"],
        2,
        app_name="hotstate-standalone-test",
        conf={
            "spark.executor.memory": "512m",
            "spark.executor.cores": "1",
            "spark.cores.max": "2",
            "spark.default.parallelism": "2",
            # A task goes to whichever executor is free, not after a wait for the one holding its input:
            # both executors write for both queries (their racks are what the test looks for).
            "spark.locality.wait": "0",
            "spark.sql.warehouse.dir": str(control / "warehouse"),
        },
        java_options="-XX:TieredStopAtLevel=1 -XX:+UseSerialGC",
    )
    source = Path(spec["source"])
    hold, held = str(control / "hold"), str(control / "held")

    def hold_after_write(batch_id: int, partition: int, written: int) -> None:  # on the executor
        import json
        import os
        import time

        if written == 0:
            return
        try:
            os.rename(hold, hold + ".taken")  # one task takes it
        except OSError:
            return
        with open(held + ".tmp", "w") as out:
            json.dump({"rack": os.environ.get("HOTSTATE_RACK"), "batch": batch_id, "pid": os.getpid()}, out)
        os.replace(held + ".tmp", held)
        time.sleep(120)

    query = hs.materialize(
        clicks(spark, source),
        spec["table"],
        key="user",
        partitions=6,
        standby_replicas=1,
        cluster=spec["cluster"],
        checkpoint=spec["checkpoint"],
        cluster_id=spec["cluster_id"],
        secret=spec["secret"],
        trigger="0.3 seconds",
        write_deadline_s=30.0,
        _after_write=hold_after_write,
    )
    # The same aggregation through Spark's own API (the Python data source's stream writer: its tasks run
    # on the executors too, and its commit on the driver's side).
    hs.register(spark)
    written = (
        clicks(spark, source)
        .writeStream.format("hotstate")
        .outputMode("complete")
        .option("table", spec["table"] + "_format")
        .option("key", "user")
        .option("partitions", 2)
        .option("cluster", spec["cluster"])
        .option("clusterId", spec["cluster_id"])
        .option("secret", spec["secret"])
        .option("checkpointLocation", spec["checkpoint"] + "_format")
        .trigger(processingTime="1 second")
        .start()
    )
    try:
        while not (control / "stop").exists():
            for running in (query, written):
                if running.exception() is not None:
                    raise RuntimeError(f"a query failed: {running.exception()}")
            _write(control / "progress.json", {"last_batch": hs.last_batch(query)})
            time.sleep(0.2)
        query.processAllAvailable()
        written.processAllAvailable()
        expected = recompute(spark, source)
        _write(control / "result.json", {"expected": expected, "last_batch": hs.last_batch(query)})
    finally:
        query.stop()
        written.stop()
        spark.stop()


def _write(path: Path, data: object) -> None:
    staging = path.with_suffix(".tmp")
    staging.write_text(json.dumps(data))
    os.replace(staging, path)


if __name__ == "__main__":
    main(sys.argv[1])

"""materialize() on a real Spark cluster: a standalone master and two workers (1 core each, racks az-a
and az-b, two of the hotstate servers' three), the driver in its own process, executors as separate JVMs
with their own Python workers.

The same aggregation is written by materialize() and by `format("hotstate")`. Exactly-once across a
SIGKILL of an executor in the middle of a batch (after its task's rows were acked, before the batch was
committed) and of a hotstate server while the stream runs: both tables end equal to the batch
recomputation. Each executor's rack (env HOTSTATE_RACK of its worker) reaches the table's
writer racks, where the assignor places actives near them."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import hotstate
from cluster.conftest import StartCluster
from spark.standalone import StandaloneSpark
from spark.streams import drop_file, wait_equal

# Spark JVMs (not the shared local session: this test's driver is its own process).
pytestmark = pytest.mark.spark

DRIVER = Path(__file__).with_name("standalone_driver.py")
RACKS = ["az-a", "az-b"]


@pytest.fixture
def standalone(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[StandaloneSpark]:
    spark = StandaloneSpark(tmp_path / "spark")
    try:
        spark.start(RACKS)
        yield spark
    finally:
        failed = getattr(request.node, "rep_call", None)
        if failed is not None and failed.failed:
            print(spark.logs())
        spark.stop()


def _round(source: Path, round_: int, size: int = 150) -> None:
    """Users seen in this round only (u<round>-*) and users seen in every round (s*)."""
    events = [{"user": f"u{round_}-{i % 20}", "n": i} for i in range(size // 3)]
    events += [
        {"user": f"s{(i * 7 + round_) % 60}", "n": round_ * 1000 + i} for i in range(size - len(events))
    ]
    drop_file(source, events)


def _wait(
    what: str, ready: Callable[[], Any], driver: subprocess.Popen[bytes], control: Path, timeout_s: float
) -> Any:
    start = time.monotonic()
    end = start + timeout_s
    while True:
        found = ready()
        if found:
            print(f"{what}: after {time.monotonic() - start:.1f} s")  # shown when the test fails
            return found
        result = control / "result.json"
        if result.exists() and "error" in json.loads(result.read_text()):
            raise AssertionError(f"the driver failed: {json.loads(result.read_text())['error']}")
        assert driver.poll() is None, f"the driver exited ({driver.returncode}) waiting for {what}"
        assert time.monotonic() < end, f"no {what} in {timeout_s} s"
        time.sleep(0.1)


def test_exactly_once_on_a_standalone_cluster_across_kill_9_of_an_executor_and_a_server(
    start_cluster: StartCluster, standalone: StandaloneSpark, tmp_path: Path
) -> None:
    running = start_cluster(3)
    cluster = running.cluster
    source, control = tmp_path / "in", tmp_path / "control"
    control.mkdir()
    _round(source, 0)
    spec = {
        "master": standalone.master_url,
        "source": str(source),
        "checkpoint": str(tmp_path / "chk"),
        "table": "clicks",
        "cluster": ",".join(f"{h}:{p}" for h, p in cluster.addresses()),
        "cluster_id": cluster.cluster_id,
        "secret": cluster.secret,
        "control": str(control),
    }
    (tmp_path / "spec.json").write_text(json.dumps(spec))
    env = {k: v for k, v in os.environ.items() if k != "HOTSTATE_RACK"}  # the driver has no rack
    driver_log = tmp_path / "driver.log"
    with driver_log.open("wb") as log:
        driver = subprocess.Popen(
            [sys.executable, str(DRIVER), str(tmp_path / "spec.json")],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
    stop = threading.Event()
    rounds = [1]

    def feed() -> None:
        while not stop.is_set():
            _round(source, rounds[0])
            rounds[0] += 1
            time.sleep(0.3)

    def batch() -> int:
        progress = control / "progress.json"
        done = json.loads(progress.read_text())["last_batch"] if progress.exists() else None
        return -1 if done is None else int(done)

    def wait(what: str, ready: Callable[[], Any], timeout_s: float = 60.0) -> Any:
        return _wait(what, ready, driver, control, timeout_s)

    feeder = threading.Thread(target=feed, daemon=True)
    try:
        wait("first batch", lambda: batch() >= 0, timeout_s=90.0)
        feeder.start()
        wait("two executors", lambda: len(set(standalone.executors().values())) == 2)
        executors = standalone.executors()
        assert sorted(w.rack or "" for w in executors.values()) == RACKS  # (a missing rack: "")

        # SIGKILL of an executor while its task holds rows acked by the cluster, its batch not committed.
        (control / "hold").touch()
        wait("a task holding its batch", lambda: (control / "held").exists())
        held = json.loads((control / "held").read_text())
        victim = next(pid for pid, worker in executors.items() if worker.rack == held["rack"])
        assert batch() < held["batch"]  # the held batch is not committed: the kill lands in its middle
        os.kill(victim, signal.SIGKILL)
        wait("the batch re-run past the killed executor", lambda: batch() >= held["batch"] + 2)
        wait(  # Spark launched another executor on that worker
            "a new executor on the killed one's worker",
            lambda: [p for p, w in standalone.executors().items() if w.rack == held["rack"] and p != victim],
        )

        # SIGKILL of the hotstate server holding the most actives, the stream running.
        with hotstate.Client(f"127.0.0.1:{cluster.servers[0].http_port}") as client:
            placement = client.tables()
        actives = Counter(p["active"] for t in placement if t["name"] == "clicks" for p in t["placement"])
        at_kill = batch()
        running.kill(actives.most_common(1)[0][0])
        wait("batches after the server's kill", lambda: batch() >= at_kill + 3)

        # Both workers' racks reach the controller (the driver has none of its own), once each worker's
        # executor has written for the table.
        def writer_racks() -> dict[str, list[str]]:
            live = next(s for s in cluster.servers if cluster.alive(s))
            with hotstate.Client(f"127.0.0.1:{live.http_port}") as client:
                return {t["name"]: t["writer_racks"] for t in client.tables()}

        wait("both racks", lambda: writer_racks() == {"clicks": RACKS, "clicks_format": RACKS})

        stop.set()
        feeder.join()
        (control / "stop").touch()
        wait("the driver's result", lambda: (control / "result.json").exists())
        result = json.loads((control / "result.json").read_text())
        assert "error" not in result, result["error"]
        expected = {user: tuple(values) for user, values in result["expected"].items()}
        assert len(expected) == rounds[0] * 20 + 60
        assert wait_equal(running, "clicks", expected) == expected
        assert wait_equal(running, "clicks_format", expected) == expected
        assert driver.wait(timeout=30) == 0
    except BaseException:
        print(driver_log.read_text(errors="replace")[-5000:])
        raise
    finally:
        stop.set()
        if driver.poll() is None:
            os.killpg(driver.pid, signal.SIGKILL)
            driver.wait()


def test_a_batch_commit_registers_the_executors_racks_once(
    start_cluster: StartCluster, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """The driver's side of the racks, without Spark: the tasks' racks (duplicates, the driver's own, one
    the controller refuses) reach the table's writer racks; a refused one is a warning, the batch still
    commits, and it is tried again with the next batch."""
    from pyspark.sql.types import LongType, StringType, StructField, StructType

    from hotstate.spark import sink
    from hotstate.spark.sink import commit_batch, config_for_schema, executor_rack, upsert_rows
    from hotstate.spark.table import TableDefinition, ensure_table, key_columns_for

    cluster = start_cluster(1).cluster
    schema = StructType([StructField("user", StringType()), StructField("n", LongType())])
    definition = TableDefinition("racks", 2, 0, key_columns_for(schema, "user"), None)
    ensure_table(cluster.addresses(), cluster.cluster_id, cluster.secret, definition, rack="driver")
    config = config_for_schema(
        schema,
        servers=tuple(cluster.addresses()),
        table="racks",
        cluster_id=cluster.cluster_id,
        secret=cluster.secret,
        rack="driver",
        deadline_s=10.0,
    )
    monkeypatch.delenv("HOTSTATE_RACK", raising=False)
    assert executor_rack(config) == "driver"
    monkeypatch.setenv("HOTSTATE_RACK", " rack-9 ")
    assert executor_rack(config) == "rack-9"

    def racks() -> list[str]:
        with hotstate.Client(f"127.0.0.1:{cluster.servers[0].http_port}") as client:
            racks: list[str] = next(t for t in client.tables() if t["name"] == "racks")["writer_racks"]
            return racks

    too_long = "r" * 300
    token = upsert_rows(config, [("a", 1)], batch_id=0).consistency_token
    with caplog.at_level("WARNING", logger="hotstate.spark.sink"):
        commit_batch(config, 0, [token, ""], ["rack-2", "driver", "rack-1", "rack-2", too_long])
    assert "executors' rack" in caplog.text and "not registered" in caplog.text
    assert racks() == ["driver", "rack-1", "rack-2"]
    where = (config.servers, config.cluster_id, config.table)
    assert {(*where, "rack-1"), (*where, "rack-2")} <= sink._registered
    assert (*where, too_long) not in sink._registered  # asked again with the next batch

    token = upsert_rows(config, [("b", 2)], batch_id=1).consistency_token
    commit_batch(config, 1, [token], ["rack-1", "rack-3"])
    assert racks() == ["driver", "rack-1", "rack-2", "rack-3"]
    with hotstate.Client(f"127.0.0.1:{cluster.servers[0].http_port}") as client:
        assert next(t for t in client.tables() if t["name"] == "racks")["last_batch"] == 1

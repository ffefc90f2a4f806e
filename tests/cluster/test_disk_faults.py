"""Bad disks between real server processes (issue 17, 3): damaged replica files, a full disk, a read-only
data directory, a damaged metadata log. Every acknowledged (acks=all) write stays readable from every
replica once the damaged one is back."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hotstate.cli.local_cluster import LocalCluster
from hotstate.log.batch import HEADER_SIZE
from hotstate.replica.messages import (
    PartitionQueryRequest,
    PartitionQueryResponse,
    QueryPartitionsRequest,
    QueryPartitionsResponse,
    ReplicaError,
    TableMetadataResponse,
)
from hotstate.server.data_dir import DISK_FAILURE_EXIT_CODE

from .conftest import RunningCluster, StartCluster
from .test_replication import Probe, _create, _writer

VICTIM = 3


def _data_dir(running: RunningCluster, node_id: int) -> Path:
    return running.server(node_id).directory(running.cluster.root).resolve() / "data"


def _server_log(running: RunningCluster, node_id: int) -> str:
    return (running.server(node_id).directory(running.cluster.root) / "server.log").read_text(
        errors="replace"
    )


def _stop(running: RunningCluster, node_id: int) -> None:
    running.kill(node_id, signal.SIGTERM)
    end = time.monotonic() + 20
    while running.cluster.alive(running.server(node_id)):
        assert time.monotonic() < end, "server did not stop"
        time.sleep(0.05)


def _wait_dead(running: RunningCluster, node_id: int, timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    while running.cluster.alive(running.server(node_id)):
        assert time.monotonic() < end, f"server {node_id} still runs\n{running.logs()}"
        time.sleep(0.05)


def _run_server(running: RunningCluster, node_id: int) -> subprocess.CompletedProcess[str]:
    return _run(running.server(node_id).directory(running.cluster.root) / "server.toml")


def _run(config: Path) -> subprocess.CompletedProcess[str]:
    """One server started by hand, to see its exit code and output (LocalCluster keeps neither)."""
    return subprocess.run(
        [sys.executable, "-m", "hotstate.cli.main", "server", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
    )


async def _write_rounds(running: RunningCluster, table: str, keys: int, rounds: range) -> dict[str, int]:
    writer = _writer(running, table)
    acked: dict[str, int] = {}
    try:
        for round_ in rounds:
            await writer.upsert([{"user": f"u{i}", "v": round_} for i in range(keys)])
            acked.update({f"u{i}": round_ for i in range(keys)})
    finally:
        await writer.close()
    return acked


async def _check_everywhere(
    running: RunningCluster, table: str, partitions: int, acked: dict[str, int]
) -> None:
    """Every replica of every partition converged and holds exactly the acknowledged rows."""
    probe = Probe(running)
    try:
        await probe.wait_converged([1, 2, 3], table, timeout_s=40)
        for node in (1, 2, 3):
            seen: dict[object, object] = {}
            for partition in range(partitions):
                _, rows = await probe.rows(node, table, partition)
                seen.update({row["user"]: row["v"] for row in rows.values()})
            assert seen == acked, f"server {node} lost or changed rows"
    finally:
        await probe.close()


def _partition_dir(running: RunningCluster, node_id: int, table_id: int, partition: int) -> Path:
    return _data_dir(running, node_id) / "partitions" / f"{table_id}-{partition}"


def _flip(path: Path, position: int) -> None:
    data = bytearray(path.read_bytes())
    data[position] ^= 0xFF
    path.write_bytes(bytes(data))


# Each damage hits one partition of the victim; the replica must be rebuilt from the active.
def _log_middle(directory: Path) -> None:
    [segment] = sorted((directory / "log").glob("*.log"))
    _flip(segment, HEADER_SIZE + 2)  # inside the first batch, valid batches after it


def _sst_deleted(directory: Path) -> None:
    next((directory / "store").glob("*.sst")).unlink()


def _sst_garbage(directory: Path) -> None:
    sst = next((directory / "store").glob("*.sst"))
    _flip(sst, sst.stat().st_size // 3)


def _manifest_deleted(directory: Path) -> None:
    for manifest in (directory / "store").glob("MANIFEST-*"):
        manifest.unlink()


def _current_deleted(directory: Path) -> None:
    (directory / "store" / "CURRENT").unlink()


REBUILT = {
    0: ("corrupt log data", _log_middle),
    1: ("No such file or directory", _sst_deleted),
    2: ("checksum mismatch", _sst_garbage),
    3: ("MANIFEST", _manifest_deleted),
    4: ("store", _current_deleted),
}
TORN = 5  # the last batch of the log cut short: a torn tail, cut on open and fetched again, no rebuild
PARTITIONS = 6


def test_damaged_replica_files_are_detected_never_served_and_rebuilt_without_losing_acked_writes(
    start_cluster: StartCluster,
) -> None:
    running = start_cluster(3)
    table = "damaged"

    async def before() -> tuple[int, dict[str, int]]:
        await _create(running, table, partitions=PARTITIONS, standbys=2)
        acked = await _write_rounds(running, table, 600, range(4))
        probe = Probe(running)
        try:
            meta = await probe.metadata(1, table)
            await probe.wait_converged([1, 2, 3], table)
        finally:
            await probe.close()
        return meta.table_id, acked

    table_id, acked = running.run(before())
    _stop(running, VICTIM)
    for partition, (_, damage) in REBUILT.items():
        damage(_partition_dir(running, VICTIM, table_id, partition))
    [segment] = sorted((_partition_dir(running, VICTIM, table_id, TORN) / "log").glob("*.log"))
    os.truncate(segment, segment.stat().st_size - 7)
    running.restart(VICTIM)
    running.run(running.cluster.wait_ready(30.0))
    acked.update(running.run(_write_rounds(running, table, 600, range(4, 6))))
    running.run(_check_everywhere(running, table, PARTITIONS, acked))

    lines = _server_log(running, VICTIM).splitlines()
    for partition, (what, _) in REBUILT.items():
        damaged = [
            line for line in lines if f"replica {table}/{partition} is damaged, not serving it" in line
        ]
        assert len(damaged) == 1 and what in damaged[0], (partition, damaged)
        assert any(f"replica {table}/{partition}: discarding the damaged copy" in line for line in lines)
    torn = f"replica {table}/{TORN}"
    assert not any(f"{torn} is damaged" in line for line in lines)
    assert any("cutting a damaged tail" in line and f"{table_id}-{TORN}" in line for line in lines)


@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[None]:
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield
    finally:
        # The server may still be dying; a lazy unmount never leaves the fixture's tmp dir mounted.
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(directory: Path) -> Path:
    """A file taking every byte the file system has left."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        for size in (1 << 20, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    os.write(fd, b"\0" * size)
    finally:
        os.close(fd)
    return filler


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_full_disk_stops_the_server_and_writes_go_on_elsewhere_without_loss(
    start_cluster: StartCluster,
) -> None:
    running = start_cluster(3, hold=(VICTIM,))
    data = _data_dir(running, VICTIM)
    table = "full"
    with _tmpfs(data, "96m"):
        running.restart(VICTIM)
        running.run(running.cluster.wait_ready(30.0))
        running.run(_create(running, table, partitions=3, standbys=2))
        acked = running.run(_write_rounds(running, table, 500, range(2)))
        # The victim leads a partition: that partition's writes must move, not just stop.
        assert VICTIM in {p.active for p in running.run(_metadata(running, table)).partitions}
        filler = _fill(data)
        # Every write goes on being acknowledged while the victim finds out and leaves.
        acked.update(running.run(_write_rounds(running, table, 500, range(2, 8))))
        _wait_dead(running, VICTIM, 20.0)
        log = _server_log(running, VICTIM)
        assert "No space left on device" in log, log[-3000:]
        assert "CRITICAL" in log and f"exit code {DISK_FAILURE_EXIT_CODE}" in log, log[-3000:]
        assert "Traceback" not in log, log[-3000:]
        acked.update(running.run(_write_rounds(running, table, 500, range(8, 10))))
        # Still full: it refuses to start, with one line and the disk-failure exit code.
        refused = _run_server(running, VICTIM)
        assert refused.returncode == DISK_FAILURE_EXIT_CODE, refused.stderr[-2000:]
        assert "refuses to start" in refused.stderr and "No space left" in refused.stderr
        assert "Traceback" not in refused.stderr
        filler.unlink()
        running.restart(VICTIM)
        running.run(running.cluster.wait_ready(30.0))
        running.run(_check_everywhere(running, table, 3, acked))
        _stop(running, VICTIM)


@pytest.mark.skipif(os.geteuid() != 0, reason="a read-only bind mount needs root")
def test_a_read_only_data_directory_refuses_to_start_with_one_line(tmp_path: Path) -> None:
    cluster = LocalCluster.create(tmp_path / "cluster", 1)
    cluster.write_configs()
    [server] = cluster.servers
    data = server.directory(cluster.root).resolve() / "data"
    data.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "--bind", str(data), str(data)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(data)], check=True)
        refused = _run(server.directory(cluster.root) / "server.toml")
    finally:
        subprocess.run(["umount", "-l", str(data)], check=False)
    assert refused.returncode == DISK_FAILURE_EXIT_CODE, refused.stderr[-2000:]
    assert f"data directory {data} is not writable: Read-only file system" in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_damaged_metadata_log_refuses_to_start_and_a_torn_tail_is_fetched_again(
    start_cluster: StartCluster,
) -> None:
    running = start_cluster(3)
    running.run(_create(running, "meta", partitions=1, standbys=2))
    _stop(running, VICTIM)
    [segment] = sorted((_data_dir(running, VICTIM) / "metadata" / "log").glob("*.log"))
    pristine = segment.read_bytes()
    _flip(segment, HEADER_SIZE + 2)  # the first batch, with valid ones after it
    refused = _run_server(running, VICTIM)
    assert refused.returncode == DISK_FAILURE_EXIT_CODE, refused.stderr[-2000:]
    assert "refuses to start: metadata log damaged: corrupt log data in" in refused.stderr
    assert str(segment) in refused.stderr and "Traceback" not in refused.stderr
    # A torn tail (the last batch cut short) is what a crash can leave: cut, and fetched from the leader.
    segment.write_bytes(pristine[:-5])
    running.restart(VICTIM)
    running.run(running.cluster.wait_ready(30.0))
    running.run(
        _check_everywhere(running, "meta", 1, running.run(_write_rounds(running, "meta", 50, range(1))))
    )
    assert "cutting a damaged tail" in _server_log(running, VICTIM)


def test_a_block_going_bad_under_a_running_replica_is_refused_and_rebuilt(
    start_cluster: StartCluster,
) -> None:
    """A store block that fails its checksum when a query reads it: the query gets a refusal, never the
    rows before the block as the whole answer, and the replica is rebuilt from the active."""
    running = start_cluster(3)
    table = "rot"
    running.run(_create(running, table, partitions=1, standbys=2))
    acked = running.run(_write_rounds(running, table, 3000, range(1)))
    running.run(_check_everywhere(running, table, 1, acked))
    meta = running.run(_metadata(running, table))
    victim = next(n for n in (1, 2, 3) if n != meta.partitions[0].active)
    _stop(running, victim)  # its memtable goes to an SST file; the restart verifies it without caching it
    running.restart(victim)
    running.run(running.cluster.wait_ready(30.0))
    running.run(_converged(running, table))  # nothing read from its store: no block of it in the cache
    [directory] = (_data_dir(running, victim) / "partitions").iterdir()
    sst = max((directory / "store").glob("*.sst"), key=lambda p: p.stat().st_size)
    with open(sst, "r+b") as file:
        file.seek(sst.stat().st_size // 3)
        byte = file.read(1)
        file.seek(-1, os.SEEK_CUR)
        file.write(bytes([byte[0] ^ 0xFF]))
    answer = running.run(_scan_at(running, victim, table))
    assert answer.error is ReplicaError.UNKNOWN_PARTITION and "checksum mismatch" in answer.message, answer
    running.run(_check_everywhere(running, table, 1, acked))
    log = _server_log(running, victim)
    assert f"replica {table}/0 is damaged, not serving it: store" in log
    assert f"replica {table}/0: discarding the damaged copy" in log


async def _converged(running: RunningCluster, table: str) -> None:
    probe = Probe(running)
    try:
        await probe.wait_converged([1, 2, 3], table, timeout_s=40)
    finally:
        await probe.close()


async def _metadata(running: RunningCluster, table: str) -> TableMetadataResponse:
    probe = Probe(running)
    try:
        return await probe.metadata(1, table)
    finally:
        await probe.close()


async def _scan_at(running: RunningCluster, node: int, table: str) -> PartitionQueryResponse:
    probe = Probe(running)
    try:
        request = QueryPartitionsRequest((PartitionQueryRequest(table, 0, (), True, None, None, None, None),))
        reply = await probe.pool.request(node, request, 5.0)
        assert isinstance(reply, QueryPartitionsResponse)
        [answer] = reply.answers
        return answer
    finally:
        await probe.close()


def test_the_last_in_sync_replica_is_never_discarded(start_cluster: StartCluster) -> None:
    """No other copy holds every acknowledged write: the damaged one is kept for an operator, not
    replaced by an empty one that could become the active."""
    running = start_cluster(3)
    table = "alone"
    running.run(_create(running, table, partitions=1, standbys=0))
    running.run(_write_rounds(running, table, 300, range(2)))
    [part] = running.run(_metadata(running, table)).partitions
    [holder] = part.replicas
    _stop(running, holder)
    [directory] = (_data_dir(running, holder) / "partitions").iterdir()
    _log_middle(directory)
    [segment] = sorted((directory / "log").glob("*.log"))
    damaged = segment.read_bytes()
    running.restart(holder)
    running.run(running.cluster.wait_ready(30.0))
    end = time.monotonic() + 10
    while "only in-sync replica" not in (log := _server_log(running, holder)):
        assert time.monotonic() < end, log[-3000:]
        time.sleep(0.05)
    assert f"replica {table}/0 is damaged, not serving it: corrupt log data" in log
    assert "discarding the damaged copy" not in log
    assert segment.read_bytes() == damaged and list((directory / "store").glob("*.sst"))  # kept as found
    answer = running.run(_scan_at(running, holder, table))
    assert answer.error is ReplicaError.UNKNOWN_PARTITION, answer

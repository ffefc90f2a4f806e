"""The server's own disk checks: an unwritable data directory at start, and a replica's log and store
checked against each other when it opens."""

from __future__ import annotations

import asyncio
import os
import subprocess
from pathlib import Path

import pytest

from hotstate.log import Log
from hotstate.raft.config import RaftConfig
from hotstate.raft.node import RaftNode, RaftRole
from hotstate.raft.storage import RaftStorage
from hotstate.replica.store import Store
from hotstate.server.data_dir import DataDirError, check_writable
from hotstate.server.raft_driver import RaftDriver
from hotstate.server.replicas import DamagedReplicaError, open_replica_files


def test_a_writable_data_directory_passes_and_is_left_clean(tmp_path: Path) -> None:
    check_writable(tmp_path / "data")
    assert list((tmp_path / "data").iterdir()) == []


def test_a_data_directory_that_is_a_file_is_refused_with_its_path(tmp_path: Path) -> None:
    (tmp_path / "data").write_text("not a directory")
    with pytest.raises(DataDirError, match=f"data directory {tmp_path / 'data'} is not writable"):
        check_writable(tmp_path / "data")


@pytest.mark.skipif(os.geteuid() != 0, reason="a read-only bind mount needs root")
def test_a_read_only_data_directory_is_refused(tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    subprocess.run(["mount", "--bind", str(data), str(data)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(data)], check=True)
        with pytest.raises(DataDirError, match="Read-only file system"):
            check_writable(data)
    finally:
        subprocess.run(["umount", "-l", str(data)], check=False)


def _replica(directory: Path, records: int, applied: int) -> None:
    with Log.open(directory / "log") as log, Store.open(directory / "store") as store:
        for i in range(records):
            log.append(1, [f"r{i}".encode()])
        store.apply([], applied, 1)


def test_a_store_behind_the_log_start_is_damaged(tmp_path: Path) -> None:
    _replica(tmp_path, 10, 8)
    with Log.open(tmp_path / "log") as log:
        log.advance_start_offset(6)
    with Store.open(tmp_path / "store.new") as store:
        store.apply([], 2, 1)
    os.rename(tmp_path / "store", tmp_path / "store.lost")
    os.rename(tmp_path / "store.new", tmp_path / "store")
    with pytest.raises(DamagedReplicaError, match="is at 2, below the log start 6"):
        open_replica_files(tmp_path, "never", "t/0")


def test_a_log_cut_below_the_store_restarts_at_the_store_position(tmp_path: Path) -> None:
    _replica(tmp_path, 10, 8)
    with Log.open(tmp_path / "log") as log:
        log.truncate_to(5)  # as recovery cutting a damaged tail would
    store, log, batches = open_replica_files(tmp_path, "never", "t/0")
    try:
        assert (log.start_offset, log.end_offset, batches) == (8, 8, [])
        assert store.position == 8
    finally:
        log.close()
        store.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="mounting a tmpfs needs root")
def test_a_full_disk_under_the_metadata_log_stops_the_member_and_reports_it(tmp_path: Path) -> None:
    """A Ready that cannot be made durable: nothing of it leaves, the member stops, the server is told."""
    metadata = tmp_path / "metadata"
    metadata.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(metadata)], check=True)
    try:

        async def scenario() -> list[str]:
            failures: list[str] = []
            loop = asyncio.get_running_loop()
            leads: asyncio.Future[None] = loop.create_future()
            failed: asyncio.Future[None] = loop.create_future()

            def on_role_change(node: RaftNode) -> None:
                if node.role is RaftRole.LEADER and not leads.done():
                    leads.set_result(None)

            def on_disk_failure(reason: str) -> None:
                failures.append(reason)
                if not failed.done():
                    failed.set_result(None)

            driver = RaftDriver(
                1,
                [1],
                RaftConfig(),
                RaftStorage(metadata),
                send=lambda message: None,
                on_committed=lambda entries, snapshot: None,
                on_role_change=on_role_change,
                on_disk_failure=on_disk_failure,
            )
            driver.start()
            if driver.node.role is not RaftRole.LEADER:
                async with asyncio.timeout(5):
                    await leads
            fd = os.open(metadata / "filler", os.O_WRONLY | os.O_CREAT)
            try:
                while True:
                    os.write(fd, b"\0" * 65536)
            except OSError:
                pass
            finally:
                os.close(fd)
            driver.propose(b"x" * 200_000)
            async with asyncio.timeout(5):
                await failed
            await driver.stop()
            return failures

        failures = asyncio.run(scenario())
        assert len(failures) == 1 and "No space left on device" in failures[0], failures
        # The member's log on disk never got the entry; it reopens (the tail cut if torn).
        (metadata / "filler").unlink()
        storage = RaftStorage(metadata)
        try:
            assert all(entry.data != b"x" * 200_000 for entry in storage.load().entries)
        finally:
            storage.close()
    finally:
        subprocess.run(["umount", "-l", str(metadata)], check=False)

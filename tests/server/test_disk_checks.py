"""The server's own disk checks: an unwritable data directory at start, and a replica's log and store
checked against each other when it opens."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from hotstate.log import Log
from hotstate.replica.store import Store
from hotstate.server.data_dir import DataDirError, check_writable
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

"""A store whose files are damaged or missing: StoreCorruptError at open or from verify(), never rows
silently missing."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

import pytest

from hotstate.replica.store import Store, StoreCorruptError


def _made(path: Path) -> Path:
    with Store.open(path) as store:
        for i in range(20):
            store.apply([(f"k{i:03d}-{j:03d}".encode(), os.urandom(64)) for j in range(100)], i + 1, 1)
    # close() flushed the memtable: the rows are in an SST file
    assert list(path.glob("*.sst"))
    return path


def _flip_sst(path: Path) -> None:
    sst = next(path.glob("*.sst"))
    data = bytearray(sst.read_bytes())
    data[len(data) // 3] ^= 0xFF
    sst.write_bytes(bytes(data))


def _delete(pattern: str) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        for file in path.glob(pattern):
            file.unlink()

    return damage


def _garbage_current(path: Path) -> None:
    (path / "CURRENT").write_text("garbage\n")


@pytest.mark.parametrize(
    "damage",
    [_delete("*.sst"), _delete("MANIFEST-*"), _delete("CURRENT"), _garbage_current, _flip_sst],
    ids=["sst-deleted", "manifest-deleted", "current-deleted", "current-garbage", "sst-flipped"],
)
def test_damaged_store_files_are_reported_as_corrupt(tmp_path: Path, damage: Callable[[Path], None]) -> None:
    path = _made(tmp_path / "store")
    damage(path)
    with pytest.raises(StoreCorruptError, match=str(path)):
        store = Store.open(path)
        try:
            store.verify()
        finally:
            store.close()


def test_verify_counts_every_row_of_a_sound_store(tmp_path: Path) -> None:
    path = _made(tmp_path / "store")
    with Store.open(path) as store:
        assert store.verify() == 2000
        assert store.position == 20

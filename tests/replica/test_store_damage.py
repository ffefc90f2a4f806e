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


def test_a_scan_over_a_damaged_block_raises_instead_of_ending_early(tmp_path: Path) -> None:
    """rocksdict's iteration stops quietly at a block failing its checksum; a query must not get the rows
    before it as the whole answer."""
    path = _made(tmp_path / "store")
    _flip_sst(path)
    with Store.open(path) as store, pytest.raises(StoreCorruptError, match="checksum mismatch"):
        list(store.scan())
    with Store.open(path) as store, pytest.raises(StoreCorruptError, match="checksum mismatch"):
        list(store.scan_chunks(None, None, 100))
    with Store.open(path) as store, pytest.raises(StoreCorruptError, match="checksum mismatch"):
        list(store.scan_chunks(None, None, 100, keys_only=True))


def test_a_scan_that_reaches_its_end_or_limit_is_not_mistaken_for_damage(tmp_path: Path) -> None:
    path = _made(tmp_path / "store")
    with Store.open(path) as store:
        assert len(list(store.scan())) == 2000
        assert len(list(store.scan(b"k005", b"k007"))) == 200
        assert len(list(store.scan(b"k005", limit=7))) == 7
        assert sum(map(len, store.scan_chunks(None, None, 1000))) == 2000  # ends exactly at a chunk's end
        assert sum(map(len, store.scan_chunks(b"k005", b"k007", 64, keys_only=True))) == 200
        assert list(store.scan(b"zzz")) == []
        rows = iter(store.scan(b"k001", b"k002"))
        first = next(rows)
        store.apply([(b"k001-zzz", b"written while scanning")], 21, 1)
        assert [first, *rows][-1][0] == b"k001-099"  # the view is as of the call


def test_a_store_found_damaged_can_be_destroyed_and_reopened_at_once(tmp_path: Path) -> None:
    """Nothing of the damaged store (an iterator in a traceback) keeps RocksDB's lock on the path."""
    path = _made(tmp_path / "store")
    _flip_sst(path)
    store = Store.open(path)
    try:
        with pytest.raises(StoreCorruptError):
            list(store.scan())
    finally:
        store.close()
    Store.destroy(path)
    with Store.open(path) as fresh:
        assert fresh.position == 0

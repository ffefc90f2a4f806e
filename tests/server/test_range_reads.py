"""A partition's key-range read (serving.range_items, what a range query's replicas answer with): exactly
`Store.scan`'s items, gathered in C, and its end-of-range check (damage raises, never a short answer)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hotstate.replica.store import Store, StoreCorruptError
from hotstate.server.serving import range_items


def _made(path: Path) -> Path:
    with Store.open(path) as store:
        for i in range(20):
            store.apply([(f"k{i:03d}-{j:03d}".encode(), os.urandom(64)) for j in range(100)], i + 1, 1)
    return path  # close() flushed the memtable: the rows are in an SST file


@pytest.mark.parametrize("limit", [-1, 0, 1, 7, 199, 200, 201, 2000, 100_001])
@pytest.mark.parametrize(
    ("start", "end"),
    [(None, None), (b"k005", b"k007"), (b"k005", None), (None, b"k001"), (b"zzz", None), (b"k007", b"k005")],
)
def test_the_same_items_as_a_scan(tmp_path: Path, start: bytes | None, end: bytes | None, limit: int) -> None:
    with Store.open(_made(tmp_path / "store")) as store:
        if limit < 0:
            with pytest.raises(ValueError, match="limit must be >= 0"):
                range_items(store, start, end, limit)
            return
        expected = tuple(store.scan(start, end, limit=limit))
        got = range_items(store, start, end, limit)
        assert got == expected
        assert all(type(item) is tuple for item in got)


def test_a_read_over_a_damaged_block_raises_as_a_scan_does(tmp_path: Path) -> None:
    path = _made(tmp_path / "store")
    sst = next(path.glob("*.sst"))
    data = bytearray(sst.read_bytes())
    data[len(data) // 3] ^= 0xFF
    sst.write_bytes(bytes(data))
    with Store.open(path) as store:
        with pytest.raises(StoreCorruptError, match="checksum mismatch"):
            range_items(store, None, None, 100_001)
        # A limit reached before the damage: the rows up to it, as the scan gives them.
        assert range_items(store, None, None, 3) == tuple(store.scan(None, None, limit=3))

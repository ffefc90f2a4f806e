from __future__ import annotations

import os
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from hotstate.replica import store as store_module
from hotstate.replica.store import Store, StoreError, store_paths

OLD = [(b"a", b"old-a"), (b"b", b"old-b")]
NEW = [(b"x", b"new-x"), (b"y", b"new-y"), (b"z", b"new-z")]


def contents(store: Store) -> list[tuple[bytes, bytes]]:
    return list(store.scan())


def make_store(path: Path, items: list[tuple[bytes, bytes]], position: int, epoch: int) -> None:
    with Store.open(path) as store:
        store.apply(items, position, epoch)


def commit_install(path: Path, items: list[tuple[bytes, bytes]], position: int, epoch: int) -> None:
    install = Store.begin_install(path)
    install.add(items)
    install.commit(position, epoch)


def leftovers(path: Path) -> list[str]:
    return sorted(entry.name for entry in path.parent.iterdir() if entry.name != path.name)


# --- apply, position, reopen --------------------------------------------------------------------------


def test_new_store_is_empty_at_position_zero(tmp_path: Path) -> None:
    with Store.open(tmp_path / "p0") as store:
        assert (store.position, store.epoch) == (0, 0)
        assert contents(store) == []
        assert store.get(b"a") is None
        assert store.count_estimate() == 0


def test_apply_and_reopen_keep_data_position_and_epoch(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "p0"
    with Store.open(path, sync=True) as store:
        store.apply([(b"k1", b"v1"), (b"k2", b"v2"), (b"k3", b"v3")], 3, 1)
        store.apply([(b"k2", None), (b"k1", b"v1b"), (b"gone", None)], 6, 2)
        assert (store.position, store.epoch) == (6, 2)
    with Store.open(path) as store:
        assert (store.position, store.epoch) == (6, 2)
        assert contents(store) == [(b"k1", b"v1b"), (b"k3", b"v3")]
        assert store.get(b"k1") == b"v1b"
        assert store.get(b"k2") is None
        assert store.get_many([b"k3", b"k2", b"k1"]) == [b"v3", None, b"v1b"]
        assert store.get_many([]) == []


def test_count_estimate(tmp_path: Path) -> None:
    path = tmp_path / "p0"
    make_store(path, [(b"k%04d" % i, b"v") for i in range(1000)], 1, 1)
    with Store.open(path) as store:
        assert 900 <= store.count_estimate() <= 1100


def test_position_never_goes_backwards(tmp_path: Path) -> None:
    with Store.open(tmp_path / "p0") as store:
        store.apply([(b"k", b"1")], 10, 3)
        with pytest.raises(ValueError, match="position 9 is behind the store's position 10"):
            store.apply([(b"k", b"2")], 9, 3)
        assert store.get(b"k") == b"1"
        store.apply([], 10, 4)  # the same position again is fine (e.g. a new epoch, nothing applied)
        assert (store.position, store.epoch) == (10, 4)
        with pytest.raises(ValueError, match="must be in"):
            store.apply([], -1, 0)


def test_data_keys_never_meet_the_meta_entry(tmp_path: Path) -> None:
    path = tmp_path / "p0"
    with Store.open(path) as store:
        store.apply([(b"applied", b"data"), (b"", b"empty key")], 5, 1)
        assert contents(store) == [(b"", b"empty key"), (b"applied", b"data")]
    with Store.open(path) as store:
        assert (store.position, store.epoch) == (5, 1)
        assert store.get(b"applied") == b"data"


def test_apply_throughput_10k_rows(tmp_path: Path) -> None:
    records: list[tuple[bytes, bytes | None]] = [(b"key%08d" % i, b"v" * 100) for i in range(10_000)]
    with Store.open(tmp_path / "p0") as store:
        store.apply(records, 10_000, 1)
        assert sum(1 for _ in store.scan()) == 10_000


# --- scan ---------------------------------------------------------------------------------------------


@pytest.fixture
def filled(tmp_path: Path) -> Store:
    store = Store.open(tmp_path / "scan")
    store.apply([(bytes([i]), b"v%d" % i) for i in (5, 1, 255, 0, 3, 7)] + [(b"\x03\x00", b"x")], 1, 1)
    return store


def test_scan_is_ordered_and_bounded(filled: Store) -> None:
    keys = [key for key, _ in filled.scan()]
    assert keys == [b"\x00", b"\x01", b"\x03", b"\x03\x00", b"\x05", b"\x07", b"\xff"]
    assert [k for k, _ in filled.scan(b"\x03", b"\x07")] == [b"\x03", b"\x03\x00", b"\x05"]
    assert [k for k, _ in filled.scan(b"\x02", None)] == keys[2:]
    assert [k for k, _ in filled.scan(None, b"\x03")] == keys[:2]
    assert [k for k, _ in filled.scan(b"\x03", b"\x03")] == []
    assert [k for k, _ in filled.scan(b"\x07", b"\x03")] == []
    assert [k for k, _ in filled.scan(limit=3)] == keys[:3]
    assert [k for k, _ in filled.scan(b"\x03", None, limit=2)] == [b"\x03", b"\x03\x00"]
    assert list(filled.scan(limit=0)) == []
    with pytest.raises(ValueError, match="limit"):
        filled.scan(limit=-1)
    filled.close()


def test_scan_chunks_are_the_scan_in_lists_of_items_or_keys(filled: Store) -> None:
    items = list(filled.scan())
    for size in (1, 2, 3, 7, 100):
        chunks = list(filled.scan_chunks(None, None, size))
        assert [item for chunk in chunks for item in chunk] == items
        assert all(len(chunk) == size for chunk in chunks[:-1]) and 0 < len(chunks[-1]) <= size
        keys = list(filled.scan_chunks(None, None, size, keys_only=True))
        assert keys == [[key for key, _ in chunk] for chunk in chunks]
    assert [k for c in filled.scan_chunks(b"\x03", b"\x07", 2) for k, _ in c] == [
        b"\x03",
        b"\x03\x00",
        b"\x05",
    ]
    assert list(filled.scan_chunks(b"\x07", b"\x03", 2)) == []
    assert list(filled.scan_chunks(b"\x08", b"\xfe", 2)) == []
    with pytest.raises(ValueError, match="size"):
        filled.scan_chunks(None, None, 0)
    open_chunks = filled.scan_chunks(None, None, 2)
    assert next(open_chunks) == items[:2]
    filled.close()
    with pytest.raises(StoreError, match="closed during a scan"):
        next(open_chunks)


def test_scan_sees_the_store_as_of_the_call(filled: Store) -> None:
    scan = filled.scan()
    assert next(scan) == (b"\x00", b"v0")
    filled.apply([(b"\x02", b"new"), (b"\xff", None)], 2, 1)
    assert [k for k, _ in scan] == [b"\x01", b"\x03", b"\x03\x00", b"\x05", b"\x07", b"\xff"]
    filled.close()


# --- snapshots ----------------------------------------------------------------------------------------


def test_snapshot_is_consistent_while_apply_continues(tmp_path: Path) -> None:
    with Store.open(tmp_path / "p0") as store:
        store.apply([(b"k%03d" % i, b"v%d" % i) for i in range(100)], 100, 2)
        expected = contents(store)
        with store.snapshot() as snapshot:
            store.apply([(b"k%03d" % i, None) for i in range(0, 100, 2)], 150, 3)
            store.apply([(b"k%03d" % i, b"changed") for i in range(1, 100, 2)], 200, 3)
            store.apply([(b"k%03d" % i, b"added") for i in range(100, 120)], 220, 4)
            assert (snapshot.position, snapshot.epoch) == (100, 2)
            items, after = snapshot.chunk(None, 1 << 20)
            assert items == expected and after is None
        assert len(contents(store)) == 70


def test_a_snapshot_reads_keys_as_of_its_view(tmp_path: Path) -> None:
    with Store.open(tmp_path / "p0") as store:
        store.apply([(b"k%03d" % i, b"v%d" % i) for i in range(10)], 10, 1)
        with store.snapshot() as snapshot:
            store.apply([(b"k001", None), (b"k002", b"changed"), (b"k050", b"added")], 20, 1)
            keys = [b"k001", b"k002", b"k003", b"k050", b"k0", b"z"]
            assert snapshot.get_many(keys) == [b"v1", b"v2", b"v3", None, None, None]
        assert store.get_many(keys) == [None, b"changed", b"v3", b"added", None, None]
        with pytest.raises(StoreError, match="snapshot closed"):
            snapshot.get_many([b"k001"])


@pytest.mark.parametrize("max_bytes", [1, 7, 100, 1000, 1 << 30])
def test_chunks_cover_everything_exactly_once(tmp_path: Path, max_bytes: int) -> None:
    rng = random.Random(max_bytes)
    data = {rng.randbytes(rng.randint(1, 12)): rng.randbytes(rng.randint(0, 60)) for _ in range(300)}
    with Store.open(tmp_path / "p0") as store:
        store.apply(list(data.items()), 1, 1)
        snapshot = store.snapshot()
        store.apply([(key, None) for key in list(data)[:100]], 2, 1)  # not in the snapshot's view
        received: list[tuple[bytes, bytes]] = []
        after: bytes | None = None
        while True:
            items, after = snapshot.chunk(after, max_bytes)
            assert items, "a chunk is never empty while items remain"
            assert sum(len(k) + len(v) for k, v in items[:-1]) < max_bytes
            received.extend(items)
            if after is None:
                break
            assert after == items[-1][0]
        assert received == sorted(data.items())
        assert snapshot.chunk(received[-1][0], max_bytes) == ([], None)
        snapshot.close()
        with pytest.raises(StoreError, match="snapshot closed"):
            snapshot.chunk(None, 10)


def test_chunk_of_an_empty_store(tmp_path: Path) -> None:
    with Store.open(tmp_path / "p0") as store, store.snapshot() as snapshot:
        assert snapshot.chunk(None, 100) == ([], None)
        assert (snapshot.position, snapshot.epoch) == (0, 0)


def test_close_releases_open_snapshots_and_scans(tmp_path: Path) -> None:
    path = tmp_path / "p0"
    store = Store.open(path)
    store.apply(OLD, 2, 1)
    snapshot = store.snapshot()
    scan = store.scan()
    next(scan)
    store.close()
    store.close()  # idempotent
    with pytest.raises(StoreError, match="closed"):
        next(scan)
    with pytest.raises(StoreError, match="snapshot closed"):
        snapshot.chunk(None, 10)
    with pytest.raises(StoreError, match="closed"):
        store.get(b"a")
    with Store.open(path) as again:  # the RocksDB lock went with the store, not with the last iterator
        assert contents(again) == OLD


# --- locking ------------------------------------------------------------------------------------------


def test_second_open_in_this_process_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p0"
    with Store.open(path), pytest.raises(StoreError, match=f"{path}.*already open"):
        Store.open(path)


def test_open_held_by_another_process_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "p0"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys; from hotstate.replica.store import Store; "
            f"s = Store.open({str(path)!r}); print('open', flush=True); sys.stdin.read()",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        with pytest.raises(StoreError, match=f"store {path}: cannot open: .*lock"):
            Store.open(path)
    finally:
        holder.communicate("")
    with Store.open(path) as store:  # free again once the other process is gone
        assert store.position == 0


# --- install and swap ---------------------------------------------------------------------------------


def test_install_beside_an_open_store_then_swap(tmp_path: Path) -> None:
    path = tmp_path / "p0"
    store = Store.open(path)
    store.apply(OLD, 10, 1)
    install = Store.begin_install(path)
    install.add(NEW[:1])
    install.add(NEW[1:])
    store.apply([(b"c", b"old-c")], 11, 1)  # the old store keeps serving meanwhile
    install.commit(40, 3)
    assert install.committed
    with pytest.raises(StoreError, match="close the store"):
        Store.swap_installed(path)
    store.close()
    with Store.swap_installed(path) as swapped:
        assert (swapped.position, swapped.epoch) == (40, 3)
        assert contents(swapped) == NEW
        swapped.apply([(b"x", None)], 41, 3)
    assert leftovers(path) == []
    with Store.open(path) as reopened:
        assert contents(reopened) == NEW[1:]
        assert (reopened.position, reopened.epoch) == (41, 3)


def test_swap_without_a_committed_install_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "p0"
    make_store(path, OLD, 10, 1)
    Store.begin_install(path).add(NEW)  # never committed (and the handle is simply dropped)
    with pytest.raises(StoreError, match="no committed install"):
        Store.swap_installed(path)


def test_abort_removes_the_install(tmp_path: Path) -> None:
    path = tmp_path / "p0"
    make_store(path, OLD, 10, 1)
    install = Store.begin_install(path)
    install.add(NEW)
    install.abort()
    assert leftovers(path) == []
    committed = Store.begin_install(path)
    committed.commit(20, 2)
    committed.abort()
    assert leftovers(path) == []
    with pytest.raises(StoreError, match="already committed or aborted"):
        committed.add(NEW)
    with Store.open(path) as store:
        assert contents(store) == OLD


def test_install_as_context_manager_aborts_on_error(tmp_path: Path) -> None:
    path = tmp_path / "p0"
    make_store(path, OLD, 10, 1)
    with pytest.raises(RuntimeError), Store.begin_install(path) as install:
        install.add(NEW)
        raise RuntimeError("transfer broke")
    assert leftovers(path) == []


def test_install_into_a_path_without_a_store(tmp_path: Path) -> None:
    path = tmp_path / "p0"
    commit_install(path, NEW, 20, 2)
    with Store.swap_installed(path) as store:
        assert contents(store) == NEW


# Each crash point of install and swap, as the directories it leaves behind.


def at_uncommitted_install(path: Path) -> None:
    install = Store.begin_install(path)
    install.add(NEW)  # then the process dies: nothing committed


def at_commit_before_rename(path: Path) -> None:
    # Data and meta durable, but the rename that publishes the install never happened.
    commit_install(path, NEW, 20, 2)
    paths = store_paths(path)
    os.rename(paths.ready, paths.install)


def at_torn_install(path: Path) -> None:
    at_uncommitted_install(path)
    for entry in store_paths(path).install.iterdir():
        if entry.name.startswith(("CURRENT", "MANIFEST")):
            entry.unlink()


def at_committed(path: Path) -> None:
    commit_install(path, NEW, 20, 2)


def at_old_moved_aside(path: Path) -> None:
    commit_install(path, NEW, 20, 2)
    paths = store_paths(path)
    os.rename(paths.live, paths.old)


def at_new_moved_in(path: Path) -> None:
    at_old_moved_aside(path)
    paths = store_paths(path)
    os.rename(paths.ready, paths.live)


def at_old_half_deleted(path: Path) -> None:
    at_new_moved_in(path)
    for entry in sorted(store_paths(path).old.iterdir())[::2]:
        entry.unlink()


@pytest.mark.parametrize(
    ("crash", "expect_new"),
    [
        (at_uncommitted_install, False),
        (at_torn_install, False),
        (at_commit_before_rename, False),
        (at_committed, True),
        (at_old_moved_aside, True),
        (at_new_moved_in, True),
        (at_old_half_deleted, True),
    ],
)
def test_open_after_a_crash_in_install_or_swap(tmp_path: Path, crash: object, expect_new: bool) -> None:
    path = tmp_path / "p0"
    make_store(path, OLD, 10, 1)
    crash(path)  # type: ignore[operator]
    with Store.open(path) as store:
        if expect_new:
            assert (contents(store), store.position, store.epoch) == (NEW, 20, 2)
        else:
            assert (contents(store), store.position, store.epoch) == (OLD, 10, 1)
    assert leftovers(path) == []


def test_a_real_crash_mid_install_and_after_commit(tmp_path: Path) -> None:
    path = tmp_path / "p0"
    make_store(path, OLD, 10, 1)
    script = textwrap.dedent(
        f"""
        import os, sys
        from hotstate.replica.store import Store
        store = Store.open({str(path)!r})
        install = Store.begin_install({str(path)!r})
        install.add([(b"k%05d" % i, b"v" * 50) for i in range(5000)])
        if sys.argv[1] == "commit":
            install.commit(20, 2)
        os._exit(0)  # killed: no close, no cleanup
        """
    )
    subprocess.run([sys.executable, "-c", script, "mid"], check=True)
    with Store.open(path) as store:
        assert (contents(store), store.position) == (OLD, 10)
    subprocess.run([sys.executable, "-c", script, "commit"], check=True)
    with Store.open(path) as store:
        assert (store.position, store.epoch, sum(1 for _ in store.scan())) == (20, 2, 5000)
    assert leftovers(path) == []


# --- destroy ------------------------------------------------------------------------------------------


def test_destroy(tmp_path: Path) -> None:
    path = tmp_path / "p0"
    make_store(path, OLD, 10, 1)
    at_committed(path)  # a leftover install goes too
    store = Store.open(path)
    with pytest.raises(StoreError, match="open store"):
        Store.destroy(path)
    store.close()
    Store.destroy(path)
    assert not path.exists() and leftovers(path) == []
    Store.destroy(path)  # nothing left to destroy is fine
    with Store.open(path) as fresh:
        assert (contents(fresh), fresh.position) == ([], 0)


def test_open_after_a_crash_in_destroy(tmp_path: Path) -> None:
    path = tmp_path / "p0"
    make_store(path, OLD, 10, 1)
    paths = store_paths(path)
    os.rename(paths.live, paths.trash)  # destroy's first step, then the crash
    with Store.open(path) as store:
        assert (contents(store), store.position) == ([], 0)
    assert leftovers(path) == []


# --- the write-time index (TTL by write time) ---------------------------------------------------------


def test_write_times_follow_puts_and_deletes_and_survive_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "p"
    with Store.open(path) as store:
        store.apply([(b"a", b"1"), (b"b", b"2")], 2, 1, b"T1______")
        store.apply([(b"a", b"3"), (b"b", None)], 4, 1, b"T2______")
        store.apply([(b"c", b"4")], 5, 1)  # a table without the index: none written
        assert store.written_many([b"a", b"b", b"c"]) == [b"T2______", None, None]
        store.stamp_written([b"c"], b"T3______")
        assert store.position == 5  # stamping is outside the log's position
    with Store.open(path) as store:
        assert store.written_many([b"a", b"c"]) == [b"T2______", b"T3______"]
        assert contents(store) == [(b"a", b"3"), (b"c", b"4")]  # the index is no data


def test_a_store_made_before_the_write_time_index_opens_and_gains_it(tmp_path: Path) -> None:
    from rocksdict import Rdict

    from hotstate.replica import store as store_module

    path = tmp_path / "p"
    options = store_module._options()
    old = Rdict(str(path), options, column_families={store_module.META_COLUMN_FAMILY: options})
    old[b"k"] = b"v"
    old.close()
    with Store.open(path) as store:
        assert contents(store) == [(b"k", b"v")] and store.written_many([b"k"]) == [None]
        store.apply([(b"k", b"w")], 1, 1, b"T1______")
        assert store.written_many([b"k"]) == [b"T1______"]


def test_scans_of_a_whole_table_leave_the_block_cache_to_point_lookups(tmp_path: Path) -> None:
    """A pull query's scan and expiry's pages (`fill_cache=False`, `scan_page`) read each block once: filling
    the process's shared block cache with them would push out the blocks that point lookups and key ranges
    keep hot. A key range read (the default) fills it, as a lookup does."""
    rng = random.Random(7)
    path = tmp_path / "p0"
    rows = [(b"k%06d" % i, rng.randbytes(200)) for i in range(10_000)]  # ~2 MB that snappy cannot shrink
    make_store(path, rows, 1, 1)  # closing flushes: the rows are in SST blocks, not the memtable
    with Store.open(path) as store:
        cache = store_module._block_cache
        assert cache is not None
        before = cache.get_usage()
        assert sum(map(len, store.scan_chunks(None, None, 1_000, fill_cache=False))) == len(rows)
        assert sum(map(len, store.scan_chunks(None, None, 1_000, keys_only=True, fill_cache=False))) == len(
            rows
        )
        start = None
        while page := store.scan_page(start, 1_000):
            start = page[-1][0] + b"\x00"
        unfilled = cache.get_usage() - before
        assert sum(map(len, store.scan_chunks(None, None, 1_000))) == len(rows)
        filled = cache.get_usage() - before - unfilled
    assert filled > 1_000_000
    assert unfilled < filled / 20


def test_a_scan_page_is_the_first_chunk_and_releases_its_iterator(filled: Store) -> None:
    items = list(filled.scan())
    assert filled.scan_page(None, 3) == items[:3]
    assert filled.scan_page(items[2][0] + b"\x00", 3) == items[3:6]
    assert filled.scan_page(items[-2][0], 10) == items[-2:]  # short: the end of the store
    assert filled.scan_page(items[-1][0] + b"\x00", 10) == []
    assert not filled._cursors  # every page let its iterator go
    filled.close()

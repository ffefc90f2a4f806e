"""Crash recovery: torn and corrupt tails are cut, corruption inside the log is refused loudly."""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import pytest

from hotstate.log import CorruptLogError, Log, RecordBatch
from hotstate.log.batch import HEADER_SIZE, encode_batch
from hotstate.log.epochs import EPOCH_FILE
from hotstate.log.files import START_OFFSET_FILE

from .helpers import BIG, fill, flat, flat_batches, records, segment_files

SEGMENT_BYTES = 400
N = 24


def open_log(path: Path, fsync: str = "never") -> Log:
    return Log.open(path, fsync=fsync, segment_bytes=SEGMENT_BYTES, index_interval_bytes=64)  # type: ignore[arg-type]


def write_pristine(path: Path, fsync: str, clean: bool) -> list[RecordBatch]:
    """N batches over several segments; the last one starts a new epoch."""
    log = open_log(path, fsync)
    batches = [log.append(1, records(i)) for i in range(N - 1)]
    batches.append(log.append(2, [b"last-a", b"last-bb", b"last-ccc"]))
    if clean:
        log.close()
    else:
        log._abandon()
    assert len(segment_files(path)) >= 3
    return batches


def assert_one_batch_lost(path: Path, fsync: str, batches: list[RecordBatch]) -> None:
    with open_log(path, fsync) as log:
        assert log.read(0, BIG) == batches[:-1]
        assert log.end_offset == batches[-1].base_offset
        assert (log.latest_epoch, log.epoch_entries()) == (1, [(1, 0)])
        again = log.append(3, [b"again"])
        assert again.base_offset == batches[-1].base_offset
    with open_log(path, fsync) as log:
        assert log.read(0, BIG) == [*batches[:-1], again]
        assert log.epoch_entries() == [(1, 0), (3, again.base_offset)]


# "always" trusts older segments even after a crash, "never" validates them all after one.
MODES = [("never", True), ("never", False), ("always", False)]


@pytest.mark.parametrize(("fsync", "clean"), MODES)
def test_torn_tail_at_every_byte_of_the_last_batch(tmp_path: Path, fsync: str, clean: bool) -> None:
    pristine = tmp_path / "pristine"
    batches = write_pristine(pristine, fsync, clean)
    last_file = segment_files(pristine)[-1].name
    data = (pristine / last_file).read_bytes()
    size = len(encode_batch(batches[-1]))
    for cut in range(len(data) - size, len(data)):
        work = tmp_path / f"cut-{cut}"
        shutil.copytree(pristine, work)
        (work / last_file).write_bytes(data[:cut])
        assert_one_batch_lost(work, fsync, batches)
        shutil.rmtree(work)


@pytest.mark.parametrize(("fsync", "clean"), MODES)
def test_flipped_byte_in_the_last_batch(tmp_path: Path, fsync: str, clean: bool) -> None:
    pristine = tmp_path / "pristine"
    batches = write_pristine(pristine, fsync, clean)
    last_file = segment_files(pristine)[-1].name
    data = (pristine / last_file).read_bytes()
    size = len(encode_batch(batches[-1]))
    assert size > HEADER_SIZE
    for at in range(len(data) - size, len(data)):
        work = tmp_path / f"flip-{at}"
        shutil.copytree(pristine, work)
        damaged = bytearray(data)
        damaged[at] ^= 0xFF
        (work / last_file).write_bytes(damaged)
        assert_one_batch_lost(work, fsync, batches)
        shutil.rmtree(work)


def test_tail_cut_is_logged_and_the_file_shrinks(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    batches = write_pristine(tmp_path, "never", clean=True)
    last = segment_files(tmp_path)[-1]
    with last.open("ab") as f:
        f.write(b"\x00" * 100)  # zeros: what a filesystem may show after a crash
    size = last.stat().st_size
    with caplog.at_level(logging.WARNING, logger="hotstate.log"), open_log(tmp_path) as log:
        assert log.read(0, BIG) == batches
    assert last.stat().st_size == size - 100
    assert "damaged tail" in caplog.text


@pytest.mark.parametrize("clean", [True, False])
def test_corruption_inside_the_last_segment_refuses_to_open(tmp_path: Path, clean: bool) -> None:
    batches = write_pristine(tmp_path, "never", clean)
    last = segment_files(tmp_path)[-1]
    data = bytearray(last.read_bytes())
    victim = len(data) - len(encode_batch(batches[-1])) - len(encode_batch(batches[-2])) + HEADER_SIZE + 2
    data[victim] ^= 0x01
    last.write_bytes(data)
    with pytest.raises(CorruptLogError, match=last.name) as info:
        open_log(tmp_path)
    assert info.value.path == last
    assert info.value.position == victim - HEADER_SIZE - 2


def test_corruption_in_an_older_segment_fails_the_read(tmp_path: Path) -> None:
    write_pristine(tmp_path, "always", clean=True)
    first = segment_files(tmp_path)[0]
    data = bytearray(first.read_bytes())
    data[HEADER_SIZE + 1] ^= 0x01  # inside the payload of the very first batch
    first.write_bytes(data)
    with open_log(tmp_path, "always") as log:
        with pytest.raises(CorruptLogError, match=first.name):
            log.read(0, BIG)
        # The damage stays local to its batch: reads after it still work.
        assert [offset for offset, _, _ in flat(log, 3)] == list(range(3, log.end_offset))


def test_unclean_never_log_validates_every_segment(tmp_path: Path) -> None:
    """After an unclean stop the page cache may have lost any unflushed part: the log ends at the damage."""
    batches = write_pristine(tmp_path, "never", clean=False)
    second = segment_files(tmp_path)[1]
    data = second.read_bytes()
    second.write_bytes(data[:-5])  # torn end of a segment that is not the last
    with open_log(tmp_path) as log:
        end = log.end_offset
        assert flat(log) == flat_batches(batches)[:end]
        assert len(segment_files(tmp_path)) == 2
        assert log.epoch_entries() == [(1, 0)]


def test_clean_shutdown_skips_older_segments(tmp_path: Path) -> None:
    batches = write_pristine(tmp_path, "never", clean=True)
    second = segment_files(tmp_path)[1]
    second.write_bytes(second.read_bytes()[:-5])
    with open_log(tmp_path) as log:
        assert log.end_offset == batches[-1].next_offset  # not scanned: trusted after a clean close
        with pytest.raises(CorruptLogError, match=second.name):
            log.read(0, BIG)


def test_missing_or_garbage_epoch_file_is_rebuilt(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        fill(log, 30, epoch_every=7)
        log.advance_start_offset(10)
        expected = log.epoch_entries()
    assert expected == [(0, 10), (1, 21), (2, 42), (3, 63), (4, 84)]
    (tmp_path / EPOCH_FILE).unlink()
    with open_log(tmp_path) as log:
        assert log.epoch_entries() == expected
    (tmp_path / EPOCH_FILE).write_text("0\n2\n5 0\n3 9\n")  # not ascending
    with open_log(tmp_path) as log:
        assert log.epoch_entries() == expected
    (tmp_path / EPOCH_FILE).write_bytes(b"\xff\x00garbage")
    with open_log(tmp_path) as log:
        assert log.epoch_entries() == expected


def test_epoch_file_behind_the_records_is_completed(tmp_path: Path) -> None:
    """A crash between appending a new epoch's first batch and writing the epoch file."""
    with open_log(tmp_path) as log:
        fill(log, 10)
        old = (tmp_path / EPOCH_FILE).read_bytes()
        log.append(7, [b"new epoch"])
        log._abandon()
    (tmp_path / EPOCH_FILE).write_bytes(old)
    with open_log(tmp_path) as log:
        assert log.epoch_entries() == [(0, 0), (7, 30)]


def test_epoch_file_ahead_of_the_records_is_trimmed(tmp_path: Path) -> None:
    """A crash between cutting records and trimming the epoch file."""
    with open_log(tmp_path) as log:
        fill(log, 12, epoch_every=4)
        old = (tmp_path / EPOCH_FILE).read_bytes()
        log.truncate_to(14)
        log._abandon()
    (tmp_path / EPOCH_FILE).write_bytes(old)
    with open_log(tmp_path) as log:
        assert log.epoch_entries() == [(0, 0), (1, 12)]


def test_crash_during_advance_start_offset(tmp_path: Path) -> None:
    """The start-offset file is written first; segments and epochs follow it on the next open."""
    with open_log(tmp_path) as log:
        batches = fill(log, 30, epoch_every=10)
        epochs = (tmp_path / EPOCH_FILE).read_bytes()
        segments = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.suffix in (".log", ".index")}
        log.advance_start_offset(50)
        log._abandon()
    (tmp_path / EPOCH_FILE).write_bytes(epochs)
    for name, content in segments.items():
        (tmp_path / name).write_bytes(content)
    with open_log(tmp_path) as log:
        assert (log.start_offset, log.epoch_entries()) == (50, [(1, 50), (2, 60)])
        assert flat(log) == flat_batches(batches)[50:]
        assert int(segment_files(tmp_path)[0].stem) <= 50
        assert len(segment_files(tmp_path)) < len([n for n in segments if n.endswith(".log")])


def test_crash_during_reset_finishes_it(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        fill(log, 30)
    (tmp_path / START_OFFSET_FILE).write_text("0\n500 1\n")  # reset(500) began, nothing else happened
    with open_log(tmp_path) as log:
        assert (log.start_offset, log.end_offset, log.epoch_entries()) == (500, 500, [])
        assert [p.name for p in segment_files(tmp_path)] == [f"{500:020d}.log"]
    assert (tmp_path / START_OFFSET_FILE).read_text() == "0\n500 0\n"


def test_lost_tail_below_the_start_empties_the_log(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        batches = fill(log, 5)
        log.advance_start_offset(13)
    last = segment_files(tmp_path)[-1]
    last.write_bytes(last.read_bytes()[: -len(encode_batch(batches[-1])) - 1])
    with open_log(tmp_path) as log:
        assert (log.start_offset, log.end_offset, log.epoch_entries()) == (13, 13, [])
        log.append(2, [b"x"])
        assert flat(log) == [(13, 2, b"x")]


def test_leftovers_of_interrupted_writes_are_removed(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        batches = fill(log, 5)
    last = segment_files(tmp_path)[-1]
    (tmp_path / (last.name + ".swap")).write_bytes(b"half a split")
    (tmp_path / (EPOCH_FILE + ".tmp")).write_bytes(b"half an epoch file")
    (tmp_path / f"{999:020d}.index").write_bytes(b"\x00" * 8)  # an index without its segment
    with open_log(tmp_path) as log:
        assert log.read(0, BIG) == batches
    names = {p.name for p in tmp_path.iterdir()}
    assert not any(n.endswith((".swap", ".tmp")) for n in names)
    assert f"{999:020d}.index" not in names


@pytest.mark.parametrize("damage", ["missing", "garbage", "torn"])
def test_bad_index_is_rebuilt(tmp_path: Path, damage: str) -> None:
    with open_log(tmp_path) as log:
        batches = fill(log, 40)
    for index in sorted(tmp_path.glob("*.index")):
        if damage == "missing":
            index.unlink()
        elif damage == "garbage":
            index.write_bytes(b"\xff" * 24)
        else:
            index.write_bytes(index.read_bytes()[:-3])
    with open_log(tmp_path) as log:
        assert log.read(0, BIG) == batches
        for batch in batches:
            assert log.read(batch.base_offset + 1, 1)[0].base_offset == batch.base_offset + 1
    assert all(p.stat().st_size % 8 == 0 for p in tmp_path.glob("*.index"))


@pytest.mark.parametrize("how", ["clean", "crash", "no epoch file"])
def test_an_emptied_log_may_restart_at_a_lower_epoch(tmp_path: Path, how: str) -> None:
    """Records below the start may carry higher epochs than the ones after it; recovery ignores them."""
    with open_log(tmp_path) as log:
        fill(log, 2, epoch_every=1)  # epochs 0 and 1 at offsets 0..5, one segment
        log.advance_start_offset(4)
        log.truncate_to(4)  # empty at 4: any epoch goes
        assert (log.latest_epoch, log.epoch_entries()) == (-1, [])
        log.append(0, [b"low"])
        log.append(0, [b"low again"])
        if how == "crash":
            log._abandon()
    if how == "no epoch file":
        (tmp_path / EPOCH_FILE).unlink()
    with open_log(tmp_path) as log:
        assert (log.start_offset, log.end_offset, log.epoch_entries()) == (4, 6, [(0, 4)])
        assert flat(log) == [(4, 0, b"low"), (5, 0, b"low again")]


def test_a_log_flushed_by_its_caller_refuses_damage_in_an_older_segment(tmp_path: Path) -> None:
    """The Raft storage fsyncs before it acknowledges: a damaged older segment may hold acknowledged
    entries, so recovery refuses rather than ending the log there (as it does for an unflushed log)."""
    write_pristine(tmp_path, "never", clean=False)
    second = segment_files(tmp_path)[1]
    second.write_bytes(second.read_bytes()[:-5])
    with pytest.raises(CorruptLogError, match=second.name):
        Log.open(tmp_path, segment_bytes=SEGMENT_BYTES, index_interval_bytes=64, flushed_by_caller=True)
    assert len(segment_files(tmp_path)) >= 3  # nothing was cut or dropped


def test_a_log_flushed_by_its_caller_still_cuts_a_torn_tail(tmp_path: Path) -> None:
    batches = write_pristine(tmp_path, "never", clean=False)
    last = segment_files(tmp_path)[-1]
    last.write_bytes(last.read_bytes()[:-5])
    log = Log.open(tmp_path, segment_bytes=SEGMENT_BYTES, index_interval_bytes=64, flushed_by_caller=True)
    with log:
        assert flat(log) == flat_batches(batches[:-1])

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hotstate.log import Log, LogError, OffsetOutOfRangeError, RecordBatch
from hotstate.log.batch import encode_batch
from hotstate.log.divergence import DivergingEpoch

from .helpers import BIG, fill, flat, flat_batches, segment_files


def open_log(path: Path, **kwargs: object) -> Log:
    options: dict[str, object] = {"segment_bytes": 512, "index_interval_bytes": 64}
    options.update(kwargs)
    return Log.open(path, **options)  # type: ignore[arg-type]


def test_empty_log(tmp_path: Path) -> None:
    with open_log(tmp_path / "new" / "log") as log:
        assert (log.start_offset, log.end_offset, log.latest_epoch) == (0, 0, -1)
        assert log.read(0, 100) == []
        assert log.epoch_entries() == []
        assert log.end_offset_for_epoch(0) == DivergingEpoch(0, 0)  # the empty prefix every log shares
        assert log.end_offset_for_epoch(-1) is None
        with pytest.raises(OffsetOutOfRangeError):
            log.read(1, 100)


def test_append_assigns_offsets_and_survives_reopen(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        first = log.append(3, [b"a", b"b"])
        second = log.append(3, [b"c"])
        assert first == RecordBatch(0, 3, (b"a", b"b"))
        assert (second.base_offset, second.last_offset, second.next_offset) == (2, 2, 3)
        assert log.end_offset == 3
    with open_log(tmp_path) as log:
        assert log.read(0, BIG) == [first, second]
        assert (log.end_offset, log.latest_epoch, log.epoch_entries()) == (3, 3, [(3, 0)])


def test_segments_roll_by_size_and_reads_cross_them(tmp_path: Path) -> None:
    with open_log(tmp_path, segment_bytes=300) as log:
        batches = fill(log, 40)
        files = segment_files(tmp_path)
        assert len(files) > 5
        assert all(f.stat().st_size <= 300 for f in files)
        assert files[0].name == f"{0:020d}.log"
        assert log.read(0, BIG) == batches
        # Names are base offsets: every segment starts with the batch its name says.
        starts = {b.base_offset for b in batches}
        assert {int(f.stem) for f in files} <= starts
    with open_log(tmp_path, segment_bytes=300) as log:
        assert log.read(0, BIG) == batches


def test_a_batch_larger_than_a_segment_gets_its_own(tmp_path: Path) -> None:
    with open_log(tmp_path, segment_bytes=100) as log:
        log.append(0, [b"small"])
        big = log.append(0, [b"x" * 500])
        log.append(0, [b"after"])
        assert len(segment_files(tmp_path)) == 3
        assert log.read(1, 10) == [big]


def test_index_lookups_with_many_small_batches(tmp_path: Path) -> None:
    with open_log(tmp_path, segment_bytes=4096, index_interval_bytes=100) as log:
        for i in range(600):
            log.append(0, [f"{i}".encode(), b"y"])
        indexes = sorted(tmp_path.glob("*.index"))
        assert len(indexes) > 2 and all(p.stat().st_size > 0 for p in indexes[:-1])
        for offset in range(0, log.end_offset, 7):
            (batch,) = log.read(offset, 1)
            assert batch.base_offset == offset
            expected = f"{offset // 2}".encode() if offset % 2 == 0 else b"y"
            assert batch.records[0] == expected


def test_read_trims_the_first_batch_and_respects_max_bytes(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        batches = fill(log, 10, per_batch=4)
        size = len(encode_batch(batches[0]))
        assert all(len(encode_batch(b)) == size for b in batches)
        # The batch holding the offset comes trimmed to start there.
        got = log.read(6, size)
        assert got == [RecordBatch(6, 0, batches[1].records[2:])]
        # max_bytes counts whole encoded batches: two fit exactly, a third does not.
        assert len(log.read(4, 2 * size)) == 2
        assert len(log.read(4, 3 * size - 1)) == 2
        # A reader always advances: one batch even if it exceeds max_bytes.
        assert log.read(5, 0) == [RecordBatch(5, 0, batches[1].records[1:])]
        assert log.read(log.end_offset - 1, 0)[0].records == (batches[-1].records[-1],)
        assert log.read(log.end_offset, 0) == []
        with pytest.raises(OffsetOutOfRangeError):
            log.read(log.end_offset + 1, 10)


def test_truncate_at_a_batch_boundary(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        batches = fill(log, 10)
        log.truncate_to(batches[6].base_offset)
        assert log.end_offset == batches[6].base_offset
        assert log.read(0, BIG) == batches[:6]
        again = log.append(0, [b"new"])
        assert again.base_offset == batches[6].base_offset
    with open_log(tmp_path) as log:
        assert log.read(0, BIG) == [*batches[:6], again]


def test_truncate_inside_a_batch_keeps_its_prefix(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        batches = fill(log, 10)
        log.truncate_to(batches[4].base_offset + 2)
        assert log.end_offset == batches[4].base_offset + 2
        prefix = RecordBatch(batches[4].base_offset, 0, batches[4].records[:2])
        assert log.read(0, BIG) == [*batches[:4], prefix]
        assert not list(tmp_path.glob("*.swap"))
        log.append(0, [b"z"])
    with open_log(tmp_path) as log:
        assert flat(log)[-3:] == [(12, 0, b"r4-0"), (13, 0, b"r4-1"), (14, 0, b"z")]


def test_truncate_across_segments(tmp_path: Path) -> None:
    with open_log(tmp_path, segment_bytes=200) as log:
        batches = fill(log, 30)
        before = len(segment_files(tmp_path))
        log.truncate_to(10)
        assert len(segment_files(tmp_path)) < before
        assert flat(log) == flat_batches(batches)[:10]
        more = fill(log, 20)
        assert log.read(10, BIG)[0].base_offset == 10
        assert [b.records for b in log.read(10, BIG)][1:] == [b.records for b in more[1:]]
    with open_log(tmp_path, segment_bytes=200) as log:
        assert log.end_offset == 10 + 20 * 3


def test_truncate_to_a_segment_base_and_to_the_start(tmp_path: Path) -> None:
    with open_log(tmp_path, segment_bytes=200) as log:
        fill(log, 20)
        second = int(segment_files(tmp_path)[1].stem)
        log.truncate_to(second)
        assert log.end_offset == second
        assert int(segment_files(tmp_path)[-1].stem) < second
        log.truncate_to(0)
        assert (log.end_offset, log.epoch_entries(), log.read(0, BIG)) == (0, [], [])
        log.append(4, [b"fresh"])
        assert flat(log) == [(0, 4, b"fresh")]


def test_truncate_bounds(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        fill(log, 10)
        log.advance_start_offset(5)
        with pytest.raises(OffsetOutOfRangeError):
            log.truncate_to(4)
        log.truncate_to(100)  # beyond the end: nothing to drop
        assert log.end_offset == 30


def test_advance_start_offset_deletes_whole_segments_below(tmp_path: Path) -> None:
    with open_log(tmp_path, segment_bytes=200) as log:
        batches = fill(log, 30, epoch_every=10)
        before = segment_files(tmp_path)
        log.advance_start_offset(40)
        after = segment_files(tmp_path)
        assert int(after[0].stem) <= 40 < (int(after[1].stem) if len(after) > 1 else log.end_offset)
        assert len(after) < len(before)
        assert log.start_offset == 40
        with pytest.raises(OffsetOutOfRangeError):
            log.read(39, 10)
        assert flat(log) == flat_batches(batches)[40:]
        # Epoch 0 held offsets 0..29 and is gone; epoch 1 (30..59) now starts at the new start.
        assert log.epoch_entries() == [(1, 40), (2, 60)]
        log.advance_start_offset(20)  # backwards: ignored
        assert log.start_offset == 40
        with pytest.raises(OffsetOutOfRangeError):
            log.advance_start_offset(log.end_offset + 1)
    with open_log(tmp_path, segment_bytes=200) as log:
        assert (log.start_offset, log.end_offset) == (40, 90)
        assert log.epoch_entries() == [(1, 40), (2, 60)]
        assert flat(log) == flat_batches(batches)[40:]


def test_advance_start_offset_to_the_end_empties_the_log(tmp_path: Path) -> None:
    with open_log(tmp_path, segment_bytes=200) as log:
        fill(log, 10, epoch_every=3)
        log.advance_start_offset(30)
        assert [int(f.stem) for f in segment_files(tmp_path)] == [30]
        assert (log.start_offset, log.end_offset, log.latest_epoch, log.epoch_entries()) == (30, 30, -1, [])
        assert log.read(30, 10) == []
        # An empty log takes any epoch: the one below the start lives in the snapshot now.
        log.append(1, [b"x"])
    with open_log(tmp_path, segment_bytes=200) as log:
        assert (log.start_offset, log.end_offset, log.epoch_entries()) == (30, 31, [(1, 30)])


def kraft_log(path: Path) -> Log:
    """Epoch 1 holds 0..4, epoch 3 holds 5..9, epoch 5 holds 10..14."""
    log = open_log(path)
    for epoch in (1, 3, 5):
        log.append(epoch, [b"a", b"b"])
        log.append(epoch, [b"c", b"d", b"e"])
    return log


def test_epoch_entries_and_end_offset_for_epoch(tmp_path: Path) -> None:
    with kraft_log(tmp_path) as log:
        assert log.epoch_entries() == [(1, 0), (3, 5), (5, 10)]
        assert log.latest_epoch == 5
        expected = {
            -1: None,
            0: DivergingEpoch(0, 0),  # below every record, at offset 0: the empty prefix
            1: DivergingEpoch(1, 5),
            2: DivergingEpoch(1, 5),
            3: DivergingEpoch(3, 10),
            4: DivergingEpoch(3, 10),
            5: DivergingEpoch(5, 15),
            6: DivergingEpoch(5, 15),
        }
        assert {e: log.end_offset_for_epoch(e) for e in expected} == expected


def test_kraft_divergence_example(tmp_path: Path) -> None:
    """A follower wrote epoch 4 records the new leader (epoch 5) never had; it asks and truncates."""
    with kraft_log(tmp_path / "leader") as leader, open_log(tmp_path / "follower") as follower:
        for batch in leader.read(0, BIG)[:4]:  # epochs 1 and 3, offsets 0..9
            follower.append_batch(batch)
        follower.append(4, [b"x", b"y", b"z"])  # offsets 10..12, unknown to the leader
        diverging = leader.end_offset_for_epoch(follower.latest_epoch)
        assert diverging == DivergingEpoch(3, 10)
        follower.truncate_to(min(diverging.end_offset, follower.end_offset))
        assert follower.end_offset_for_epoch(diverging.epoch) == DivergingEpoch(3, 10)
        for batch in leader.read(follower.end_offset, BIG):
            follower.append_batch(batch)
        assert follower.read(0, BIG) == leader.read(0, BIG)
        assert follower.epoch_entries() == leader.epoch_entries()


def test_epochs_after_truncation_and_reopen(tmp_path: Path) -> None:
    with kraft_log(tmp_path) as log:
        log.truncate_to(12)
        assert log.end_offset_for_epoch(5) == DivergingEpoch(5, 12)
        log.truncate_to(10)
        assert log.epoch_entries() == [(1, 0), (3, 5)]
        assert log.end_offset_for_epoch(5) == DivergingEpoch(3, 10)
        log.truncate_to(7)  # inside epoch 3's first batch
        assert log.epoch_entries() == [(1, 0), (3, 5)]
        log.append(6, [b"n"])
    with open_log(tmp_path) as log:
        assert log.epoch_entries() == [(1, 0), (3, 5), (6, 7)]
        assert log.end_offset_for_epoch(5) == DivergingEpoch(3, 7)
        log.advance_start_offset(6)
        assert log.epoch_entries() == [(3, 6), (6, 7)]
        # Below every record above offset 0: the checkpoint does not keep the epoch below the start.
        assert log.end_offset_for_epoch(1) is None
    with open_log(tmp_path) as log:
        assert log.epoch_entries() == [(3, 6), (6, 7)]


def test_append_batch_rejections(tmp_path: Path) -> None:
    with open_log(tmp_path) as log:
        log.append_batch(RecordBatch(0, 2, (b"a", b"b")))
        with pytest.raises(LogError, match="ends at 2"):
            log.append_batch(RecordBatch(1, 2, (b"c",)))
        with pytest.raises(LogError, match="ends at 2"):
            log.append_batch(RecordBatch(3, 2, (b"c",)))
        with pytest.raises(LogError, match="epoch 1"):
            log.append_batch(RecordBatch(2, 1, (b"c",)))
        with pytest.raises(LogError, match="epoch 1"):
            log.append(1, [b"c"])
        with pytest.raises(LogError):
            log.append_batch(RecordBatch(2, 2, ()))
        with pytest.raises(LogError):
            log.append(2, [])
        assert (log.end_offset, log.latest_epoch) == (2, 2)
        log.append_batch(RecordBatch(2, 3, (b"c",)))
        assert log.epoch_entries() == [(2, 0), (3, 2)]


def test_reset(tmp_path: Path) -> None:
    with open_log(tmp_path, segment_bytes=200) as log:
        fill(log, 20, epoch_every=5)
        log.reset(1000)
        assert (log.start_offset, log.end_offset, log.latest_epoch, log.epoch_entries()) == (
            1000,
            1000,
            -1,
            [],
        )
        assert [f.name for f in segment_files(tmp_path)] == [f"{1000:020d}.log"]
        with pytest.raises(OffsetOutOfRangeError):
            log.read(999, 10)
        log.append(9, [b"after"])
        log.reset(3)  # a reset may also move the start back
        assert (log.start_offset, log.end_offset) == (3, 3)
        log.append(9, [b"again"])
    with open_log(tmp_path, segment_bytes=200) as log:
        assert (log.start_offset, log.end_offset, log.epoch_entries()) == (3, 4, [(9, 3)])
        assert flat(log) == [(3, 9, b"again")]


def test_a_directory_opens_once(tmp_path: Path) -> None:
    with open_log(tmp_path), pytest.raises(LogError, match="open elsewhere"):
        open_log(tmp_path)
    open_log(tmp_path).close()


def test_closed_log_refuses_calls(tmp_path: Path) -> None:
    log = open_log(tmp_path)
    log.close()
    log.close()
    assert log.closed
    with pytest.raises(LogError, match="closed"):
        log.append(0, [b"x"])
    with pytest.raises(LogError, match="closed"):
        log.read(0, 1)


def test_bad_options(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        Log.open(tmp_path, fsync="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        Log.open(tmp_path, segment_bytes=10)
    with pytest.raises(ValueError):
        Log.open(tmp_path, index_interval_bytes=-1)


@pytest.mark.parametrize("policy", ["always", "never"])
def test_fsync_policy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, policy: str) -> None:
    calls: list[int] = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def counting_fsync(fd: int) -> None:
        calls.append(fd)
        real_fsync(fd)

    def counting_fdatasync(fd: int) -> None:
        calls.append(fd)
        real_fdatasync(fd)

    log = open_log(tmp_path, fsync=policy)
    monkeypatch.setattr(os, "fsync", counting_fsync)
    monkeypatch.setattr(os, "fdatasync", counting_fdatasync)
    log.append(0, [b"a"])
    log.append(0, [b"b"])
    log.truncate_to(1)
    assert len(calls) >= (3 if policy == "always" else 0)
    if policy == "never":
        assert calls == []
        log.flush()
        assert calls
    log.close()
    with open_log(tmp_path, fsync=policy) as log:
        assert flat(log) == [(0, 0, b"a")]


def test_flush_syncs_every_segment_written_since_the_last_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[int] = []
    real_fdatasync = os.fdatasync

    def recording_fdatasync(fd: int) -> None:
        synced.append(fd)
        real_fdatasync(fd)

    with open_log(tmp_path, segment_bytes=200) as log:
        fill(log, 3)
        log.flush()
        monkeypatch.setattr(os, "fdatasync", recording_fdatasync)
        first_unflushed = len(segment_files(tmp_path)) - 1
        fill(log, 12)
        assert synced == []  # fsync="never": rolls do not sync
        log.flush()
        assert len(synced) == len(segment_files(tmp_path)) - first_unflushed
        synced.clear()
        log.flush()
        assert synced == []

"""The log against an in-memory model, through appends, truncations, restarts and torn tails."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hotstate.log import Log, LogError, OffsetOutOfRangeError, RecordBatch
from hotstate.log.batch import encode_batch
from hotstate.log.divergence import DivergingEpoch

from .helpers import BIG, segment_files

RECORDS = st.lists(st.binary(max_size=24), min_size=1, max_size=5)


class Model:
    """The stored batches (their layout matters for reads and torn tails) and the start offset."""

    def __init__(self) -> None:
        self.batches: list[RecordBatch] = []
        self.start = 0
        self.empty_end = 0  # end offset when no batch reaches the start (after reset or advance to end)

    @property
    def end(self) -> int:
        if self.batches and self.batches[-1].next_offset > self.start:
            return self.batches[-1].next_offset
        return max(self.empty_end, self.start)

    def visible(self) -> list[tuple[int, int, bytes]]:
        return [
            (b.base_offset + i, b.leader_epoch, r)
            for b in self.batches
            for i, r in enumerate(b.records)
            if b.base_offset + i >= self.start
        ]

    def epoch_entries(self) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for offset, epoch, _ in self.visible():
            if not out or epoch > out[-1][0]:
                out.append((epoch, offset))
        return out

    def latest_epoch(self) -> int:
        entries = self.epoch_entries()
        return entries[-1][0] if entries else -1

    def end_offset_for_epoch(self, epoch: int) -> DivergingEpoch | None:
        entries = self.epoch_entries()
        below = [i for i, (e, _) in enumerate(entries) if e <= epoch]
        if not below:
            # Only the empty prefix below offset 0 (epoch 0) is known below the records: the log file does
            # not keep the epoch below a later start.
            return DivergingEpoch(0, 0) if self.start == 0 and epoch >= 0 else None
        i = below[-1]
        return DivergingEpoch(entries[i][0], entries[i + 1][1] if i + 1 < len(entries) else self.end)

    def append(self, batch: RecordBatch) -> None:
        self.batches.append(batch)

    def truncate(self, offset: int) -> None:
        kept: list[RecordBatch] = []
        for b in self.batches:
            if b.next_offset <= offset:
                kept.append(b)
            elif b.base_offset < offset:
                kept.append(RecordBatch(b.base_offset, b.leader_epoch, b.records[: offset - b.base_offset]))
        self.batches = kept
        self.empty_end = offset

    def advance(self, offset: int) -> None:
        if offset > self.start:
            self.empty_end = self.end
            self.start = offset

    def reset(self, offset: int) -> None:
        self.batches = []
        self.start = self.empty_end = offset

    def lose_last_batch(self) -> None:
        """What recovery does when the last stored batch is torn."""
        lost = self.batches.pop()
        if lost.base_offset < self.start:  # the log ended below its start: emptied at the start
            self.batches = []
        self.empty_end = max(lost.base_offset, self.start)

    def expected_read(self, from_offset: int, max_bytes: int) -> list[RecordBatch]:
        out: list[RecordBatch] = []
        used = 0
        for b in self.batches:
            if b.next_offset <= from_offset:
                continue
            size = len(encode_batch(b))
            if out and used + size > max_bytes:
                break
            if b.base_offset < from_offset:
                b = RecordBatch(from_offset, b.leader_epoch, b.records[from_offset - b.base_offset :])
            out.append(b)
            used += size
        return out


class LogMachine(RuleBasedStateMachine):
    fsync = "never"
    root: Path | None = None  # set per test to its tmp_path

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="machine-", dir=self.root))
        self.path = self.tmp / "log"
        self.model = Model()
        self.log = self._open()

    def _open(self) -> Log:
        return Log.open(self.path, fsync=self.fsync, segment_bytes=160, index_interval_bytes=48)  # type: ignore[arg-type]

    def teardown(self) -> None:
        self.log._abandon()
        shutil.rmtree(self.tmp, ignore_errors=True)

    @initialize(count=st.integers(0, 12))
    def prefill(self, count: int) -> None:
        for i in range(count):
            self.model.append(self.log.append(i // 4, [bytes([i]) * (i % 7)]))

    @rule(bump=st.integers(0, 2), records=RECORDS)
    def append(self, bump: int, records: list[bytes]) -> None:
        epoch = max(self.model.latest_epoch(), 0) + bump
        batch = self.log.append(epoch, records)
        assert batch == RecordBatch(self.model.end, epoch, tuple(records))
        self.model.append(batch)

    @rule(bump=st.integers(0, 2), records=RECORDS)
    def append_batch(self, bump: int, records: list[bytes]) -> None:
        batch = RecordBatch(self.model.end, max(self.model.latest_epoch(), 0) + bump, tuple(records))
        self.log.append_batch(batch)
        self.model.append(batch)

    @rule(shift=st.sampled_from([-2, -1, 1, 3]), records=RECORDS)
    def append_batch_at_wrong_offset(self, shift: int, records: list[bytes]) -> None:
        batch = RecordBatch(max(self.model.end + shift, 0), max(self.model.latest_epoch(), 0), tuple(records))
        if batch.base_offset == self.model.end:
            return
        with pytest.raises(LogError):
            self.log.append_batch(batch)

    @precondition(lambda self: self.model.latest_epoch() > 0)
    @rule(records=RECORDS)
    def append_stale_epoch(self, records: list[bytes]) -> None:
        with pytest.raises(LogError):
            self.log.append(self.model.latest_epoch() - 1, records)

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(self.model.start, self.model.end + 2), label="truncate_to")
        self.log.truncate_to(offset)
        if offset < self.model.end:
            self.model.truncate(offset)

    @precondition(lambda self: self.model.start > 0)
    @rule()
    def truncate_below_start(self) -> None:
        with pytest.raises(OffsetOutOfRangeError):
            self.log.truncate_to(self.model.start - 1)

    @rule(data=st.data())
    def advance_start(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(max(self.model.start - 2, 0), self.model.end), label="advance_to")
        self.log.advance_start_offset(offset)
        self.model.advance(offset)

    @rule(data=st.data())
    def reset(self, data: st.DataObject) -> None:
        offset = data.draw(st.integers(0, self.model.end + 20), label="reset_to")
        self.log.reset(offset)
        self.model.reset(offset)

    @rule(clean=st.booleans())
    def reopen(self, clean: bool) -> None:
        if clean:
            self.log.close()
        else:
            self.log._abandon()
        self.log = self._open()

    @rule(data=st.data(), clean=st.booleans())
    def tear_tail(self, data: st.DataObject, clean: bool) -> None:
        """Cut the last segment inside its last batch, as a crash in the middle of a write leaves it."""
        if clean:
            self.log.close()
        else:
            self.log._abandon()
        last = segment_files(self.path)[-1]
        content = last.read_bytes()
        if content:
            encoded = encode_batch(self.model.batches[-1])
            assert content.endswith(encoded)
            cut = data.draw(st.integers(1, len(encoded)), label="bytes_cut")
            last.write_bytes(content[:-cut])
            self.model.lose_last_batch()
        self.log = self._open()

    @rule(data=st.data(), max_bytes=st.integers(0, 300))
    def read(self, data: st.DataObject, max_bytes: int) -> None:
        offset = data.draw(st.integers(max(self.model.start - 1, 0), self.model.end + 1), label="read_from")
        if not self.model.start <= offset <= self.model.end:
            with pytest.raises(OffsetOutOfRangeError):
                self.log.read(offset, max_bytes)
            return
        assert self.log.read(offset, max_bytes) == self.model.expected_read(offset, max_bytes)

    @rule(epoch=st.integers(-1, 12))
    def end_offset_for_epoch(self, epoch: int) -> None:
        assert self.log.end_offset_for_epoch(epoch) == self.model.end_offset_for_epoch(epoch)

    @invariant()
    def agrees_with_model(self) -> None:
        model = self.model
        assert (self.log.start_offset, self.log.end_offset) == (model.start, model.end)
        assert self.log.epoch_entries() == model.epoch_entries()
        assert self.log.latest_epoch == model.latest_epoch()
        got = [
            (b.base_offset + i, b.leader_epoch, r)
            for b in self.log.read(model.start, BIG)
            for i, r in enumerate(b.records)
        ]
        assert got == model.visible()


class AlwaysFsyncLogMachine(LogMachine):
    fsync = "always"


@pytest.fixture(autouse=True)
def _machines_in_tmp_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(LogMachine, "root", tmp_path)


_SETTINGS = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)
TestLog = LogMachine.TestCase
TestLog.settings = _SETTINGS
TestAlwaysFsyncLog = AlwaysFsyncLogMachine.TestCase
TestAlwaysFsyncLog.settings = settings(_SETTINGS, max_examples=20)

"""BatchLog, the replication core's in-memory tail of a partition log: one rule per test, then a model."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from hotstate.log.batch import RecordBatch
from hotstate.log.divergence import DivergingEpoch
from hotstate.replica.batchlog import BatchLog, BatchLogError, batch_bytes


def batch(base: int, epoch: int, count: int, size: int = 4) -> RecordBatch:
    return RecordBatch(base, epoch, tuple(bytes([65 + (base + i) % 26]) * size for i in range(count)))


def sample() -> BatchLog:
    """[0,3) epoch 1 | [3,5) epoch 1 | [5,8) epoch 2 | [8,10) epoch 4."""
    return BatchLog(batches=[batch(0, 1, 3), batch(3, 1, 2), batch(5, 2, 3), batch(8, 4, 2)])


def flat(batches: list[RecordBatch]) -> list[tuple[int, int, bytes]]:
    return [(b.base_offset + i, b.leader_epoch, r) for b in batches for i, r in enumerate(b.records)]


# ---------------------------------------------------------------------- append and read


def test_append_moves_the_end_and_read_returns_the_batches() -> None:
    log = sample()
    assert (log.start_offset, log.end_offset, log.batch_count, log.last_epoch) == (0, 10, 4, 4)
    assert log.read(0, 1 << 30) == [batch(0, 1, 3), batch(3, 1, 2), batch(5, 2, 3), batch(8, 4, 2)]
    assert log.read(10, 1 << 30) == []


def test_read_stops_at_max_bytes_but_returns_at_least_one_batch() -> None:
    log = sample()
    first, second = batch(0, 1, 3), batch(3, 1, 2)
    assert log.read(0, 1) == [first]  # one batch even though it is larger than max_bytes
    assert log.read(0, 0) == [first]
    exactly_two = batch_bytes(first) + batch_bytes(second)
    assert log.read(0, exactly_two) == [first, second]
    assert log.read(0, exactly_two - 1) == [first]


def test_read_from_inside_a_batch_cuts_the_first_batch_to_start_there() -> None:
    log = sample()
    out = log.read(6, 1 << 30)
    assert out[0] == RecordBatch(6, 2, batch(5, 2, 3).records[1:])
    assert out[1:] == [batch(8, 4, 2)]
    # The cut batch's bytes are what the budget counts.
    assert log.read(6, batch_bytes(out[0])) == [out[0]]


def test_between_cuts_at_both_ends() -> None:
    log = sample()
    assert flat(log.read_between(4, 9)) == [o for o in flat(log.read(0, 1 << 30)) if 4 <= o[0] < 9]
    assert log.read_between(4, 9) == [
        RecordBatch(4, 1, batch(3, 1, 2).records[1:]),
        batch(5, 2, 3),
        RecordBatch(8, 4, batch(8, 4, 2).records[:1]),
    ]
    assert log.read_between(5, 8) == [batch(5, 2, 3)]
    assert log.read_between(6, 6) == []
    assert log.read_between(10, 10) == []


def test_between_counts_no_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    # The core asks for its committed batches at every Ready: counting each record's bytes up to the log's
    # end there cost one len() per record appended behind them (loop stalls during a bulk load).
    import hotstate.replica.batchlog as batchlog

    def refuse(_: RecordBatch) -> int:
        raise AssertionError("read_between counted a batch's bytes")

    monkeypatch.setattr(batchlog, "batch_bytes", refuse)
    log = sample()
    assert flat(log.read_between(4, 6)) == [(4, 1, b"EEEE"), (5, 2, b"FFFF")]
    assert log.read_between(0, 10) == [batch(0, 1, 3), batch(3, 1, 2), batch(5, 2, 3), batch(8, 4, 2)]
    with pytest.raises(BatchLogError):
        log.read_between(11, 12)


def test_epoch_at() -> None:
    log = sample()
    assert [log.epoch_at(o) for o in range(10)] == [1, 1, 1, 1, 1, 2, 2, 2, 4, 4]
    with pytest.raises(BatchLogError):
        log.epoch_at(10)


# ---------------------------------------------------------------------- errors


def test_append_with_a_gap_or_an_overlap_is_refused() -> None:
    log = sample()
    with pytest.raises(BatchLogError):
        log.append(batch(11, 4, 1))
    with pytest.raises(BatchLogError):
        log.append(batch(9, 4, 1))
    assert log.end_offset == 10


def test_append_of_an_older_epoch_is_refused() -> None:
    log = sample()
    with pytest.raises(BatchLogError):
        log.append(batch(10, 3, 1))
    log.append(batch(10, 4, 1))  # the same epoch is fine
    log.append(batch(11, 7, 1))
    assert log.last_epoch == 7


def test_append_below_the_pinned_start_epoch_is_refused() -> None:
    log = BatchLog(10, 3)
    with pytest.raises(BatchLogError):
        log.append(batch(10, 2, 1))


def test_empty_batch_is_refused() -> None:
    with pytest.raises(BatchLogError):
        BatchLog().append(RecordBatch(0, 0, ()))


def test_read_outside_the_log_is_refused() -> None:
    log = sample()
    log.advance_start(5)
    with pytest.raises(BatchLogError):
        log.read(4, 100)
    with pytest.raises(BatchLogError):
        log.read(11, 100)
    with pytest.raises(BatchLogError):
        log.truncate_to(4)


# ---------------------------------------------------------------------- truncate


def test_truncate_mid_batch_keeps_the_head_of_the_batch() -> None:
    log = sample()
    log.truncate_to(6)
    assert log.end_offset == 6
    assert log.read(0, 1 << 30)[-1] == RecordBatch(5, 2, batch(5, 2, 3).records[:1])
    assert log.last_epoch == 2
    log.append(batch(6, 5, 1))  # appends continue at the new end
    assert log.end_offset == 7


def test_truncate_at_a_boundary_forgets_that_epoch() -> None:
    log = sample()
    log.truncate_to(5)
    assert log.last_epoch == 1
    assert log.end_offset_for_epoch(2) == DivergingEpoch(1, 5)
    assert log.end_offset_for_epoch(9) == DivergingEpoch(1, 5)
    log.append(batch(5, 3, 1))
    assert log.end_offset_for_epoch(2) == DivergingEpoch(1, 5)
    assert log.end_offset_for_epoch(3) == DivergingEpoch(3, 6)


def test_truncate_at_or_past_the_end_changes_nothing() -> None:
    log = sample()
    log.truncate_to(10)
    log.truncate_to(50)
    assert log.end_offset == 10 and log.batch_count == 4


def test_truncate_to_zero_empties_the_log() -> None:
    log = sample()
    log.truncate_to(0)
    assert (log.end_offset, log.batch_count, log.last_epoch) == (0, 0, 0)
    assert log.end_offset_for_epoch(1) == DivergingEpoch(0, 0)
    log.append(batch(0, 1, 1))


def test_truncate_to_the_start_keeps_the_pinned_start_epoch() -> None:
    log = sample()
    log.advance_start(5)
    log.truncate_to(5)
    assert (log.start_offset, log.end_offset, log.last_epoch) == (5, 5, 1)
    assert log.end_offset_for_epoch(1) == DivergingEpoch(1, 5)
    assert log.end_offset_for_epoch(4) == DivergingEpoch(1, 5)
    assert log.end_offset_for_epoch(0) is None


# ---------------------------------------------------------------------- advance_start


def test_advance_start_forgets_only_whole_batches() -> None:
    log = sample()
    assert log.advance_start(4) == 3  # [3,5) holds offset 4, so it stays
    assert (log.start_offset, log.batch_count, log.start_epoch) == (3, 3, 1)
    assert log.advance_start(4) == 3
    assert log.advance_start(8) == 8
    assert (log.start_offset, log.batch_count, log.start_epoch) == (8, 1, 2)  # pinned: epoch of record 7
    assert log.epoch_at(7) == 2
    assert log.read(8, 1 << 30) == [batch(8, 4, 2)]


def test_advance_start_below_the_start_changes_nothing() -> None:
    log = sample()
    log.advance_start(5)
    assert log.advance_start(2) == 5
    assert log.advance_start(5) == 5
    assert log.start_offset == 5


def test_advance_start_past_the_end_stops_at_the_end() -> None:
    log = sample()
    assert log.advance_start(100) == 10
    assert (log.start_offset, log.end_offset, log.batch_count) == (10, 10, 0)
    assert (log.start_epoch, log.last_epoch) == (4, 4)
    assert log.end_offset_for_epoch(4) == DivergingEpoch(4, 10)
    assert log.end_offset_for_epoch(3) is None
    log.append(batch(10, 4, 1))
    assert log.end_offset_for_epoch(4) == DivergingEpoch(4, 11)


def test_advance_start_at_an_epoch_boundary_pins_the_previous_epoch() -> None:
    log = sample()
    log.advance_start(5)  # record 4 is of epoch 1, record 5 starts epoch 2
    assert log.start_epoch == 1
    assert log.end_offset_for_epoch(1) == DivergingEpoch(1, 5)
    assert log.end_offset_for_epoch(2) == DivergingEpoch(2, 8)
    assert log.end_offset_for_epoch(3) == DivergingEpoch(2, 8)
    assert log.end_offset_for_epoch(4) == DivergingEpoch(4, 10)
    assert log.end_offset_for_epoch(0) is None


# ---------------------------------------------------------------------- reset


def test_reset_empties_the_log_at_the_snapshot_position() -> None:
    log = sample()
    log.reset(42, 3)
    assert (log.start_offset, log.end_offset, log.batch_count) == (42, 42, 0)
    assert (log.start_epoch, log.last_epoch, log.epoch_at(41)) == (3, 3, 3)
    assert log.read(42, 100) == []
    assert log.end_offset_for_epoch(3) == DivergingEpoch(3, 42)
    assert log.end_offset_for_epoch(2) is None
    with pytest.raises(BatchLogError):
        log.append(batch(43, 3, 1))
    with pytest.raises(BatchLogError):
        log.append(batch(42, 2, 1))
    log.append(batch(42, 3, 2))
    assert log.end_offset_for_epoch(3) == DivergingEpoch(3, 44)


def test_constructor_with_a_start_pins_its_epoch() -> None:
    log = BatchLog(20, 2, [batch(20, 2, 2), batch(22, 5, 1)])
    assert log.end_offset_for_epoch(2) == DivergingEpoch(2, 22)
    assert log.end_offset_for_epoch(4) == DivergingEpoch(2, 22)
    assert log.end_offset_for_epoch(5) == DivergingEpoch(5, 23)
    assert log.end_offset_for_epoch(1) is None


# ---------------------------------------------------------------------- end_offset_for_epoch


def test_end_offset_for_epoch_answers() -> None:
    log = sample()
    assert log.end_offset_for_epoch(1) == DivergingEpoch(1, 5)
    assert log.end_offset_for_epoch(2) == DivergingEpoch(2, 8)
    assert log.end_offset_for_epoch(3) == DivergingEpoch(
        2, 8
    )  # unknown epoch: the largest one below, and its end
    assert log.end_offset_for_epoch(4) == DivergingEpoch(4, 10)
    assert log.end_offset_for_epoch(99) == DivergingEpoch(4, 10)
    # Older than any record: the empty prefix below offset 0, which counts as epoch 0, ends at 0.
    assert log.end_offset_for_epoch(0) == DivergingEpoch(0, 0)
    assert log.end_offset_for_epoch(-1) is None


def test_end_offset_for_epoch_of_an_empty_log_at_zero() -> None:
    log = BatchLog()
    assert log.end_offset_for_epoch(0) == DivergingEpoch(0, 0)
    assert log.end_offset_for_epoch(5) == DivergingEpoch(0, 0)
    assert log.end_offset_for_epoch(-1) is None


# ---------------------------------------------------------------------- against a model


class Model:
    """Every record with its epoch, the batch boundaries, and the pinned start."""

    def __init__(self) -> None:
        self.start = 0
        self.start_epoch = 0
        self.records: list[tuple[int, bytes]] = []  # (epoch, record) from `start` on
        self.bases: list[int] = []  # batch starts, as absolute offsets

    @property
    def end(self) -> int:
        return self.start + len(self.records)

    @property
    def last_epoch(self) -> int:
        return self.records[-1][0] if self.records else self.start_epoch

    def end_for_epoch(self, epoch: int) -> DivergingEpoch | None:
        # The record just below the start is of the start epoch (epoch 0 for the empty prefix below 0).
        known = [(self.start_epoch if self.start > 0 else 0, self.start)]
        known += [(e, self.start + i) for i, (e, _) in enumerate(self.records)]
        below = [e for e, _ in known if e <= epoch]
        if not below:
            return None
        found = max(below)
        return DivergingEpoch(found, min((o for e, o in known if e > found), default=self.end))


RECORDS = st.lists(st.binary(min_size=0, max_size=6), min_size=1, max_size=4)


class BatchLogMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.log = BatchLog()
        self.model = Model()

    @rule(records=RECORDS, bump=st.integers(0, 2))
    def append(self, records: list[bytes], bump: int) -> None:
        epoch = self.model.last_epoch + bump
        self.log.append(RecordBatch(self.model.end, epoch, tuple(records)))
        self.model.bases.append(self.model.end)
        self.model.records.extend((epoch, r) for r in records)

    @rule(data=st.data())
    def truncate(self, data: st.DataObject) -> None:
        m = self.model
        offset = data.draw(st.integers(m.start, m.end + 2))
        self.log.truncate_to(offset)
        if offset < m.end:
            del m.records[offset - m.start :]
            m.bases = [b for b in m.bases if b < offset]

    @rule(data=st.data())
    def advance_start(self, data: st.DataObject) -> None:
        m = self.model
        target = data.draw(st.integers(max(0, m.start - 2), m.end + 2))
        new_start = self.log.advance_start(target)
        # The model: the start moves to the largest batch start <= target (or to the end).
        bound = min(target, m.end)
        candidates = [b for b in m.bases if b <= bound] + ([m.end] if bound == m.end else [])
        expected = max([m.start, *candidates])
        assert new_start == expected
        if expected > m.start:
            m.start_epoch = m.records[expected - m.start - 1][0]
            del m.records[: expected - m.start]
            m.start = expected
            m.bases = [b for b in m.bases if b >= expected]

    @rule(bump=st.integers(0, 30), epoch_bump=st.integers(0, 2))
    def reset(self, bump: int, epoch_bump: int) -> None:
        m = self.model
        offset, epoch = m.end + bump, m.last_epoch + epoch_bump
        self.log.reset(offset, epoch)
        m.start, m.start_epoch, m.records, m.bases = offset, epoch, [], []

    @rule(data=st.data(), max_bytes=st.integers(0, 60))
    def read(self, data: st.DataObject, max_bytes: int) -> None:
        m = self.model
        offset = data.draw(st.integers(m.start, m.end))
        out = self.log.read(offset, max_bytes)
        if offset == m.end:
            assert out == []
            return
        assert out and out[0].base_offset == offset
        assert len(out) == 1 or sum(batch_bytes(b) for b in out) <= max_bytes
        got = flat(out)
        want = [(m.start + i, e, r) for i, (e, r) in enumerate(m.records)][offset - m.start :]
        assert got == want[: len(got)]
        # Every batch after the first starts where the log has a batch boundary.
        assert all(b.base_offset in m.bases for b in out[1:])

    @rule(data=st.data())
    def between(self, data: st.DataObject) -> None:
        m = self.model
        start = data.draw(st.integers(m.start, m.end))
        end = data.draw(st.integers(start, m.end))
        got = flat(self.log.read_between(start, end))
        assert (
            got
            == [(m.start + i, e, r) for i, (e, r) in enumerate(m.records)][start - m.start : end - m.start]
        )

    @invariant()
    def matches_the_model(self) -> None:
        m, log = self.model, self.log
        assert (log.start_offset, log.end_offset, log.last_epoch) == (m.start, m.end, m.last_epoch)
        if m.start > 0:
            assert log.start_epoch == m.start_epoch
        everything = log.read(log.start_offset, 1 << 62)
        assert flat(everything) == [(m.start + i, e, r) for i, (e, r) in enumerate(m.records)]
        assert [b.base_offset for b in everything] == m.bases
        for offset in range(m.start, m.end):
            assert log.epoch_at(offset) == m.records[offset - m.start][0]
        for epoch in range(-1, m.last_epoch + 2):
            assert log.end_offset_for_epoch(epoch) == m.end_for_epoch(epoch), epoch


TestBatchLogAgainstModel = BatchLogMachine.TestCase
TestBatchLogAgainstModel.settings = settings(max_examples=100, stateful_step_count=25, deadline=None)

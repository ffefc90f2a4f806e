"""EpochIndex against a model keeping every record's epoch, through appends, truncations, advances, resets."""

from __future__ import annotations

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from hotstate.log.divergence import DivergingEpoch
from hotstate.log.epochs import NO_EPOCH, EpochIndex


class Model:
    def __init__(self) -> None:
        self.start = 0
        self.below = 0  # the epoch of the record just below the start (0: the empty prefix below offset 0)
        self.vouched = True  # whether the index was told `below`
        self.records: list[int] = []  # the epoch of every record from `start` on

    @property
    def end(self) -> int:
        return self.start + len(self.records)

    @property
    def last_epoch(self) -> int:
        return self.records[-1] if self.records else self.below

    def entries(self) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        for i, epoch in enumerate(self.records):
            if not out or epoch > out[-1][0]:
                out.append((epoch, self.start + i))
        return out

    def epoch_at(self, offset: int) -> int:
        return self.below if offset == self.start - 1 else self.records[offset - self.start]

    def end_offset_for_epoch(self, epoch: int) -> DivergingEpoch | None:
        known = [(e, self.start + i) for i, e in enumerate(self.records)]
        if self.start == 0:
            known.append((0, 0))
        elif self.vouched:
            known.append((self.below, self.start))
        found = max((e for e, _ in known if e <= epoch), default=None)
        if found is None:
            return None
        return DivergingEpoch(found, min((o for e, o in known if e > found), default=self.end))


class EpochIndexMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.index = EpochIndex()
        self.model = Model()

    @rule(bump=st.integers(0, 2), count=st.integers(1, 4))
    def append(self, bump: int, count: int) -> None:
        m = self.model
        epoch = m.last_epoch + bump
        for _ in range(count):
            self.index.append(epoch, m.end)
            m.records.append(epoch)

    @rule(data=st.data())
    def truncate_to(self, data: st.DataObject) -> None:
        m = self.model
        offset = data.draw(st.integers(m.start, m.end + 2))
        self.index.truncate_to(offset)
        del m.records[max(offset - m.start, 0) :]

    @rule(data=st.data(), vouch=st.booleans())
    def advance_start(self, data: st.DataObject, vouch: bool) -> None:
        m = self.model
        offset = data.draw(st.integers(max(m.start - 1, 0), m.end))
        if offset <= m.start:
            assert not self.index.advance_start(offset, m.end, NO_EPOCH)
            return
        below = m.records[offset - m.start - 1]
        self.index.advance_start(offset, m.end, below if vouch else NO_EPOCH)
        del m.records[: offset - m.start]
        m.start, m.below, m.vouched = offset, below, vouch

    @rule(bump=st.integers(0, 20), epoch_bump=st.integers(0, 2), vouch=st.booleans())
    def reset(self, bump: int, epoch_bump: int, vouch: bool) -> None:
        m = self.model
        offset, epoch = m.end + bump, m.last_epoch + epoch_bump
        self.index.reset(offset, epoch if vouch else NO_EPOCH)
        m.start, m.below, m.vouched, m.records = offset, epoch, vouch, []

    @invariant()
    def agrees_with_the_model(self) -> None:
        m, index = self.model, self.index
        assert index.entries() == m.entries()
        assert index.latest_epoch == (m.records[-1] if m.records else -1)
        assert index.start_offset == m.start
        for offset in range(m.start, m.end):
            assert index.epoch_at(offset) == m.epoch_at(offset), offset
        if m.start > 0 and m.vouched:
            assert index.epoch_at(m.start - 1) == m.below
        for epoch in range(-1, m.last_epoch + 3):
            assert index.end_offset_for_epoch(epoch, m.end) == m.end_offset_for_epoch(epoch), epoch


TestEpochIndexAgainstModel = EpochIndexMachine.TestCase
TestEpochIndexAgainstModel.settings = settings(max_examples=200, stateful_step_count=30, deadline=None)


def test_an_epoch_below_every_record_gets_the_epoch_below_the_start() -> None:
    """KRaft answers with the snapshot id there: the fetcher of epoch 2 cuts at 10, needing no snapshot."""
    index = EpochIndex([(1, 0), (3, 10)])
    index.advance_start(10, 12, 1)  # records 0..9, of epoch 1, are gone
    assert index.entries() == [(3, 10)]
    assert index.end_offset_for_epoch(3, 12) == DivergingEpoch(3, 12)
    assert index.end_offset_for_epoch(2, 12) == DivergingEpoch(1, 10)
    assert index.end_offset_for_epoch(0, 12) is None
    index.reset(20, NO_EPOCH)
    assert index.end_offset_for_epoch(5, 20) is None  # not vouched for: only a snapshot helps


def test_epoch_at_below_the_start_is_refused() -> None:
    index = EpochIndex([(1, 0)])
    index.advance_start(4, 6, 1)
    with pytest.raises(ValueError):
        index.epoch_at(2)

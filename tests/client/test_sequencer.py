"""The per-partition order of pipelined Produces (client/sequencer.py), driven through many interleavings
of writes, answers, failures and give-ups against a model of the log where any send that did not succeed
may or may not have been written (at the place it was sent), and a send that succeeded was. Whatever
happens, each key must end with the value of the last write that succeeded for it, or a later one; never
an older one."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import pytest
from hypothesis import find, given, settings
from hypothesis import strategies as st

from hotstate.client.sequencer import Committed, Grant, PartitionSequencer

KEYS = "abcd"


def keys_of(rows: Sequence[bytes]) -> list[bytes]:
    return [row.split(b"=")[0] for row in rows]


def rows_for(seq_hint: int, mask: int) -> list[bytes]:
    """A write's rows: the keys in `mask` (at least one), each valued with the write's number."""
    chosen = [k for i, k in enumerate(KEYS) if mask & (1 << i)] or [KEYS[mask % len(KEYS)]]
    return [f"{k}={seq_hint}".encode() for k in chosen]


@dataclass
class Model:
    """The writer's side (what the sequencer is told) and the log's (which sends were written)."""

    sequencer: PartitionSequencer
    # Sends written to the log, each at its place: the order sends left in (the active appends a connection's
    # requests in arrival order; one sent to an active that was replaced, if it survived, precedes the new
    # active's appends).
    written: list[tuple[int, int, Sequence[bytes]]] = field(default_factory=list)
    sends: list[tuple[int, bool]] = field(default_factory=list)  # (seq, retry) in send order
    in_flight: dict[int, tuple[int, Sequence[bytes]]] = field(default_factory=dict)  # seq -> (send, rows)
    holding: bool = False  # a retry is out: nothing else may be
    original: dict[int, Sequence[bytes]] = field(default_factory=dict)
    succeeded: set[int] = field(default_factory=set)
    problems: list[str] = field(default_factory=list)

    def release(self) -> None:
        for grant in self.sequencer.take():
            self._send(grant)
        if len(self.in_flight) > self.sequencer.max_in_flight:
            self.problems.append(f"{len(self.in_flight)} in flight, above {self.sequencer.max_in_flight}")

    def _send(self, grant: Grant) -> None:
        if grant.superseded:
            self.succeeded.add(grant.seq)
            return
        if self.holding or (grant.retry and self.in_flight):
            self.problems.append(f"{grant.seq} sent while a retry held the partition: {self.in_flight}")
        self.holding = grant.retry
        self.in_flight[grant.seq] = (len(self.sends), grant.rows)
        self.sends.append((grant.seq, grant.retry))

    def answer(self, seq: int, outcome: str, written: bool) -> None:
        send, rows = self.in_flight.pop(seq)
        self.holding = False
        if outcome == "ok" or written:
            self.written.append((send, seq, rows))
        if outcome == "ok":
            self.sequencer.committed(seq, send)
            self.succeeded.add(seq)
        elif outcome == "retry":
            self.sequencer.failed(seq)
        else:  # given up: deadline, an answer that wrote nothing (then not written), cancelled
            self.sequencer.dropped(seq)
        self.release()

    def drop(self, seq: int, written: bool) -> None:
        """A write given up while queued, failed, or in flight (its outcome then unknown)."""
        sent = self.in_flight.pop(seq, None)
        if sent is not None:
            self.holding = False
            if written:
                self.written.append((sent[0], seq, sent[1]))
        self.sequencer.dropped(seq)
        self.release()

    def check(self) -> list[str]:
        problems = list(self.problems)
        firsts = [seq for seq, retry in self.sends if not retry]
        if firsts != sorted(firsts):
            problems.append(f"first sends out of order: {firsts}")
        final: dict[bytes, int] = {}
        for _, seq, rows in sorted(self.written, key=lambda w: w[0]):
            for key in keys_of(rows):
                final[key] = seq
        for key in {k for seq in self.succeeded for k in keys_of(self.original[seq])}:
            last = max(seq for seq in self.succeeded if key in keys_of(self.original[seq]))
            if final.get(key, -1) < last:
                problems.append(f"key {key!r} holds write {final.get(key)}, the last that succeeded: {last}")
        return problems


Action = tuple[int, int, int, bool]
actions = st.lists(
    st.tuples(st.integers(0, 9), st.integers(0, 15), st.integers(0, 2), st.booleans()), max_size=60
)


def run(program: list[Action], max_in_flight: int, sequencer_class: type[PartitionSequencer]) -> list[str]:
    """Interpret `program`: each action adds a write (kinds 0-3), answers one in flight (4-8: committed,
    to retry, or given up; written or not) or gives one up wherever it is (9). Then every send left is
    answered committed, so every write ends."""
    model = Model(sequencer_class(max_in_flight, keys_of))
    for kind, pick, outcome, written in program:
        if kind <= 3:
            seq = model.sequencer.add(rows_for(len(model.original), pick))
            model.original[seq] = rows_for(len(model.original), pick)
            model.release()
        elif kind <= 8 and model.in_flight:
            seq = sorted(model.in_flight)[pick % len(model.in_flight)]
            model.answer(seq, ("ok", "retry", "drop")[outcome], written)
        elif kind == 9:
            unsettled = [s for s in model.original if model.sequencer.state(s) != "settled"]
            if unsettled:
                model.drop(unsettled[pick % len(unsettled)], written)
    for _ in range(10 * len(model.original) + 10):
        if not model.in_flight:
            break
        model.answer(min(model.in_flight), "ok", True)
    if not model.sequencer.idle:
        model.problems.append("writes left unsettled")
    return model.check()


@settings(max_examples=600, deadline=None)
@given(program=actions, max_in_flight=st.integers(1, 4))
def test_every_key_ends_with_its_last_successful_write_or_a_later_one(
    program: list[Action], max_in_flight: int
) -> None:
    assert run(program, max_in_flight, PartitionSequencer) == []


class ResendsWhole(PartitionSequencer):
    """The plain retry: a failed Produce resent as it was."""

    def _without_superseded(self, seq: int, rows: Sequence[bytes]) -> Sequence[bytes]:
        return rows


class ResendsAtOnce(PartitionSequencer):
    """No gate: a failure is resent at once, in flight beside the later ones."""

    def failed(self, seq: int) -> None:
        super().failed(seq)
        self._failed.remove(seq)
        self._queued.appendleft(seq)


class FiltersOnGivenUp(PartitionSequencer):
    """A retry filtered on a later Produce given up too, not only on committed ones."""

    def dropped(self, seq: int) -> None:
        rows = self._rows.get(seq)
        if rows is not None and (self._in_flight - {seq} or self._failed):
            self._committed[seq] = Committed(rows)
        super().dropped(seq)

    def _prune(self) -> None:
        pass  # keeps what dropped() put in


@pytest.mark.parametrize("broken", [ResendsWhole, ResendsAtOnce, FiltersOnGivenUp])
def test_the_model_catches_a_retry_that_overwrites_a_later_write(broken: type[PartitionSequencer]) -> None:
    found = find(actions, lambda program: bool(run(program, 2, broken)), settings=settings(max_examples=5000))
    assert run(found, 2, broken) and not run(found, 2, PartitionSequencer), found


def _sequencer(max_in_flight: int = 5) -> PartitionSequencer:
    return PartitionSequencer(max_in_flight, keys_of)


def test_sends_leave_in_order_up_to_the_bound_and_the_next_goes_when_one_commits() -> None:
    s = _sequencer(2)
    seqs = [s.add([f"k{i}=1".encode()]) for i in range(4)]
    assert [g.seq for g in s.take()] == seqs[:2]
    assert s.take() == [] and s.in_flight == 2
    s.committed(seqs[1], 5)  # an answer out of order frees a slot too
    assert [g.seq for g in s.take()] == [seqs[2]]
    assert s.position == 5


def test_a_failure_closes_the_gate_until_everything_in_flight_settled() -> None:
    s = _sequencer()
    first, second, third = s.add([b"a=0", b"b=0"]), s.add([b"a=1"]), s.add([b"c=2"])
    assert len(s.take()) == 3
    fourth = s.add([b"a=3"])
    s.failed(first)
    assert s.recovering and s.take() == []  # fourth waits behind the gate; second and third are out
    s.committed(second, 7)
    assert s.take() == []
    s.failed(third)
    (retry,) = s.take()
    # The retry of the first leaves without the row of key a, which the second (later) committed.
    assert retry == Grant(first, [b"b=0"], retry=True)
    assert s.take() == []  # the retry holds the partition
    s.committed(first, 9)
    (retry,) = s.take()
    assert retry == Grant(third, [b"c=2"], retry=True)
    s.committed(third, 10)
    assert [g.seq for g in s.take()] == [fourth] and not s.recovering


def test_a_retry_superseded_entirely_is_done_without_a_send() -> None:
    s = _sequencer()
    first, second = s.add([b"a=0"]), s.add([b"a=1", b"b=1"])
    s.take()
    s.failed(first)
    s.committed(second, 3)
    assert s.take() == [Grant(first, (), retry=True, superseded=True)]
    assert s.idle


def test_a_later_write_that_fails_for_good_filters_nothing() -> None:
    s = _sequencer()
    first, second, third = s.add([b"a=0", b"b=0"]), s.add([b"a=1"]), s.add([b"b=2"])
    s.take()
    s.failed(first)
    s.failed(second)
    s.committed(third, 4)
    (retry,) = s.take()
    assert retry.rows == [b"a=0"]  # b: the third committed it
    s.committed(first, 5)
    (retry,) = s.take()
    assert retry.seq == second
    s.dropped(second)  # its deadline passed: the first's row of key a stays
    assert s.take() == [] and s.idle


def test_rows_whose_keys_cannot_be_read_are_resent_whole() -> None:
    s = PartitionSequencer(5, lambda rows: None if b"bad" in rows else keys_of(rows))
    first, second = s.add([b"a=0", b"bad"]), s.add([b"a=1"])
    s.take()
    s.failed(first)
    s.committed(second, 2)
    assert s.take() == [Grant(first, [b"a=0", b"bad"], retry=True)]


def test_misuse_is_named() -> None:
    s = _sequencer()
    seq = s.add([b"a=0"])
    with pytest.raises(ValueError, match="Produce 0 reported committed but it is queued"):
        s.committed(seq, 1)
    with pytest.raises(ValueError, match="at least 1"):
        PartitionSequencer(0, keys_of)

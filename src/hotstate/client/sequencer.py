"""The order of one partition's Produce requests from one writer, kept through failures: a pure core (no
IO, no clock, no asyncio) that the writer's shell (client/writer.py) asks what to send and tells how each
send ended.

A writer pipelines a partition's Produces: up to `max_in_flight` of them unanswered at once, sent in the
order the writes were made (their *sequence number*). While none fails, the active appends them in that
order: the writer keeps one connection per server, and the server starts a connection's requests in the
order they arrive and appends a Produce's rows before its first wait (docs/replication.md, "Pipelined
writes"), so the log, and every store, apply them in sequence order. Rows are upserts and deletes are
tombstones, the last write of a key wins, so that order is what a reader sees.

A failed Produce is the danger: resent as it is, it would land after a later Produce that succeeded and
bring back older values of the keys they share (a lost update). So:

- Produces are sent in sequence order, at most `max_in_flight` unanswered.
- A retriable failure closes the partition's gate: nothing new is sent.
- Once nothing is in flight (every Produce sent has been answered, has failed, or was given up), the
  failed ones are resent one at a time, in sequence order, each without the rows whose key a *later*
  Produce has committed: that later value must win, and dropping the older row is what applying them in
  sequence order would have left. A Produce left with no row is done without a send.
- When none is left, the gate opens again.
- A Produce given up (its write ran out of time, got an answer that wrote nothing, or was cancelled) is
  *dropped*: never sent again, and never used to filter an earlier one. Only a committed Produce filters,
  so a later write that fails for good cannot cost an earlier one its rows.

A Produce whose outcome is unknown (a timeout, a lost connection) may still have been written, where it
was sent: before everything sent after it. So a failure that turns out to have been written changes
nothing above: the retry writes the same rows again (upserts, or tombstones: deleting a key twice leaves
it deleted), still before the later ones that did not commit yet, and never over those that did.
tests/client/test_sequencer.py checks this against a model where any failed send may or may not have been
kept.

`keys_of(rows)` gives each row's key (any hashable bytes; a tombstone's is the key it deletes, so a
committed delete filters an earlier row of its key and a committed row an earlier delete), or None for rows
it cannot read (such a retry
goes out whole: the active refuses the bad row and writes nothing). It is called only on the failure path.
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

KeysOf = Callable[[Sequence[bytes]], Sequence[bytes] | None]


@dataclass(frozen=True, slots=True)
class Grant:
    """A Produce that may go now. `retry`: a resend after a failure, with `rows` already filtered; it holds
    the partition (nothing else is sent) until it is reported. `superseded`: every row of a retry was
    committed later by another Produce; it is done, and there is nothing to send."""

    seq: int
    rows: Sequence[bytes]
    retry: bool = False
    superseded: bool = False


@dataclass(slots=True)
class Committed:
    rows: Sequence[bytes]
    keys: frozenset[bytes] | None = None


class PartitionSequencer:
    """One partition's Produces from one writer: see the module's docstring for the rule."""

    def __init__(self, max_in_flight: int, keys_of: KeysOf) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be at least 1, not {max_in_flight}")
        self.max_in_flight = max_in_flight
        self._keys_of = keys_of
        self._next = 0
        self._rows: dict[int, Sequence[bytes]] = {}  # queued, in flight or failed
        self._queued: deque[int] = deque()
        self._in_flight: set[int] = set()
        self._failed: list[int] = []  # sorted
        self._retrying: int | None = None  # a retry in flight: the gate stays closed until it is reported
        # Committed Produces later than one still unsettled (in flight or failed): what a retry filters on.
        self._committed: dict[int, Committed] = {}
        self.position = 0  # the largest end offset a commit answered with

    # ------------------------------------------------------------------ state, for the shell and tests
    @property
    def recovering(self) -> bool:
        """The gate is closed: a failed Produce waits to be resent, or its retry is out."""
        return bool(self._failed) or self._retrying is not None

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    @property
    def idle(self) -> bool:
        """Nothing queued, in flight or failed."""
        return not self._rows

    def state(self, seq: int) -> str:
        """queued, in flight, failed, or settled (committed, dropped, or never added)."""
        if seq in self._in_flight:
            return "in flight"
        if seq not in self._rows:
            return "settled"
        return "failed" if self._failed and _contains(self._failed, seq) else "queued"

    # ------------------------------------------------------------------ the rule
    def add(self, rows: Sequence[bytes]) -> int:
        """A new Produce, after every one added before: its sequence number."""
        seq = self._next
        self._next += 1
        self._rows[seq] = rows
        self._queued.append(seq)
        return seq

    def take(self) -> list[Grant]:
        """What may be sent now, in sequence order, each counted in flight from now on (a superseded retry
        is done already). Call after every change: add, committed, failed, dropped."""
        grants: list[Grant] = []
        if self._retrying is not None:
            return grants
        while self._failed:
            if self._in_flight:
                return grants
            seq = self._failed[0]
            rows = self._without_superseded(seq, self._rows[seq])
            del self._failed[0]
            if rows:
                self._rows[seq] = rows
                self._in_flight.add(seq)
                self._retrying = seq
                grants.append(Grant(seq, rows, retry=True))
                return grants
            del self._rows[seq]
            self._prune()
            grants.append(Grant(seq, (), retry=True, superseded=True))
        while self._queued and len(self._in_flight) < self.max_in_flight:
            seq = self._queued.popleft()
            self._in_flight.add(seq)
            grants.append(Grant(seq, self._rows[seq]))
        return grants

    def committed(self, seq: int, end_offset: int) -> None:
        """`seq`'s send was committed (acks=all), ending the log at `end_offset`."""
        self._settle_in_flight(seq, "committed")
        rows = self._rows.pop(seq)
        self.position = max(self.position, end_offset)
        if self._in_flight or self._failed:
            self._committed[seq] = Committed(rows)
        self._prune()

    def failed(self, seq: int) -> None:
        """`seq`'s send failed and may be retried (written or not): the gate closes until it is resent."""
        self._settle_in_flight(seq, "failed")
        bisect.insort(self._failed, seq)

    def dropped(self, seq: int) -> None:
        """`seq` is given up, in whatever state (a no-op once settled): never sent again, filters nothing."""
        if self._rows.pop(seq, None) is None:
            return
        if seq in self._in_flight:
            self._in_flight.discard(seq)
            if self._retrying == seq:
                self._retrying = None
        elif _contains(self._failed, seq):
            self._failed.remove(seq)
        else:
            self._queued.remove(seq)
        self._prune()

    # ------------------------------------------------------------------ helpers
    def _settle_in_flight(self, seq: int, what: str) -> None:
        if seq not in self._in_flight:
            raise ValueError(f"Produce {seq} reported {what} but it is {self.state(seq)}, not in flight")
        self._in_flight.discard(seq)
        if self._retrying == seq:
            self._retrying = None

    def _without_superseded(self, seq: int, rows: Sequence[bytes]) -> Sequence[bytes]:
        later = [done for other, done in self._committed.items() if other > seq]
        if not later:
            return rows
        taken: set[bytes] = set()
        for done in later:
            if done.keys is None:
                done.keys = frozenset(self._keys_of(done.rows) or ())
            taken |= done.keys
        keys = self._keys_of(rows) if taken else None
        if keys is None:
            return rows
        return [row for row, key in zip(rows, keys, strict=True) if key not in taken]

    def _prune(self) -> None:
        """Forget committed Produces no unsettled one comes before: no retry will need their keys."""
        if not self._committed:
            return
        unsettled = [*self._in_flight, *self._failed[:1]]
        if not unsettled:
            self._committed.clear()
            return
        lowest = min(unsettled)
        for seq in [s for s in self._committed if s < lowest]:
            del self._committed[seq]


def _contains(ordered: list[int], seq: int) -> bool:
    at = bisect.bisect_left(ordered, seq)
    return at < len(ordered) and ordered[at] == seq

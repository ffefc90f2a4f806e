"""The Raft driver's applier: committed entries are applied in order by a task of their own, so a slow
apply (a 100,000-partition table decoded in steps) never holds up the quorum."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from hotstate.raft.records import Entry, EntryKind, Snapshot
from hotstate.server.raft_driver import RaftDriver

from .raft_leader import single_voter_leader


class Applier:
    """prepare_commit and on_committed: what was applied, and a gate the first data entry waits at."""

    def __init__(self) -> None:
        self.applied: list[bytes] = []
        self.gate = asyncio.Event()
        self.held = asyncio.Event()  # set when a data entry waits at the gate

    async def prepare(self, entries: Sequence[Entry], snapshot: Snapshot | None) -> None:
        if any(e.kind is EntryKind.DATA for e in entries) and not self.gate.is_set():
            self.held.set()
            await self.gate.wait()

    def on_committed(self, entries: Sequence[Entry], snapshot: Snapshot | None) -> None:
        self.applied.extend(e.data for e in entries if e.kind is EntryKind.DATA)


async def _leader(tmp_path: Path, applier: Applier, **kwargs: object) -> RaftDriver:
    return await single_voter_leader(
        tmp_path, on_committed=applier.on_committed, prepare_commit=applier.prepare, **kwargs
    )


def test_the_quorum_commits_on_while_an_apply_is_slow(tmp_path: Path) -> None:
    async def scenario() -> None:
        applier = Applier()
        driver = await _leader(tmp_path, applier)
        try:
            first, epoch = driver.propose(b"big")
            async with asyncio.timeout(10):
                await applier.held.wait()
            # The first apply is held; the quorum still takes, persists and commits the next proposal.
            second, _ = driver.propose(b"next")
            waited = asyncio.ensure_future(driver.committed(second, epoch))
            async with asyncio.timeout(10):
                while driver.node.high_watermark <= second:
                    await asyncio.sleep(0.01)
            assert applier.applied == []
            # Committed is not enough for `committed()`: it answers once the entry is applied.
            await asyncio.sleep(0)
            assert not waited.done()
            assert driver.applying == 2  # "big" held in its apply, "next" queued behind it
            applier.gate.set()
            async with asyncio.timeout(10):
                assert await waited
            assert applier.applied == [b"big", b"next"]
            assert await driver.committed(first, epoch)
            assert not await driver.committed(first, epoch + 1)
            assert driver.applying == 0
        finally:
            await driver.stop()

    asyncio.run(scenario())


class PoisonApplier(Applier):
    def on_committed(self, entries: Sequence[Entry], snapshot: Snapshot | None) -> None:
        if any(e.data == b"poison" for e in entries):
            raise ValueError("record 7 is not a record")
        super().on_committed(entries, snapshot)


def test_an_apply_that_fails_stops_the_member_and_says_why(tmp_path: Path) -> None:
    async def scenario() -> list[str]:
        failures: list[str] = []
        failed = asyncio.Event()
        applier = PoisonApplier()
        applier.gate.set()

        def on_apply_failure(reason: str) -> None:
            failures.append(reason)
            failed.set()

        driver = await _leader(tmp_path, applier, on_apply_failure=on_apply_failure)
        try:
            driver.propose(b"fine")
            driver.propose(b"poison")
            async with asyncio.timeout(10):
                await failed.wait()
            assert applier.applied in ([], [b"fine"])
            return failures
        finally:
            await driver.stop()

    failures = asyncio.run(scenario())
    assert len(failures) == 1 and "record 7 is not a record" in failures[0], failures

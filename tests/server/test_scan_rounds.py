"""Scans through the coordinator's rounds: each partition's program runs at the replica that serves it, a
replica that fails mid-scan costs a retry of that partition on another replica (never a wrong total), a
query error is a 400 at once, a busy replica sends the partition to the next one. Peers are in-memory
stand-ins running query/scan.py as a server does; LocalReads' steps are tested with a stand-in store."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from hotstate.controller.image import MetadataImage, PartitionInfo, TableInfo
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.protocol.keys import encode_key, partition_for
from hotstate.protocol.rows import encode_row
from hotstate.query.execute import QueryError
from hotstate.query.expressions import EvalError
from hotstate.query.scan import ScanProgram, ScanRun
from hotstate.query.sql import parse
from hotstate.replica.messages import (
    PartitionQueryRequest,
    PartitionQueryResponse,
    QueryPartitionsRequest,
    QueryPartitionsResponse,
    ReplicaError,
)
from hotstate.replica.store import Store, StoreError
from hotstate.routing.lags import LagTable
from hotstate.rpc import NotConnected
from hotstate.server.coordinator import ClusterView, Coordinator, request_soon_of
from hotstate.server.serving import LocalReads

PARTITIONS = 4
TABLE = TableInfo("clicks", 1, PARTITIONS, 1, (KeyColumn("user", KeyType.STRING),), acceptable_lag=None)
PLACEMENT = {0: (2, 3), 1: (3, 2), 2: (2, 3), 3: (3, 2)}
USERS = [f"u{i:03d}" for i in range(200)]


def _items(partition: int) -> list[tuple[bytes, bytes]]:
    return sorted(
        (encode_key((u,)), encode_row({"user": u, "n": int(u[1:]), "g": int(u[1:]) % 3}))
        for u in USERS
        if partition_for(encode_key((u,)), PARTITIONS) == partition
    )


class Peers:
    """Servers holding every row; `down` fail as a dead peer does, `busy` refuse scans, `bad` say the
    query fails on a row."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, tuple[int, ...]]] = []
        self.down: set[int] = set()
        self.busy: set[int] = set()
        self.bad: set[int] = set()
        self.delay: dict[int, float] = {}

    async def request(self, node: int, message: object, timeout_s: float) -> object:
        assert isinstance(message, QueryPartitionsRequest)
        self.calls.append((node, tuple(p.partition for p in message.parts)))
        if node in self.down:
            raise NotConnected(f"node {node} is down")
        await asyncio.sleep(self.delay.get(node, 0.0))
        return QueryPartitionsResponse(tuple(self.answer(node, part) for part in message.parts))

    def answer(self, node: int, part: PartitionQueryRequest) -> PartitionQueryResponse:
        assert part.program, "a scan's every partition carries its program"
        if node in self.busy:
            return PartitionQueryResponse(ReplicaError.SCAN_BUSY, f"server {node} runs 4 scans already")
        if node in self.bad:
            return PartitionQueryResponse(ReplicaError.BAD_QUERY, "cannot compare string 'a' with number 1")
        run = ScanRun(ScanProgram.decode(part.program))
        items = [i for i in _items(part.partition) if (part.start is None or i[0] >= part.start)]
        run.feed(items)
        rows, partial = run.answer()
        return PartitionQueryResponse(ReplicaError.NONE, "", "active", 10, 0, rows, partial)


def _coordinator(peers: Peers) -> Coordinator:
    parts = tuple(
        PartitionInfo(1, p, (active, standby), active, (), 1, (active, standby))
        for p, (active, standby) in sorted(PLACEMENT.items())
    )
    image = MetadataImage(1, {}, {"clicks": TABLE}, {1: parts})
    cluster = ClusterView(lambda: image, LagTable(), lambda node: True)
    reads = LocalReads(
        1, image=cluster.image, replicas=dict, lags=cluster.lags, on_store_failure=lambda r, e: None
    )
    return Coordinator(1, cluster, reads, request_soon_of(peers.request), cluster_id="scans")


def test_an_aggregate_runs_at_the_replicas_and_merges_here() -> None:
    peers = Peers()
    result = asyncio.run(
        _coordinator(peers).execute("SELECT g, COUNT(*), SUM(n) FROM clicks GROUP BY g ORDER BY g")
    )
    assert result.columns == ["g", "COUNT(*)", "SUM(n)"]
    assert result.rows == [
        [g, sum(1 for i in range(200) if i % 3 == g), sum(i for i in range(200) if i % 3 == g)]
        for g in range(3)
    ]
    assert sorted(node for node, _ in peers.calls) == [2, 3]


def test_a_replica_that_fails_costs_its_partitions_a_retry_never_a_wrong_total() -> None:
    peers = Peers()
    peers.down.add(2)
    result = asyncio.run(_coordinator(peers).execute("SELECT COUNT(*), SUM(n) FROM clicks WHERE n >= 100"))
    assert result.rows == [[100, sum(range(100, 200))]]
    assert [p.served_by for p in result.partitions] == [3, 3, 3, 3]


def test_a_busy_replica_sends_its_partitions_to_the_next() -> None:
    peers = Peers()
    peers.busy.add(3)
    result = asyncio.run(_coordinator(peers).execute("SELECT user FROM clicks WHERE n < 3"))
    assert result.rows == [["u000"], ["u001"], ["u002"]]
    assert [p.served_by for p in result.partitions] == [2, 2, 2, 2]


def test_a_query_error_at_a_replica_is_a_400_without_trying_others() -> None:
    peers = Peers()
    peers.bad.update({2, 3})
    with pytest.raises(QueryError) as caught:
        asyncio.run(_coordinator(peers).execute("SELECT * FROM clicks WHERE n > 'a'"))
    assert caught.value.kind == "bad_request" and "cannot compare" in caught.value.message
    assert len(peers.calls) <= 2  # one round: no partition was sent to its standby


def test_a_long_scan_is_not_hedged_nor_makes_its_peer_look_slow() -> None:
    peers = Peers()
    peers.delay[2] = 0.4  # past the longest hedge delay (200 ms)
    coordinator = _coordinator(peers)
    result = asyncio.run(coordinator.execute("SELECT COUNT(*) FROM clicks"))
    assert result.rows == [[len(USERS)]]
    assert sorted(peers.calls) == [(2, (0, 2)), (3, (1, 3))]  # no copy of 0 and 2 went to 3
    assert not coordinator.hedging.slow(2, 10**12)


def test_pages_of_a_sorted_or_aggregated_scan_are_refused() -> None:
    with pytest.raises(QueryError, match="no next page"):
        asyncio.run(_coordinator(Peers()).execute("SELECT COUNT(*) FROM clicks", {"after": "AAAA"}))


# --- LocalReads: steps and the concurrency cap -----------------------------------------------------------


@dataclasses.dataclass
class _Store:
    items: list[tuple[bytes, bytes]]
    read: int = 0
    closed: bool = False
    close_after: int | None = None  # rows read before it is closed under the scan
    pause_s: float = 0.0  # a slow disk: this long per row read
    keys_only: bool | None = None  # how the last scan_chunks was asked
    fill_cache: bool | None = None

    def scan(self, start: bytes | None = None, end: bytes | None = None) -> Iterator[tuple[bytes, bytes]]:
        for item in self.items:
            if self.read == self.close_after:
                self.closed = True
            if self.closed:
                raise StoreError(Path("/x"), "closed during a scan")
            self.read += 1
            time.sleep(self.pause_s)
            yield item

    def scan_chunks(
        self,
        start: bytes | None,
        end: bytes | None,
        size: int | Callable[[], int],
        *,
        keys_only: bool = False,
        fill_cache: bool = True,
    ) -> Iterator[list[Any]]:
        self.keys_only = keys_only
        self.fill_cache = fill_cache
        items = self.scan(start, end)
        size_of = size if callable(size) else itertools.repeat(size).__next__
        while chunk := list(itertools.islice(items, size_of())):
            yield [key for key, _ in chunk] if keys_only else chunk


def _local(store: _Store, failures: list[object] | None = None, **settings: Any) -> LocalReads:
    # These steps are of scans that read rows: no column copies (tests/server/test_column_cache.py).
    settings.setdefault("scan_cache_bytes", 0)
    reads = LocalReads(
        1,
        image=lambda: MetadataImage(1, {}, {}, {}),
        replicas=dict,
        lags=LagTable(),
        on_store_failure=lambda r, e: (failures if failures is not None else []).append(e),
        **settings,
    )
    replica = type("Replica", (), {"store": store, "pid": (1, 0)})()
    reads._checked = lambda request: (replica, "active", 10, 0)  # type: ignore[method-assign]
    return reads


def _request(sql: str, budget_ms: int = 0) -> PartitionQueryRequest:
    from hotstate.query.scan import program_for

    spec = parse(sql).scan
    assert spec is not None
    program = program_for(spec, None, 100_000, budget_ms).encode()
    return PartitionQueryRequest("clicks", 0, (), True, None, None, None, None, 0, program=program)


def test_a_local_scan_yields_to_the_event_loop_every_step() -> None:
    store = _Store(_items(0) * 10)
    reads = _local(store, scan_step_rows=7)
    ticks = itertools.count()

    async def scan_while_ticking() -> tuple[PartitionQueryResponse, int]:
        stop = asyncio.Event()

        async def ticker() -> None:
            while not stop.is_set():
                next(ticks)
                await asyncio.sleep(0)

        task = asyncio.create_task(ticker())
        answer = await reads.scan(_request("SELECT COUNT(*) FROM clicks WHERE n >= 0"))
        stop.set()
        await task
        return answer, next(ticks)

    answer, ticked = asyncio.run(scan_while_ticking())
    assert answer.error is ReplicaError.NONE and store.read == len(store.items)
    # The other task ran between every two steps: the loop never waited for the whole scan.
    assert ticked >= len(store.items) // 7
    assert reads.scans == 0


def test_concurrent_scans_take_turns_one_step_per_turn_of_the_event_loop() -> None:
    """Four scans: between two polls for IO the loop runs one step (7 rows) of one of them, not one of
    each, so a point lookup waits out one step whatever the number of scans."""
    store = _Store(_items(0) * 10)
    reads = _local(store, scan_step_rows=7)
    per_turn: list[int] = []

    async def scans_while_counting() -> list[PartitionQueryResponse]:
        loop = asyncio.get_running_loop()
        last = [0]

        def turn() -> None:  # runs once per turn of the loop (call_soon from a callback: the next turn)
            per_turn.append(store.read - last[0])
            last[0] = store.read
            if not done.done():
                loop.call_soon(turn)

        done = loop.create_future()
        loop.call_soon(turn)
        request = _request("SELECT COUNT(*) FROM clicks WHERE n >= 0")
        answers = await asyncio.gather(*(reads.scan(request) for _ in range(4)))
        done.set_result(None)
        return list(answers)

    answers = asyncio.run(scans_while_counting())
    assert all(a.error is ReplicaError.NONE for a in answers)
    assert store.read == 4 * len(_items(0)) * 10
    assert max(per_turn) <= 7, per_turn
    assert reads.scans == 0


def test_a_cancelled_scan_waiting_for_its_turn_passes_the_turn_on() -> None:
    store = _Store(_items(0) * 10)
    reads = _local(store, scan_step_rows=7)

    async def three_one_cancelled() -> list[PartitionQueryResponse | BaseException]:
        request = _request("SELECT COUNT(*) FROM clicks WHERE n >= 0")
        tasks = [asyncio.create_task(reads.scan(request)) for _ in range(3)]
        for _ in range(5):
            await asyncio.sleep(0)
        tasks[1].cancel()
        return list(await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10))

    first, cancelled, third = asyncio.run(three_one_cancelled())
    assert isinstance(cancelled, asyncio.CancelledError)
    assert isinstance(first, PartitionQueryResponse) and first.error is ReplicaError.NONE
    assert isinstance(third, PartitionQueryResponse) and third.error is ReplicaError.NONE
    assert reads.scans == 0


def test_a_step_ends_after_query_scan_step_ms_before_its_rows() -> None:
    """A slow store (1 ms a row read): steps end on time, not after their 100,000 rows nor after a chunk
    of 256: a chunk's read is timed with its feed, so the next chunk is a few rows."""
    store = _Store(_items(0) * 2, pause_s=0.001)
    reads = _local(store, scan_step_rows=100_000, scan_step_ms=5)
    steps = reads._scan_steps(_request("SELECT COUNT(*) FROM clicks WHERE n >= 0"))
    yields = 0
    for answer in steps:
        if answer is not None:
            break
        yields += 1
    assert isinstance(answer, PartitionQueryResponse) and answer.error is ReplicaError.NONE
    # About 5 rows a step (a loaded machine's sleeps are longer: fewer); one chunk of 256 would be no yield.
    assert len(store.items) >= 100 and yields >= len(store.items) // 20, (len(store.items), yields)


def test_a_step_of_costly_rows_ends_after_a_row_not_after_its_chunk() -> None:
    """A WHERE that rewrites a 120 kB string takes milliseconds a row (17 ms here): a step ends after a
    chunk of a row or a few, so the loop waits out about a row's time, not a chunk of 256 rows' seconds. A
    CI run failed when a peer, scanning such rows a chunk a step, left its /metrics unanswered for 5 s."""
    pad = "x" * 120_000
    items = sorted(
        (encode_key((f"u{i:03d}",)), encode_row({"user": f"u{i:03d}", "pad": pad})) for i in range(60)
    )
    store = _Store(items)
    reads = _local(store, scan_step_rows=1000, scan_step_ms=1)
    sql = "SELECT COUNT(*) FROM clicks WHERE LENGTH(REPLACE(REPLACE(pad, 'x', 'yy'), 'y', 'zz')) = 0"
    steps = reads._scan_steps(_request(sql))
    yields = 0
    for answer in steps:
        if answer is not None:
            break
        yields += 1
    assert isinstance(answer, PartitionQueryResponse) and answer.error is ReplicaError.NONE, answer
    assert store.read == len(items)
    # Every row takes longer than a step's 1 ms: after the first slice (FIRST_SLICE_ROWS rows) a step is a
    # row; a chunk a step would have been one step for the 60.
    assert yields >= len(items) - 10, yields


def test_a_count_of_every_row_reads_keys_not_values() -> None:
    store = _Store(_items(0) * 3)
    answer = asyncio.run(_local(store).scan(_request("SELECT COUNT(*) FROM clicks")))
    assert answer.error is ReplicaError.NONE and store.keys_only is True
    assert store.fill_cache is False  # a scan reads each block once: it leaves the block cache alone
    answer = asyncio.run(_local(store).scan(_request("SELECT COUNT(*) FROM clicks WHERE n >= 0")))
    assert answer.error is ReplicaError.NONE and store.keys_only is False


def test_scans_beyond_the_concurrency_cap_are_refused_as_busy() -> None:
    store = _Store(_items(0) * 10)
    reads = _local(store, scan_step_rows=5, scan_max_concurrent=1)

    async def two() -> list[PartitionQueryResponse]:
        request = _request("SELECT COUNT(*) FROM clicks")
        return list(await asyncio.gather(reads.scan(request), reads.scan(request)))

    first, second = asyncio.run(two())
    assert first.error is ReplicaError.NONE
    assert second.error is ReplicaError.SCAN_BUSY and "query.scan.max.concurrent" in second.message
    assert reads.scans == 0


def test_a_local_scan_over_its_row_cap_is_a_query_error() -> None:
    reads = _local(_Store(_items(0)), scan_max_rows=3, scan_step_rows=2)
    answer = asyncio.run(reads.scan(_request("SELECT COUNT(*) FROM clicks")))
    assert answer.error is ReplicaError.BAD_QUERY and "query.scan.max.rows" in answer.message
    assert issubclass(EvalError, ValueError)


def test_a_store_closed_under_a_scan_is_a_refusal_not_a_disk_failure() -> None:
    failures: list[object] = []
    reads = _local(_Store(_items(0) * 3, close_after=20), failures, scan_step_rows=8)
    answer = asyncio.run(reads.scan(_request("SELECT COUNT(*) FROM clicks WHERE n >= 0")))
    assert answer.error is ReplicaError.UNKNOWN_PARTITION and "closed mid-scan" in answer.message
    assert failures == [] and reads.scans == 0


def test_the_event_loop_never_waits_for_a_whole_scan(tmp_path: Path) -> None:
    """The loop's longest stall while a GROUP BY scans 30,000 rows of a real RocksDB store, measured by a
    task that notes the time at each turn: a step of rows, not the scan (which takes many of them)."""
    store = Store.open(tmp_path / "store")
    rows = [
        (encode_key((f"u{i:06d}",)), encode_row({"user": f"u{i:06d}", "n": i, "g": i % 10}))
        for i in range(30_000)
    ]
    store.apply(rows, len(rows), 1)
    reads = _local(store, scan_step_rows=500)  # type: ignore[arg-type]

    async def scan_while_timing() -> tuple[float, float, PartitionQueryResponse]:
        stop = asyncio.Event()
        longest = 0.0

        async def ticker() -> None:
            nonlocal longest
            last = time.perf_counter()
            while not stop.is_set():
                await asyncio.sleep(0)
                now = time.perf_counter()
                longest = max(longest, now - last)
                last = now

        task = asyncio.create_task(ticker())
        await asyncio.sleep(0)
        started = time.perf_counter()
        answer = await reads.scan(_request("SELECT g, SUM(n) FROM clicks WHERE n >= 0 GROUP BY g"))
        took = time.perf_counter() - started
        stop.set()
        await task
        return longest, took, answer

    longest, took, answer = asyncio.run(scan_while_timing())
    store.close()
    assert answer.error is ReplicaError.NONE, answer.message
    print(f"\nscan of 30,000 rows: {took * 1000:.1f} ms; the loop's longest stall {longest * 1000:.2f} ms")
    # 60 steps of ~2.5 ms; a step sometimes takes several times that (a garbage collection, a block read),
    # but the loop never waits for more than a small part of the scan.
    assert longest < took / 4


def test_a_replica_stops_a_scan_past_the_querys_time_budget() -> None:
    store = _Store(_items(0) * 10, pause_s=0.001)
    reads = _local(store, scan_step_rows=10)
    answer = asyncio.run(reads.scan(_request("SELECT COUNT(*) FROM clicks WHERE n >= 0", budget_ms=5)))
    assert answer.error is ReplicaError.TIMEOUT and "timeout_ms (5 ms)" in answer.message
    assert store.read < len(store.items) and reads.scans == 0

"""Column copies of partitions (server/column_cache.py) over a real RocksDB store: a full filter scan
leaves one behind, the next answers from it, and whatever was applied in between (puts that start or stop
matching, deletes, new keys) gives the answer a scan of the rows gives. A copy too changed is rebuilt, a
closed store's is never used, the server's copies stay within their bytes."""

from __future__ import annotations

import asyncio
import os
import random
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hotstate.controller.image import MetadataImage
from hotstate.protocol.keys import encode_key
from hotstate.protocol.rows import decode_row, encode_row
from hotstate.query.expressions import unpack
from hotstate.query.scan import ScanSpec, program_for, spec_of_conditions
from hotstate.query.sql import parse
from hotstate.replica.messages import PartitionQueryRequest, PartitionQueryResponse, ReplicaError
from hotstate.replica.store import Store
from hotstate.routing.lags import LagTable
from hotstate.server import column_cache
from hotstate.server.column_cache import ColumnCaches
from hotstate.server.serving import LocalReads


class _Replica:
    def __init__(self, store: Store) -> None:
        self.store = store
        self.pid = (1, 0)


_MADE: list[LocalReads] = []


@pytest.fixture(autouse=True)
def _close_reads() -> Iterator[None]:
    yield
    while _MADE:
        _MADE.pop().close()  # their scan compute threads


class _Reads:
    """A server's LocalReads over one replica of a real store, counting the rows its scans read."""

    def __init__(self, store: Store, **settings: Any) -> None:
        self.reads = LocalReads(
            1,
            image=lambda: MetadataImage(1, {}, {}, {}),
            replicas=dict,
            lags=LagTable(),
            on_store_failure=lambda replica, error: None,
            **settings,
        )
        _MADE.append(self.reads)
        self.reads.load_column_engine()  # a server loads it in a thread at its first such scan
        self.replica = _Replica(store)
        self.rows_read = 0
        replica: Any = self.replica  # LocalReads reads its store and pid alone
        self.reads._checked = lambda request: (replica, "active", 10, 0)  # type: ignore[method-assign]

    @property
    def caches(self) -> ColumnCaches:
        caches = self.reads.column_caches
        assert caches is not None
        return caches

    def answer(self, sql: str) -> PartitionQueryResponse:
        request = _request(sql)
        store = self.replica.store
        scan_chunks = store.scan_chunks

        def counted(*args: Any, **kwargs: Any) -> Iterator[list[Any]]:
            for chunk in scan_chunks(*args, **kwargs):
                self.rows_read += len(chunk)
                yield chunk

        store.scan_chunks = counted  # type: ignore[method-assign]
        try:
            answer = asyncio.run(self.reads.scan(request))
        finally:
            del store.scan_chunks
        assert answer.error is ReplicaError.NONE, answer.message
        return answer


def _spec(sql: str) -> ScanSpec:
    """The scan of `sql`, as query/plan.py makes it for a table keyed by `user`."""
    query = parse(sql)
    return query.scan or spec_of_conditions(query.conditions, query.columns)


def _request(sql: str) -> PartitionQueryRequest:
    program = program_for(_spec(sql), parse(sql).limit, 100_000).encode()
    return PartitionQueryRequest("t", 0, (), True, None, None, None, None, 0, program=program)


def _key(i: int) -> bytes:
    return encode_key((f"u{i:05d}",))


def _row(i: int, clicks: int, amount: float | None = 1.5) -> bytes:
    return encode_row({"user": f"u{i:05d}", "clicks": clicks, "amount": amount, "name": f"n{i % 7}"})


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    store = Store.open(tmp_path / "store")
    store.apply([(_key(i), _row(i, i % 10)) for i in range(3000)], 1, 1)
    yield store
    store.close()


def _users(answer: PartitionQueryResponse) -> list[str]:
    return [str(decode_row(row)["user"]) for _, row in answer.items]


def _partial(answer: PartitionQueryResponse) -> dict[str, Any]:
    """The partial answer, its groups by key (a replica sends them in no particular order)."""
    partial: Any = unpack(answer.partial)
    if "groups" in partial:
        partial["groups"] = {tuple(key): states for key, states in partial["groups"]}
    return dict(partial)


QUERIES = [
    "SELECT * FROM t WHERE clicks = 7",
    "SELECT * FROM t WHERE clicks >= 3 AND name < 'n3'",
    "SELECT COUNT(*) FROM t WHERE amount > 1.0",
    "SELECT COUNT(*) FROM t",  # a copy of keys alone
    "SELECT name, SUM(clicks), COUNT(*), MIN(clicks), MAX(name), AVG(clicks), COUNT(amount) "
    "FROM t GROUP BY name",
    "SELECT SUM(clicks), MAX(clicks) FROM t WHERE amount > 1.0",
    "SELECT clicks, COUNT(*) FROM t WHERE name >= 'n2' GROUP BY clicks",
    "SELECT user, clicks FROM t ORDER BY clicks DESC LIMIT 5",
    "SELECT user FROM t WHERE clicks > 2 ORDER BY name DESC, clicks LIMIT 7",
    "SELECT user FROM t ORDER BY amount, user LIMIT 9",
    "SELECT * FROM t WHERE clicks IN (1, 7) OR amount IS NULL",
    "SELECT COUNT(*) FROM t WHERE NOT (clicks = 3 OR name = 'n2') AND amount IS NOT NULL",
    "SELECT name, COUNT(*) FROM t WHERE name NOT IN ('n1', 'n3') AND clicks > 4 GROUP BY name",
]


def test_a_filter_scan_leaves_a_copy_and_the_next_reads_no_row(store: Store) -> None:
    reads = _Reads(store)
    plain = _Reads(store, scan_cache_bytes=0)
    first = reads.answer(QUERIES[0])
    assert reads.rows_read == 3000 and len(reads.caches) == 1
    again = reads.answer(QUERIES[0])
    assert reads.rows_read == 3000  # answered from the copy
    assert again.items == first.items == plain.answer(QUERIES[0]).items
    assert len(first.items) == 300
    # A query naming a column the copy lacks scans the rows, and builds a copy of its columns and the
    # copy's: from then on both queries (and any on those columns) are answered from it.
    reads.answer(QUERIES[1])
    assert reads.rows_read == 6000
    (copy,) = reads.caches._caches.values()
    assert copy.names == {"clicks", "name"}
    for sql in QUERIES[:2]:
        assert reads.answer(sql).items == plain.answer(sql).items
    assert reads.rows_read == 6000


def test_a_column_with_no_form_is_left_out_of_the_shared_copy(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "mixed")
    try:
        rows = [(_key(i), encode_row({"user": f"u{i:05d}", "clicks": i % 10, "odd": i})) for i in range(100)]
        rows.append((_key(100), encode_row({"user": "u00100", "clicks": 7, "odd": 2.5})))  # ints and a float
        store.apply(rows, 1, 1)
        reads = _Reads(store)
        clicks, odd = "SELECT * FROM t WHERE clicks = 7", "SELECT COUNT(*) FROM t WHERE odd > 50"
        reads.answer(clicks)  # the copy of clicks
        assert _partial(reads.answer(odd))["groups"] == {(): [49]}  # clicks and odd: refused
        assert _partial(reads.answer(odd))["groups"] == {(): [49]}  # odd alone: refused
        assert reads.rows_read == 303
        reads.answer(odd)  # nothing more is built for odd
        assert len(reads.answer(clicks).items) == 11  # from the copy of clicks, still there
        assert reads.rows_read == 404 and store.trackers == 1
    finally:
        store.close()


@pytest.mark.parametrize("seed", range(6))
def test_applies_after_the_copy_give_the_answer_a_scan_of_the_rows_gives(store: Store, seed: int) -> None:
    rng = random.Random(seed)
    # A server per query: each keeps the copy of its query's columns (one server's copy of a partition
    # is of the last columns built).
    servers = {sql: _Reads(store) for sql in QUERIES}
    plain = _Reads(store, scan_cache_bytes=0)
    for sql, reads in servers.items():
        reads.answer(sql)
    position = 1
    for _ in range(5):
        records: list[tuple[bytes, bytes | None]] = []
        for _ in range(rng.randint(1, 60)):
            i = rng.randrange(3300)  # some keys new
            kind = rng.random()
            if kind < 0.3:
                records.append((_key(i), None))
            else:
                amount = rng.choice([None, 0.5, 2.5, 1.0])
                records.append((_key(i), _row(i, rng.randrange(10), amount)))
        position += 1
        store.apply(records, position, 1)
        for sql, reads in servers.items():
            got, want = reads.answer(sql), plain.answer(sql)
            assert reads.rows_read == 3000  # the first scan, which built the copy; since, from the copy
            assert _users(got) == _users(want), sql
            assert _partial(got) == _partial(want), sql  # the aggregates, and the rows counted as scanned


def test_a_copy_too_changed_is_rebuilt(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(column_cache, "MIN_CHANGE_LIMIT", 100)
    reads = _Reads(store)
    reads.answer(QUERIES[0])
    store.apply([(_key(i), _row(i, 7)) for i in range(50)], 2, 1)
    reads.answer(QUERIES[0])
    assert reads.rows_read == 3000  # 50 changed keys: patched from the store
    store.apply([(_key(i), _row(i, 7)) for i in range(1000)], 3, 1)  # past 3000 // 4
    answer = reads.answer(QUERIES[0])
    assert reads.rows_read == 6000 and len(answer.items) == 1000 + 200
    reads.answer(QUERIES[0])
    assert reads.rows_read == 6000  # the new copy


def test_a_copy_of_a_closed_store_is_never_used(store: Store, tmp_path: Path) -> None:
    reads = _Reads(store)
    reads.answer(QUERIES[0])
    other = Store.open(tmp_path / "other")  # as after a snapshot install: the replica's store replaced
    try:
        other.apply([(_key(i), _row(i, 7)) for i in range(5)], 1, 1)
        reads.replica.store = other
        assert _users(reads.answer(QUERIES[0])) == [f"u{i:05d}" for i in range(5)]
    finally:
        reads.replica.store = store
        other.close()


def test_copies_stay_within_the_servers_bytes(tmp_path: Path) -> None:
    stores = [Store.open(tmp_path / f"s{n}") for n in range(3)]
    try:
        for store in stores:
            store.apply([(_key(i), _row(i, i % 10)) for i in range(2000)], 1, 1)
        reads = _Reads(stores[0])
        reads.answer(QUERIES[0])
        one = reads.caches.nbytes
        reads.caches.max_bytes = 2 * one + one // 2
        for pid, store in enumerate(stores):
            reads.replica.store, reads.replica.pid = store, (1, pid)
            reads.answer(QUERIES[0])
        assert len(reads.caches) == 2  # the least recently used dropped
        assert reads.caches.nbytes <= reads.caches.max_bytes
    finally:
        for store in stores:
            store.close()


def test_columns_without_a_column_form_scan_the_rows_and_are_not_built_again(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "mixed")
    try:
        rows = [(_key(i), _row(i, i % 10)) for i in range(100)]
        rows.append((_key(100), encode_row({"user": "u00100", "clicks": 2.5})))  # ints and a float
        store.apply(rows, 1, 1)
        reads = _Reads(store)
        assert len(reads.answer(QUERIES[0]).items) == 10
        assert len(reads.caches) == 0
        reads.answer(QUERIES[0])
        assert reads.rows_read == 202 and not store.trackers
    finally:
        store.close()


def test_a_scan_that_stops_early_builds_nothing_and_stops_tracking(store: Store) -> None:
    reads = _Reads(store)
    # LIMIT 5: the scan ends after 6 matches
    program = program_for(_spec("SELECT * FROM t WHERE clicks = 7"), 5, 100_000).encode()
    request = PartitionQueryRequest("t", 0, (), True, None, None, None, None, 0, program=program)
    answer = asyncio.run(reads.reads.scan(request))
    assert answer.error is ReplicaError.NONE and len(answer.items) == 6
    assert len(reads.caches) == 0 and not store.trackers


@pytest.mark.parametrize("sql", QUERIES)
def test_a_scan_from_a_copy_answers_as_of_its_first_step(
    store: Store, sql: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(column_cache, "COPY_CHUNK_ROWS", 500)  # a copy of arrays of 500 rows: a top n of each
    reads = _Reads(store, scan_step_rows=50)  # the changed keys' rows read 50 a step
    plain = _Reads(store, scan_cache_bytes=0)
    store.apply([(_key(i), _row(i, 7)) for i in range(0, 3000, 13)], 2, 1)
    reads.answer(sql)  # the copy
    store.apply([(_key(i), None) for i in range(0, 3000, 17)], 3, 1)  # changed since the copy
    want = plain.answer(sql)

    def no_rows(*args: Any, **kwargs: Any) -> Iterator[list[Any]]:
        raise AssertionError("the copy answers: no row is read")

    monkeypatch.setattr(store, "scan_chunks", no_rows)
    steps = reads.reads._scan_steps(_request(sql))
    work = next(steps)  # the first step: the changed keys and the view taken, the copy's part handed over
    assert callable(work) and not isinstance(work, PartitionQueryResponse)

    def between_steps() -> None:  # applied between the steps: not in the answer, of the first's moment
        store.apply([(_key(i), _row(i, 7, 9.5)) for i in range(1, 3000, 5)], store.position + 1, 1)
        store.apply([(_key(i), None) for i in range(2, 3000, 7)], store.position + 1, 1)

    between_steps()
    answer = steps.send(work())
    loop_steps = 0
    while not isinstance(answer, PartitionQueryResponse):
        assert answer is None  # one piece of work off the loop, the rest steps on it
        loop_steps += 1
        between_steps()
        answer = next(steps)
    assert answer.error is ReplicaError.NONE, answer
    assert loop_steps >= 3000 // 17 // 50  # the changed keys' rows, 50 a step
    assert _users(answer) == _users(want)
    assert _partial(answer) == _partial(want)


def test_a_copy_s_part_is_decided_in_the_low_priority_compute_thread_while_the_loop_serves(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    reads = _Reads(store)
    sql = "SELECT name, SUM(clicks) FROM t GROUP BY name"
    want = reads.answer(sql)  # the copy
    entered, release = threading.Event(), threading.Event()
    seen: dict[str, object] = {}
    decide = column_cache._decide

    def held(*args: Any) -> object:
        seen["thread"] = threading.current_thread().name
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        entered.set()
        assert release.wait(30)
        return decide(*args)

    monkeypatch.setattr(column_cache, "_decide", held)
    lookup = PartitionQueryRequest("t", 0, (_key(5),), False, None, None, None, None, 0)

    async def scan_and_lookup() -> tuple[PartitionQueryResponse, PartitionQueryResponse]:
        scan = asyncio.create_task(reads.reads.scan(_request(sql)))
        assert await asyncio.to_thread(entered.wait, 30)
        served = reads.reads.serve(lookup)  # the loop serves while the copy's part is being decided
        release.set()
        return await scan, served

    got, served = asyncio.run(scan_and_lookup())
    assert served.error is ReplicaError.NONE and [k for k, _ in served.items] == [_key(5)]
    assert _partial(got) == _partial(want)
    assert str(seen["thread"]).startswith("scan-compute")
    assert seen["nice"] == os.getpriority(os.PRIO_PROCESS, 0) + 10


def test_a_failure_off_the_loop_is_the_scan_s_error(store: Store, monkeypatch: pytest.MonkeyPatch) -> None:
    reads = _Reads(store)
    sql = "SELECT user, COUNT(*) FROM t GROUP BY user"
    reads.answer(sql)  # the copy; 3000 groups are within the test's cap
    monkeypatch.setattr(column_cache, "MAX_GROUPS", 100)
    answer = asyncio.run(reads.reads.scan(_request(sql)))
    assert answer.error is ReplicaError.BAD_QUERY and "more than 100 groups" in answer.message

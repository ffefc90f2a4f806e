"""Concurrent writes on one TableWriter against one real RPC server whose answers the test scripts (to fail
exactly the Produce a case needs): Produces of a partition are pipelined up to max_in_flight, in the order
the calls were made, and a failed one is resent after the later ones settled, without the rows whose key a
later write committed, so no key goes back to an older value. The server applies rows in the order
Produces arrive, as an active appends them."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from hotstate.client.writer import TableWriter, WriteError, WriteResult
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.protocol.rows import decode_row
from hotstate.protocol.wire import MESSAGES
from hotstate.query.tokens import cluster_tag, decode
from hotstate.replica.messages import (
    PartitionMetadata,
    PartitionRows,
    ProducePartitionsRequest,
    ProducePartitionsResponse,
    ProduceRequest,
    ProduceResponse,
    ReplicaError,
    ServerAddress,
    TableMetadataRequest,
    TableMetadataResponse,
)
from hotstate.rpc import PeerInfo, RpcServer

CLUSTER, SECRET = "writer-test", "a-secret-of-16-chars-or-more"

# What the server answers a part (its rows decoded), or None to write it.
Script = Callable[[list[dict[str, object]]], ReplicaError | None]
# Whether the answer to the part with this index (in arrival order) may go now; asked again on each arrival
# and on `Server.release`, so a test holds an answer until the Produces it must overlap have arrived.
AnswerWhen = Callable[["Server", int], bool]


class Server:
    """Node 1, the active of table 't' (one partition). Writes each part's rows into `store` in arrival
    order unless `script` fails it; holds each answer until `answer_when` allows it, then `turns` loop
    turns more (in which a writer that sent more than it should would have sent it)."""

    def __init__(
        self,
        script: Script = lambda rows: None,
        answer_when: AnswerWhen = lambda server, index: True,
        turns: int = 1,
        produce_max_bytes: int = 0,
    ) -> None:
        self.script = script
        self.answer_when = answer_when
        self.turns = turns
        self.released = False
        self.changed = asyncio.Condition()
        self.produce_max_bytes = produce_max_bytes
        self.store: dict[object, object] = {}
        self.parts: list[list[dict[str, object]]] = []  # every part received, in arrival order
        self.outstanding = self.most_outstanding = 0
        self.end = 0
        self.table_id = 7
        self.metadata_offset = 10
        self.rpc = RpcServer("127.0.0.1", 0, CLUSTER, SECRET, 1, self.handle, MESSAGES)

    async def handle(self, peer: PeerInfo, message: object) -> object:
        if isinstance(message, TableMetadataRequest):
            if message.max_wait_ms:
                # A watch: parked until the server closes. A test that changes the table fetches the new
                # metadata itself (metadata(refresh=True)), so no watch needs answering.
                await asyncio.get_running_loop().create_future()
            return TableMetadataResponse(
                ReplicaError.NONE,
                "",
                self.table_id,
                (KeyColumn("k", KeyType.STRING),),
                None,
                (PartitionMetadata(0, 1, 3, (1,), (1,)),),
                (ServerAddress(1, "127.0.0.1", self.rpc.port, None, False),),
                self.metadata_offset,
                self.produce_max_bytes,
            )
        single = isinstance(message, ProduceRequest)
        parts: tuple[PartitionRows, ...]
        if isinstance(message, ProduceRequest):
            parts = (PartitionRows(message.partition, message.leader_epoch, message.rows),)
        else:
            assert isinstance(message, ProducePartitionsRequest)
            parts = message.parts
        first = len(self.parts)
        answers = [self._append(part) for part in parts]  # before the first wait, as an active does
        self.outstanding += len(parts)
        self.most_outstanding = max(self.most_outstanding, self.outstanding)
        async with self.changed:
            self.changed.notify_all()
            await self.changed.wait_for(lambda: self.answer_when(self, first))
        for _ in range(self.turns):
            await asyncio.sleep(0)
        self.outstanding -= len(parts)
        return answers[0] if single else ProducePartitionsResponse(tuple(answers))

    async def until(self, condition: Callable[[], bool]) -> None:
        """Wait until `condition` holds, checked on each arrival."""
        async with asyncio.timeout(5), self.changed:
            await self.changed.wait_for(condition)

    async def release(self) -> None:
        self.released = True
        async with self.changed:
            self.changed.notify_all()

    def _append(self, part: PartitionRows) -> ProduceResponse:
        rows = [decode_row(row) for row in part.rows]
        self.parts.append(rows)
        error = self.script(rows)
        if error is not None:
            return ProduceResponse(error, f"{error.name} from the test", active=1, leader_epoch=3)
        for row in rows:
            self.store[row["k"]] = row["v"]
        self.end += len(rows)
        return ProduceResponse(ReplicaError.NONE, "", self.end - len(rows), self.end, 1, 3)


def _rows(call: int, keys: str) -> list[dict[str, object]]:
    return [{"k": key, "v": call} for key in keys]


async def _concurrently(
    server: Server, calls: list[list[dict[str, object]]], max_in_flight: int = 5
) -> tuple[TableWriter, list[WriteResult | BaseException]]:
    """Every call started at once, in list order, on one writer; their results or errors."""
    await server.rpc.start()
    try:
        async with TableWriter(
            [("127.0.0.1", server.rpc.port)],
            "t",
            cluster_id=CLUSTER,
            secret=SECRET,
            max_in_flight=max_in_flight,
        ) as writer:
            await writer.metadata()
            tasks = [asyncio.create_task(writer.upsert(rows, deadline_s=10.0)) for rows in calls]
            results = await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        await server.rpc.close()
    return writer, results


def test_produces_of_a_partition_are_pipelined_up_to_the_bound_in_call_order() -> None:
    # Each answer waits for the two Produces after it: only a writer that keeps 3 in flight gets any.
    server = Server(answer_when=lambda server, index: len(server.parts) >= min(index + 3, 10))
    calls = [_rows(call, f"k{call}") for call in range(10)]
    writer, results = asyncio.run(_concurrently(server, calls, max_in_flight=3))
    assert all(not isinstance(r, BaseException) for r in results), results
    assert server.most_outstanding == 3  # never more, and the window was filled
    assert [rows[0]["v"] for rows in server.parts] == list(range(10))
    assert writer.stats.produce_requests == 10


def test_one_in_flight_sends_a_partitions_writes_one_at_a_time() -> None:
    server = Server(turns=10)
    calls = [_rows(call, "ab") for call in range(4)]
    _, results = asyncio.run(_concurrently(server, calls, max_in_flight=1))
    assert all(not isinstance(r, BaseException) for r in results), results
    assert server.most_outstanding == 1
    assert server.store == {"a": 3, "b": 3}


def _after_arrivals(count: int) -> AnswerWhen:
    """The first Produce is answered once `count` have arrived (the later ones in flight); the rest at
    once."""
    return lambda server, index: index > 0 or len(server.parts) >= count


def _fails_once(call: int, error: ReplicaError) -> Script:
    failed: set[int] = set()

    def script(rows: list[dict[str, object]]) -> ReplicaError | None:
        if rows[0]["v"] == call and call not in failed:
            failed.add(call)
            return error
        return None

    return script


@pytest.mark.parametrize("error", [ReplicaError.NOT_ENOUGH_REPLICAS, ReplicaError.TIMEOUT], ids=str)
def test_a_failed_write_is_resent_without_the_keys_a_later_write_committed(error: ReplicaError) -> None:
    server = Server(_fails_once(0, error), _after_arrivals(3))
    calls = [_rows(0, "ab0"), _rows(1, "a1"), _rows(2, "b2")]
    writer, results = asyncio.run(_concurrently(server, calls))
    assert all(not isinstance(r, BaseException) for r in results), results
    # The first call failed while the later two were in flight; its retry went last, with only the key
    # no later call wrote. Resent whole, it would have put a and b back to 0.
    assert [sorted(str(r["k"]) for r in part) for part in server.parts] == [
        ["0", "a", "b"],
        ["1", "a"],
        ["2", "b"],
        ["0"],
    ]
    assert server.store == {"a": 1, "b": 2, "0": 0, "1": 1, "2": 2}
    assert writer.stats.rows_superseded == 2
    assert (writer.stats.produce_requests, writer.stats.produce_failures) == (4, 1)


def test_a_later_write_that_fails_for_good_costs_an_earlier_one_no_row() -> None:
    def script(rows: list[dict[str, object]]) -> ReplicaError | None:
        return ReplicaError.INVALID_ROW if rows[0]["v"] == 1 else first(rows)

    first = _fails_once(0, ReplicaError.NOT_ENOUGH_REPLICAS)
    server = Server(script, _after_arrivals(3))
    calls = [_rows(0, "abc"), _rows(1, "a"), _rows(2, "b")]
    writer, results = asyncio.run(_concurrently(server, calls))
    assert isinstance(results[1], WriteError) and results[1].error is ReplicaError.INVALID_ROW
    assert not isinstance(results[0], BaseException) and not isinstance(results[2], BaseException)
    # Call 1 wrote nothing, so the retry of call 0 keeps its row of a; call 2 committed b.
    assert server.parts[-1] == [{"k": "a", "v": 0}, {"k": "c", "v": 0}]
    assert server.store == {"a": 0, "b": 2, "c": 0}
    assert writer.stats.produce_failures == 2  # the one retried and the one given up


def test_a_retry_whose_every_row_a_later_write_committed_is_not_sent() -> None:
    server = Server(_fails_once(0, ReplicaError.NOT_ENOUGH_REPLICAS), _after_arrivals(2))
    calls = [_rows(0, "ab"), _rows(1, "ab")]
    writer, results = asyncio.run(_concurrently(server, calls))
    assert all(not isinstance(r, BaseException) for r in results), results
    assert len(server.parts) == 2 and server.store == {"a": 1, "b": 1}
    assert writer.stats.rows_superseded == 2


def test_writes_behind_a_failing_one_wait_and_fail_at_their_own_deadline() -> None:
    async def main() -> None:
        server = Server(lambda rows: ReplicaError.NOT_ENOUGH_REPLICAS if rows[0]["v"] == 0 else None)
        await server.rpc.start()
        try:
            async with TableWriter(
                [("127.0.0.1", server.rpc.port)], "t", cluster_id=CLUSTER, secret=SECRET
            ) as writer:
                await writer.metadata()
                stuck = asyncio.create_task(writer.upsert(_rows(0, "a"), deadline_s=1.5))
                # Sent, failed and sent again: the writer had the failure, so the gate is closed.
                await server.until(lambda: len(server.parts) >= 2)
                with pytest.raises(WriteError) as error:
                    await writer.upsert(_rows(1, "b"), deadline_s=0.3)
                assert error.value.error is ReplicaError.TIMEOUT
                with pytest.raises(WriteError) as error:
                    await stuck
                assert error.value.error is ReplicaError.TIMEOUT
                assert "NOT_ENOUGH_REPLICAS" in str(error.value)
                # The gate opened when the failing write gave up: the next write goes through.
                await writer.upsert(_rows(2, "b"), deadline_s=5.0)
            assert server.store == {"b": 2}
        finally:
            await server.rpc.close()

    asyncio.run(main())


def test_produces_made_while_the_connection_opens_leave_in_call_order() -> None:
    """A call every event-loop turn while the writer connects to the active: the Produces made before the
    connection is up wait for it, and must not be overtaken by one made just as it opens."""

    async def main() -> list[object]:
        server = Server()
        await server.rpc.start()
        try:
            async with TableWriter(
                [("127.0.0.1", server.rpc.port)],
                "t",
                cluster_id=CLUSTER,
                secret=SECRET,
                max_in_flight=1000,
            ) as writer:
                await writer.metadata()  # through the bootstrap address: node 1 itself is not connected yet
                tasks = []
                for call in range(300):
                    tasks.append(asyncio.create_task(writer.upsert(_rows(call, "a"), deadline_s=10.0)))
                    await asyncio.sleep(0)
                results = await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            await server.rpc.close()
        assert all(not isinstance(r, BaseException) for r in results), results
        return [rows[0]["v"] for rows in server.parts]

    arrived = asyncio.run(main())
    assert arrived == list(range(300))


def test_a_large_write_goes_as_several_produces_in_order_and_a_failed_one_is_filtered_too() -> None:
    failed: set[str] = set()

    def script(rows: list[dict[str, object]]) -> ReplicaError | None:
        first = str(rows[0]["k"])
        if rows[0]["v"] == 0 and first != "k00" and not failed:  # the second Produce of call 0
            failed.add(first)
            return ReplicaError.NOT_ENOUGH_REPLICAS
        return None

    server = Server(script, produce_max_bytes=100)  # a few rows per Produce
    keys = [f"k{i:02d}" for i in range(40)]
    calls = [[{"k": key, "v": call} for key in keys] for call in range(2)]
    writer, results = asyncio.run(_concurrently(server, calls))
    assert all(not isinstance(r, BaseException) for r in results), results
    values = [[row["v"] for row in part] for part in server.parts]
    chunks = len(values) // 2
    assert chunks >= 4 and all(len(set(v)) == 1 for v in values), values
    # Call 0's Produces, then call 1's, in order; the failed one was not sent again: call 1 had committed
    # every one of its keys.
    assert [v[0] for v in values] == [0] * chunks + [1] * chunks
    for call in range(2):
        sent = [str(row["k"]) for part in server.parts[call * chunks : (call + 1) * chunks] for row in part]
        assert sent == keys
    assert server.store == dict.fromkeys(keys, 1)
    assert writer.stats.rows_superseded == len(server.parts[1])


@pytest.mark.parametrize("old_write_in_flight", [False, True], ids=["settled", "old-write-in-flight"])
def test_a_table_created_again_under_the_writer_gets_positions_of_its_own(old_write_in_flight: bool) -> None:
    """The table is deleted and created again (a new table id, its log starting over) while the writer
    lives: a token must not carry the old table's end offsets, which are beyond the new log's end (a reader
    given one is refused). A write all of whose rows a later one committed takes the partition's position;
    a write to the old table answered only after the writer saw the new one moves it not at all."""

    async def main() -> list[WriteResult]:
        old_write = [{"k": "z", "v": 99}]
        # The old write's answer is held until the writer has the new table's metadata.
        server = Server(answer_when=lambda server, index: server.released or server.parts[index] != old_write)
        await server.rpc.start()
        try:
            async with TableWriter(
                [("127.0.0.1", server.rpc.port)], "t", cluster_id=CLUSTER, secret=SECRET
            ) as writer:
                await writer.upsert([{"k": f"old{i}", "v": 99} for i in range(100)])
                old = asyncio.create_task(writer.upsert(_rows(99, "z") if old_write_in_flight else []))
                if old_write_in_flight:  # appended to the old log, its answer still to come
                    await server.until(lambda: server.parts[-1] == old_write)
                server.table_id, server.end, server.metadata_offset = 8, 0, 11
                server.script = _fails_once(0, ReplicaError.NOT_ENOUGH_REPLICAS)
                await writer.metadata(refresh=True)
                await server.release()
                calls = [writer.upsert(_rows(0, "ab"), deadline_s=10.0), writer.upsert(_rows(1, "ab"))]
                results = list(await asyncio.gather(*calls))
                await old
                return results
        finally:
            await server.rpc.close()

    results = asyncio.run(main())
    assert [decode(r.consistency_token, cluster_tag(CLUSTER)) for r in results] == [{(8, 0): 2}, {(8, 0): 2}]


async def _paced_write(
    answers: int | None, pause_s: float, deadline_s: float
) -> tuple[Server, float, WriteResult | WriteError]:
    """One large write (several Produces, one in flight at a time) whose answers the server lets go one at
    a time, `pause_s` after each Produce arrived; after `answers` of them (None: all) it stops answering.
    The server, the seconds the write took, its result or error."""
    allowed = 0
    server = Server(answer_when=lambda server, index: index < allowed, produce_max_bytes=100)
    keys = [f"k{i:02d}" for i in range(80)]
    await server.rpc.start()
    try:
        async with TableWriter(
            [("127.0.0.1", server.rpc.port)], "t", cluster_id=CLUSTER, secret=SECRET, max_in_flight=1
        ) as writer:
            await writer.metadata()
            started = asyncio.get_running_loop().time()
            write = asyncio.create_task(
                writer.upsert([{"k": k, "v": 0} for k in keys], deadline_s=deadline_s)
            )

            def arrived() -> bool:  # the Produce whose answer is next, or the write gave up
                return len(server.parts) > allowed or write.done()

            async def pace() -> None:
                nonlocal allowed
                while answers is None or allowed < answers:
                    await server.until(arrived)
                    if write.done():
                        return
                    # Real time must pass for a deadline to run out: the write is slow but acknowledged.
                    await asyncio.sleep(pause_s)
                    allowed += 1
                    await server.release()

            pacer = asyncio.create_task(pace())
            try:
                result: WriteResult | WriteError = await write
            except WriteError as error:
                result = error
            took = asyncio.get_running_loop().time() - started
            pacer.cancel()
    finally:
        await server.rpc.close()
    return server, took, result


def test_a_write_that_keeps_being_acknowledged_runs_past_its_deadline() -> None:
    # The deadline bounds a time without progress, not the whole write (issue 26: a Spark task's rows).
    server, took, result = asyncio.run(_paced_write(None, pause_s=0.1, deadline_s=0.3))
    assert isinstance(result, WriteResult), result
    assert len(server.parts) >= 6 and took > 0.3 * 2, (len(server.parts), took)
    assert server.store == {f"k{i:02d}": 0 for i in range(80)}


def test_a_write_whose_partition_stops_acknowledging_fails_after_the_deadline_naming_the_stall() -> None:
    _, took, result = asyncio.run(_paced_write(2, pause_s=0.1, deadline_s=0.3))
    assert isinstance(result, WriteError) and result.error is ReplicaError.TIMEOUT, result
    message = str(result)
    assert "t/0" in message and "server 1" in message and "0.3 s" in message and "writeTimeoutMs" in message
    # Two answers after 0.1 s each, then the deadline from the last one: not cut short, not held much longer.
    assert 0.2 + 0.3 <= took < 0.2 + 0.3 + 2.0, took

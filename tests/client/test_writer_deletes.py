"""TableWriter.delete and mixed writes against one real RPC server that checks each Produce as an active does
(`replica.ingest.records_for_rows`) and applies its records in arrival order (a nil record deletes): deletes
travel as tombstones in their place among the rows, every key form names the same row, a bad key fails the
call before anything is sent, and a failed Produce's retry is filtered by later committed deletes as by
later rows, both ways."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import pytest

from hotstate.client import writer as writer_module
from hotstate.client.writer import Delete, TableWriter, WriteError
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.protocol.keys import KeyValue, decode_key, encode_key, partition_for
from hotstate.protocol.rows import decode_record, decode_row
from hotstate.protocol.wire import MESSAGES
from hotstate.query.tokens import cluster_tag, decode
from hotstate.replica.ingest import records_for_rows
from hotstate.replica.messages import (
    PartitionMetadata,
    PartitionRows,
    ProducePartitionsRequest,
    ProducePartitionsResponse,
    ProduceRequest,
    ProduceResponse,
    ReadPartitionRequest,
    ReadPartitionResponse,
    ReplicaError,
    ServerAddress,
    TableMetadataRequest,
    TableMetadataResponse,
)
from hotstate.rpc import PeerInfo, RpcServer

CLUSTER, SECRET = "writer-test", "a-secret-of-16-chars-or-more"
PARTITIONS = 2
KEY = (KeyColumn("k", KeyType.STRING), KeyColumn("n", KeyType.INT))

# A part's records as (key tuple, row or None) -> an error to answer it with, or None to apply it.
Script = Callable[[list[tuple[tuple[KeyValue, ...], dict[str, object] | None]]], ReplicaError | None]


class Server:
    """Node 1, the active of both partitions of table 't' keyed by (k, n)."""

    def __init__(self, script: Script = lambda records: None) -> None:
        self.script = script
        self.store: dict[tuple[KeyValue, ...], dict[str, object]] = {}
        self.parts: list[list[tuple[tuple[KeyValue, ...], dict[str, object] | None]]] = []
        self.ends = [0] * PARTITIONS
        self.reads: list[ReadPartitionRequest] = []
        self.behind = 0
        self.rpc = RpcServer("127.0.0.1", 0, CLUSTER, SECRET, 1, self.handle, MESSAGES)

    async def handle(self, peer: PeerInfo, message: object) -> object:
        if isinstance(message, TableMetadataRequest):
            if message.max_wait_ms:
                await asyncio.sleep(min(message.max_wait_ms, 200) / 1000)
            return TableMetadataResponse(
                ReplicaError.NONE,
                "",
                7,
                KEY,
                None,
                tuple(PartitionMetadata(p, 1, 3, (1,), (1,)) for p in range(PARTITIONS)),
                (ServerAddress(1, "127.0.0.1", self.rpc.port, None, False),),
                10,
                0,
            )
        if isinstance(message, ReadPartitionRequest):
            self.reads.append(message)
            held = sorted(
                encode_key(k)
                for k in self.store
                if partition_for(encode_key(k), PARTITIONS) == message.partition
            )
            page = tuple(
                (key, b"row") for key in held if message.after_key is None or key > message.after_key
            )
            # The first answers come from a store still behind the last write.
            position = self.ends[message.partition] - (1 if len(self.reads) <= self.behind else 0)
            return ReadPartitionResponse(ReplicaError.NONE, "", position, page[: message.limit])
        if isinstance(message, ProduceRequest):
            parts: Sequence[PartitionRows] = (PartitionRows(message.partition, 3, message.rows),)
        else:
            assert isinstance(message, ProducePartitionsRequest)
            parts = message.parts
        answers = [self._append(part) for part in parts]
        await asyncio.sleep(0.05)
        return (
            answers[0] if isinstance(message, ProduceRequest) else ProducePartitionsResponse(tuple(answers))
        )

    def _append(self, part: PartitionRows) -> ProduceResponse:
        records, problem = records_for_rows(part.rows, KEY, PARTITIONS, part.partition, "t")
        if problem is not None:
            return ProduceResponse(ReplicaError.INVALID_ROW, problem)
        decoded = []
        for record in records:
            key, row = decode_record(record)
            decoded.append((decode_key(key), None if row is None else decode_row(row)))
        self.parts.append(decoded)
        error = self.script(decoded)
        if error is not None:
            return ProduceResponse(error, f"{error.name} from the test", active=1, leader_epoch=3)
        for key_values, value in decoded:
            if value is None:
                self.store.pop(key_values, None)
            else:
                self.store[key_values] = value
        self.ends[part.partition] += len(decoded)
        end = self.ends[part.partition]
        return ProduceResponse(ReplicaError.NONE, "", end - len(decoded), end, 1, 3)


async def _with_writer(server: Server, body: Callable[[TableWriter], object]) -> object:
    await server.rpc.start()
    try:
        async with TableWriter([("127.0.0.1", server.rpc.port)], "t", cluster_id=CLUSTER, secret=SECRET) as w:
            return await body(w)  # type: ignore[misc]
    finally:
        await server.rpc.close()


def _row(k: str, n: int, v: int) -> dict[str, object]:
    return {"k": k, "n": n, "v": v}


def test_deleted_keys_are_gone_whatever_form_names_them_and_the_token_covers_the_deletes() -> None:
    server = Server()
    rows = [_row(f"u{i}", i, i) for i in range(12)]

    async def body(writer: TableWriter) -> object:
        await writer.upsert(rows)
        return await writer.delete(
            [("u0", 0), ["u1", 1], {"k": "u2", "n": 2, "v": "ignored"}, rows[3], ("nobody", 9)]
        )

    result = asyncio.run(_with_writer(server, body))
    assert set(server.store) == {(f"u{i}", i) for i in range(4, 12)}
    assert result.rows == 5  # type: ignore[attr-defined]
    positions = decode(result.consistency_token, cluster_tag(CLUSTER))  # type: ignore[attr-defined]
    # Each partition the deletes went to, at its end: the deletes themselves are in the log.
    deleted = [("u0", 0), ("u1", 1), ("u2", 2), ("u3", 3), ("nobody", 9)]
    touched = {partition_for(encode_key(k), PARTITIONS) for k in deleted}
    assert positions == {(7, p): server.ends[p] for p in touched}


def test_a_mixed_write_keeps_its_order_per_key() -> None:
    server = Server()

    async def body(writer: TableWriter) -> object:
        await writer.upsert([_row("b", 1, 0), _row("c", 1, 0)])
        return await writer.write(
            [_row("a", 1, 1), Delete(("a", 1)), Delete(("b", 1)), _row("b", 1, 2), Delete({"k": "c", "n": 1})]
        )

    result = asyncio.run(_with_writer(server, body))
    assert server.store == {("b", 1): _row("b", 1, 2)}
    assert result.rows == 5  # type: ignore[attr-defined]


def test_a_bad_key_fails_the_call_before_anything_is_sent() -> None:
    for bad, message in [
        (("a",), "delete 1 of t: key has 1 values but the table's key columns are \\(k, n\\)"),
        (("a", "1"), "delete 1 of t: key column 'n' must be an int"),
        ({"k": "a"}, "delete 1 of t: key column 'n' is missing"),
        ("a", "delete 1 of t: key of a table keyed by \\(k, n\\) must be a tuple or a mapping"),
    ]:
        server = Server()

        async def body(writer: TableWriter, bad: object = bad) -> object:
            return await writer.write([_row("x", 1, 1), Delete(bad)])  # type: ignore[arg-type]

        with pytest.raises(WriteError, match=message) as error:
            asyncio.run(_with_writer(server, body))
        assert error.value.error is ReplicaError.INVALID_ROW
        assert server.parts == []


def _fails_first_send_of(value: object) -> Script:
    failed: list[bool] = []

    def script(records: list[tuple[tuple[KeyValue, ...], dict[str, object] | None]]) -> ReplicaError | None:
        if not failed and any(
            (row or {}).get("v") == value or (row is None and value is None) for _, row in records
        ):
            failed.append(True)
            return ReplicaError.NOT_ENOUGH_REPLICAS
        return None

    return script


def _same_partition_keys(count: int) -> list[str]:
    keys = [f"s{i}" for i in range(100)]
    return [k for k in keys if partition_for(encode_key((k, 0)), PARTITIONS) == 0][:count]


def test_a_retry_leaves_out_rows_a_later_committed_delete_removed() -> None:
    """Call 0 writes a and b and fails while call 1, a delete of a, commits: its retry must not bring a
    back."""
    a, b = _same_partition_keys(2)
    server = Server(_fails_first_send_of(0))

    async def body(writer: TableWriter) -> object:
        await writer.metadata()
        first = asyncio.create_task(writer.upsert([_row(a, 0, 0), _row(b, 0, 0)]))
        second = asyncio.create_task(writer.delete([(a, 0)]))
        await asyncio.gather(first, second)
        return writer

    writer = asyncio.run(_with_writer(server, body))
    assert server.parts[-1] == [((b, 0), _row(b, 0, 0))]  # the retry: b alone
    assert server.store == {(b, 0): _row(b, 0, 0)}
    assert writer.stats.rows_superseded == 1  # type: ignore[attr-defined]


def test_a_retried_delete_leaves_out_keys_a_later_committed_row_wrote() -> None:
    """Call 0 deletes a and b and fails while call 1 writes a: its retry deletes b only, and a keeps call
    1's row."""
    a, b = _same_partition_keys(2)
    server = Server(_fails_first_send_of(None))

    async def body(writer: TableWriter) -> object:
        await writer.upsert([_row(a, 0, 0), _row(b, 0, 0)])
        first = asyncio.create_task(writer.delete([(a, 0), (b, 0)]))
        second = asyncio.create_task(writer.upsert([_row(a, 0, 1)]))
        await asyncio.gather(first, second)
        return None

    asyncio.run(_with_writer(server, body))
    assert server.parts[-1] == [((b, 0), None)]
    assert server.store == {(a, 0): _row(a, 0, 1)}


def test_partition_keys_reads_every_page_once_the_store_holds_the_position(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    server = Server()
    server.behind = 2
    monkeypatch.setattr(writer_module, "KEY_PAGE", 4)

    async def body(writer: TableWriter) -> object:
        result = await writer.upsert([_row(f"p{i:02d}", i, i) for i in range(30)])
        at = decode(result.consistency_token, cluster_tag(CLUSTER))
        return [await writer.partition_keys(p, at_least=at[(7, p)]) for p in range(PARTITIONS)]

    held = asyncio.run(_with_writer(server, body))
    assert isinstance(held, list)
    for partition, keys in enumerate(held):
        mine = [encode_key((f"p{i:02d}", i)) for i in range(30)]
        assert keys == sorted(k for k in mine if partition_for(k, PARTITIONS) == partition)
    # Two answers from a store behind the write were asked again; then pages of 4 after the last key.
    assert [r.after_key is None for r in server.reads[:3]] == [True, True, True]
    assert len(server.reads) == 2 + sum(len(keys) // 4 + 1 for keys in held)

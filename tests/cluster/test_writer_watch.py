"""Between real server processes: the writer learns partition moves from its metadata watches (not by
polling), rows that can never be written fail at once, and a restarted server says "not ready" (never "no
such table") until its metadata has caught up."""

from __future__ import annotations

import dataclasses
import signal
import time
from collections import Counter

import httpx
import pytest

import hotstate
from hotstate.client.query import Unavailable
from hotstate.client.writer import TableWriter, WriteError, WriterStats
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError
from hotstate.protocol.http_api import SERVER_NOT_READY
from hotstate.protocol.rows import MAX_NESTING
from hotstate.protocol.wire import MESSAGES
from hotstate.replica.messages import ReplicaError, TableMetadataRequest, TableMetadataResponse
from hotstate.rpc import PeerPool

from .conftest import RunningCluster, StartCluster, present

KEY = (KeyColumn("user", KeyType.STRING),)


async def _create(running: RunningCluster, name: str, partitions: int, standbys: int) -> None:
    async with running.cluster.admin(request_timeout_s=2.0) as admin:
        reply = await admin.create_table(
            name, partitions=partitions, standby_replicas=standbys, key_columns=KEY
        )
        assert reply.error is ControllerError.NONE, reply


def _writer(running: RunningCluster, table: str, servers: list[tuple[str, int]] | None = None) -> TableWriter:
    cluster = running.cluster
    return TableWriter(
        servers or cluster.addresses(), table, cluster_id=cluster.cluster_id, secret=cluster.secret
    )


def _rows(value: int, count: int = 60) -> list[dict[str, object]]:
    return [{"user": f"k{i}", "value": value} for i in range(count)]


def _nested(depth: int) -> object:
    value: object = 0
    for _ in range(depth):
        value = [value]
    return value


def test_rows_that_can_never_be_written_fail_at_once_naming_the_row_and_the_limit(
    start_cluster: StartCluster,
) -> None:
    running = start_cluster(1)

    async def scenario() -> None:
        await _create(running, "big", partitions=2, standbys=0)
        async with _writer(running, "big") as writer:
            await writer.upsert(_rows(0, 4))
            sent = writer.stats.produce_requests
            huge: list[dict[str, object]] = [
                *_rows(1, 3),
                {"user": "huge", "value": "x" * (20 * 1024 * 1024)},
            ]
            started = time.monotonic()
            with pytest.raises(WriteError) as error:
                await writer.upsert(huge, deadline_s=15.0)
            assert error.value.error is ReplicaError.TOO_LARGE
            message = str(error.value)
            # The server's produce.max.bytes (8 MiB by default) is what applies, not the RPC frame.
            assert "row 3 of big: 20,971,5" in message and "the limit is 8,388,608" in message, message
            assert time.monotonic() - started < 5.0  # not retried until the deadline
            deep = [*_rows(2, 1), {"user": "deep", "value": _nested(5000)}]
            with pytest.raises(WriteError) as error:
                await writer.upsert(deep)
            assert error.value.error is ReplicaError.INVALID_ROW
            assert "row 1 of big: column 'value'" in str(error.value)
            assert f"nested more than {MAX_NESTING} levels" in str(error.value)
            assert writer.stats.produce_requests == sent  # nothing of either call was sent

    running.run(scenario())


def _stats(writer: TableWriter) -> WriterStats:
    return dataclasses.replace(writer.stats)


def test_after_kill_9_of_an_active_the_writer_learns_the_new_active_from_its_watch(
    start_cluster: StartCluster,
) -> None:
    running = start_cluster(3)
    leader = running.leader()

    async def scenario() -> None:
        await _create(running, "moves", partitions=6, standbys=1)
        async with _writer(running, "moves") as writer:
            await writer.upsert(_rows(0), deadline_s=30.0)
            meta = await writer.metadata()
            counts = Counter(p.active for p in meta.partitions if p.active != leader)
            victim = present(counts.most_common(1)[0][0])  # not the metadata leader: no election in the way
            moved = [p.partition for p in meta.partitions if p.active == victim]
            before = _stats(writer)
            running.kill(victim)
            killed_at = time.monotonic()
            result = await writer.upsert(_rows(1), deadline_s=30.0)
            took = time.monotonic() - killed_at
            after = _stats(writer)
            meta = await writer.metadata()
        print(f"kill -9 of server {victim} (partitions {moved}): acked after {took:.3f} s, stats {after}")
        assert all(meta.partitions[p].active not in (victim, None) for p in moved)
        # The mechanism: the new actives came from a watch answer, and the retries went out on it; no
        # plain metadata request was made (no refresh after failures, no polling while waiting).
        assert after.metadata_requests == before.metadata_requests, (before, after)
        assert after.watch_changes > before.watch_changes, (before, after)
        # Either a Produce failed against the dead server and was resent when the watch showed the move,
        # or the watch had shown it before the first Produce went out (the controller can fence a killed
        # server within milliseconds) and nothing needed a retry.
        assert after.retried_on_move > before.retried_on_move or result.retries == 0, (before, after)

    running.run(scenario())


def test_a_produce_hanging_on_a_paused_active_is_moved_when_the_watch_shows_the_new_active(
    start_cluster: StartCluster,
) -> None:
    running = start_cluster(3)
    leader = running.leader()

    async def scenario() -> None:
        await _create(running, "paused", partitions=6, standbys=1)
        async with _writer(running, "paused") as writer:
            await writer.upsert(_rows(0), deadline_s=30.0)
            meta = await writer.metadata()
            victim = present(
                Counter(p.active for p in meta.partitions if p.active != leader).most_common(1)[0][0]
            )
            before = _stats(writer)
            # Paused, its connections stay open: the Produce waits for an answer that never comes, until
            # the controller fences the server (session timeout) and a watch brings the new active.
            running.kill(victim, signal.SIGSTOP)
            try:
                await writer.upsert(_rows(1), deadline_s=30.0)
            finally:
                running.kill(victim, signal.SIGCONT)
            after = _stats(writer)
        assert after.moved_while_waiting > before.moved_while_waiting, (before, after)
        assert after.metadata_requests == before.metadata_requests, (before, after)

    running.run(scenario())


async def _ask_metadata(pool: PeerPool, node: int, table: str) -> TableMetadataResponse:
    reply = await pool.request(node, TableMetadataRequest(table), 5.0)
    assert isinstance(reply, TableMetadataResponse)
    return reply


def test_a_restarted_server_says_not_ready_until_its_metadata_caught_up(start_cluster: StartCluster) -> None:
    running = start_cluster(3)
    cluster = running.cluster
    server1 = running.server(1)
    base = f"http://127.0.0.1:{server1.http_port}"
    select = {"sql": "SELECT * FROM restart WHERE user = 'k1'"}

    async def create_and_write() -> None:
        await _create(running, "restart", partitions=3, standbys=1)
        async with _writer(running, "restart") as writer:
            await writer.upsert(_rows(0, 10), deadline_s=30.0)

    running.run(create_and_write())
    # With servers 2 and 3 paused there is no metadata quorum, so a restarted server 1 learns no high
    # watermark and its image cannot catch up: a catch-up as slow as it gets, for as long as needed.
    running.kill(2, signal.SIGSTOP)
    running.kill(3, signal.SIGSTOP)
    try:
        running.kill(1)
        running.restart(1)
        deadline = time.monotonic() + 30.0
        while True:
            try:
                answer = httpx.post(f"{base}/v1/query", json=select, timeout=2.0)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "server 1 did not open its HTTP port"
                time.sleep(0.1)
        assert answer.status_code == 503, answer.text
        body = answer.json()
        assert body["error_code"] == SERVER_NOT_READY and "server 1 is starting" in body["message"], body
        health = httpx.get(f"{base}/healthcheck", timeout=2.0)
        assert (
            health.status_code == 503 and health.json()["details"]["metadataCaughtUp"]["isHealthy"] is False
        )
        assert httpx.get(f"{base}/v1/tables", timeout=2.0).status_code == 503
        with hotstate.Client([f"127.0.0.1:{server1.http_port}"], timeout_s=1.0) as client:
            with pytest.raises(Unavailable) as error:
                client.query(select["sql"])
            assert error.value.error_code == SERVER_NOT_READY

        async def while_not_ready() -> None:
            pool = PeerPool(0, cluster.cluster_id, cluster.secret, MESSAGES, backoff_max=0.2)
            pool.update({1: ("127.0.0.1", server1.rpc_port)})
            try:
                reply = await _ask_metadata(pool, 1, "restart")
                assert reply.error is ReplicaError.NOT_READY and "server 1 is starting" in reply.message
            finally:
                await pool.close()

        running.run(while_not_ready())
    finally:
        running.kill(2, signal.SIGCONT)
        running.kill(3, signal.SIGCONT)

    async def after_catch_up() -> None:
        # A writer that knows only server 1 retries NOT_READY until the server has caught up, instead of
        # failing with "no table".
        async with _writer(running, "restart", [("127.0.0.1", server1.rpc_port)]) as writer:
            await writer.upsert(_rows(1, 10), deadline_s=60.0)

    running.run(after_catch_up())
    # The client asks the starting server again (rounds) until it answers.
    with hotstate.Client([f"127.0.0.1:{server1.http_port}"], timeout_s=60.0) as client:
        result = client.query(select["sql"])
    assert result.dicts() == [{"user": "k1", "value": 1}]
    assert httpx.get(f"{base}/healthcheck", timeout=2.0).status_code == 200

"""Partition replicas between real server processes: kill -9 under acks=all writes, full restarts,
followers rebuilt from a store snapshot."""

from __future__ import annotations

import asyncio
import re
import signal
import time
from collections import Counter

from hotstate.client.writer import TableWriter, WriteError
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError
from hotstate.protocol.rows import decode_row
from hotstate.protocol.wire import MESSAGES
from hotstate.replica.core import ReplicaConfig
from hotstate.replica.messages import (
    LagInfoRequest,
    LagInfoResponse,
    ReadPartitionRequest,
    ReadPartitionResponse,
    ReplicaError,
    TableMetadataRequest,
    TableMetadataResponse,
)
from hotstate.rpc import PeerPool

from .conftest import RunningCluster, StartCluster, present

KEY = (KeyColumn("user", KeyType.STRING),)


class Probe:
    """Asks servers directly, by node id (the local cluster numbers them 1..N)."""

    def __init__(self, running: RunningCluster) -> None:
        cluster = running.cluster
        self.pool = PeerPool(0, cluster.cluster_id, cluster.secret, MESSAGES, backoff_max=0.2)
        self.pool.update({s.node_id: ("127.0.0.1", s.rpc_port) for s in cluster.servers})

    async def close(self) -> None:
        await self.pool.close()

    async def lag(self, node: int) -> LagInfoResponse:
        reply = await self.pool.request(node, LagInfoRequest(), 2.0)
        assert isinstance(reply, LagInfoResponse)
        return reply

    async def metadata(self, node: int, table: str) -> TableMetadataResponse:
        """The table's metadata in `node`'s image, once that image has the table (a create commits at the
        controller first; each server's image follows a moment later)."""
        end = time.monotonic() + 10.0
        while True:
            reply = await self.pool.request(node, TableMetadataRequest(table), 2.0)
            assert isinstance(reply, TableMetadataResponse)
            if reply.error is not ReplicaError.UNKNOWN_TABLE or time.monotonic() > end:
                return reply
            await asyncio.sleep(0.05)

    async def rows(self, node: int, table: str, partition: int) -> tuple[int, dict[bytes, dict[str, object]]]:
        out: dict[bytes, dict[str, object]] = {}
        after = None
        position = 0
        while True:
            reply = await self.pool.request(node, ReadPartitionRequest(table, partition, after, 5000), 5.0)
            assert isinstance(reply, ReadPartitionResponse) and reply.error is ReplicaError.NONE, reply
            position = reply.position
            for key, row in reply.items:
                out[key] = decode_row(row)
            if len(reply.items) < 5000:
                return position, out
            after = reply.items[-1][0]

    async def wait_converged(self, nodes: list[int], table: str, timeout_s: float = 30.0) -> None:
        """Every replica of every partition on `nodes` at the same position as the partition's active."""
        end = time.monotonic() + timeout_s
        while True:
            positions: dict[int, set[int]] = {}
            reported: Counter[int] = Counter()
            try:
                for node in nodes:
                    for info in (await self.lag(node)).replicas:
                        if info.table == table:
                            # Its store at its log's end: a store applies committed records in steps (a
                            # moment may find every replica at one position short of the end).
                            positions.setdefault(info.partition, set()).update(
                                (info.current_offset_position, info.end_offset_position)
                            )
                            reported[info.partition] += 1
                meta = await self.metadata(nodes[0], table)
                # Every replica must report (a restarted server opens its replicas a moment later), and all
                # of a partition's replicas must stand at one position.
                complete = all(
                    reported[p.partition] == len([r for r in p.replicas if r in nodes])
                    and len(positions.get(p.partition, ())) == 1
                    for p in meta.partitions
                )
                if complete and meta.partitions:
                    return
            except Exception:
                pass
            if time.monotonic() > end:
                raise AssertionError(f"replicas did not converge: {positions}")
            await asyncio.sleep(0.1)


async def _create(running: RunningCluster, name: str, partitions: int, standbys: int) -> None:
    async with running.cluster.admin(request_timeout_s=2.0) as admin:
        reply = await admin.create_table(
            name, partitions=partitions, standby_replicas=standbys, key_columns=KEY
        )
        assert reply.error is ControllerError.NONE, reply


def _writer(running: RunningCluster, table: str) -> TableWriter:
    cluster = running.cluster
    return TableWriter(cluster.addresses(), table, cluster_id=cluster.cluster_id, secret=cluster.secret)


def test_kill_9_an_active_under_acks_all_writes_loses_no_acked_write(start_cluster: StartCluster) -> None:
    running = start_cluster(3)

    async def scenario() -> None:
        await _create(running, "clicks", partitions=6, standbys=1)
        probe = Probe(running)
        meta = await probe.metadata(1, "clicks")
        busiest = present(Counter(p.active for p in meta.partitions).most_common(1)[0][0])
        acked: dict[str, int] = {}
        attempted: dict[str, set[int]] = {}
        stop = asyncio.Event()
        failures: list[Exception] = []
        stalls: list[float] = []

        async def write_loop(worker: int) -> None:
            writer = _writer(running, "clicks")
            value = 0
            try:
                while not stop.is_set():
                    value += 1
                    rows = [{"user": f"w{worker}-k{i}", "clicks": value} for i in range(40)]
                    for row in rows:
                        attempted.setdefault(str(row["user"]), set()).add(value)
                    started = time.monotonic()
                    try:
                        await writer.upsert(rows, deadline_s=20.0)
                    except WriteError as error:
                        failures.append(error)
                        continue
                    stalls.append(time.monotonic() - started)
                    for row in rows:
                        acked[str(row["user"])] = value
            finally:
                await writer.close()

        async def writes(more: int, what: str) -> None:
            """Until `more` further writes were acknowledged (or one failed)."""
            target = len(stalls) + more
            for _ in range(400):
                if len(stalls) >= target or failures:
                    return
                await asyncio.sleep(0.05)
            raise AssertionError(f"{len(stalls)} writes, {target} expected {what}")

        writers = [asyncio.create_task(write_loop(w)) for w in range(3)]
        await writes(30, "before the kill")
        running.kill(busiest)
        killed_at = time.monotonic()
        # The partitions the killed server led get new actives, at higher leader epochs.
        survivor = next(s.node_id for s in running.cluster.servers if s.node_id != busiest)
        for _ in range(200):
            after = await probe.metadata(survivor, "clicks")
            moved = [
                now.active not in (None, busiest) and now.leader_epoch > before.leader_epoch
                for before, now in zip(meta.partitions, after.partitions, strict=True)
                if before.active == busiest
            ]
            if all(moved):
                break
            await asyncio.sleep(0.05)
        assert all(moved), after
        await writes(30, "after the actives moved")
        running.restart(busiest)
        await writes(30, "while the killed server restarts")
        stop.set()
        await asyncio.gather(*writers)
        assert not failures, failures[:3]
        longest = max(stalls)
        print(f"\nlongest acks=all write during the kill: {longest:.2f} s (killed at +{killed_at:.0f})")
        assert longest < 10.0

        nodes = [s.node_id for s in running.cluster.servers]
        await probe.wait_converged(nodes, "clicks")
        final = await probe.metadata(survivor, "clicks")
        for part in final.partitions:
            stores = {}
            for node in part.replicas:
                stores[node] = await probe.rows(node, "clicks", part.partition)
            (position, rows), *others = stores.values()
            for other_position, other_rows in others:
                assert (other_position, other_rows) == (position, rows), (
                    f"replicas of {part.partition} differ"
                )
        # Every acked key holds its last acked value, or a later one that was sent but not acked.
        seen: dict[str, int] = {}
        for part in final.partitions:
            _, rows = await probe.rows(present(part.active), "clicks", part.partition)
            for row in rows.values():
                clicks = row["clicks"]
                assert isinstance(clicks, int), row
                seen[str(row["user"])] = clicks
        for user, value in acked.items():
            assert user in seen, f"acked key {user} is gone"
            assert seen[user] >= value and seen[user] in attempted[user], (user, value, seen[user])
        logs = running.logs()
        print(
            f"acked keys checked: {len(acked)}; truncations logged: {len(re.findall('truncated to', logs))}"
        )
        await probe.close()

    running.run(scenario())


def test_a_full_restart_resumes_every_store_at_its_position(start_cluster: StartCluster) -> None:
    running = start_cluster(3)

    async def before() -> dict[tuple[int, int], int]:
        await _create(running, "clicks", partitions=4, standbys=2)
        writer = _writer(running, "clicks")
        for round_ in range(5):
            await writer.upsert([{"user": f"u{i}", "clicks": round_} for i in range(2000)])
        await writer.close()
        probe = Probe(running)
        await probe.wait_converged([1, 2, 3], "clicks")
        positions = {}
        for node in (1, 2, 3):
            for info in (await probe.lag(node)).replicas:
                positions[(node, info.partition)] = info.current_offset_position
        await probe.close()
        return positions

    positions = running.run(before())
    assert sum(positions.values()) == 3 * 10_000
    for server in running.cluster.servers:
        running.kill(server.node_id, signal.SIGTERM)
    for server in running.cluster.servers:
        running.restart(server.node_id)
    running.status(30.0)

    async def after() -> None:
        probe = Probe(running)
        await probe.wait_converged([1, 2, 3], "clicks")
        for node in (1, 2, 3):
            for info in (await probe.lag(node)).replicas:
                assert info.current_offset_position == positions[(node, info.partition)]
            _, rows = await probe.rows(node, "clicks", 0)
            assert rows and all(row["clicks"] == 4 for row in rows.values())
        await probe.close()

    running.run(after())
    # No replay from zero: each replica reopened its store at the position it had reached.
    for server in running.cluster.servers:
        log = (server.directory(running.cluster.root) / "server.log").read_text()
        opened = [int(m) for m in re.findall(r"replica clicks/\d+ opened: store at (\d+)", log)]
        assert len(opened) == 8  # 4 partitions on each server, at creation and after the restart
        assert sorted(opened[4:]) == sorted(p for (n, _), p in positions.items() if n == server.node_id)


def test_a_follower_behind_the_log_start_is_rebuilt_from_a_snapshot(start_cluster: StartCluster) -> None:
    running = start_cluster(3, replica=ReplicaConfig(log_retention_records=200))

    async def scenario() -> None:
        await _create(running, "clicks", partitions=2, standbys=2)
        probe = Probe(running)
        writer = _writer(running, "clicks")
        await writer.upsert([{"user": f"u{i}", "clicks": 0} for i in range(500)])
        meta = await probe.metadata(1, "clicks")
        behind = next(n for n in (1, 2, 3) if n not in {p.active for p in meta.partitions})
        running.kill(behind, signal.SIGSTOP)
        try:
            for round_ in range(1, 6):
                await writer.upsert([{"user": f"u{i}", "clicks": round_} for i in range(1000)])
        finally:
            running.kill(behind, signal.SIGCONT)
        await writer.close()
        await probe.wait_converged([1, 2, 3], "clicks", timeout_s=40)
        for part in meta.partitions:
            active = await probe.rows(part.active or 1, "clicks", part.partition)
            mine = await probe.rows(behind, "clicks", part.partition)
            assert mine == active
            assert all(row["clicks"] == 5 for row in mine[1].values())
        await probe.close()

    running.run(scenario())
    log = (running.cluster.servers[0].directory(running.cluster.root) / "server.log").read_text()
    logs = running.logs() + log
    assert "rebuilt from the active's snapshot" in "".join(
        (s.directory(running.cluster.root) / "server.log").read_text() for s in running.cluster.servers
    ), logs[-3000:]


def test_produce_answers_each_mistake_with_its_typed_error(start_cluster: StartCluster) -> None:
    from hotstate.protocol.keys import encode_key, partition_for
    from hotstate.protocol.rows import encode_row
    from hotstate.replica.messages import (
        MetadataForKeyRequest,
        MetadataForKeyResponse,
        ProduceRequest,
        ProduceResponse,
    )
    from hotstate.server.replicas import INGEST_STEP_ROWS

    running = start_cluster(3, replica=ReplicaConfig(min_insync_replicas=2), produce_max_bytes=64 * 1024)

    async def scenario() -> None:
        await _create(running, "clicks", partitions=3, standbys=1)
        probe = Probe(running)
        meta = await probe.metadata(1, "clicks")

        def rows_for(partition: int, count: int = 3) -> list[bytes]:
            out: list[bytes] = []
            i = 0
            while len(out) < count:
                if partition_for(encode_key((f"u{i}",)), 3) == partition:
                    out.append(encode_row({"user": f"u{i}", "clicks": i}))
                i += 1
            return out

        async def produce(node: int | None, request: ProduceRequest) -> ProduceResponse:
            reply = await probe.pool.request(present(node), request, 10.0)
            assert isinstance(reply, ProduceResponse), reply
            return reply

        part = meta.partitions[0]
        other = next(n for n in (1, 2, 3) if n != part.active)
        ok = await produce(part.active, ProduceRequest("clicks", 0, part.leader_epoch, tuple(rows_for(0))))
        assert ok.error is ReplicaError.NONE and ok.end_offset - ok.base_offset == 3
        reply = await produce(part.active, ProduceRequest("nope", 0, 0, tuple(rows_for(0))))
        assert reply.error is ReplicaError.UNKNOWN_TABLE and "nope" in reply.message
        reply = await produce(other, ProduceRequest("clicks", 0, part.leader_epoch, tuple(rows_for(0))))
        assert reply.error is ReplicaError.NOT_LEADER and reply.active == part.active
        # Bad rows: nothing of the request is written, and the error names the row and the column.
        good = rows_for(0)
        for bad, expected in (
            (encode_row({"clicks": 1}), "'user'"),
            (encode_row({"user": 5, "clicks": 1}), "'user'"),
            (rows_for(1, 1)[0], "partition 1"),
            (b"\xc1not msgpack", "row 2"),
        ):
            request = ProduceRequest("clicks", 0, part.leader_epoch, (*good[:2], bad))
            reply = await produce(part.active, request)
            assert reply.error is ReplicaError.INVALID_ROW, reply
            assert "row 2" in reply.message and expected in reply.message, reply.message
        # A long request is checked a step of INGEST_STEP_ROWS rows at a time: a bad row in a later step still
        # refuses all of it, named by its index in the request.
        long = rows_for(0, 2 * INGEST_STEP_ROWS + 50)
        for index, bad in (
            (2 * INGEST_STEP_ROWS + 10, b"\xc1not msgpack"),
            (INGEST_STEP_ROWS, rows_for(1, 1)[0]),
        ):
            request = ProduceRequest("clicks", 0, part.leader_epoch, (*long[:index], bad, *long[index + 1 :]))
            reply = await produce(part.active, request)
            assert reply.error is ReplicaError.INVALID_ROW and f"row {index} " in reply.message, reply
        huge = tuple(encode_row({"user": f"u{i}", "pad": "x" * 1000}) for i in range(100))
        reply = await produce(part.active, ProduceRequest("clicks", 0, part.leader_epoch, huge))
        assert reply.error is ReplicaError.TOO_LARGE and "produce.max.bytes" in reply.message
        lag = {(i.partition, i.state): i for i in (await probe.lag(present(part.active))).replicas}
        assert lag[(0, "active")].end_offset_position == ok.end_offset  # none of the bad requests wrote
        # Sent one after the other on one connection, a short Produce does not overtake a long one being
        # checked in steps: appended in the order they came.
        sent = [
            probe.pool.request_soon(
                present(part.active), ProduceRequest("clicks", 0, part.leader_epoch, rows), 10.0
            )
            for rows in (tuple(long), tuple(good))
        ]
        written, after = await asyncio.gather(*sent)
        assert isinstance(written, ProduceResponse) and isinstance(after, ProduceResponse)
        assert written.error is ReplicaError.NONE and written.end_offset - written.base_offset == len(long)
        assert after.error is ReplicaError.NONE and after.base_offset == written.end_offset, (written, after)

        # KIP-535's metadata for a key, from any server.
        key_row = encode_row({"user": "u42"})
        answer = await probe.pool.request(other, MetadataForKeyRequest("clicks", key_row), 2.0)
        assert isinstance(answer, MetadataForKeyResponse) and answer.error is ReplicaError.NONE
        expected_partition = partition_for(encode_key(("u42",)), 3)
        assert answer.partition == expected_partition
        assert answer.active == meta.partitions[expected_partition].active
        assert set(answer.standbys) == set(meta.partitions[expected_partition].replicas) - {answer.active}

        # A controlled shutdown moves the active away: the old epoch is fenced at the new active.
        running.kill(present(part.active), signal.SIGTERM)
        for _ in range(100):
            now = (await probe.metadata(other, "clicks")).partitions[0]
            if now.active not in (None, part.active):
                break
            await asyncio.sleep(0.1)
        assert now.leader_epoch > part.leader_epoch
        for _ in range(50):
            reply = await produce(now.active, ProduceRequest("clicks", 0, part.leader_epoch, tuple(good)))
            if reply.error is not ReplicaError.NOT_LEADER:  # the new active may not have the image yet
                break
            await asyncio.sleep(0.1)
        assert reply.error is ReplicaError.FENCED_EPOCH, reply
        # One replica left in the ISR, below min.insync.replicas=2: nothing is written.
        reply = await produce(now.active, ProduceRequest("clicks", 0, now.leader_epoch, tuple(good)))
        assert reply.error is ReplicaError.NOT_ENOUGH_REPLICAS, reply
        await probe.close()

    running.run(scenario())


def test_sigstop_of_the_metadata_leader_takes_no_partition_offline(start_cluster: StartCluster) -> None:
    """Found under load: heartbeats forwarded to the stopped leader hung for 5 s, so the next controller
    fenced every server (itself too) and every partition went offline for seconds."""
    running = start_cluster(3)

    async def scenario() -> None:
        await _create(running, "clicks", partitions=2, standbys=2)
        probe = Probe(running)
        async with running.cluster.admin(request_timeout_s=2.0) as admin:
            leader = present((await admin.describe()).leader_id)
        writer = _writer(running, "clicks")
        await writer.upsert([{"user": f"u{i}", "clicks": 0} for i in range(200)])
        running.kill(leader, signal.SIGSTOP)
        stopped_at = time.monotonic()
        offline: list[int] = []

        async def watch() -> None:
            others = [n for n in (1, 2, 3) if n != leader]
            while True:
                for node in others:
                    try:
                        meta = await probe.metadata(node, "clicks")
                    except Exception:
                        continue
                    offline.extend(p.partition for p in meta.partitions if p.active is None)
                await asyncio.sleep(0.2)

        watcher = asyncio.create_task(watch())
        try:
            for round_ in range(1, 4):
                await writer.upsert([{"user": f"u{i}", "clicks": round_} for i in range(200)], deadline_s=30)
            took = time.monotonic() - stopped_at
        finally:
            watcher.cancel()
            running.kill(leader, signal.SIGCONT)
            await writer.close()
            await probe.close()
        print(f"\nwrites resumed {took:.1f} s after SIGSTOP of the metadata leader")
        assert not offline, f"partitions offline: {sorted(set(offline))}"
        assert took < 10.0

    running.run(scenario())


def test_a_produce_per_server_carries_its_partitions_and_answers_each_on_its_own(
    start_cluster: StartCluster,
) -> None:
    """The writer sends one message per server for all the partitions it leads (ProducePartitionsRequest),
    and each part of one is checked, written and answered as its own ProduceRequest would be."""
    from hotstate.protocol.keys import encode_key, partition_for
    from hotstate.protocol.rows import encode_row
    from hotstate.replica.messages import (
        PartitionRows,
        ProducePartitionsRequest,
        ProducePartitionsResponse,
    )

    running = start_cluster(3, produce_max_bytes=64 * 1024)

    async def scenario() -> None:
        await _create(running, "clicks", partitions=6, standbys=1)
        probe = Probe(running)
        meta = await probe.metadata(1, "clicks")
        async with _writer(running, "clicks") as writer:
            await writer.metadata()
            rows: list[dict[str, str | int]] = [{"user": f"u{i}", "clicks": i} for i in range(600)]
            result = await writer.upsert(rows)
        actives = {present(p.active) for p in meta.partitions}
        assert result.rows == 600 and result.retries == 0
        assert writer.stats.produce_requests == 6  # one part per partition...
        assert writer.stats.produce_messages == len(actives)  # ...in one message per server
        await probe.wait_converged([1, 2, 3], "clicks")
        for part in meta.partitions:
            for node in part.replicas:
                _, stored = await probe.rows(node, "clicks", part.partition)
                expected = {
                    r["user"] for r in rows if partition_for(encode_key((r["user"],)), 6) == part.partition
                }
                assert {row["user"] for row in stored.values()} == expected

        # One server, several parts, each with its own fate.
        def rows_for(partition: int, count: int = 3) -> tuple[bytes, ...]:
            out: list[bytes] = []
            i = 0
            while len(out) < count:
                if partition_for(encode_key((f"v{i}",)), 6) == partition:
                    out.append(encode_row({"user": f"v{i}", "clicks": i}))
                i += 1
            return tuple(out)

        node = next(iter(actives))
        led = [p for p in meta.partitions if p.active == node]
        other = next(p for p in meta.partitions if p.active != node)
        mine = led[0]
        ends_before = {
            i.partition: i.end_offset_position
            for i in (await probe.lag(node)).replicas
            if i.state == "active"
        }
        parts = (
            PartitionRows(mine.partition, mine.leader_epoch, rows_for(mine.partition)),  # written
            PartitionRows(other.partition, other.leader_epoch, rows_for(other.partition)),  # not the active
            PartitionRows(mine.partition, mine.leader_epoch - 1, rows_for(mine.partition)),  # fenced
            PartitionRows(mine.partition, mine.leader_epoch + 1, rows_for(mine.partition)),  # unknown epoch
            PartitionRows(mine.partition, mine.leader_epoch, (*rows_for(mine.partition, 2), b"\xc1")),
            PartitionRows(
                mine.partition, mine.leader_epoch, rows_for(mine.partition + 1 if mine.partition < 5 else 0)
            ),
            PartitionRows(
                mine.partition,
                mine.leader_epoch,
                tuple(encode_row({"user": "big", "pad": "x" * 70_000}) for _ in range(1)),
            ),
            PartitionRows(6, mine.leader_epoch, rows_for(mine.partition)),  # no such partition
            PartitionRows(mine.partition, mine.leader_epoch, ()),  # no rows
        )
        reply = await probe.pool.request(node, ProducePartitionsRequest("clicks", parts), 10.0)
        assert isinstance(reply, ProducePartitionsResponse) and len(reply.answers) == len(parts)
        ok, not_leader, fenced, unknown, bad_row, wrong_partition, too_large, no_partition, empty = (
            reply.answers
        )
        assert ok.error is ReplicaError.NONE and ok.end_offset - ok.base_offset == 3
        assert ok.base_offset == ends_before[mine.partition]
        assert not_leader.error is ReplicaError.NOT_LEADER and not_leader.active == other.active
        assert not_leader.leader_epoch == other.leader_epoch
        assert fenced.error is ReplicaError.FENCED_EPOCH
        assert unknown.error is ReplicaError.UNKNOWN_EPOCH
        assert bad_row.error is ReplicaError.INVALID_ROW and "row 2" in bad_row.message
        assert wrong_partition.error is ReplicaError.INVALID_ROW and "partition" in wrong_partition.message
        assert too_large.error is ReplicaError.TOO_LARGE and "produce.max.bytes" in too_large.message
        assert no_partition.error is ReplicaError.INVALID_REQUEST
        assert empty.error is ReplicaError.INVALID_REQUEST
        ends_after = {
            i.partition: i.end_offset_position
            for i in (await probe.lag(node)).replicas
            if i.state == "active"
        }
        assert ends_after[mine.partition] == ok.end_offset  # only the good part was written
        assert all(ends_after[p] == ends_before[p] for p in ends_before if p != mine.partition)
        # A table this server does not know: every part says so.
        reply = await probe.pool.request(node, ProducePartitionsRequest("nope", parts[:2]), 10.0)
        assert isinstance(reply, ProducePartitionsResponse), reply
        assert [a.error for a in reply.answers] == [ReplicaError.UNKNOWN_TABLE] * 2
        await probe.close()

    running.run(scenario())

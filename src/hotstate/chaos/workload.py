"""The chaos workload: writers, readers and a metadata client against a real cluster, recording what they saw.

- Writers: each owns some keys and upserts increasing values to them (one at a time per writer, acks=all,
  the only kind of write there is), recording every attempt as acknowledged or unknown. After some
  acknowledged writes it reads the key back through a random server with the write's consistency token.
- Readers: one per server, each querying only its server (so every server's routing is exercised):
  actives only (`standby_reads=False`), any replica, or with the consistency token of its previous answer
  (a chain whose reads must be monotonic).
- A metadata client creates, deletes and lists small tables (the history tests/cluster/test_linearizable.py
  checks), recorded with hotstate.sim.history.
- After the nemesis healed everything: final reads of every key through every server (actives, max_lag 0),
  then the replicas are left to converge, the servers stopped, and every store read from disk.

Everything here runs on one event loop; the caller puts it in the client network namespace.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import hotstate
from hotstate.chaos.checker import Read, StoreState, Write
from hotstate.cli.local_cluster import LocalCluster
from hotstate.client.admin import AdminClient, ClusterUnavailableError, OutcomeUnknownError
from hotstate.client.writer import WriteError
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import ControllerError
from hotstate.replica.store import Store
from hotstate.rpc import RpcError
from hotstate.sim.history import HistoryRecorder
from hotstate.sim.linearizability import TableInput, TableOutput, TableSetModel, check

TABLE = "chaos"
KEY = (KeyColumn("k", KeyType.STRING),)
META_NAMES = ("m-a", "m-b")


async def table_operation(admin: AdminClient, op: TableInput, names: tuple[str, ...]) -> TableOutput | None:
    """One metadata operation of a linearizability history (create, delete or list tables), as
    TableSetModel's output; None when its outcome is unknown (a lost answer, a timeout, no controller
    before the deadline). A list answers only the tables among `names`."""
    try:
        if op[0] == "create":
            created = await admin.create_table(
                op[1], partitions=1, standby_replicas=0, key_columns=KEY, deadline_s=3.0
            )
            return {ControllerError.NONE: "ok", ControllerError.TABLE_EXISTS: "exists"}.get(created.error)
        if op[0] == "delete":
            deleted = await admin.delete_table(op[1], deadline_s=3.0)
            return {ControllerError.NONE: "ok", ControllerError.UNKNOWN_TABLE: "missing"}.get(deleted.error)
        listed = await admin.list_tables(deadline_s=3.0)
    except (OutcomeUnknownError, ClusterUnavailableError):
        return None
    if listed.error is not ControllerError.NONE:
        return None
    return frozenset(t for t in listed.tables if t in names)


@dataclass(frozen=True, slots=True)
class WorkloadConfig:
    partitions: int = 3
    standby_replicas: int = 1
    writers: int = 3
    keys_per_writer: int = 2
    write_deadline_s: float = 4.0
    read_timeout_ms: int = 2000
    pause_s: tuple[float, float] = (0.02, 0.08)  # between one client's requests
    read_back_share: float = 0.3  # of acknowledged writes, read back with their token
    metadata_pause_s: tuple[float, float] = (0.3, 0.8)


@dataclass
class Workload:
    cluster: LocalCluster
    config: WorkloadConfig
    seed: int
    writes: list[Write] = field(default_factory=list)
    reads: list[Read] = field(default_factory=list)
    metadata: HistoryRecorder[TableInput, TableOutput] = field(default_factory=HistoryRecorder)

    def keys(self) -> list[str]:
        return [f"k{w}-{j}" for w in range(self.config.writers) for j in range(self.config.keys_per_writer)]

    def _http(self, node: int) -> str:
        server = next(s for s in self.cluster.servers if s.node_id == node)
        return f"{server.host}:{server.http_port}"

    async def create_table(self) -> None:
        async with self.cluster.admin(request_timeout_s=2.0) as admin:
            reply = await admin.create_table(
                TABLE,
                partitions=self.config.partitions,
                standby_replicas=self.config.standby_replicas,
                key_columns=KEY,
                deadline_s=20.0,
            )
        if reply.error not in (ControllerError.NONE, ControllerError.TABLE_EXISTS):
            raise RuntimeError(f"cannot create table {TABLE}: {reply}")

    async def run(self, stop: asyncio.Event) -> None:
        clients = [self._writer(w, stop) for w in range(self.config.writers)]
        clients += [self._reader(s.node_id, stop) for s in self.cluster.servers]
        clients.append(self._metadata_client(stop))
        await asyncio.gather(*clients)

    # ------------------------------------------------------------------ clients
    async def _query(
        self, client: hotstate.AsyncClient, key: str, **options: Any
    ) -> tuple[bool, int | None, str, str]:
        """(ok, value, error, token) of one point lookup."""
        try:
            answer = await client.query(
                f"SELECT * FROM {TABLE} WHERE k = '{key}'", timeout_ms=self.config.read_timeout_ms, **options
            )
        except (hotstate.QueryFailed, hotstate.ClusterUnreachable) as error:
            return False, None, f"{type(error).__name__}: {str(error)[:200]}", ""
        rows = answer.dicts()
        return True, (int(rows[0]["v"]) if rows else None), "", answer.consistency_token

    async def _writer(self, index: int, stop: asyncio.Event) -> None:
        rng = random.Random(f"{self.seed}-writer-{index}")
        keys = [f"k{index}-{j}" for j in range(self.config.keys_per_writer)]
        values = dict.fromkeys(keys, 0)
        servers = [s.node_id for s in self.cluster.servers]
        async with self.cluster.writer(TABLE, request_timeout_s=2.0) as writer:
            readers = {
                n: hotstate.AsyncClient(self._http(n), timeout_s=3.0, connect_timeout_s=1.0) for n in servers
            }
            try:
                while not stop.is_set():
                    key = rng.choice(keys)
                    values[key] += 1
                    value = values[key]
                    start = time.monotonic()
                    token = ""
                    try:
                        result = await writer.upsert(
                            [{"k": key, "v": value}], deadline_s=self.config.write_deadline_s
                        )
                        acked, token = True, result.consistency_token
                    except (TimeoutError, WriteError, RpcError, OSError):
                        acked = False
                    self.writes.append(Write(index, key, value, start, time.monotonic(), acked))
                    if acked and rng.random() < self.config.read_back_share:
                        node = rng.choice(servers)
                        start = time.monotonic()
                        ok, got, error, _ = await self._query(readers[node], key, consistency_token=token)
                        self.reads.append(
                            Read(
                                f"writer-{index}",
                                node,
                                key,
                                "ryw",
                                start,
                                time.monotonic(),
                                ok,
                                got,
                                error,
                                floor=value,
                            )
                        )
                    await asyncio.sleep(rng.uniform(*self.config.pause_s))
            finally:
                for client in readers.values():
                    await client.close()

    async def _reader(self, node: int, stop: asyncio.Event) -> None:
        rng = random.Random(f"{self.seed}-reader-{node}")
        name = f"reader-{node}"
        keys = self.keys()
        token = ""
        async with hotstate.AsyncClient(self._http(node), timeout_s=3.0, connect_timeout_s=1.0) as client:
            while not stop.is_set():
                key = rng.choice(keys)
                mode = rng.choice(("standby", "active", "token"))
                options: dict[str, Any] = {"standby_reads": mode != "active"}
                if mode == "token" and token:
                    options["consistency_token"] = token
                start = time.monotonic()
                ok, value, error, answered = await self._query(client, key, **options)
                chain = name if mode == "token" else None
                self.reads.append(
                    Read(name, node, key, mode, start, time.monotonic(), ok, value, error, chain)
                )
                if ok and mode == "token":
                    token = answered
                await asyncio.sleep(rng.uniform(*self.config.pause_s))

    async def _metadata_client(self, stop: asyncio.Event) -> None:
        rng = random.Random(f"{self.seed}-metadata")
        async with AdminClient(
            self.cluster.addresses(),
            cluster_id=self.cluster.cluster_id,
            secret=self.cluster.secret,
            request_timeout_s=1.0,
        ) as admin:
            while not stop.is_set():
                roll, name = rng.random(), rng.choice(META_NAMES)
                op: TableInput = (
                    ("create", name) if roll < 0.4 else ("delete", name) if roll < 0.75 else ("list",)
                )
                token = self.metadata.invoke(0, op)
                outcome = await table_operation(admin, op, META_NAMES)
                if outcome is None:
                    self.metadata.timeout(token)
                else:
                    self.metadata.ok(token, outcome)
                await asyncio.sleep(rng.uniform(*self.config.metadata_pause_s))

    def check_metadata(self, timeout_s: float = 60.0) -> tuple[bool | None, str, int]:
        """(linearizable: True, False or None when the search ran out of time; the checker's explanation;
        operations with a definite answer)."""
        history = self.metadata.operations()
        result = check(TableSetModel(), history, timeout_s=timeout_s)
        return result.ok, str(result.explanation or ""), sum(not op.unknown for op in history)

    # ------------------------------------------------------------------ after healing
    async def final_reads(self, deadline_s: float = 45.0) -> None:
        """Every key through every server, from an active whose store holds everything committed; a 503 is
        asked again until `deadline_s` (the cluster is settling after the last fault)."""
        end = time.monotonic() + deadline_s

        async def one(node: int, key: str, client: hotstate.AsyncClient) -> None:
            while True:
                start = time.monotonic()
                ok, value, error, _ = await self._query(client, key, standby_reads=False, max_lag=0)
                if ok or time.monotonic() > end:
                    self.reads.append(
                        Read(f"final-{node}", node, key, "final", start, time.monotonic(), ok, value, error)
                    )
                    return
                await asyncio.sleep(0.2)

        clients = {
            s.node_id: hotstate.AsyncClient(self._http(s.node_id), timeout_s=5.0)
            for s in self.cluster.servers
        }
        try:
            await asyncio.gather(*(one(n, k, c) for n, c in clients.items() for k in self.keys()))
        finally:
            for client in clients.values():
                await client.close()

    async def converge(self, deadline_s: float = 30.0) -> bool:
        """Until every server's lag reports give each partition's replicas one position (True), or until
        `deadline_s` (False)."""
        end = time.monotonic() + deadline_s
        clients = [hotstate.AsyncClient(self._http(s.node_id), timeout_s=3.0) for s in self.cluster.servers]
        try:
            while time.monotonic() < end:
                positions: dict[tuple[str, str], set[int]] = {}
                seen = 0
                for client in clients:
                    try:
                        body = await client.lags()
                    except (hotstate.QueryFailed, hotstate.ClusterUnreachable):
                        continue
                    seen += 1
                    for tables in body["lags"].values():
                        for table, partitions in tables.items():
                            for partition, lag in partitions.items():
                                positions.setdefault((table, partition), set()).add(
                                    lag["current_offset_position"]
                                )
                if seen == len(clients) and positions and all(len(p) == 1 for p in positions.values()):
                    await asyncio.sleep(1.0)  # reports are sent every 500 ms: one more round settles them
                    return True
                await asyncio.sleep(0.5)
            return False
        finally:
            for client in clients:
                await client.close()


def read_stores(cluster: LocalCluster) -> dict[str, list[StoreState]]:
    """Every replica's store, by partition directory (`<table id>-<partition>`), read from disk: call it
    only when every server has stopped."""
    found: dict[str, list[StoreState]] = {}
    for server in cluster.servers:
        root = server.directory(cluster.root) / "data" / "partitions"
        if not root.is_dir():
            continue
        for directory in sorted(root.iterdir()):
            if not (directory / "store").exists():
                continue
            found.setdefault(directory.name, []).append(_store_state(server.node_id, directory / "store"))
    return found


def _store_state(node: int, path: Path) -> StoreState:
    digest = hashlib.sha256()
    rows = 0
    with Store.open(path) as store:
        for key, value in store.scan():
            digest.update(len(key).to_bytes(4, "big") + key + len(value).to_bytes(4, "big") + value)
            rows += 1
        return StoreState(node, store.position, digest.hexdigest(), rows)

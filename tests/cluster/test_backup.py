"""`hotstate table export` and `import` against real server processes (issue 26 §3): a round trip of every
declared type, a backup taken during writes restoring exactly the rows acknowledged up to its token, and
the bad inputs refused before anything is written. One cluster for the module."""

from __future__ import annotations

import asyncio
import datetime as dt
import decimal
import json
import math
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from hotstate.cli.local_cluster import LocalCluster
from hotstate.cli.main import app
from hotstate.client.backup import MANIFEST, arrow_type
from hotstate.client.query import Client
from hotstate.client.writer import TableWriter
from hotstate.controller.records import KeyColumn, KeyType, ValueColumn
from hotstate.controller.requests import ControllerError
from hotstate.query import tokens

# One worker runs the whole module (make test: --dist loadgroup), so its one cluster is started once.
pytestmark = pytest.mark.xdist_group("backup")

# Every key type, then every value type the docs list (Spark's names, as a Spark writer declares them).
KEYS = (
    KeyColumn("name", KeyType.STRING),
    KeyColumn("n", KeyType.INT),
    KeyColumn("x", KeyType.FLOAT),
    KeyColumn("flag", KeyType.BOOL),
    KeyColumn("blob", KeyType.BYTES),
    KeyColumn("at", KeyType.TIMESTAMP),
)
VALUES = (
    ValueColumn("s", "string"),
    ValueColumn("big", "bigint"),
    ValueColumn("i", "int"),
    ValueColumn("small", "smallint"),
    ValueColumn("tiny", "tinyint"),
    ValueColumn("d", "double"),
    ValueColumn("f", "float"),
    ValueColumn("b", "boolean"),
    ValueColumn("bin", "binary"),
    ValueColumn("ts", "timestamp"),
    ValueColumn("wall", "timestamp_ntz"),
    ValueColumn("day", "date"),
    ValueColumn("money", "decimal(12,3)"),
    ValueColumn("tags", "array<string>"),
    ValueColumn("counts", "map<string,bigint>"),
    ValueColumn("by_id", "map<int,double>"),
    ValueColumn("point", "struct<x:double,y:double,label:string>"),
    ValueColumn("nested", "array<struct<at:timestamp,amounts:array<decimal(10,2)>>>"),
)


def _row(i: int) -> dict[str, Any]:
    at = dt.datetime(2026, 1, 1, tzinfo=dt.UTC) + dt.timedelta(seconds=i, microseconds=i)
    special = [math.nan, math.inf, -math.inf, -0.5, 1e300][i % 5]
    return {
        "name": f"user-{i}é",
        "n": -(2**62) + i,
        "x": i / 7,
        "flag": i % 2 == 0,
        "blob": bytes([i % 256, 0, 255]),
        "at": at,
        "s": None if i % 11 == 0 else f"text {i} ✓",
        "big": 2**63 - 1 - i,
        "i": -(2**31) + i,
        "small": -(2**15) + i,
        "tiny": i % 128,
        "d": special,
        "f": 0.5 * i,
        "b": i % 3 == 0,
        "bin": b"\x00\x01" * (i % 4),
        "ts": at,
        "wall": dt.datetime(1999, 12, 31, 23, 59, 59, i),
        "day": dt.date(1970, 1, 1) + dt.timedelta(days=i * 400 - 20_000),
        "money": decimal.Decimal(f"{i}.125") * (-1 if i % 2 else 1),
        "tags": [f"t{j}" for j in range(i % 4)],
        "counts": {f"k{j}": j * i for j in range(i % 3)},
        "by_id": {j: j / 3 for j in range(i % 3)},
        "point": None if i % 7 == 0 else {"x": 1.5 * i, "y": -2.0, "label": None},
        "nested": [{"at": at, "amounts": [decimal.Decimal("1.25"), None]}] if i % 2 else [],
    }


ROWS = [_row(i) for i in range(300)]


class Cluster:
    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster
        self.env = {"HOTSTATE_CLUSTER_ID": cluster.cluster_id, "HOTSTATE_CLUSTER_SECRET": cluster.secret}
        self.at = ["--dir", str(cluster.root)]

    def cli(self, *args: str) -> Result:
        return CliRunner().invoke(app, ["table", *args, *self.at], env=self.env)

    def create(
        self, name: str, keys: tuple[KeyColumn, ...], values: tuple[ValueColumn, ...], parts: int
    ) -> None:
        async def go() -> None:
            async with self.cluster.admin() as admin:
                made = await admin.create_table(name, partitions=parts, standby_replicas=1, key_columns=keys)
                assert made.error is ControllerError.NONE, made
                declared = await admin.set_value_columns(name, values)
                assert declared.error is ControllerError.NONE, declared

        asyncio.run(go())

    def writer(self, table: str) -> TableWriter:
        return TableWriter(
            self.cluster.addresses(), table, cluster_id=self.cluster.cluster_id, secret=self.cluster.secret
        )

    def rows(self, table: str, token: str | None = None) -> list[dict[str, Any]]:
        """Every row of `table` as JSON shows it, in key order."""
        with Client(self.cluster.http_addresses(), timeout_s=20.0) as client:
            answer = client.query(f"SELECT * FROM `{table}`", consistency_token=token)
        rows = answer.dicts()
        return sorted(
            rows, key=lambda r: json.dumps([r[c.name] for c in KEYS if c.name in r] or r, sort_keys=True)
        )

    def tables(self) -> list[str]:
        with Client(self.cluster.http_addresses(), timeout_s=20.0) as client:
            return sorted(str(t["name"]) for t in client.tables())


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    cluster = LocalCluster.create(tmp_path_factory.mktemp("backup") / "cluster", 3)
    cluster.write_configs()
    cluster.save()
    for server in cluster.servers:
        cluster.start(server)
    try:
        asyncio.run(cluster.wait_ready(30.0, expect=3))
        yield Cluster(cluster)
    finally:
        for server in cluster.servers:
            cluster.signal(server, signal.SIGKILL)


def _ok(result: Result) -> str:
    assert result.exit_code == 0, result.output
    return result.stdout


def _refused(result: Result, *texts: str) -> None:
    assert result.exit_code == 1, result.output
    assert "Traceback" not in result.output and not result.stdout.strip(), result.output
    message = " ".join(result.stderr.split())
    for text in texts:
        assert text in message, message


def test_every_declared_type_round_trips_through_export_and_import(running: Cluster, tmp_path: Path) -> None:
    running.create("all_types", KEYS, VALUES, 4)

    async def write() -> None:
        async with running.writer("all_types") as writer:
            await writer.upsert(ROWS)

    asyncio.run(write())
    before = running.rows("all_types")
    assert len(before) == len(ROWS)

    out = tmp_path / "export"
    # Pages of 7 rows: the cursors carry every key type.
    said = _ok(running.cli("export", "all_types", str(out), "--page-rows", "7"))
    assert "300 rows" in said and "exact at its token" in said, said
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["format_version"] == 1 and manifest["table"] == "all_types"
    assert manifest["partitions"] == 4 and manifest["exact"] is True
    assert [c["name"] for c in manifest["key_columns"]] == [c.name for c in KEYS]
    assert manifest["value_columns"] == [{"name": c.name, "type": c.type} for c in VALUES]
    assert sum(p["rows"] for p in manifest["read"].values()) == 300
    assert set(tokens.decode(manifest["token"], None)) == {(manifest["generation"], p) for p in range(4)}
    assert sorted(f.name for f in out.iterdir()) == [MANIFEST] + [f"part-{p:05d}.parquet" for p in range(4)]

    # The Parquet files hold the declared types, as any Parquet reader sees them.
    import pyarrow.parquet as pq

    schema = pq.read_schema(out / "part-00000.parquet")
    for column in VALUES:
        assert schema.field(column.name).type == arrow_type(column.type), column
    assert str(schema.field("at").type) == "timestamp[us, tz=UTC]"

    said = _ok(running.cli("import", str(out), "--table", "all_types_copy"))
    assert "imported 300 rows into table all_types_copy (created)" in said, said
    after = running.rows("all_types_copy", token=said.rsplit("token ", 1)[1].strip())
    assert after == before
    # Floats read back as floats, exactly (NaN compares as its JSON text).
    with Client(running.cluster.http_addresses()) as client:
        described = {t["name"]: t for t in client.tables()}
    assert described["all_types_copy"]["value_columns"] == described["all_types"]["value_columns"]
    assert described["all_types_copy"]["partitions"] == 4

    # Imported again into the same table: an upsert of the same rows changes nothing.
    again = _ok(running.cli("import", str(out), "--table", "all_types_copy"))
    assert "(existing)" in again
    assert running.rows("all_types_copy") == before


def test_a_backup_during_writes_restores_exactly_the_rows_acknowledged_up_to_its_token(
    running: Cluster, tmp_path: Path
) -> None:
    keys = (KeyColumn("id", KeyType.INT),)
    values = (ValueColumn("version", "bigint"), ValueColumn("note", "string"))
    running.create("live", keys, values, 3)
    # Each write is one row, so its token's position in the row's partition is where the row sits: the
    # acknowledged history, in order, per partition.
    history: list[tuple[dict[str, Any], dict[tuple[int, int], int]]] = []
    stop = threading.Event()
    started = threading.Event()

    async def write() -> None:
        async with running.writer("live") as writer:
            version = 0
            while not stop.is_set():
                version += 1
                row = {"id": version % 40, "version": version, "note": f"v{version}"}
                done = await writer.upsert([row])
                history.append((row, tokens.decode(done.consistency_token, None)))
                if version == 200:
                    started.set()

    thread = threading.Thread(target=lambda: asyncio.run(write()))
    thread.start()
    try:
        assert started.wait(60)
        out = tmp_path / "backup"
        said = _ok(running.cli("export", "live", str(out)))
    finally:
        stop.set()
        thread.join(60)
    manifest = json.loads((out / MANIFEST).read_text())
    assert manifest["exact"] is True, manifest
    at = tokens.decode(manifest["token"], None)
    assert len(history) > 200 and "token " + manifest["token"] in said

    # What the writer had acknowledged up to the token, applied in order.
    expected: dict[int, dict[str, Any]] = {}
    after_token = 0
    for row, written in history:
        [(where, position)] = [(k, v) for k, v in written.items() if k in at]
        if position <= at[where]:
            expected[row["id"]] = row
        else:
            after_token += 1
    assert after_token > 0, "the writes all ended before the export: nothing was tested"

    restored = _ok(running.cli("import", str(out), "--table", "live_restored"))
    got = running.rows("live_restored", token=restored.rsplit("token ", 1)[1].strip())
    assert {r["id"]: r for r in got} == expected


def test_bad_inputs_are_refused_before_anything_is_written(running: Cluster, tmp_path: Path) -> None:
    running.create("small", (KeyColumn("k", KeyType.STRING),), (ValueColumn("v", "bigint"),), 2)

    async def write() -> None:
        async with running.writer("small") as writer:
            await writer.upsert([{"k": f"k{i}", "v": i} for i in range(10)])

    asyncio.run(write())
    good = tmp_path / "good"
    _ok(running.cli("export", "small", str(good)))

    # An export to a directory that exists: refused, the directory untouched, nothing beside it.
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("keep")
    _refused(running.cli("export", "small", str(taken)), "exists", str(taken))
    assert [p.name for p in taken.iterdir()] == ["mine.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good", "taken"]

    # A table whose value columns nobody declared: no types to write, so no export.
    async def undeclared() -> None:
        async with running.cluster.admin() as admin:
            made = await admin.create_table(
                "untyped", partitions=1, standby_replicas=0, key_columns=(KeyColumn("k", KeyType.STRING),)
            )
            assert made.error is ControllerError.NONE, made

    asyncio.run(undeclared())
    _refused(running.cli("export", "untyped", str(tmp_path / "untyped")), "no declared value columns")
    assert not (tmp_path / "untyped").exists()

    # Files of another table: its key columns are not the target's.
    running.create("other_key", (KeyColumn("id", KeyType.INT),), (ValueColumn("v", "bigint"),), 2)
    _refused(
        running.cli("import", str(good), "--table", "other_key"),
        "table 'other_key' has key (id BIGINT)",
        "the export of table 'small' has key (k STRING)",
    )
    assert running.rows("other_key") == []
    # Same key, other value columns.
    running.create("other_values", (KeyColumn("k", KeyType.STRING),), (ValueColumn("v", "string"),), 2)
    _refused(
        running.cli("import", str(good), "--table", "other_values"),
        "table 'other_values' declares value columns (v string)",
        "the export of table 'small' has (v bigint)",
    )
    assert running.rows("other_values") == []

    # A newer format version.
    newer = tmp_path / "newer"
    newer.mkdir()
    for file in good.iterdir():
        (newer / file.name).write_bytes(file.read_bytes())
    manifest = json.loads((newer / MANIFEST).read_text())
    (newer / MANIFEST).write_text(json.dumps(manifest | {"format_version": 2}))
    _refused(running.cli("import", str(newer), "--table", "from_newer"), "format version 2 is newer")

    # A file changed since the export.
    damaged = tmp_path / "damaged"
    damaged.mkdir()
    for file in good.iterdir():
        (damaged / file.name).write_bytes(file.read_bytes())
    part = damaged / "part-00001.parquet"
    part.write_bytes(part.read_bytes()[:-20] + b"\0" * 20)
    _refused(running.cli("import", str(damaged), "--table", "from_damaged"), "part-00001.parquet", "checksum")

    # Not an export at all.
    _refused(running.cli("import", str(taken)), "is not a hotstate export")
    # None of them created a table.
    assert not {"from_newer", "from_damaged"} & set(running.tables())

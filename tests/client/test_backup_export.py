"""The export's reading against a scripted query client: a partition whose position moves between its pages
is read again until one read holds still; one that never does is recorded as not exact, with the range
of positions read; an overwrite during the export fails it and leaves nothing; a failed export leaves no
directory."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import pytest

from hotstate.client.backup import MANIFEST, BackupError, arrow_type, export_table
from hotstate.client.query import Client, PartitionServed, QueryResult
from hotstate.query import tokens

TAG = tokens.cluster_tag("test-cluster")
TABLE_ID = 7


class ScriptedClient:
    """One partition of rows k0..k9 (2 a page); `positions(attempt, page)` is where each page is read."""

    def __init__(self, positions: Any, table_id: int = TABLE_ID) -> None:
        self.positions = positions
        self.table_id = table_id
        self.attempt = -1
        self.asked: list[str | None] = []

    def tables(self) -> list[dict[str, Any]]:
        return [
            {
                "name": "t",
                "partitions": 1,
                "generation": TABLE_ID,
                "standby_replicas": 1,
                "key_columns": [{"name": "k", "type": "STRING"}],
                "value_columns": [{"name": "v", "type": "bigint"}],
            }
        ]

    def query(
        self,
        sql: str,
        *,
        partitions: Sequence[int] | None = None,
        after: str | None = None,
        consistency_token: str | None = None,
        standby_reads: bool = True,
    ) -> QueryResult:
        if partitions is None:  # where the actives are
            return self._answer([], 10, None)
        self.asked.append(consistency_token)
        if after is None:
            self.attempt += 1
        page = 0 if after is None else int(after)
        rows = [[f"k{i}", i] for i in range(page * 2, page * 2 + 2)]
        cursor = None if page == 4 else str(page + 1)
        return self._answer(rows, self.positions(self.attempt, page), cursor)

    def _answer(self, rows: list[list[Any]], position: int, cursor: str | None) -> QueryResult:
        return QueryResult(
            columns=["k", "v"],
            rows=rows,
            partitions=[PartitionServed(0, 1, "active", 0, position)],
            query_id="q",
            took_ms=0.0,
            server="s",
            consistency_token=tokens.encode({(self.table_id, 0): position}, TAG),
            cursor=cursor,
        )


def _export(client: ScriptedClient, out: Path) -> dict[str, Any]:
    export_table(cast(Client, client), "t", out, page_rows=2, attempts=3)
    return cast(dict[str, Any], json.loads((out / MANIFEST).read_text()))


def test_a_partition_written_during_its_pages_is_read_again_until_it_holds_still(tmp_path: Path) -> None:
    client = ScriptedClient(lambda attempt, page: 10 + page if attempt == 0 else 20)
    manifest = _export(client, tmp_path / "out")
    assert manifest["exact"] is True
    assert manifest["read"]["0"] == manifest["read"]["0"] | {"exact": True, "position": 20, "rows": 10}
    assert tokens.decode(manifest["token"], TAG) == {(TABLE_ID, 0): 20}
    # The second read was pinned at least where the first ended.
    assert tokens.decode(cast(str, client.asked[5]), TAG)[(TABLE_ID, 0)] == 14


def test_a_partition_that_never_holds_still_is_recorded_as_not_exact(tmp_path: Path) -> None:
    client = ScriptedClient(lambda attempt, page: 100 * attempt + page)
    manifest = _export(client, tmp_path / "out")
    assert manifest["exact"] is False
    entry = manifest["read"]["0"]
    assert entry["exact"] is False and entry["positions_read"] == [200, 204] and entry["position"] == 204


def test_an_overwrite_during_the_export_fails_it_and_leaves_nothing(tmp_path: Path) -> None:
    client = ScriptedClient(lambda attempt, page: 10, table_id=TABLE_ID + 1)
    with pytest.raises(BackupError, match="overwritten during the export"):
        _export(client, tmp_path / "out")
    assert list(tmp_path.iterdir()) == []


def test_an_existing_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(BackupError, match="exists"):
        _export(ScriptedClient(lambda attempt, page: 10), tmp_path)


@pytest.mark.parametrize(
    ("spark", "arrow"),
    [
        ("decimal(10,2)", "decimal128(10, 2)"),
        ("map<int,array<string>>", "map<int32, list<item: string>>"),
        (
            "struct<a:timestamp,b:struct<c:date>>",
            "struct<a: timestamp[us, tz=UTC], b: struct<c: date32[day]>>",
        ),
        ("timestamp_ntz", "timestamp[us]"),
    ],
)
def test_spark_type_names_as_arrow_types(spark: str, arrow: str) -> None:
    assert str(arrow_type(spark)) == arrow


def test_an_unknown_type_is_named() -> None:
    with pytest.raises(BackupError, match="'interval'"):
        arrow_type("interval")

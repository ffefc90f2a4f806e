"""Export a table to Parquet at one consistency token, and import such an export back (docs/operations.md).

An export is a directory: one Parquet file per partition (`part-00000.parquet`, the key columns with
their key types, then the value columns with the types the table's writer declared) and `_manifest.json`
(the format version, table, key and value columns, partition count, the token, and per partition the
position read, its rows and its file's SHA-256). The manifest's name starts with `_` so that
`spark.read.parquet(dir)` skips it.

What the server offers: a query given a token is served, per partition, by a replica at least at the
token's position, and every answer names the position each partition was read at; there is no read at an
exact older position (a store keeps only its newest version of a key). So each partition is read in pages
pinned to the export's token, and it is exact when every page of it was read at the same position: that
position goes into the manifest, whose token is those positions. A page is one scan of one store, at the
position the answer names (a read and the applying of records never interleave on a server), so a
partition of up to PAGE_ROWS rows, read in one page, is always exact. A partition whose position moved between
its pages (it took writes during the read) is read again, at least at the newest position seen, up to
`attempts` times; one that never holds still is recorded with `exact: false` and the range of positions
its pages were read at, and the manifest's `exact` is false.

Undeclared value columns (a table written only by TableWriter or the HTTP API) have no types to write
Parquet with: the export refuses such a table and says how to declare them.
"""

from __future__ import annotations

import asyncio
import base64
import datetime as dt
import decimal
import hashlib
import json
import math
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgpack

from hotstate.controller.records import KeyColumn, KeyType, ValueColumn, key_type_named
from hotstate.query import tokens

if TYPE_CHECKING:
    import pyarrow as pa

    from hotstate.client.query import Client
    from hotstate.client.writer import TableWriter

__all__ = [
    "FORMAT",
    "FORMAT_VERSION",
    "MANIFEST",
    "BackupError",
    "ExportResult",
    "ImportPlan",
    "arrow_type",
    "export_table",
    "load_rows",
    "plan_import",
]

FORMAT = "hotstate-table-export"
FORMAT_VERSION = 1
MANIFEST = "_manifest.json"
# The most rows one query answers (query/execute.py MAX_ROWS): a partition that fits in one page is read
# by one store scan, at one position, however fast it is being written.
PAGE_ROWS = 100_000
ATTEMPTS = 5


class BackupError(Exception):
    """An export or import that cannot be done; the message names the table, file or directory."""


# ------------------------------------------------------------------------------------ types to Arrow

_KEY_ARROW = {
    KeyType.STRING: "string",
    KeyType.INT: "bigint",
    KeyType.FLOAT: "double",
    KeyType.BOOL: "boolean",
    KeyType.BYTES: "binary",
    KeyType.TIMESTAMP: "timestamp",
}


def arrow_type(spark: str) -> pa.DataType:
    """Spark's simpleString of a type (bigint, decimal(10,2), array<struct<a:int>>, ...) as Arrow's;
    BackupError for one it does not know."""
    parser = _TypeParser(spark)
    found = parser.parse()
    if parser.rest():
        raise BackupError(f"type {spark!r}: unexpected {parser.rest()!r}")
    return found


class _TypeParser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.at = 0

    def rest(self) -> str:
        return self.text[self.at :].strip()

    def _skip(self) -> None:
        while self.at < len(self.text) and self.text[self.at] == " ":
            self.at += 1

    def _expect(self, char: str) -> None:
        self._skip()
        if not self.text.startswith(char, self.at):
            raise BackupError(f"type {self.text!r}: expected {char!r} at {self.at}")
        self.at += 1

    def _word(self, stops: str = "<>(),:") -> str:
        self._skip()
        start = self.at
        while self.at < len(self.text) and self.text[self.at] not in stops:
            self.at += 1
        return self.text[start : self.at].strip()

    def parse(self) -> pa.DataType:
        import pyarrow as pa

        name = self._word().lower()
        simple = {
            "string": pa.string(),
            "bigint": pa.int64(),
            "int": pa.int32(),
            "smallint": pa.int16(),
            "tinyint": pa.int8(),
            "double": pa.float64(),
            "float": pa.float32(),
            "boolean": pa.bool_(),
            "binary": pa.binary(),
            "timestamp": pa.timestamp("us", tz="UTC"),
            "timestamp_ntz": pa.timestamp("us"),
            "date": pa.date32(),
        }
        if name in simple:
            return simple[name]
        if name == "decimal":
            self._expect("(")
            precision = int(self._word())
            self._expect(",")
            scale = int(self._word())
            self._expect(")")
            return pa.decimal128(precision, scale)
        if name == "array":
            self._expect("<")
            element = self.parse()
            self._expect(">")
            return pa.list_(element)
        if name == "map":
            self._expect("<")
            key = self.parse()
            self._expect(",")
            value = self.parse()
            self._expect(">")
            return pa.map_(key, value)
        if name == "struct":
            self._expect("<")
            fields = []
            self._skip()
            while not self.text.startswith(">", self.at):
                field_name = self._word(":")
                self._expect(":")
                fields.append(pa.field(field_name, self.parse()))
                self._skip()
                if self.text.startswith(",", self.at):
                    self.at += 1
                    self._skip()
            self._expect(">")
            return pa.struct(fields)
        raise BackupError(f"type {self.text!r}: {name!r} is not a type an export can write")


# JSON as /v1/query writes a value -> the Python value pyarrow takes for the type.


def _from_json(kind: pa.DataType) -> Callable[[Any], Any]:
    import pyarrow as pa

    def nullable(convert: Callable[[Any], Any]) -> Callable[[Any], Any]:
        return lambda v: None if v is None else convert(v)

    if pa.types.is_string(kind):
        return nullable(lambda v: v if isinstance(v, str) else json.dumps(v))
    if pa.types.is_integer(kind):
        return nullable(int)
    if pa.types.is_floating(kind):
        return nullable(_float)
    if pa.types.is_boolean(kind):
        return nullable(bool)
    if pa.types.is_binary(kind):
        return nullable(lambda v: base64.b64decode(v, validate=True))
    if pa.types.is_timestamp(kind):
        return nullable(_instant if kind.tz is not None else _wall_time)
    if pa.types.is_date(kind):
        return nullable(lambda v: dt.date.fromisoformat(str(v)[:10]))
    if pa.types.is_decimal(kind):
        return nullable(lambda v: decimal.Decimal(str(v)))
    if pa.types.is_map(kind):
        # JSON object keys are strings whatever the map's key type: parsed back as it.
        key = _key_from_text(kind.key_type)
        item = _from_json(kind.item_type)
        return nullable(lambda v: [(key(k), item(x)) for k, x in v.items()])
    if pa.types.is_list(kind):
        element = _from_json(kind.value_type)
        return nullable(lambda v: [element(e) for e in v])
    if pa.types.is_struct(kind):
        fields = [(kind.field(i).name, _from_json(kind.field(i).type)) for i in range(kind.num_fields)]
        return nullable(lambda v: {name: convert(v.get(name)) for name, convert in fields})
    raise BackupError(f"no conversion to {kind}")


def _key_from_text(kind: pa.DataType) -> Callable[[Any], Any]:
    import pyarrow as pa

    inner = _from_json(kind)
    if pa.types.is_integer(kind):
        return lambda k: int(k)
    if pa.types.is_floating(kind):
        return lambda k: _float(k if k in _NON_FINITE else float(k))
    if pa.types.is_boolean(kind):
        return lambda k: k if isinstance(k, bool) else str(k).lower() == "true"
    return inner


_NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def _float(value: Any) -> float:
    return _NON_FINITE[value] if isinstance(value, str) else float(value)


def _instant(value: Any) -> dt.datetime:
    parsed = dt.datetime.fromisoformat(value)
    return parsed.replace(tzinfo=dt.UTC) if parsed.tzinfo is None else parsed.astimezone(dt.UTC)


def _wall_time(value: Any) -> dt.datetime:
    parsed = dt.datetime.fromisoformat(value)
    return parsed if parsed.tzinfo is None else parsed.astimezone(dt.UTC).replace(tzinfo=None)


# Arrow's Python values -> what the row codec stores, as the Spark sink writes them (a map as a dict).


def _to_row_value(kind: pa.DataType) -> Callable[[Any], Any] | None:
    """None: the value is stored as pyarrow gives it."""
    import pyarrow as pa

    if pa.types.is_map(kind):
        key = _to_row_value(kind.key_type)
        item = _to_row_value(kind.item_type)
        return lambda v: (
            None
            if v is None
            else {(k if key is None else key(k)): (x if item is None else item(x)) for k, x in v}
        )
    if pa.types.is_list(kind):
        element = _to_row_value(kind.value_type)
        if element is None:
            return None
        return lambda v: None if v is None else [element(e) for e in v]
    if pa.types.is_struct(kind):
        fields = [(kind.field(i).name, _to_row_value(kind.field(i).type)) for i in range(kind.num_fields)]
        if all(convert is None for _, convert in fields):
            return None
        return lambda v: (
            None
            if v is None
            else {name: (v[name] if convert is None else convert(v[name])) for name, convert in fields}
        )
    if pa.types.is_timestamp(kind) and kind.tz is not None:
        # pyarrow's tz-aware values carry its own UTC zone; the codec wants an offset of 0, any zone.
        return lambda v: None if v is None else v.astimezone(dt.UTC)
    return None


# ------------------------------------------------------------------------------------------- export


@dataclass(frozen=True, slots=True)
class ExportResult:
    directory: Path
    rows: int
    token: str
    exact: bool
    manifest: dict[str, Any]


def export_table(
    client: Client,
    table: str,
    directory: Path,
    *,
    token: str | None = None,
    page_rows: int = PAGE_ROWS,
    attempts: int = ATTEMPTS,
) -> ExportResult:
    """Write `table` to the new `directory` (BackupError if it exists): every partition at or past
    `token` and at least at where each partition's active is when the export starts."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from hotstate.client.query import QueryFailed

    if directory.exists():
        raise BackupError(f"export directory {str(directory)!r} exists: name a new one")
    found = [t for t in client.tables() if t.get("name") == table]
    if not found:
        raise BackupError(f"no table {table!r} to export")
    [info] = found
    keys = [(str(c["name"]), str(c["type"])) for c in info["key_columns"]]
    values = [(str(c["name"]), str(c["type"])) for c in info.get("value_columns", ())]
    if not values:
        raise BackupError(
            f"table {table!r} has no declared value columns, so an export cannot give them types: "
            "declare them (a Spark writer does; AdminClient.set_value_columns) and export again"
        )
    partitions = int(info["partitions"])
    generation = info.get("generation")
    columns: list[tuple[str, pa.DataType]] = []
    for name, type_name in keys:
        kind = key_type_named(type_name)
        if kind is None:
            raise BackupError(f"table {table!r}: key column {name!r} has type {type_name!r}, unknown here")
        columns.append((name, arrow_type(_KEY_ARROW[kind])))
    columns += [(name, arrow_type(type_name)) for name, type_name in values]
    schema = pa.schema(
        [pa.field(name, kind, nullable=i >= len(keys)) for i, (name, kind) in enumerate(columns)]
    )
    converters = [_from_json(kind) for _, kind in columns]
    select = f"SELECT * FROM `{table}` LIMIT {page_rows}"

    # Where every partition is now: a scan of one row per query, from the actives, so the export holds at
    # least everything acknowledged before it began.
    try:
        start = client.query(f"SELECT * FROM `{table}` LIMIT 1", standby_reads=False, consistency_token=token)
    except QueryFailed as error:
        raise BackupError(f"table {table!r}: {error}") from None
    tag = _tag_of(start.consistency_token)
    pinned = start.consistency_token
    have = {partition for _, partition in tokens.decode(pinned, tag)}
    for partition in sorted(set(range(partitions)) - have):  # a scan the planner cut short of it
        where = client.query(
            f"SELECT * FROM `{table}` LIMIT 1",
            partitions=[partition],
            standby_reads=False,
            consistency_token=pinned,
        )
        pinned = where.consistency_token

    parent = directory.parent
    parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", suffix=".partial", dir=parent))
    try:
        read: dict[str, Any] = {}
        positions: dict[tuple[int, int], int] = {}
        total = 0
        for partition in range(partitions):
            path = staging / f"part-{partition:05d}.parquet"
            low = high = 0
            exact = False
            rows = 0
            table_id = -1
            for _ in range(attempts):
                seen: list[int] = []
                rows = 0
                after: str | None = None
                with pq.ParquetWriter(path, schema) as out:
                    while True:
                        page = client.query(
                            select, partitions=[partition], consistency_token=pinned, after=after
                        )
                        [served] = [p for p in page.partitions if p.partition == partition]
                        seen.append(served.position)
                        table_id = _generation_of(page.consistency_token, table, generation)
                        if page.rows:
                            index = {name: i for i, name in enumerate(page.columns)}
                            arrays = [
                                pa.array(
                                    [
                                        convert(row[index[name]]) if name in index else None
                                        for row in page.rows
                                    ],
                                    type=kind,
                                )
                                for (name, kind), convert in zip(columns, converters, strict=True)
                            ]
                            out.write_table(pa.Table.from_arrays(arrays, schema=schema))
                            rows += len(page.rows)
                        if page.cursor is None:
                            break
                        after = page.cursor
                low, high = min(seen), max(seen)
                # The next attempt starts at least where this one ended: a replica behind it refuses.
                pinned = tokens.encode(
                    tokens.merge(tokens.decode(pinned, tag), {(table_id, partition): high}), tag
                )
                if low == high:
                    exact = True
                    break
            positions[(table_id, partition)] = high
            entry: dict[str, Any] = {
                "file": path.name,
                "rows": rows,
                "sha256": _sha256(path),
                "exact": exact,
                "position": high,
            }
            if not exact:
                entry["positions_read"] = [low, high]
            read[str(partition)] = entry
            total += rows
        exact_all = all(e["exact"] for e in read.values())
        manifest = {
            "format": FORMAT,
            "format_version": FORMAT_VERSION,
            "table": table,
            "generation": generation,
            "key_columns": [{"name": n, "type": t} for n, t in keys],
            "value_columns": [{"name": n, "type": t} for n, t in values],
            "partitions": partitions,
            "standby_replicas": info.get("standby_replicas"),
            "token": tokens.encode(positions, tag),
            "exact": exact_all,
            "rows": total,
            "read": read,
            "exported_at": dt.datetime.now(dt.UTC).isoformat(),
        }
        (staging / MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
        _fsync_dir(staging)
        # Refuses (rather than replaces) a directory made meanwhile by someone else.
        os.rename(staging, directory)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return ExportResult(directory, total, str(manifest["token"]), exact_all, manifest)


def _tag_of(token: str) -> bytes:
    body = token[len(tokens.PREFIX) :]
    tag = msgpack.unpackb(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))[0]
    assert isinstance(tag, bytes)
    return tag


def _generation_of(token: str, table: str, generation: object) -> int:
    """The table id a page was read from; BackupError when an overwrite swapped in another meanwhile."""
    read = {table_id for table_id, _ in tokens.decode(token, None)}
    if isinstance(generation, int):
        if read - {generation}:
            raise BackupError(
                f"table {table!r} was overwritten during the export (generation {generation}, now "
                f"{', '.join(map(str, sorted(read - {generation})))}): export it again"
            )
        return generation
    return min(read)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def _fsync_dir(directory: Path) -> None:
    for path in directory.iterdir():
        with path.open("rb") as file:
            os.fsync(file.fileno())


# ------------------------------------------------------------------------------------------- import


@dataclass(frozen=True, slots=True)
class ImportPlan:
    """A checked export: the table to load into and what it must be."""

    directory: Path
    manifest: dict[str, Any]
    table: str
    key_columns: tuple[KeyColumn, ...]
    value_columns: tuple[ValueColumn, ...]
    partitions: int
    files: tuple[Path, ...]

    @property
    def rows(self) -> int:
        return int(self.manifest["rows"])


def plan_import(directory: Path, table: str | None, existing: Sequence[Mapping[str, Any]]) -> ImportPlan:
    """Check an export before anything is written: its manifest, format version, checksums and file
    schemas, and the table it goes into (`existing`: GET /v1/tables). BackupError names what is wrong."""
    import pyarrow.parquet as pq

    path = directory / MANIFEST
    if not path.is_file():
        raise BackupError(f"{str(directory)!r} is not a hotstate export: no {MANIFEST}")
    try:
        manifest = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise BackupError(f"{str(path)!r}: not a readable manifest: {error}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise BackupError(f"{str(path)!r}: not a hotstate table export manifest")
    version = manifest.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise BackupError(
            f"{str(path)!r}: export format version {version!r} is newer than this hotstate reads "
            f"({FORMAT_VERSION}): import it with a newer hotstate"
        )
    try:
        keys = tuple(KeyColumn(str(c["name"]), _known_key(str(c["type"]))) for c in manifest["key_columns"])
        values = tuple(ValueColumn(str(c["name"]), str(c["type"])) for c in manifest["value_columns"])
        partitions = int(manifest["partitions"])
        read = manifest["read"]
        files = tuple(directory / str(read[str(p)]["file"]) for p in range(partitions))
    except (KeyError, TypeError, ValueError) as error:
        raise BackupError(f"{str(path)!r}: damaged manifest ({error!r})") from None
    for partition, file in enumerate(files):
        if not file.is_file():
            raise BackupError(f"export {str(directory)!r}: {file.name} is missing")
        if _sha256(file) != read[str(partition)]["sha256"]:
            raise BackupError(
                f"export {str(directory)!r}: {file.name} does not match the manifest's checksum "
                "(changed or damaged since the export)"
            )
    names = [c.name for c in keys] + [c.name for c in values]
    for file in files:
        if pq.read_schema(file).names != names:
            raise BackupError(
                f"export {str(directory)!r}: {file.name} has columns {pq.read_schema(file).names}, "
                f"the manifest says {names}"
            )
    source = str(manifest["table"])
    target = source if table is None else table
    found = next((t for t in existing if t.get("name") == target), None)
    if found is not None:
        theirs = tuple((str(c["name"]), key_type_named(str(c["type"]))) for c in found["key_columns"])
        if theirs != tuple((c.name, c.type) for c in keys):
            shown = ", ".join(f"{c['name']} {c['type']}" for c in found["key_columns"])
            raise BackupError(
                f"table {target!r} has key ({shown}), the export of table {source!r} has key "
                f"({', '.join(f'{c.name} {c.type.name}' for c in keys)}): import into another table "
                "(--table NAME) or drop this one"
            )
        declared = tuple((str(c["name"]), str(c["type"])) for c in found.get("value_columns", ()))
        if declared and declared != tuple((c.name, c.type) for c in values):
            raise BackupError(
                f"table {target!r} declares value columns ({_columns_text(declared)}), the export of "
                f"table {source!r} has ({_columns_text((c.name, c.type) for c in values)}): import into "
                "another table (--table NAME) or drop this one"
            )
    return ImportPlan(directory, manifest, target, keys, values, partitions, files)


def _columns_text(columns: Iterable[tuple[str, str]]) -> str:
    return ", ".join(f"{name} {kind}" for name, kind in columns)


def _known_key(name: str) -> KeyType:
    kind = key_type_named(name)
    if kind is None:
        raise ValueError(f"unknown key type {name!r}")
    return kind


def load_rows(plan: ImportPlan, batch_rows: int = 5_000) -> Iterator[list[dict[str, Any]]]:
    """The export's rows, in batches, as the row codec stores them."""
    import pyarrow.parquet as pq

    for file in plan.files:
        parquet = pq.ParquetFile(file)
        fixes = [
            (field.name, convert)
            for field in parquet.schema_arrow
            if (convert := _to_row_value(field.type)) is not None
        ]
        for batch in parquet.iter_batches(batch_size=batch_rows):
            rows = batch.to_pylist()
            for name, convert in fixes:
                for row in rows:
                    row[name] = convert(row[name])
            yield rows


async def write_rows(writer: TableWriter, plan: ImportPlan, in_flight: int = 8) -> str:
    """Upsert every row of the export through `writer`, `in_flight` batches at a time (the writer
    pipelines them per partition, in order); the merged token of every write."""
    pending: set[asyncio.Task[Any]] = set()
    positions: list[str] = []
    for rows in load_rows(plan):
        if len(pending) >= in_flight:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            positions += [task.result().consistency_token for task in done]
        pending.add(asyncio.ensure_future(writer.upsert(rows)))
    if pending:
        done, _ = await asyncio.wait(pending)
        positions += [task.result().consistency_token for task in done]
    merged: dict[tuple[int, int], int] = {}
    tag = b""
    for token in positions:
        if token:
            tag = _tag_of(token)
            merged = tokens.merge(merged, tokens.decode(token, None))
    return tokens.encode(merged, tag) if merged else ""

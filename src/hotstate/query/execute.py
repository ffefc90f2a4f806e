"""A pull query's pure execution: properties -> per-partition work, paging and cursors, the merge of the
partitions' rows, projection and LIMIT. Data in, data out: no sockets, clocks or replicas.

The coordinator (server/coordinator.py) calls these around its IO: `QueryOptions.read` and
`partition_work`/`plain_work` before it asks any replica, `merge_rows` once every partition answered.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import itertools
import operator
from collections.abc import Iterable, KeysView, Mapping
from dataclasses import dataclass, field

from hotstate.controller.image import TableInfo
from hotstate.protocol.http_api import DEFAULT_QUERY_TIMEOUT_MS
from hotstate.protocol.replica_state import ReplicaState, as_replica_state
from hotstate.protocol.rows import decode_rows, may_hold_non_finite
from hotstate.query.plan import FullScan, KeyLookup, KeyRange, QueryPlan
from hotstate.query.scan import finish, program_for
from hotstate.query.tokens import Positions, TokenError, decode, encode, merge
from hotstate.replica.messages import PartitionQueryRequest, PartitionQueryResponse

# ksqlDB's name, and `acceptable.offset.lag` as users of the anchors' docs bring it.
MAX_LAG_PROPERTIES = ("max_lag", "ksql.query.pull.max.allowed.offset.lag", "acceptable.offset.lag")
STANDBY_READS_PROPERTIES = ("standby_reads", "ksql.query.pull.enable.standby.reads")
TIMEOUT_PROPERTY = "timeout_ms"
HEDGING_PROPERTIES = ("hedging",)
TOKEN_PROPERTY = "consistency_token"
MIN_BATCH_PROPERTY = "min_batch"
# Reading a table a piece at a time (the Spark data source): only these partitions, and only keys after
# the `cursor` of an earlier answer (one whose LIMIT cut it short).
PARTITIONS_PROPERTY = "partitions"
AFTER_PROPERTY = "after"
KNOWN_PROPERTIES = frozenset(
    (
        *MAX_LAG_PROPERTIES,
        *STANDBY_READS_PROPERTIES,
        TIMEOUT_PROPERTY,
        *HEDGING_PROPERTIES,
        TOKEN_PROPERTY,
        MIN_BATCH_PROPERTY,
        PARTITIONS_PROPERTY,
        AFTER_PROPERTY,
    )
)
# Push-query settings that ksqlDB's clients send with every statement; they mean nothing to a pull query.
IGNORED_PROPERTIES = frozenset(("auto.offset.reset", "ksql.streams.auto.offset.reset"))
DEFAULT_TIMEOUT_MS = DEFAULT_QUERY_TIMEOUT_MS  # clients size their own timeouts from it
MAX_TIMEOUT_MS = 300_000
MAX_LAG_LIMIT = 2**63 - 1  # what every API and the wire can carry; larger means unbounded: pass null
MAX_ROWS = 100_000  # the most rows one query returns; more needs a LIMIT and key ranges


class QueryError(Exception):
    """A query that cannot be answered. `kind` decides the HTTP status and the ksqlDB error code."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind  # bad_request | not_found | unavailable | timeout | not_ready
        self.message = message


@dataclass(slots=True)  # not frozen: made for every partition of every answer, and never changed
class PartitionServed:
    partition: int
    served_by: int
    state: ReplicaState
    offset_lag: int
    position: int


@dataclass(slots=True)
class PartitionAnswer:
    """One partition's rows, as (encoded key, row bytes) in key order, and who served them."""

    served: PartitionServed
    items: list[tuple[bytes, bytes]] | tuple[tuple[bytes, bytes], ...]
    partial: bytes = b""  # a scan's partial answer (query/scan.py)

    @classmethod
    def of(cls, partition: int, node_id: int, answer: PartitionQueryResponse) -> PartitionAnswer:
        state = as_replica_state(answer.state)  # the wire carries it as text; callers checked it
        served = PartitionServed(partition, node_id, state, answer.offset_lag, answer.position)
        return cls(served, answer.items, answer.partial)


@dataclass(slots=True)
class QueryResult:
    query_id: str
    table: TableInfo
    columns: list[str]
    rows: list[list[object]]
    partitions: list[PartitionServed] = field(default_factory=list)
    forwarded: int = 0
    took_ms: float = 0.0
    # Some row may hold a NaN or an infinity, which JSON has no number for (the answer's encoder decides).
    non_finite: bool = False
    # Where this answer read, merged with the token the query was given (query/tokens.py), and the
    # cluster's tag: the token's string is built only when an answer carries it (ksqlDB's /query does not).
    token_positions: Positions = field(default_factory=dict)
    token_tag: bytes = b""
    # The last key returned when the LIMIT cut the answer short: the next page starts after it.
    last_key: bytes | None = None

    @property
    def cursor(self) -> str | None:
        """`last_key` as the `after` of the next page's query (opaque to clients), None: no more rows."""
        return None if self.last_key is None else base64.urlsafe_b64encode(self.last_key).decode()

    @property
    def consistency_token(self) -> str:
        return encode(self.token_positions, self.token_tag) if self.token_tag else ""


@dataclass(frozen=True, slots=True)
class QueryOptions:
    """A query's properties, checked: how fresh, how long, from where, and which part of the table."""

    max_lag: int | None
    timeout_ms: int = DEFAULT_TIMEOUT_MS
    standby_reads: bool = True
    hedge: bool = True
    min_batch: int | None = None
    token: Positions = field(default_factory=dict)  # the positions of the query's consistency token
    partitions: frozenset[int] | None = None
    after: bytes | None = None

    @classmethod
    def read(cls, properties: Mapping[str, object], table: TableInfo, tag: bytes) -> QueryOptions:
        """The options `properties` ask for; QueryError (bad_request) naming the first wrong one."""
        return cls(
            max_lag(properties, table),
            timeout_ms(properties),
            flag(properties, STANDBY_READS_PROPERTIES, default=True),
            flag(properties, HEDGING_PROPERTIES, default=True),
            min_batch(properties),
            token(properties, table, tag),
            partitions(properties, table),
            after(properties),
        )


def check_properties(properties: Mapping[str, object]) -> None:
    """Refuses property names this server does not know: a typo must not run an unbounded query."""
    unknown = [name for name in properties if name not in KNOWN_PROPERTIES and name not in IGNORED_PROPERTIES]
    if unknown:
        names = ", ".join(repr(name) for name in sorted(unknown))
        raise QueryError(
            "bad_request",
            f"unknown {'property' if len(unknown) == 1 else 'properties'} {names}; "
            f"known: {', '.join(sorted(KNOWN_PROPERTIES))}",
        )


def max_lag(properties: Mapping[str, object], table: TableInfo) -> int | None:
    given = [key for key in MAX_LAG_PROPERTIES if key in properties]
    if len({str(properties[key]) for key in given}) > 1:
        both = ", ".join(f"{key}={properties[key]!r}" for key in given)
        raise QueryError(
            "bad_request", f"{both}: the same bound under different names, with different values"
        )
    for key in given:
        if key in properties:
            value = properties[key]
            if value is None:
                return None
            problem = f"{key}={value!r}: must be an integer from 0 to {MAX_LAG_LIMIT}, or null for no bound"
            try:
                number = int(str(value))
            except ValueError:
                raise QueryError("bad_request", problem) from None
            if not 0 <= number <= MAX_LAG_LIMIT:
                raise QueryError("bad_request", problem)
            return number
    return table.acceptable_lag


def min_batch(properties: Mapping[str, object]) -> int | None:
    value = properties.get(MIN_BATCH_PROPERTY)
    if value is None:
        return None
    if type(value) is not int or value < 0:
        raise QueryError(
            "bad_request", f"{MIN_BATCH_PROPERTY}={value!r}: must be a Spark batch id (an integer >= 0)"
        )
    return value


def token(properties: Mapping[str, object], table: TableInfo, tag: bytes) -> Positions:
    """The positions of the query's consistency token (all tables: the answer carries them on)."""
    value = properties.get(TOKEN_PROPERTY)
    if value is None:
        return {}
    if not isinstance(value, str):
        raise QueryError("bad_request", f"{TOKEN_PROPERTY}: must be a string")
    try:
        positions = decode(value, tag)
    except TokenError as error:
        raise QueryError("bad_request", f"{TOKEN_PROPERTY}: {error}") from None
    for table_id, partition in positions:
        if table_id == table.table_id and partition >= table.partitions:
            raise QueryError(
                "bad_request",
                f"{TOKEN_PROPERTY}: names partition {partition} of {table.name}, which has "
                f"{table.partitions}: not a token of this table",
            )
    return positions


def partitions(properties: Mapping[str, object], table: TableInfo) -> frozenset[int] | None:
    value = properties.get(PARTITIONS_PROPERTY)
    if value is None:
        return None
    problem = f"{PARTITIONS_PROPERTY}: must be a list of partition numbers of {table.name} (0 to "
    problem += f"{table.partitions - 1})"
    if not isinstance(value, list | tuple) or not value:
        raise QueryError("bad_request", problem)
    for number in value:
        if type(number) is not int or not 0 <= number < table.partitions:
            raise QueryError("bad_request", f"{problem}, got {number!r}")
    return frozenset(value)


def after(properties: Mapping[str, object]) -> bytes | None:
    value = properties.get(AFTER_PROPERTY)
    if value is None:
        return None
    problem = f"{AFTER_PROPERTY}: must be the cursor of an earlier answer"
    if not isinstance(value, str) or not value:
        raise QueryError("bad_request", problem)
    try:
        return base64.b64decode(value.encode("ascii"), altchars=b"-_", validate=True)
    except (ValueError, binascii.Error):
        raise QueryError("bad_request", problem) from None


def flag(properties: Mapping[str, object], names: tuple[str, ...], *, default: bool) -> bool:
    for name in names:
        if name in properties:
            value = properties[name]
            if isinstance(value, bool):
                return value
            text = str(value).strip().lower()
            if text in ("true", "1", "yes", "on"):
                return True
            if text in ("false", "0", "no", "off"):
                return False
            raise QueryError("bad_request", f"{name}={value!r}: must be true or false")
    return default


def timeout_ms(properties: Mapping[str, object]) -> int:
    value = properties.get(TIMEOUT_PROPERTY, DEFAULT_TIMEOUT_MS)
    try:
        number = int(str(value))
    except ValueError:
        raise QueryError("bad_request", f"timeout_ms={value!r}: must be a positive integer") from None
    if not 1 <= number <= MAX_TIMEOUT_MS:
        raise QueryError("bad_request", f"timeout_ms={value!r}: must be 1..{MAX_TIMEOUT_MS}")
    return number


def batch_positions(table: TableInfo) -> Positions:
    """Where each partition's log was when the table's last committed Spark batch was (min_batch)."""
    return {(table.table_id, p): at for p, at in enumerate(table.batch_positions) if at}


def given_positions(table: TableInfo, options: QueryOptions) -> Positions:
    """The positions a query must read at or past: its token's, and with `min_batch` those of the table's
    last committed Spark batch (`table` as of that commit)."""
    if options.min_batch is None:
        return options.token
    return merge(options.token, batch_positions(table))


def work_for(
    query_plan: QueryPlan, table: TableInfo, options: QueryOptions, given: Positions
) -> dict[int, PartitionQueryRequest]:
    """What to ask of each partition for a query with `options`, reading at or past `given`."""
    if options.after is not None and query_plan.scan is not None and query_plan.scan.mode != "rows":
        raise QueryError(
            "bad_request",
            f"{AFTER_PROPERTY}: pages follow key order; a query with ORDER BY or aggregates has no next page",
        )
    work = partition_work(query_plan, table, options.max_lag, given, options.timeout_ms)
    return page(work, options.partitions, options.after)


def partition_work(
    query_plan: QueryPlan,
    table: TableInfo,
    max_lag: int | None = None,
    token: Positions | None = None,
    timeout_ms: int = DEFAULT_TIMEOUT_MS,
) -> dict[int, PartitionQueryRequest]:
    """What to ask of each partition the plan touches, in partition order, each no older than `token`."""
    work = plain_work(query_plan, table, max_lag, timeout_ms)
    if token:
        for partition, spec in work.items():
            wanted = token.get((table.table_id, partition), 0)
            if wanted > spec.min_position:
                work[partition] = dataclasses.replace(spec, min_position=wanted)
    return work


def plain_work(
    query_plan: QueryPlan, table: TableInfo, max_lag: int | None, timeout_ms: int = DEFAULT_TIMEOUT_MS
) -> dict[int, PartitionQueryRequest]:
    """`partition_work` without a token: every property at its default but the bound (most lookups)."""
    if query_plan.scan is not None:
        return scan_work(query_plan, table, max_lag, timeout_ms)
    work = _plain_work(query_plan, table, max_lag)
    if table.loaded_positions:
        # A generation an overwrite swapped in is served only from stores holding all of its load.
        for partition, spec in work.items():
            work[partition] = dataclasses.replace(spec, min_position=table.loaded_positions[partition])
    return work


def _plain_work(
    query_plan: QueryPlan, table: TableInfo, max_lag: int | None
) -> dict[int, PartitionQueryRequest]:
    access = query_plan.access
    if isinstance(access, KeyLookup):
        if len(access.keys) == 1:  # a point lookup
            [partition] = access.partitions
            return {
                partition: PartitionQueryRequest(
                    table.name, partition, access.keys, False, None, None, None, max_lag, 0, table.table_id
                )
            }
        by_partition: dict[int, list[bytes]] = {}
        for key, partition in zip(access.keys, access.partitions, strict=True):
            by_partition.setdefault(partition, []).append(key)
        return {
            partition: PartitionQueryRequest(
                table.name,
                partition,
                tuple(by_partition[partition]),
                False,
                None,
                None,
                None,
                max_lag,
                table_id=table.table_id,
            )
            for partition in sorted(by_partition)
        }
    start, end = (access.start, access.end) if isinstance(access, KeyRange) else (None, None)
    assert isinstance(access, KeyRange | FullScan)
    # One row past the LIMIT tells whether more follow (the answer's cursor); a LIMIT above what one query
    # returns reads no more than that (and fits the wire). Rows a window filter drops do not count.
    limit = None if query_plan.limit is None else min(query_plan.limit + 1, MAX_ROWS + 1)
    if query_plan.window_filter is not None:
        limit = None
    one = access.partition if isinstance(access, KeyRange) else None
    return {
        partition: PartitionQueryRequest(
            table.name, partition, (), True, start, end, limit, max_lag, table_id=table.table_id
        )
        for partition in (range(table.partitions) if one is None else (one,))
    }


def scan_work(
    query_plan: QueryPlan, table: TableInfo, max_lag: int | None, timeout_ms: int = DEFAULT_TIMEOUT_MS
) -> dict[int, PartitionQueryRequest]:
    """`plain_work` of a scan: the same reads, each with the program its replica runs over the rows (for
    at most the query's `timeout_ms`: a replica does not scan on for a query that gave up)."""
    assert query_plan.scan is not None
    program = program_for(query_plan.scan, query_plan.limit, MAX_ROWS, timeout_ms).encode()
    plain = dataclasses.replace(query_plan, scan=None, limit=None)
    return {
        partition: dataclasses.replace(spec, program=program)
        for partition, spec in plain_work(plain, table, max_lag).items()
    }


def page(
    work: dict[int, PartitionQueryRequest], partitions: frozenset[int] | None, after: bytes | None
) -> dict[int, PartitionQueryRequest]:
    """`work` restricted to `partitions` and to keys greater than `after`."""
    if partitions is not None:
        work = {partition: spec for partition, spec in work.items() if partition in partitions}
    if after is None:
        return work
    # The least key greater than `after`: keys compare as bytes.
    start = after + b"\x00"
    paged = {}
    for partition, spec in work.items():
        if spec.scan:
            spec = dataclasses.replace(spec, start=start if spec.start is None else max(spec.start, start))
        else:
            keys = tuple(key for key in spec.keys if key > after)
            if not keys:
                continue
            spec = dataclasses.replace(spec, keys=keys)
        paged[partition] = spec
    return paged


def result(
    query_id: str,
    node_id: int,
    tag: bytes,
    query_plan: QueryPlan,
    table: TableInfo,
    answers: list[PartitionAnswer],
    given: Positions,
    took_ms: float,
) -> QueryResult:
    """The answer of a query whose partitions (in partition order) answered, as server `node_id` gives it."""
    if len(answers) == 1:  # a lookup: no comprehension or generator per query
        [only] = answers
        served = [only.served]
        read = {(table.table_id, only.served.partition): only.served.position}
        items: Iterable[tuple[bytes, bytes]] = only.items
        forwarded = int(only.served.served_by != node_id)
    else:
        served = [a.served for a in answers]
        read = {(table.table_id, a.served.partition): a.served.position for a in answers}
        items = itertools.chain.from_iterable(a.items for a in answers)
        forwarded = sum(1 for a in answers if a.served.served_by != node_id)
    if query_plan.scan is not None:
        columns, rows, last_key, non_finite = scan_rows(query_plan, table, answers)
    else:
        columns, rows, last_key = merge_rows(query_plan, table, answers)
        # One search over all rows: a mark spanning two rows is at worst a false alarm.
        non_finite = may_hold_non_finite(b"".join(map(_ROW, items)))
    return QueryResult(
        query_id,
        table,
        columns,
        rows,
        served,
        forwarded,
        took_ms,
        non_finite,
        merge(given, read) if given else read,
        tag,
        last_key,
    )


_KEY = operator.itemgetter(0)  # of a (key, row) item: keys are unique, so items order by key alone
_ROW = operator.itemgetter(1)


def merge_rows(
    query_plan: QueryPlan, table: TableInfo, answers: Iterable[PartitionAnswer]
) -> tuple[list[str], list[list[object]], bytes | None]:
    """Merge the partitions' rows in key order, apply the LIMIT, and project the columns; the last key
    when the LIMIT cut the rows short (maybe more follow)."""
    sources = [a.items for a in answers if a.items]
    limit = MAX_ROWS + 1 if query_plan.limit is None else min(query_plan.limit, MAX_ROWS + 1)
    # Each partition's items are already in key order. A key lives in one partition, so (key, row) pairs
    # order by key alone; a sort in C beats a merge in Python at every size one query returns (each
    # partition sends at most `limit` + 1 items).
    merged = sources[0] if len(sources) == 1 else sorted(itertools.chain.from_iterable(sources), key=_KEY)
    if query_plan.window_filter is not None:
        keep = query_plan.window_filter.keep
        merged = [item for item in merged if keep(item[0])]
    items = merged[:limit]
    if query_plan.limit is None and len(items) > MAX_ROWS:
        raise QueryError("bad_request", f"more than {MAX_ROWS} rows: add a LIMIT or narrow the key range")
    # Rows past the LIMIT: the next page starts after the last key returned. Each partition sent its
    # first items in key order, so every key up to that one is among those returned.
    last_key = items[-1][0] if query_plan.limit is not None and items and len(merged) > len(items) else None
    decoded = decode_rows(list(map(_ROW, items)))
    if query_plan.columns is None:
        columns = [c.name for c in table.key_columns]
        if decoded:
            columns += [name for name in decoded[0] if name not in columns]
            # One writer's rows share their columns: all names at once (in C), and the slow way (each
            # row's new names in order) only when some row has a column the first lacks.
            if len(decoded) > 1 and not set().union(*decoded).issubset(columns):
                _add_columns(columns, decoded)
    else:
        columns = list(query_plan.columns)
        for name in columns:
            if decoded and all(_missing(row, name) for row in decoded):
                raise QueryError("bad_request", f"column {name!r} is not in table {table.name!r}")
    return columns, _projected(decoded, columns), last_key


def scan_rows(
    query_plan: QueryPlan, table: TableInfo, answers: list[PartitionAnswer]
) -> tuple[list[str], list[list[object]], bytes | None, bool]:
    """A scan's answer from the partitions' (query/scan.py): columns, rows, cursor key, non-finite."""
    assert query_plan.scan is not None
    try:
        done = finish(
            query_plan.scan,
            query_plan.limit,
            [a.items for a in answers],
            [a.partial for a in answers],
            [c.name for c in table.key_columns],
            MAX_ROWS,
        )
    except ValueError as error:  # the query's fault: a row its expressions fail on, a cap passed
        raise QueryError("bad_request", str(error)) from error
    return done.columns, done.rows, done.last_key, done.non_finite


def _add_columns(columns: list[str], decoded: list[dict[str, object]]) -> None:
    """Every row's columns not in `columns` yet, appended in the order the rows first name them."""
    shape: KeysView[str] | None = None
    for row in decoded:
        names = row.keys()
        if names == shape:  # compared as sets, in C
            continue
        shape = names
        for name in names:
            if name not in columns:
                columns.append(name)


def _projected(decoded: list[dict[str, object]], columns: list[str]) -> list[list[object]]:
    """Each row's values in `columns` order; a column a row lacks (or names only when case is ignored)
    is looked up the slow way, for that row."""
    pick = operator.itemgetter(*columns)
    if len(columns) > 1:
        try:  # every row has every column (the common case): in C
            return list(map(list, map(pick, decoded)))
        except KeyError:
            pass
    rows: list[list[object]] = []
    for row in decoded:
        try:
            values = pick(row)
        except KeyError:
            rows.append([_value(row, name) for name in columns])
            continue
        rows.append(list(values) if len(columns) > 1 else [values])
    return rows


def _value(row: dict[str, object], name: str) -> object:
    if name in row:
        return row[name]
    lowered = name.lower()
    for key, value in row.items():
        if key.lower() == lowered:
            return value
    return None


def _missing(row: dict[str, object], name: str) -> bool:
    lowered = name.lower()
    return not any(key.lower() == lowered for key in row)

"""Client-side key routing (KIP-535's `queryMetadataForKey`, used by the client): send a single-partition
key lookup straight to a server that holds the key's partition, so the query is served where it lands
instead of paying a forward hop.

What the client learns, and from where:
- a table's partition map (partition count, key columns, acceptable lag) from `GET /v1/tables`, once per
  table. The query is planned by the server's own planner (hotstate.query.plan, which hashes the key with
  protocol/keys.partition_for), so the client computes exactly the partition the server will;
- a partition's holders (active, standbys and warmups, each one's HTTP address, liveness, state and lag)
  from `GET /v1/tables/{table}/keys?col=v` for the first key the client meets in it, cached.

A cached partition is learned again on a miss: the server that was sent the query forwarded it (its
`served_by` is not the coordinator: the active moved, or came back), the holder could not be reached or
answered with an error, the answer's partition is not the one computed (the table was dropped and made
again: its whole map is learned again), or the entry is older than `refresh_s`. A miss is learned again at
most once per `retry_s`; meanwhile the query takes the client's usual walk over its servers.

Which holder (`choose`): the live active first (the servers route to it first, so a query sent to any other
holder would be forwarded to it), unless it is restoring and beyond the bound; then the live standbys and
warmups within the staleness bound (the query's max_lag, else the table's acceptable lag), freshest first.
None: the client takes its usual walk.

This module is pure (answers and times in, decisions out); the clients (client/query.py) do the IO.
"""

from __future__ import annotations

import urllib.parse
from collections.abc import Container, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, TypeAlias

from hotstate.controller.image import TableInfo
from hotstate.controller.records import KeyColumn, key_type_named
from hotstate.protocol.keys import KeyValue, decode_key
from hotstate.query.plan import KeyLookup, find_table, plan
from hotstate.query.pull_query import PullQuery, QueryError
from hotstate.query.sql import parse

__all__ = [
    "Holder",
    "KeyRouter",
    "Lookup",
    "PartitionHolders",
    "Send",
    "Target",
    "choose",
    "table_infos",
]

Role: TypeAlias = Literal["active", "standby", "warmup"]

# How long a learned partition is trusted without a miss: it also picks up holders that came back.
REFRESH_S = 30.0
# A miss is learned again at most this often per partition (and a table the listing lacked is asked
# for again no sooner): a partition whose holders cannot serve costs at most one lookup per period.
RETRY_S = 1.0
# A holder that could not be reached is not chosen for this long.
DOWN_S = 5.0


@dataclass(frozen=True, slots=True)
class Holder:
    """One replica of a partition as the key-location answer describes it."""

    server: int
    http: str | None  # host:port of its HTTP API; None when it has none
    role: Role
    alive: bool
    state: str | None
    offset_lag: int | None  # None: no report yet


@dataclass(frozen=True, slots=True)
class PartitionHolders:
    table: str
    partition: int
    holders: tuple[Holder, ...]  # the active first, then standbys and warmups
    learned_at: float

    @staticmethod
    def from_json(body: Mapping[str, Any], now: float) -> PartitionHolders:
        """GET /v1/tables/{table}/keys's answer (raises KeyError, TypeError or ValueError if malformed)."""

        def holder(item: Mapping[str, Any], role: Role) -> Holder:
            lag = item.get("offset_lag")
            return Holder(
                int(item["server"]),
                None if item.get("http") is None else str(item["http"]),
                role,
                bool(item.get("alive", False)),
                None if item.get("state") is None else str(item["state"]),
                None if lag is None else int(lag),
            )

        active = body.get("active")
        holders = (
            *(() if active is None else (holder(active, "active"),)),
            *(holder(item, "standby") for item in body.get("standbys", ())),
            *(holder(item, "warmup") for item in body.get("warmups", ())),
        )
        return PartitionHolders(str(body["table"]), int(body["partition"]), holders, now)


def choose(
    holders: PartitionHolders, *, max_lag: int | None, standby_reads: bool, down: Container[str] = ()
) -> Holder | None:
    """The holder to send a lookup to: the live active (held to `max_lag` only while restoring, as the
    servers' router holds it), else the live standby or warmup within `max_lag` (None: unbounded) with the
    lowest lag, those with no lag reported after the others, lower server id on equal lags. Holders without
    an HTTP address, not alive in the answering server's view, or in `down` are never chosen. None: no
    holder qualifies (the caller sends the query its usual way)."""
    qualified: list[Holder] = []
    for h in holders.holders:
        if h.http is None or not h.alive or h.http in down:
            continue
        judged = h.role != "active" or h.state == "restoring"
        if h.role != "active" and not standby_reads:
            continue
        if judged and max_lag is not None and h.offset_lag is not None and h.offset_lag > max_lag:
            continue
        qualified.append(h)
    if not qualified:
        return None
    return min(
        qualified,
        key=lambda h: (h.role != "active", h.offset_lag is None, h.offset_lag or 0, h.server),
    )


def table_infos(listing: list[dict[str, Any]]) -> dict[str, TableInfo]:
    """GET /v1/tables's entries as the planner's TableInfo (placement and ids are not needed to plan).
    A table with a key type this client does not know is left out (never routed)."""
    out: dict[str, TableInfo] = {}
    for entry in listing:
        columns = []
        for column in entry["key_columns"]:
            kind = key_type_named(str(column["type"]))
            if kind is None:
                break
            columns.append(KeyColumn(str(column["name"]), kind))
        else:
            lag = entry.get("acceptable_lag")
            name = str(entry["name"])
            out[name] = TableInfo(
                name,
                0,
                int(entry["partitions"]),
                int(entry.get("standby_replicas", 0)),
                tuple(columns),
                None if lag is None else int(lag),
            )
    return out


@dataclass(frozen=True, slots=True)
class Target:
    """A query that reads one partition of one table: where it goes once its holders are known."""

    table: TableInfo
    partition: int
    key: tuple[KeyValue, ...]  # one of its keys, decoded: what the key-location lookup names
    max_lag: int | None
    standby_reads: bool


@dataclass(frozen=True, slots=True)
class Lookup:
    """Ask any server (the client's usual walk) `path`: the tables listing, or where a key lives."""

    path: str
    kind: Literal["tables", "holders"]


@dataclass(frozen=True, slots=True)
class Send:
    """Send the query to this holder."""

    http: str
    partition: int
    table: str
    kind: Literal["send"] = "send"


Step: TypeAlias = Lookup | Send


@dataclass
class KeyRouter:
    """The cache and the rules; one per client. `refresh_s`, `retry_s`, `down_s`: see the module doc."""

    refresh_s: float = REFRESH_S
    retry_s: float = RETRY_S
    down_s: float = DOWN_S
    tables: dict[str, TableInfo] = field(default_factory=dict)
    holders: dict[tuple[str, int], PartitionHolders] = field(default_factory=dict)
    # What was asked for last, and when: a miss is not asked for again within retry_s.
    _asked: dict[object, float] = field(default_factory=dict)
    _down: dict[str, float] = field(default_factory=dict)  # http -> until

    def start(self, body: Mapping[str, Any]) -> Routing | None:
        """The routing of one /v1/query body; None when it cannot be routed (not a lookup, bad SQL: the
        server words the error)."""
        sql = body.get("sql")
        if not isinstance(sql, str):
            return None
        try:
            query = parse(sql)
        except QueryError:
            return None
        if not query.conditions:  # a scan reads every partition
            return None
        return Routing(self, query, body)

    def down(self, now: float) -> frozenset[str]:
        # A blocking Client may be shared by threads: copy the items in one step, and pop what may be gone.
        marked = tuple(self._down.items())
        for http, until in marked:
            if until <= now:
                self._down.pop(http, None)
        return frozenset(http for http, until in marked if until > now)

    def mark_down(self, http: str, now: float) -> None:
        self._down[http] = now + self.down_s

    def forget(self, table: str, partition: int) -> None:
        self.holders.pop((table, partition), None)

    def may_ask(self, what: object, now: float) -> bool:
        asked = self._asked.get(what)
        if asked is not None and now - asked < self.retry_s:
            return False
        self._asked[what] = now
        return True


class Routing:
    """One query's way to a holder: `next` says what to do, the other methods take what came of it."""

    def __init__(self, router: KeyRouter, query: PullQuery, body: Mapping[str, Any]) -> None:
        self._router = router
        self._query = query
        self._body = body
        self._sent: Send | None = None
        self._target_found: Target | None = None  # planned once the table is known
        self._asked_tables = False
        self._asked_holders = False

    def next(self, now: float) -> Step | None:
        """The next step, or None: send the query the usual way."""
        router = self._router
        target = self._target(now)
        if target is None or isinstance(target, Lookup):
            return target
        key = (target.table.name, target.partition)
        cached = router.holders.get(key)
        if cached is not None and now - cached.learned_at >= router.refresh_s:
            cached = None
        if cached is None:
            if self._asked_holders or not router.may_ask(key, now):
                return None
            self._asked_holders = True
            return Lookup(_key_path(target.table, target.key), "holders")
        chosen = choose(
            cached, max_lag=target.max_lag, standby_reads=target.standby_reads, down=router.down(now)
        )
        if chosen is None or chosen.http is None:
            return None
        self._sent = Send(chosen.http, target.partition, target.table.name)
        return self._sent

    def _target(self, now: float) -> Target | Lookup | None:
        if self._target_found is not None:
            return self._target_found
        router = self._router
        try:
            table = find_table(router.tables, self._query.table)
        except QueryError:
            if self._asked_tables or not router.may_ask(("tables", self._query.table.casefold()), now):
                return None
            self._asked_tables = True
            return Lookup("/v1/tables", "tables")
        try:
            planned = plan(self._query, table)
        except QueryError:
            return None
        access = planned.access
        if not isinstance(access, KeyLookup) or not access.keys or len(set(access.partitions)) != 1:
            return None
        max_lag = self._body.get("max_lag", table.acceptable_lag)
        self._target_found = Target(
            table,
            access.partitions[0],
            decode_key(access.keys[0]),
            max_lag if isinstance(max_lag, int) else None,
            self._body.get("standby_reads", True) is not False,
        )
        return self._target_found

    def learned(self, step: Lookup, answer: Any, now: float) -> None:
        """What a lookup answered (the decoded body; malformed answers are ignored)."""
        router = self._router
        try:
            if step.kind == "tables":
                router.tables = table_infos(list(answer["tables"]))
                return
            holders = PartitionHolders.from_json(answer, now)
        except (KeyError, TypeError, ValueError):
            return
        target = self._target(now)
        if isinstance(target, Target) and target.partition != holders.partition:
            # The server places the key elsewhere: its table is not the one this map knows.
            router.tables.pop(target.table.name, None)
            return
        router.holders[(holders.table, holders.partition)] = holders

    def unreachable(self, now: float) -> None:
        """The holder the query was sent to could not be reached (or did not answer in time)."""
        if self._sent is not None:
            self._router.mark_down(self._sent.http, now)
            self._router.forget(self._sent.table, self._sent.partition)

    def failed(self) -> None:
        """The holder answered with an error: the query goes the usual way, the partition is learned again."""
        if self._sent is not None:
            self._router.forget(self._sent.table, self._sent.partition)

    def served(self, coordinator: int | None, served_by: Mapping[int, int]) -> None:
        """The holder answered: `served_by` maps partitions read to the server that read them. A forward
        (or another partition than computed) means the map is stale."""
        sent = self._sent
        if sent is None:
            return
        if sent.partition not in served_by and served_by:
            self._router.tables.pop(sent.table, None)
            self._router.forget(sent.table, sent.partition)
        elif served_by.get(sent.partition, coordinator) != coordinator:
            self._router.forget(sent.table, sent.partition)


def _key_path(table: TableInfo, key: tuple[KeyValue, ...]) -> str:
    """GET /v1/tables/{table}/keys?col=v&...: each value as the text the server reads as its column's type."""
    params = [(column.name, _text(value)) for column, value in zip(table.key_columns, key, strict=True)]
    name = urllib.parse.quote(table.name, safe="")
    return f"/v1/tables/{name}/keys?{urllib.parse.urlencode(params)}"


def _text(value: KeyValue) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, float):
        return repr(value)
    if value is None:
        return ""
    if isinstance(value, int | str):
        return str(value)
    return value.isoformat()  # a datetime, naive in UTC as decode_key gives it

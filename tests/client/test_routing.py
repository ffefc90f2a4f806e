"""Client-side key routing (client/routing.py): the pure choice of a holder, the cache's rules, and both
clients' walk against a fake cluster (httpx.MockTransport): lookups go straight to a holder, a stale map
costs at most one extra hop, and a query never fails for the routing's sake."""

from __future__ import annotations

import asyncio
import datetime as dt
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

import hotstate
from hotstate.client.routing import (
    Holder,
    KeyRouter,
    Lookup,
    PartitionHolders,
    Send,
    choose,
    table_infos,
)
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.protocol.keys import KeyValue, encode_key, partition_for
from hotstate.server.http.key_location import encoded_key


def _holders(*holders: Holder) -> PartitionHolders:
    return PartitionHolders("t", 0, holders, 0.0)


def _h(
    server: int,
    role: str = "standby",
    *,
    lag: int | None = 0,
    alive: bool = True,
    state: str | None = "active",
    http: str | None = "default",
) -> Holder:
    address = f"h{server}:8080" if http == "default" else http
    return Holder(server, address, role, alive, state, lag)  # type: ignore[arg-type]


def test_the_live_active_is_chosen_whatever_the_standbys_lags() -> None:
    found = choose(
        _holders(_h(1, "active", lag=50), _h(2, lag=0), _h(3, lag=0)), max_lag=10, standby_reads=True
    )
    assert found is not None and found.server == 1


def test_without_the_active_the_freshest_live_standby_within_the_bound_is_chosen() -> None:
    holders = _holders(
        _h(1, "active", alive=False), _h(2, lag=30), _h(3, lag=5), _h(4, lag=1, alive=False), _h(5, lag=90)
    )
    chosen = choose(holders, max_lag=50, standby_reads=True)
    assert chosen is not None and chosen.server == 3
    # The holder the client found unreachable is passed over like a dead one.
    chosen = choose(holders, max_lag=50, standby_reads=True, down={"h3:8080"})
    assert chosen is not None and chosen.server == 2
    # Beyond the bound: none.
    assert choose(holders, max_lag=2, standby_reads=True) is None
    # No bound: the freshest.
    chosen = choose(holders, max_lag=None, standby_reads=True, down={"h3:8080", "h2:8080"})
    assert chosen is not None and chosen.server == 5


def test_actives_only_unreported_lags_last_and_holders_without_an_address() -> None:
    holders = _holders(_h(1, "active", http=None), _h(2, lag=None), _h(3, "warmup", lag=4))
    assert choose(holders, max_lag=None, standby_reads=False) is None
    chosen = choose(holders, max_lag=10, standby_reads=True)
    assert chosen is not None and chosen.server == 3
    chosen = choose(holders, max_lag=10, standby_reads=True, down={"h3:8080"})
    assert chosen is not None and chosen.server == 2  # its own server checks its lag on arrival


def test_a_restoring_active_is_held_to_the_bound() -> None:
    holders = _holders(_h(1, "active", lag=500, state="restoring"), _h(2, lag=3))
    chosen = choose(holders, max_lag=100, standby_reads=True)
    assert chosen is not None and chosen.server == 2
    chosen = choose(holders, max_lag=None, standby_reads=True)
    assert chosen is not None and chosen.server == 1


@pytest.mark.parametrize(
    ("kind", "sql_type", "value"),
    [
        (KeyType.STRING, "STRING", "a b/&=?é"),
        (KeyType.INT, "BIGINT", -(2**63)),
        (KeyType.FLOAT, "DOUBLE", 0.1),
        (KeyType.BOOL, "BOOLEAN", False),
        (KeyType.BYTES, "BYTES", b"\x00\xff"),
        (KeyType.TIMESTAMP, "TIMESTAMP", dt.datetime(2026, 1, 2, 3, 4, 5, 6)),
    ],
)
def test_the_key_location_lookup_names_the_key_the_server_encodes(
    kind: KeyType, sql_type: str, value: KeyValue
) -> None:
    """The lookup's text of each key type is read back by the server's own key-location parsing as the
    same encoded key the query's plan hashes."""
    listing = [{"name": "t", "key_columns": [{"name": "k", "type": sql_type}], "partitions": 7}]
    router = KeyRouter(tables=table_infos(listing))
    literal = {
        KeyType.STRING: "'a b/&=?é'",
        KeyType.INT: "-9223372036854775808",
        KeyType.FLOAT: "0.1",
        KeyType.BOOL: "FALSE",
        KeyType.BYTES: "X'00ff'",
        KeyType.TIMESTAMP: "TIMESTAMP '2026-01-02 03:04:05.000006'",
    }[kind]
    routing = router.start({"sql": f"SELECT * FROM t WHERE k = {literal}"})
    assert routing is not None
    step = routing.next(0.0)
    assert isinstance(step, Lookup) and step.kind == "holders"
    path, _, query = step.path.partition("?")
    assert path == "/v1/tables/t/keys"
    params = dict(urllib.parse.parse_qsl(query, keep_blank_values=True))
    table = router.tables["t"]
    assert table.key_columns == (KeyColumn("k", kind),)
    assert encoded_key(table, None, params) == encode_key((value,))


def _location(partition: int, active: int, standbys: tuple[int, ...] = ()) -> dict[str, Any]:
    def holder(node: int) -> dict[str, Any]:
        return {"server": node, "http": f"h{node}:8080", "alive": True, "state": "active", "offset_lag": 0}

    return {
        "table": "t",
        "partition": partition,
        "active": holder(active),
        "standbys": [holder(n) for n in standbys],
        "warmups": [],
    }


def test_a_forward_a_down_holder_or_an_error_makes_the_partition_learned_again_at_most_once_a_period() -> (
    None
):
    listing = [{"name": "t", "key_columns": [{"name": "k", "type": "STRING"}], "partitions": 4}]
    router = KeyRouter(retry_s=1.0, refresh_s=30.0)
    body = {"sql": "SELECT * FROM t WHERE k = 'x'"}
    partition = partition_for(encode_key(("x",)), 4)

    def walk(now: float) -> tuple[list[Lookup], Send | None, Any]:
        routing = router.start(body)
        assert routing is not None
        lookups: list[Lookup] = []
        while (step := routing.next(now)) is not None:
            if isinstance(step, Send):
                return lookups, step, routing
            lookups.append(step)
            answer = {"tables": listing} if step.kind == "tables" else _location(partition, 2, (3,))
            routing.learned(step, answer, now)
        return lookups, None, routing

    lookups, sent, routing = walk(0.0)
    assert [s.kind for s in lookups] == ["tables", "holders"] and sent == Send("h2:8080", partition, "t")
    routing.served(2, {partition: 2})  # served where it landed: kept
    assert walk(0.5)[:2] == ([], sent)
    # Forwarded (the active moved): learned again, but not within retry_s of the last lookup.
    walk(0.6)[2].served(2, {partition: 3})
    assert walk(0.7)[:2] == ([], None)
    lookups, sent, routing = walk(1.1)
    assert [s.kind for s in lookups] == ["holders"] and sent == Send("h2:8080", partition, "t")
    # Unreachable: the holder is down for down_s and its partition learned again; the standby is chosen.
    routing.unreachable(1.2)
    lookups, sent, routing = walk(2.5)
    assert [s.kind for s in lookups] == ["holders"] and sent == Send("h3:8080", partition, "t")
    # An error answer forgets the partition too.
    routing.failed()
    assert walk(2.6)[:2] == ([], None)
    # An entry older than refresh_s is learned again; a down holder is chosen again after down_s.
    walk(3.6)
    lookups, sent, _ = walk(40.0)
    assert [s.kind for s in lookups] == ["holders"] and sent == Send("h2:8080", partition, "t")


def test_a_partition_other_than_computed_relearns_the_table() -> None:
    listing = [{"name": "t", "key_columns": [{"name": "k", "type": "STRING"}], "partitions": 4}]
    router = KeyRouter(tables=table_infos(listing))
    routing = router.start({"sql": "SELECT * FROM t WHERE k = 'x'"})
    assert routing is not None
    step = routing.next(0.0)
    assert isinstance(step, Lookup)
    wrong = (partition_for(encode_key(("x",)), 4) + 1) % 4
    routing.learned(step, _location(wrong, 2), 0.0)
    assert router.tables == {} and router.holders == {}


@pytest.mark.parametrize(
    "sql",
    [
        "SELECT * FROM t",  # every partition
        "SELECT * FROM t WHERE k > 'a'",  # a range: every partition
        "SELECT * FROM t WHERE",  # not SQL: the server says why
        "SELECT * FROM nosuch WHERE k = 'a'",  # a table the listing lacks
    ],
)
def test_what_is_not_a_lookup_of_one_partition_is_not_routed(sql: str) -> None:
    listing = [{"name": "t", "key_columns": [{"name": "k", "type": "STRING"}], "partitions": 4}]
    router = KeyRouter(tables=table_infos(listing))
    routing = router.start({"sql": sql})
    if routing is not None:
        step = routing.next(0.0)
        if isinstance(step, Lookup):  # the unknown table: the listing is asked for once
            assert step.kind == "tables"
            routing.learned(step, {"tables": listing}, 0.0)
            step = routing.next(0.0)
        assert step is None


# --- both clients against a fake cluster ------------------------------------------------------------------


@dataclass
class FakeCluster:
    """Three servers h1..h3:8080 and table t (4 partitions), partition p held by server p % 3 + 1 (active)
    and the next one (standby). Any server answers a query, forwarding it to the active."""

    owners: dict[int, int] = field(default_factory=lambda: {p: p % 3 + 1 for p in range(4)})
    unreachable: set[str] = field(default_factory=set)
    failing: set[str] = field(default_factory=set)  # answer 503
    requests: list[tuple[str, str, str]] = field(default_factory=list)  # (server, method, path)

    def handle(self, request: httpx.Request) -> httpx.Response:
        server = f"{request.url.host}:{request.url.port}"
        self.requests.append((server, request.method, request.url.path))
        if server in self.unreachable:
            raise httpx.ConnectError("[Errno 111] Connection refused", request=request)
        if server in self.failing:
            return httpx.Response(503, json={"error_code": 50300, "message": "no replica"})
        node = int(server[1])
        if request.url.path == "/v1/tables":
            return httpx.Response(200, json={"tables": [self.table()]})
        if request.url.path == "/v1/tables/t/keys":
            key = encode_key((request.url.params["k"],))
            partition = partition_for(key, 4)
            return httpx.Response(200, json=self.location(partition))
        assert request.url.path == "/v1/query", request.url
        sql = __import__("json").loads(request.content)["sql"]
        value = sql.split("'")[1]
        partition = partition_for(encode_key((value,)), 4)
        return httpx.Response(
            200,
            json={
                "query_id": "q",
                "columns": ["k"],
                "rows": [[value]],
                "partitions": [
                    {
                        "partition": partition,
                        "served_by": self.owners[partition],
                        "state": "active",
                        "offset_lag": 0,
                        "position": 1,
                    }
                ],
                "served_locally": node,
            },
        )

    def table(self) -> dict[str, Any]:
        return {"name": "t", "key_columns": [{"name": "k", "type": "STRING"}], "partitions": 4}

    def location(self, partition: int) -> dict[str, Any]:
        active = self.owners[partition]
        return _location(partition, active, (active % 3 + 1,)) | {
            "active": {
                "server": active,
                "http": f"h{active}:8080",
                "alive": f"h{active}:8080" not in self.unreachable,
                "state": "active",
                "offset_lag": 0,
            }
        }

    def queries(self) -> list[str]:
        return [server for server, method, _ in self.requests if method == "POST"]

    def lookups(self) -> list[str]:
        return [path for _, method, path in self.requests if method == "GET"]


def _keys() -> dict[int, str]:
    """One key per partition of t."""
    found: dict[int, str] = {}
    for i in range(100):
        found.setdefault(partition_for(encode_key((f"k{i}",)), 4), f"k{i}")
    assert len(found) == 4
    return found


@pytest.fixture
def cluster() -> Iterator[FakeCluster]:
    yield FakeCluster()


def test_with_routing_each_lookup_goes_straight_to_the_active(cluster: FakeCluster) -> None:
    keys = _keys()
    with hotstate.Client("h1:8080", routing=True, transport=httpx.MockTransport(cluster.handle)) as client:
        for partition, key in keys.items():
            for _ in range(3):
                result = client.query(f"SELECT * FROM t WHERE k = '{key}'")
                assert result.rows == [[key]] and result.server == f"h{cluster.owners[partition]}:8080"
                assert result.coordinator == result.partitions[0].served_by  # not forwarded
        # One listing, one key location per partition, every query where its partition's active is.
        assert cluster.lookups() == ["/v1/tables"] + ["/v1/tables/t/keys"] * 4
        assert cluster.queries() == [f"h{cluster.owners[p]}:8080" for p in keys for _ in range(3)]
        # Not a lookup of one partition: the usual way, to the server given.
        cluster.requests.clear()
        client.query("SELECT * FROM t WHERE k IN ('k0', 'k1', 'k2', 'k3', 'k4', 'k5', 'k6')")
        assert cluster.queries() == ["h1:8080"] and cluster.lookups() == []


def test_without_routing_nothing_changes(cluster: FakeCluster) -> None:
    with hotstate.Client("h1:8080", transport=httpx.MockTransport(cluster.handle)) as client:
        for key in _keys().values():
            assert client.query(f"SELECT * FROM t WHERE k = '{key}'").server == "h1:8080"
    assert cluster.lookups() == [] and set(cluster.queries()) == {"h1:8080"}


def test_a_moved_active_costs_one_forward_then_the_new_one_is_asked(cluster: FakeCluster) -> None:
    keys = _keys()
    partition, key = next((p, k) for p, k in keys.items() if cluster.owners[p] == 2)
    router_retry = 0.0  # learn again at once, so the test needs no clock
    with hotstate.Client("h1:8080", routing=True, transport=httpx.MockTransport(cluster.handle)) as client:
        assert client._router is not None
        client._router.retry_s = router_retry
        sql = f"SELECT * FROM t WHERE k = '{key}'"
        assert client.query(sql).server == "h2:8080"
        cluster.owners[partition] = 3
        moved = client.query(sql)  # h2 forwards it: answered, and the partition is forgotten
        assert moved.server == "h2:8080" and moved.partitions[0].served_by == 3
        cluster.requests.clear()
        assert client.query(sql).server == "h3:8080"
        assert cluster.lookups() == ["/v1/tables/t/keys"] and cluster.queries() == ["h3:8080"]


@pytest.mark.parametrize("failure", ["unreachable", "failing"])
def test_a_holder_that_cannot_answer_costs_one_attempt_then_the_usual_way_answers(
    cluster: FakeCluster, failure: str
) -> None:
    key = next(k for p, k in _keys().items() if cluster.owners[p] == 2)
    with hotstate.Client("h1:8080", routing=True, transport=httpx.MockTransport(cluster.handle)) as client:
        sql = f"SELECT * FROM t WHERE k = '{key}'"
        assert client.query(sql).server == "h2:8080"
        getattr(cluster, failure).add("h2:8080")
        cluster.requests.clear()
        result = client.query(sql)
        assert result.rows == [[key]] and result.server == "h1:8080"
        assert cluster.queries() == ["h2:8080", "h1:8080"]
        # Within retry_s the partition is not asked for again: the usual way, one hop.
        cluster.requests.clear()
        assert client.query(sql).server == "h1:8080"
        assert cluster.requests == [("h1:8080", "POST", "/v1/query")]


def test_lookups_that_fail_never_fail_the_query(cluster: FakeCluster) -> None:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return httpx.Response(500, text="broken")
        return cluster.handle(request)

    with hotstate.Client("h1:8080", routing=True, transport=httpx.MockTransport(handle)) as client:
        assert client.query("SELECT * FROM t WHERE k = 'k1'").server == "h1:8080"
        assert client.query("SELECT * FROM t WHERE k = 'k2'").server == "h1:8080"


def test_the_async_client_routes_the_same_way(cluster: FakeCluster) -> None:
    keys = _keys()

    async def handle(request: httpx.Request) -> httpx.Response:
        return cluster.handle(request)

    async def run() -> list[str]:
        transport = httpx.MockTransport(handle)
        async with hotstate.AsyncClient("h1:8080", routing=True, transport=transport) as client:
            return [(await client.query(f"SELECT * FROM t WHERE k = '{k}'")).server for k in keys.values()]

    assert asyncio.run(run()) == [f"h{cluster.owners[p]}:8080" for p in keys]
    assert cluster.lookups() == ["/v1/tables"] + ["/v1/tables/t/keys"] * 4

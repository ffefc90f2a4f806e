"""The coordinator's rounds: one request per server per round, a partition refused or unanswered goes to
its next candidate, and the error names every replica tried. Peers are in-memory stand-ins that answer
QueryPartitionsRequest the way a server does (or fail the way a transport does)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping

import pytest

from hotstate.controller.image import MetadataImage, PartitionInfo, TableInfo
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.protocol.keys import encode_key, partition_for
from hotstate.protocol.rows import encode_row
from hotstate.query.execute import QueryError
from hotstate.query.tokens import cluster_tag, decode, encode
from hotstate.replica.messages import (
    PartitionQueryResponse,
    QueryPartitionsRequest,
    QueryPartitionsResponse,
    ReplicaError,
)
from hotstate.routing.attempts import UNCONNECTED_ATTEMPT_S
from hotstate.routing.hedging import HedgeConfig, HedgePolicy
from hotstate.routing.lags import LagTable
from hotstate.rpc import NotConnected, RpcTimeout
from hotstate.server.coordinator import CURRENT_USER, ClusterView, Coordinator, request_soon_of
from hotstate.server.serving import LocalReads

PARTITIONS = 4
TABLE = TableInfo("clicks", 1, PARTITIONS, 1, (KeyColumn("user", KeyType.STRING),), acceptable_lag=None)
# Actives on 2 and 3, each partition's standby on the other one; the coordinator (1) holds nothing.
PLACEMENT = {0: (2, 3), 1: (3, 2), 2: (2, 3), 3: (3, 2)}


def _image() -> MetadataImage:
    parts = tuple(
        PartitionInfo(1, p, (active, standby), active, (), 1, (active, standby))
        for p, (active, standby) in sorted(PLACEMENT.items())
    )
    return MetadataImage(1, {}, {"clicks": TABLE}, {1: parts})


USERS = [f"u{i}" for i in range(40)]
CLUSTER = "rounds"
TAG = cluster_tag(CLUSTER)


def _partition(user: str) -> int:
    return partition_for(encode_key((user,)), PARTITIONS)


class Peers:
    """Answers like servers holding every row; `refuse`, `timeout` and `down` make a node fail."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, tuple[int, ...]]] = []
        self.timeouts: list[float] = []  # what each request was given
        self.refuse: set[int] = set()
        self.timeout: set[int] = set()
        self.down: set[int] = set()
        self.slow: set[int] = set()  # alive but paused: answers only after the request's timeout
        self.state: dict[int, str] = {}  # the replica state a node answers in (default "active")
        self.positions: dict[int, int] = {}  # each node's store position (default 10)
        self.log_end = 10**6  # what the actives hold
        self.users: list[str] = []  # each request's user, as the coordinator's auth admitted it

    async def request(self, node: int, message: object, timeout_s: float) -> object:
        assert isinstance(message, QueryPartitionsRequest)
        self.calls.append((node, tuple(p.partition for p in message.parts)))
        self.timeouts.append(timeout_s)
        self.users.append(message.user)
        if node in self.slow:
            await asyncio.sleep(timeout_s)
            raise RpcTimeout(f"node {node} took longer than {timeout_s:.3f} s")
        if node in self.down:
            raise NotConnected(f"node {node} is down")
        if node in self.timeout:
            raise RpcTimeout(f"node {node} took longer than {timeout_s:.3f} s")
        answers = []
        for part in message.parts:
            if node in self.refuse:
                answers.append(PartitionQueryResponse(ReplicaError.LAG_OVER_BOUND, "lag 9 > bound 0"))
                continue
            position = self.positions.get(node, 10)
            if part.min_position > self.log_end and PLACEMENT[part.partition][0] == node:
                answers.append(PartitionQueryResponse(ReplicaError.TOKEN_AHEAD, "beyond the log end"))
                continue
            if part.min_position > position:
                answers.append(
                    PartitionQueryResponse(
                        ReplicaError.BEHIND_TOKEN, f"at {position}, wants {part.min_position}"
                    )
                )
                continue
            items = tuple(
                sorted(
                    (encode_key((u,)), encode_row({"user": u, "n": int(u[1:])}))
                    for u in USERS
                    if _partition(u) == part.partition and encode_key((u,)) in part.keys
                )
            )
            state = self.state.get(node, "active")
            answers.append(PartitionQueryResponse(ReplicaError.NONE, "", state, position, 0, items))
        return QueryPartitionsResponse(tuple(answers))


def _service(
    peers: Peers,
    forwards: list[str] | None = None,
    hedging: HedgePolicy | None = None,
    table: TableInfo = TABLE,
    down: frozenset[int] = frozenset(),
) -> Coordinator:
    image = dataclasses.replace(_image(), tables={"clicks": table})
    return _coordinator(
        ClusterView(lambda: image, LagTable(), lambda node: node not in down),
        peers,
        on_forward=(forwards.append if forwards is not None else lambda outcome: None),
        hedging=hedging,
    )


def _coordinator(
    cluster: ClusterView,
    peers: Peers,
    on_forward: Callable[[str], None] = lambda outcome: None,
    hedging: HedgePolicy | None = None,
) -> Coordinator:
    """A coordinator on server 1, which holds no replica: every partition is forwarded to `peers`."""
    reads = LocalReads(
        1, image=cluster.image, replicas=dict, lags=cluster.lags, on_store_failure=lambda replica, error: None
    )
    return Coordinator(
        1,
        cluster,
        reads,
        request_soon_of(peers.request),
        hedging=hedging,
        cluster_id=CLUSTER,
        on_forward=on_forward,
    )


def _in_list(users: list[str]) -> str:
    return "SELECT * FROM clicks WHERE user IN (" + ", ".join(f"'{u}'" for u in users) + ")"


def test_one_request_per_server_carries_all_its_partitions() -> None:
    peers = Peers()
    forwards: list[str] = []
    result = asyncio.run(_service(peers, forwards).execute(_in_list(USERS)))
    assert [row[0] for row in result.rows] == sorted(USERS)
    assert sorted(node for node, _ in peers.calls) == [2, 3]  # one round, one request each
    assert dict(peers.calls) == {2: (0, 2), 3: (1, 3)}
    assert forwards == ["ok"] * PARTITIONS  # the metric still counts partitions
    assert [p.served_by for p in result.partitions] == [2, 3, 2, 3]


def test_forwarded_partitions_carry_the_user_the_coordinators_auth_admitted() -> None:
    peers = Peers()

    async def as_reader() -> None:
        CURRENT_USER.set("reader")  # what the auth guard does in the request's task
        await _service(peers).execute(_in_list(USERS))

    asyncio.run(as_reader())
    asyncio.run(_service(peers).execute(_in_list(USERS)))  # auth off: no user
    assert peers.users == ["reader", "reader", "", ""]


def test_partitions_a_server_refuses_go_to_their_next_candidate_in_one_more_request() -> None:
    peers = Peers()
    peers.refuse.add(2)
    forwards: list[str] = []
    result = asyncio.run(_service(peers, forwards).execute(_in_list(USERS)))
    assert [row[0] for row in result.rows] == sorted(USERS)
    # Round 1: 2 refuses 0 and 2; round 2: 3 (their standby) serves them in one request.
    assert peers.calls == [(2, (0, 2)), (3, (1, 3)), (3, (0, 2))]
    assert [p.served_by for p in result.partitions] == [3, 3, 3, 3]
    assert sorted(forwards) == ["ok"] * 4 + ["refused"] * 2


def test_an_answer_in_a_replica_state_this_version_does_not_know_goes_to_the_next_candidate() -> None:
    peers = Peers()
    peers.state[2] = "leader-ish"  # a peer of another version
    forwards: list[str] = []
    result = asyncio.run(_service(peers, forwards).execute(_in_list(USERS)))
    assert [row[0] for row in result.rows] == sorted(USERS)
    assert [p.served_by for p in result.partitions] == [3, 3, 3, 3]
    assert sorted(forwards) == ["error"] * 2 + ["ok"] * 4


def test_a_server_that_times_out_costs_its_partitions_one_try_each() -> None:
    peers = Peers()
    peers.timeout.add(3)
    result = asyncio.run(_service(peers).execute(_in_list(USERS)))
    assert [row[0] for row in result.rows] == sorted(USERS)
    assert peers.calls == [(2, (0, 2)), (3, (1, 3)), (2, (1, 3))]


def test_when_no_replica_can_serve_the_error_names_each_and_why() -> None:
    peers = Peers()
    peers.down.add(2)
    peers.refuse.add(3)
    with pytest.raises(QueryError) as error:
        asyncio.run(_service(peers).execute("SELECT * FROM clicks WHERE user = 'u1'"))
    assert error.value.kind == "unavailable"
    partition = _partition("u1")
    active, standby = PLACEMENT[partition]
    message = error.value.message
    assert f"clicks/{partition}" in message
    assert (
        f"{active} (active): unreachable (NotConnected)" in message
        or f"{active} (active): refused" in message
    )
    assert f"{standby} (standby): " in message


def test_standby_reads_off_never_asks_a_standby() -> None:
    peers = Peers()
    peers.refuse.add(2)
    with pytest.raises(QueryError, match="standby reads are off"):
        asyncio.run(_service(peers).execute(_in_list(USERS), {"standby_reads": False}))
    assert all(node == 2 for node, parts in peers.calls if 0 in parts or 2 in parts)


def test_unknown_properties_are_refused_with_the_known_ones() -> None:
    with pytest.raises(QueryError, match=r"unknown property 'max_lags'; known: .*max_lag") as error:
        asyncio.run(_service(Peers()).execute("SELECT * FROM clicks WHERE user = 'u1'", {"max_lags": 3}))
    assert error.value.kind == "bad_request"
    # What ksqlDB's clients send with every statement is accepted.
    result = asyncio.run(
        _service(Peers()).execute(
            "SELECT * FROM clicks WHERE user = 'u1'", {"ksql.streams.auto.offset.reset": "earliest"}
        )
    )
    assert result.rows == [["u1", 1]]


def test_a_bound_beyond_what_the_wire_carries_is_a_clear_error() -> None:
    for bound in (2**63, 2**64, "1" * 30):
        with pytest.raises(QueryError, match=r"max_lag=.*from 0 to 9223372036854775807") as error:
            asyncio.run(
                _service(Peers()).execute("SELECT * FROM clicks WHERE user = 'u1'", {"max_lag": bound})
            )
        assert error.value.kind == "bad_request"
    result = asyncio.run(
        _service(Peers()).execute("SELECT * FROM clicks WHERE user = 'u1'", {"max_lag": 2**63 - 1})
    )
    assert result.rows == [["u1", 1]]


def test_a_slow_server_is_hedged_to_the_next_candidate_and_the_first_answer_wins() -> None:
    peers = Peers()
    peers.slow.add(2)
    forwards: list[str] = []
    policy = HedgePolicy(HedgeConfig(delay_floor_ms=5, delay_cap_ms=20))
    service = _service(peers, forwards, policy)

    async def run() -> tuple[object, float]:
        loop = asyncio.get_running_loop()
        started = loop.time()
        result = await service.execute(_in_list(USERS), {"timeout_ms": 5000})
        return result, loop.time() - started

    result, took = asyncio.run(run())
    assert [row[0] for row in result.rows] == sorted(USERS)  # type: ignore[attr-defined]
    # 2's partitions (0, 2) went to their standby 3 after the hedge delay, not after 2's timeout (2.5 s).
    assert (3, (0, 2)) in peers.calls
    assert [p.served_by for p in result.partitions] == [3, 3, 3, 3]  # type: ignore[attr-defined]
    assert forwards.count("hedged") == 2 and forwards.count("hedge_won") == 2
    assert took < 2.0
    assert policy.hedges == 1  # one hedge: both partitions in one request


def test_hedging_off_for_a_query_waits_for_the_slow_server() -> None:
    peers = Peers()
    peers.slow.add(2)
    forwards: list[str] = []
    service = _service(peers, forwards, HedgePolicy(HedgeConfig(delay_floor_ms=5, delay_cap_ms=20)))
    result = asyncio.run(service.execute(_in_list(USERS), {"timeout_ms": 1200, "hedging": False}))
    assert [row[0] for row in result.rows] == sorted(USERS)
    assert "hedged" not in forwards
    assert peers.calls == [(2, (0, 2)), (3, (1, 3)), (3, (0, 2))]  # the next round, after 2 timed out


def test_hedges_stop_when_the_budget_is_spent() -> None:
    peers = Peers()
    peers.slow.add(2)
    policy = HedgePolicy(HedgeConfig(delay_floor_ms=5, delay_cap_ms=20, max_percent=1, burst=1))
    service = _service(peers, None, policy)
    user = next(u for u in USERS if PLACEMENT[_partition(u)][0] == 2)  # its active is the slow server
    for _ in range(2):
        asyncio.run(service.execute(f"SELECT * FROM clicks WHERE user = '{user}'", {"timeout_ms": 1000}))
    assert policy.hedges == 1
    assert peers.calls.count((2, (_partition(user),))) == 2  # the second query waited for 2's timeout


def test_after_a_hedge_finds_a_slow_server_later_queries_try_the_others_first_without_a_hedge() -> None:
    peers = Peers()
    peers.slow.add(2)
    policy = HedgePolicy(HedgeConfig(delay_floor_ms=5, delay_cap_ms=20))
    service = _service(peers, None, policy)
    user = next(u for u in USERS if PLACEMENT[_partition(u)][0] == 2)
    partition = _partition(user)

    async def run() -> None:
        for _ in range(5):
            result = await service.execute(
                f"SELECT * FROM clicks WHERE user = '{user}'", {"timeout_ms": 5000}
            )
            assert [p.served_by for p in result.partitions] == [3]

    asyncio.run(run())
    assert policy.hedges == 1
    assert peers.calls.count((2, (partition,))) == 1  # the hedged forward still hangs: 2 counts as slow


def _token_for(user: str, position: int) -> str:
    return encode({(1, _partition(user)): position, (7, 0): 3}, TAG)  # table 7: another table, carried on


def test_a_token_skips_replicas_behind_it_and_the_answer_token_carries_it_on() -> None:
    peers = Peers()
    user = next(u for u in USERS if PLACEMENT[_partition(u)][0] == 2)
    peers.positions = {2: 50, 3: 90}  # the active is behind (it just took over), the standby is not
    result = asyncio.run(
        _service(peers).execute(
            f"SELECT * FROM clicks WHERE user = '{user}'", {"consistency_token": _token_for(user, 80)}
        )
    )
    assert [p.served_by for p in result.partitions] == [3]
    assert decode(result.consistency_token, TAG) == {(1, _partition(user)): 90, (7, 0): 3}


def test_when_every_replica_is_behind_the_token_the_query_waits_for_one_to_catch_up() -> None:
    peers = Peers()
    user = next(u for u in USERS if PLACEMENT[_partition(u)][0] == 2)
    peers.positions = {2: 50, 3: 60}

    async def run() -> object:
        async def apply_later() -> None:
            await asyncio.sleep(0.05)
            peers.positions[2] = 80

        catching_up = asyncio.create_task(apply_later())
        result = await _service(peers).execute(
            f"SELECT * FROM clicks WHERE user = '{user}'", {"consistency_token": _token_for(user, 80)}
        )
        await catching_up
        return result

    result = asyncio.run(run())
    assert [p.served_by for p in result.partitions] == [2]  # type: ignore[attr-defined]
    # And once the timeout passes with nobody there, the 503 names each replica's position. (At 100 ms a
    # loaded CI machine ran out of it before the standby was asked.)
    peers.positions = {2: 50, 3: 60}
    with pytest.raises(QueryError) as error:
        asyncio.run(
            _service(peers).execute(
                f"SELECT * FROM clicks WHERE user = '{user}'",
                {"consistency_token": _token_for(user, 80), "timeout_ms": 1000},
            )
        )
    assert error.value.kind == "unavailable"
    assert "at 50, wants 80" in error.value.message and "at 60, wants 80" in error.value.message


def test_a_paused_server_that_looks_down_holds_a_token_wait_no_longer_than_a_connect() -> None:
    """Tried as the last candidate while the live standby is behind the token, a server down by heartbeats
    and not answering (paused) gets as long as a connect, not the rest of the timeout: the standby, caught
    up meanwhile, answers (given the whole budget, the paused one made the query fail; half: a 5 s wait)."""
    peers = Peers()
    user = next(u for u in USERS if PLACEMENT[_partition(u)][0] == 2)
    peers.positions = {3: 60}
    peers.slow.add(2)

    async def run() -> object:
        async def apply_later() -> None:
            await asyncio.sleep(0.05)
            peers.positions[3] = 80

        catching_up = asyncio.create_task(apply_later())
        result = await _service(peers, down=frozenset({2})).execute(
            f"SELECT * FROM clicks WHERE user = '{user}'",
            {"consistency_token": _token_for(user, 80), "timeout_ms": 10_000},
        )
        await catching_up
        return result

    result = asyncio.run(run())
    assert [p.served_by for p in result.partitions] == [3]  # type: ignore[attr-defined]
    assert [node for node, _ in peers.calls] == [3, 2, 3]  # behind; the paused one; caught up
    assert peers.timeouts[1] == pytest.approx(UNCONNECTED_ATTEMPT_S)


@pytest.mark.parametrize(
    ("token", "message"),
    [
        ("hs1.!!!", "damaged"),
        ("v1.abc", "not a consistency token"),
        (encode({(1, 0): 5}, cluster_tag("another")), "another cluster"),
        (encode({(1, 9): 5}, TAG), "partition 9"),
        (42, "must be a string"),
    ],
)
def test_bad_tokens_are_a_clear_400(token: object, message: str) -> None:
    with pytest.raises(QueryError) as error:
        asyncio.run(
            _service(Peers()).execute("SELECT * FROM clicks WHERE user = 'u1'", {"consistency_token": token})
        )
    assert error.value.kind == "bad_request" and message in error.value.message


def test_a_token_from_beyond_the_log_end_is_a_400_not_a_wait() -> None:
    peers = Peers()
    user = next(u for u in USERS if PLACEMENT[_partition(u)][0] == 2)
    with pytest.raises(QueryError) as error:
        asyncio.run(
            _service(peers).execute(
                f"SELECT * FROM clicks WHERE user = '{user}'", {"consistency_token": _token_for(user, 10**7)}
            )
        )
    assert error.value.kind == "bad_request" and "beyond the log end" in error.value.message


def test_min_batch_reads_at_least_where_the_sinks_batch_left_every_partition() -> None:
    peers = Peers()
    user = next(u for u in USERS if PLACEMENT[_partition(u)][0] == 2)
    positions = [0] * PARTITIONS
    positions[_partition(user)] = 80
    table = dataclasses.replace(TABLE, batch_id=5, batch_positions=tuple(positions))
    peers.positions = {2: 50, 3: 90}  # the active has not applied batch 5 yet; its standby has
    sql = f"SELECT * FROM clicks WHERE user = '{user}'"
    for batch in (0, 5):
        result = asyncio.run(_service(peers, table=table).execute(sql, {"min_batch": batch}))
        assert [p.served_by for p in result.partitions] == [3]
    without = asyncio.run(_service(peers, table=table).execute(sql))
    assert [p.served_by for p in without.partitions] == [2]  # the batch asked for is what moved it
    with pytest.raises(QueryError) as error:
        asyncio.run(_service(peers, table=table).execute(sql, {"min_batch": 6, "timeout_ms": 50}))
    assert error.value.kind == "unavailable" and "batch 6" in error.value.message
    assert "last committed: 5" in error.value.message


def test_kept_routes_follow_every_change_of_liveness_and_lags() -> None:
    """With `alive_version`, the coordinator keeps each partition's route between queries: a server going
    down or a lag report must still reroute the very next query."""
    from hotstate.replica.messages import LagInfo

    peers = Peers()
    image = _image()  # one image throughout: its partitions are the kept routes' keys
    lags = LagTable()
    alive = {1, 2, 3}
    version = [0]
    service = _coordinator(
        ClusterView(lambda: image, lags, alive.__contains__, alive_version=lambda: version[0]), peers
    )
    first = [u for u in USERS if _partition(u) == 0][:2]

    def served_by(properties: dict[str, object] | None = None) -> list[int]:
        result = asyncio.run(service.execute(_in_list(first), properties))
        return [p.served_by for p in result.partitions]

    assert served_by() == [2] and served_by() == [2]  # the second from the kept route
    alive.discard(2)
    version[0] += 1
    assert served_by() == [3]  # the standby, at once
    assert served_by({"max_lag": 0}) == [3]

    def report(node: int, position: int, state: str) -> LagInfo:
        return LagInfo("clicks", 1, 0, state, position, 100, 100 - position, 1, 100, True)

    lags.update(2, [report(2, 100, "active")], now_ms=1)
    lags.update(3, [report(3, 40, "standby")], now_ms=1)  # 60 behind the end the active reported
    # The standby is over the bound: the active, silent by heartbeats, is tried anyway (a flap costs
    # nothing); when it is really gone, the error says both.
    assert served_by({"max_lag": 0}) == [2]
    peers.down.add(2)
    with pytest.raises(QueryError, match=r"lag 60 > bound 0; 2 \(active\): down, tried anyway: unreachable"):
        served_by({"max_lag": 0})
    peers.down.discard(2)
    assert served_by({"max_lag": 60}) == [3]
    alive.add(2)
    version[0] += 1
    assert served_by({"max_lag": 0}) == [2]


def test_a_query_without_timeout_ms_has_the_servers_default_budget() -> None:
    """query.timeout.ms: every forward of a query that gives no timeout_ms fits in the server's default
    (both the path with no properties and the one with others); a query's own timeout_ms still wins."""
    peers = Peers()
    service = _service(peers)
    service.default_timeout_ms = 600
    asyncio.run(service.execute(_in_list(USERS)))
    asyncio.run(service.execute(_in_list(USERS), {"hedging": False}))
    assert len(peers.timeouts) == 4 and all(t <= 0.6 for t in peers.timeouts), peers.timeouts
    peers.timeouts.clear()
    asyncio.run(service.execute(_in_list(USERS), {"timeout_ms": 5000}))
    assert max(peers.timeouts) > 0.6, peers.timeouts


def test_a_forward_to_every_partitions_last_candidate_sets_no_hedge_timer() -> None:
    """A hedge needs a next candidate: a partition with one replica is forwarded without a timer for one
    (issue 25: a timer per forward was part of a forwarded lookup's cost); with a standby it gets one."""

    def timers(placement: Mapping[int, tuple[int, ...]]) -> int:
        parts = tuple(
            PartitionInfo(1, p, replicas, replicas[0], (), 1, replicas)
            for p, replicas in sorted(placement.items())
        )
        image = MetadataImage(1, {}, {"clicks": TABLE}, {1: parts})
        service = _coordinator(ClusterView(lambda: image, LagTable(), lambda node: True), Peers())
        set_timers: list[float] = []

        async def run() -> None:
            loop = asyncio.get_running_loop()
            call_later = loop.call_later

            def counted(delay: float, callback: Callable[..., object], *args: object) -> asyncio.TimerHandle:
                set_timers.append(delay)
                return call_later(delay, callback, *args)

            loop.call_later = counted  # type: ignore[method-assign,assignment]
            result = await service.execute(_in_list(USERS))
            assert [row[0] for row in result.rows] == sorted(USERS)

        asyncio.run(run())
        return len(set_timers)

    assert timers({p: (active,) for p, (active, _) in PLACEMENT.items()}) == 0
    assert timers(PLACEMENT) == 2  # one per server asked, each with a standby to hedge to

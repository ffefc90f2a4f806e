"""Standbys are restored at once after server losses; max_warmup_replicas bounds only warmups for moves.

Kafka Streams (KIP-441) assigns every configured standby and uses `max.warmup.replicas` only for the extra
replicas that move tasks. Property: over any sequence of server losses and returns, with the assignor
applied after every step and restores that take one or more assignments to catch up, every assignment
gives every partition min(asked, live servers - 1 - its active's warmups) standbys, and no warmup starts
while it would take the cluster's warmups over the budget.

Lag model: a replica assigned in an assignment has caught up after `slow` assignments in which it was
assigned (1: by the next one); a replica no longer assigned loses its data, and so does every replica of
a server that is lost (it comes back empty).
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hotstate.assignor import Assignment, AssignorConfig, PartitionId, Server, Table, assign

from .helpers import RACKS, active_warmups

LIMIT = 10


@dataclass(frozen=True)
class Scenario:
    servers: list[Server]
    tables: list[Table]
    config: AssignorConfig
    slow: int
    # (server index, lost?) per step; every step is followed by one or more assignments.
    events: list[tuple[int, bool, int]]


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    n = draw(st.integers(2, 7))
    servers = [Server(f"s{i}", rack=RACKS[draw(st.integers(0, 2))]) for i in range(n)]
    tables = [
        Table(f"t{t}", draw(st.integers(1, 12)), draw(st.one_of(st.none(), st.integers(0, 3))))
        for t in range(draw(st.integers(1, 2)))
    ]
    config = AssignorConfig(
        acceptable_recovery_lag=LIMIT,
        max_warmup_replicas=draw(st.integers(1, 3)),
        num_standby_replicas=draw(st.integers(0, 3)),
        rack_aware_assignment_tags=draw(st.sampled_from([(), ("rack",)])),
        rack_aware_assignment_strategy=draw(st.sampled_from(["none", "min_traffic", "balance_subtopology"])),
    )
    events = draw(
        st.lists(st.tuples(st.integers(0, n - 1), st.booleans(), st.integers(1, 3)), min_size=1, max_size=6)
    )
    return Scenario(servers, tables, config, draw(st.integers(1, 2)), events)


class Cluster:
    """Live servers, the last assignment, and how far each replica has restored."""

    def __init__(self, scenario: Scenario) -> None:
        self.s = scenario
        self.live = list(scenario.servers)
        self.previous: Assignment | None = None
        self.progress: dict[tuple[PartitionId, str], int] = {}  # >= slow: caught up

    def lags(self) -> dict[PartitionId, dict[str, int]]:
        out: dict[PartitionId, dict[str, int]] = {}
        for (pid, server), done in self.progress.items():
            behind = self.s.slow - done
            out.setdefault(pid, {})[server] = 0 if behind <= 0 else LIMIT + 100 * behind
        return out

    def step(self) -> Assignment:
        known = self.lags()
        out = assign(self.live, self.s.tables, self.previous, known, self.s.config)
        check(self, out, known)
        progress = {}
        for pid, pa in out.partitions.items():
            for server in pa.replicas():
                key = (pid, server)
                # A partition with no state anywhere starts every replica empty and in sync.
                progress[key] = self.progress.get(key, 0) + 1 if known.get(pid) else self.s.slow
        self.progress = progress
        self.previous = out
        return out

    def lose(self, server: str) -> None:
        self.live = [x for x in self.live if x.id != server]
        self.progress = {k: v for k, v in self.progress.items() if k[1] != server}

    def bring_back(self, server: Server) -> None:
        if all(x.id != server.id for x in self.live):
            self.live.append(server)


def check(cluster: Cluster, out: Assignment, known: dict[PartitionId, dict[str, int]]) -> None:
    cfg = cluster.s.config
    asked = {
        t.name: cfg.num_standby_replicas if t.num_standby_replicas is None else t.num_standby_replicas
        for t in cluster.s.tables
    }
    warming = active_warmups(out)
    for pid, pa in out.partitions.items():
        # The active's warmup holds a copy already; every other live server is a standby's candidate.
        eligible = len(cluster.live) - 1 - len(warming[pid])
        want = min(asked[pid.table], eligible)
        assert len(pa.standbys) == want, (
            f"{pid}: {len(pa.standbys)} standbys, {want} possible ({len(cluster.live)} live): {pa}"
        )
    held = {
        pid: set(pa.replicas())
        for pid, pa in (cluster.previous.partitions if cluster.previous else {}).items()
    }
    warmups = [(pid, w) for pid, pa in out.partitions.items() if known.get(pid) for w in pa.warmups]
    started = [(pid, w) for pid, w in warmups if w not in held.get(pid, set())]
    # Warmups under way are never cut; a new one starts only while all of them fit in the budget.
    if started:
        assert len(warmups) <= cfg.max_warmup_replicas, f"warmups {warmups}, new {started}"


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios())
def test_after_any_losses_every_partition_has_its_standbys_at_once(scenario: Scenario) -> None:
    cluster = Cluster(scenario)
    cluster.step()
    for _ in range(2):
        cluster.step()
    for index, lost, rounds in scenario.events:
        server = scenario.servers[index]
        if lost and len(cluster.live) > 1:
            cluster.lose(server.id)
        elif not lost:
            cluster.bring_back(server)
        for _ in range(rounds):
            cluster.step()

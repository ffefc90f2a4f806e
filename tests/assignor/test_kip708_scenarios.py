"""The scenarios of KIP-708 (Kafka Streams' rack-aware standby task assignment): clients tagged with a
Kubernetes cluster and an availability zone."""

from __future__ import annotations

from collections import Counter

from hotstate.assignor import (
    Assignment,
    AssignorConfig,
    PartitionId,
    Placement,
    Server,
    Table,
    assign,
)

TAGS = ("cluster", "zone")


def client(cluster: int, zone: str) -> Server:
    return Server(f"c{cluster}-{zone}", tags={"cluster": f"k8s-cluster-{cluster}", "zone": f"az-{zone}"})


# The article's active tasks: 2_1 on c2-a, 2_0 on c2-b, 1_1 on c2-c, 2_2 on c1-a, 1_2 on c1-b, 1_0 on c1-c.
ARTICLE_ACTIVES = {
    PartitionId("2", 1): "c2-a",
    PartitionId("2", 0): "c2-b",
    PartitionId("1", 1): "c2-c",
    PartitionId("2", 2): "c1-a",
    PartitionId("1", 2): "c1-b",
    PartitionId("1", 0): "c1-c",
}


def run_article(servers: list[Server], standbys: int, actives: dict[PartitionId, str]) -> Assignment:
    prev = {pid: Placement(sid) for pid, sid in actives.items()}
    tables = sorted({pid.table for pid in actives})
    sizes = {t: 1 + max(pid.partition for pid in actives if pid.table == t) for t in tables}
    # The article places standbys next to running actives. Each restores, and the default warmup budget
    # does not hold one back: standbys are always assigned (issue 29).
    cfg = AssignorConfig(num_standby_replicas=standbys, rack_aware_assignment_tags=TAGS)
    return assign(servers, [Table(t, sizes[t]) for t in tables], prev, None, cfg)


def tags_of(servers: list[Server]) -> dict[str, tuple[str, str]]:
    return {s.id: (s.tags["cluster"], s.tags["zone"]) for s in servers}


def spreads(a: Assignment) -> dict[tuple[PartitionId, str], str | None]:
    return {(r.partition, r.server): r.spread for r in a.explanation.replicas if r.role == "standby"}


def test_six_clients_two_clusters_three_zones_one_standby_is_ideal() -> None:
    servers = [client(c, z) for c in (1, 2) for z in "abc"]
    out = run_article(servers, 1, ARTICLE_ACTIVES)
    where = tags_of(servers)
    for pid, pa in out.partitions.items():
        assert pa.active == ARTICLE_ACTIVES[pid]  # balanced and caught up: the actives stay
        (sb,) = pa.standbys
        assert where[sb][0] != where[pa.active][0] and where[sb][1] != where[pa.active][1]
        assert spreads(out)[(pid, sb)] == "ideal"
    # One standby per client: balanced as well as spread.
    assert Counter(pa.standbys[0] for pa in out.partitions.values()) == Counter({s.id: 1 for s in servers})


def test_two_standbys_the_second_spreads_by_zone_only() -> None:
    servers = [client(c, z) for c in (1, 2) for z in "abc"]
    out = run_article(servers, 2, ARTICLE_ACTIVES)
    where = tags_of(servers)
    levels = spreads(out)
    for pid, pa in out.partitions.items():
        first, second = pa.standbys
        assert levels[(pid, first)] == "ideal"
        # Both cluster values are used by the active and the first standby: only the zone can be new.
        assert levels[(pid, second)] == "partial"
        zones = {where[s][1] for s in (pa.active, first, second)}
        assert zones == {"az-a", "az-b", "az-c"}
        detail = next(r.detail for r in out.explanation.replicas if r.server == second and r.partition == pid)
        assert "new on zone" in detail
    assert set(Counter(s for pa in out.partitions.values() for s in pa.standbys).values()) == {2}


def test_two_zones_two_standbys_the_second_is_least_loaded() -> None:
    servers = [client(c, z) for c in (1, 2) for z in "ab"]
    actives = {
        PartitionId("1", 0): "c1-a",
        PartitionId("1", 1): "c1-b",
        PartitionId("2", 0): "c2-a",
        PartitionId("2", 1): "c2-b",
    }
    out = run_article(servers, 2, actives)
    where = tags_of(servers)
    levels = spreads(out)
    for pid, pa in out.partitions.items():
        first, second = pa.standbys
        assert levels[(pid, first)] == "ideal"
        assert where[first][0] != where[pa.active][0] and where[first][1] != where[pa.active][1]
        assert levels[(pid, second)] == "least_loaded"
    counts = Counter(s for pa in out.partitions.values() for s in pa.standbys)
    assert max(counts.values()) - min(counts.values()) <= 1

"""Bad input gets a clear ValueError; stale references degrade with a note, never a bare KeyError."""

from __future__ import annotations

import pytest

from hotstate.assignor import AssignorConfig, PartitionId, Placement, Server, Table, assign


@pytest.mark.parametrize("capacity", [0, -1, 1.5, True])
def test_server_capacity_must_be_a_positive_integer(capacity: object) -> None:
    with pytest.raises(ValueError, match=r"Server 'b1': capacity must be an integer > 0"):
        Server("b1", capacity=capacity)  # type: ignore[arg-type]


def test_server_tags_are_normalised_so_insertion_order_does_not_matter() -> None:
    a = Server("b1", tags={"zone": "z1", "cluster": "k1"})
    b = Server("b1", tags={"cluster": "k1", "zone": "z1"})
    assert a == b and list(a.tags) == ["cluster", "zone"]
    with pytest.raises(TypeError):
        a.tags["zone"] = "z2"  # type: ignore[index]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"partitions": 0}, r"partitions must be an integer >= 1"),
        (
            {"partitions": 2, "num_standby_replicas": -1},
            r"num_standby_replicas must be None or an integer >= 0",
        ),
        ({"partitions": 2, "writer_racks": "az-a"}, r"writer_racks must be a collection of strings"),
        (
            {"partitions": 2, "partition_racks": {2: ("az-a",)}},
            r"partition_racks has partition 2, allowed are 0\.\.1",
        ),
    ],
)
def test_table_validation(kwargs: dict[str, object], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        Table("t", **kwargs)  # type: ignore[arg-type]


def test_no_servers_is_an_error() -> None:
    with pytest.raises(ValueError, match="no servers"):
        assign([], [Table("t", 3)])


def test_duplicate_server_and_table_names_are_errors() -> None:
    with pytest.raises(ValueError, match="server id 'a' twice"):
        assign([Server("a"), Server("a")], [Table("t", 1)])
    with pytest.raises(ValueError, match="table 't' twice"):
        assign([Server("a")], [Table("t", 1), Table("t", 2)])


def test_negative_lag_names_partition_and_server() -> None:
    with pytest.raises(
        ValueError, match=r"lag of partition t-0 on server 'a' must be an integer >= 0, got -3"
    ):
        assign([Server("a"), Server("b")], [Table("t", 1)], lags={PartitionId("t", 0): {"a": -3}})


def test_previous_and_lags_must_be_keyed_by_partition_id() -> None:
    with pytest.raises(ValueError, match="previous must be keyed by PartitionId"):
        assign([Server("a")], [Table("t", 1)], previous={("t", 0): Placement("a")})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match=r"previous\[t-0\] must be a Placement"):
        assign([Server("a")], [Table("t", 1)], previous={PartitionId("t", 0): "a"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="lags must be keyed by PartitionId"):
        assign([Server("a")], [Table("t", 1)], lags={"t-0": {"a": 1}})  # type: ignore[dict-item]


def test_stale_references_are_dropped_with_notes() -> None:
    prev = {
        PartitionId("t", 0): Placement("gone", ("a",)),
        PartitionId("deleted", 0): Placement("a"),
    }
    lags = {PartitionId("t", 0): {"gone": 0, "a": 5}, PartitionId("t", 7): {"a": 0}}
    out = assign([Server("a"), Server("b")], [Table("t", 2)], prev, lags)
    notes = " ".join(out.explanation.notes)
    assert "'gone'" in notes and "no longer in the cluster" in notes
    assert "1 partitions of unknown tables/partitions" in notes
    assert "2 lag reports for unknown servers or partitions" in notes
    # The caught-up standby of the vanished owner takes the active.
    assert out.partitions[PartitionId("t", 0)].active == "a"


def test_more_standbys_than_servers_degrades_and_says_so() -> None:
    out = assign([Server("a"), Server("b"), Server("c")], [Table("t", 4, num_standby_replicas=5)])
    for pa in out.partitions.values():
        assert len(pa.standbys) == 2
    notes = " ".join(out.explanation.notes)
    assert "asks for 5 standbys per partition but only 2 other servers exist" in notes
    assert "4 partitions have 2 of 5 standbys" in notes


def test_single_server_places_actives_and_no_standbys() -> None:
    out = assign([Server("a")], [Table("t", 3)], config=AssignorConfig(num_standby_replicas=1))
    assert {pa.active for pa in out.partitions.values()} == {"a"}
    assert all(pa.standbys == () for pa in out.partitions.values())


def test_no_tables_gives_an_empty_assignment() -> None:
    out = assign([Server("a")], [])
    assert dict(out.partitions) == {}

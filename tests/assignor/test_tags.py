"""Server locations and KIP-708 spread scoring."""

from __future__ import annotations

import logging

import pytest

from hotstate.assignor import AssignorConfig, PartitionId, Server, Table, assign
from hotstate.assignor.tags import (
    effective_rack,
    new_keys,
    rack_tag_conflict,
    resolve_locations,
    spread_level,
    spread_score,
    tag_vector,
    used_values,
)


def test_rack_counts_as_the_tag_rack_and_the_tag_wins_on_disagreement() -> None:
    assert effective_rack(Server("a", rack="az-a")) == "az-a"
    assert effective_rack(Server("a", rack="az-a", tags={"rack": "az-b"})) == "az-b"
    assert rack_tag_conflict(Server("a", rack="az-a", tags={"rack": "az-a"})) is None
    warning = rack_tag_conflict(Server("a", rack="az-a", tags={"rack": "az-b"}))
    assert warning is not None and "'az-a'" in warning and "rack='az-b'" in warning


def test_disagreement_is_logged_and_in_the_explanation(caplog: pytest.LogCaptureFixture) -> None:
    servers = [Server("a", rack="az-a", tags={"rack": "az-c"}), Server("b", rack="az-b")]
    with caplog.at_level(logging.WARNING, logger="hotstate.assignor.assign"):
        out = assign(servers, [Table("t", 2)])
    assert any("disagrees" in rec.getMessage() for rec in caplog.records)
    assert any("disagrees" in w for w in out.explanation.warnings)
    # The tag is used: with writers in az-c, the active goes to the server tagged az-c.
    out = assign(
        servers, [Table("t", 1, writer_racks=("az-c",))], config=AssignorConfig(num_standby_replicas=0)
    )
    assert out.partitions[PartitionId("t", 0)].active == "a"


def test_tag_vector_follows_config_order_and_missing_tags_are_none() -> None:
    s = Server("a", rack="az-a", tags={"zone": "z1"})
    assert tag_vector(s, ("cluster", "zone", "rack")) == (None, "z1", "az-a")
    locs = resolve_locations([s, Server("b")], ("rack",))
    assert locs.vectors == (("az-a",), (None,)) and locs.racks == ("az-a", None)


def test_spread_score_counts_new_values_per_key_and_prefers_earlier_keys() -> None:
    used = used_values([("k1", "z1")], 2)
    assert spread_score(("k2", "z2"), used) == (2, 0b11)
    assert spread_score(("k2", "z1"), used) == (1, 0b10)
    assert spread_score(("k1", "z2"), used) == (1, 0b01)
    assert spread_score(("k2", "z1"), used) > spread_score(("k1", "z2"), used)
    assert spread_score(("k1", "z1"), used) == (0, 0)


def test_values_are_compared_per_key() -> None:
    # zone=a and cluster=a are different things: a shared string across keys is not "used".
    used = used_values([("a", "b")], 2)
    assert spread_score(("b", "a"), used) == (2, 0b11)


def test_levels_and_key_names() -> None:
    assert spread_level((2, 0b11), 2) == "ideal"
    assert spread_level((1, 0b01), 2) == "partial"
    assert spread_level((0, 0), 2) == "least_loaded"
    assert spread_level((0, 0), 0) == "least_loaded"
    assert new_keys((1, 0b01), ("cluster", "zone")) == ("zone",)

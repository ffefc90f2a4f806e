"""Rack-aware placement measured on a real network: with writers in a rack, `min_traffic` puts their table's
actives in that rack (as far as balance allows) and fewer bytes cross racks than with `none`; every
partition's standby is in another rack than its active under both."""

from __future__ import annotations

from typing import Any

import pytest

from hotstate.chaos.rack_traffic import RACK_NAMES, measure, one_table, per_rack_tables

# One worker takes the whole module, so the measured runs (its module-scoped fixture) happen once.
pytestmark = [pytest.mark.usefixtures("netns_available"), pytest.mark.xdist_group("rack_traffic")]

ROWS = 3000
ROW_BYTES = 250  # a row's key, columns and payload, before framing


@pytest.fixture(scope="module")
def runs() -> dict[str, dict[str, Any]]:
    scenarios = [per_rack_tables(2, ROWS), one_table(6, ROWS)]
    return {strategy: measure(strategy, scenarios, idle_s=1.0) for strategy in ("none", "min_traffic")}


def test_min_traffic_puts_actives_in_their_writers_rack_and_fewer_bytes_cross(runs: dict[str, Any]) -> None:
    none, near = (runs[s]["scenarios"][0] for s in ("none", "min_traffic"))
    # 2 servers per rack and 2 partitions per table: balance lets every active sit in its writers' rack.
    for table in near["tables"]:
        assert table["actives_in_writer_rack"] == 2, table["placement"]
    assert none["actives_in_writer_rack"] < 6  # rack-blind: some actives elsewhere
    # Replication to the standby (another rack) crosses once per row under both; the writer -> active hop
    # crosses only under none, for the actives outside the writer's rack.
    assert near["cross_rack_bytes"] >= ROWS * ROW_BYTES * 0.9
    assert near["cross_rack_bytes"] < 0.85 * none["cross_rack_bytes"], (near, none)
    # The az-a table's actives are in az-a, so its rows leave through az-a's uplink only (to its standbys);
    # the other racks send only fetch requests, acks and the cluster's own background traffic.
    table_a = next(t for t in near["tables"] if t["writer_rack"] == RACK_NAMES[0])
    out = table_a["rack_bytes_out"]
    assert out["az-a"] >= ROWS // 3 * ROW_BYTES * 0.9
    assert out["az-a"] > 3 * max(out["az-b"], out["az-c"]), out


def test_one_table_gets_only_its_balanced_share_of_actives_in_the_writers_rack(runs: dict[str, Any]) -> None:
    # 6 partitions on 6 servers: every server holds one active whatever the strategy, so 2 are in az-a.
    for strategy in ("none", "min_traffic"):
        one = runs[strategy]["scenarios"][1]
        assert one["actives_in_writer_rack"] == 2, (strategy, one["tables"][0]["placement"])


def test_every_standby_is_in_another_rack_than_its_active(runs: dict[str, Any]) -> None:
    for strategy, run in runs.items():
        for scenario in run["scenarios"]:
            for table in scenario["tables"]:
                assert table["standbys_per_partition"] == [1], (strategy, table["placement"])
                for part in table["placement"]:
                    assert part["active_rack"] not in part["standby_racks"], (strategy, table["table"], part)

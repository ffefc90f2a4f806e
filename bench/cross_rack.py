"""Bytes crossing racks for the same writes under `rack.aware.assignment.strategy` none vs min_traffic
-> bench/results/cross_rack.json.

6 servers in 3 racks (2 each), each in its own network namespace (hotstate.chaos.netns); the racks joined
through a core namespace, one uplink each, whose counters give the bytes between racks. One cluster per
strategy, one after the other (the strategy is a server setting), the same tables created in the same
order with their writer racks (`CreateTable.writer_rack`), the same rows written by `TableWriter`s
(acks=all, batches of 500) running in a client namespace on their rack's bridge. Scenarios, in one
cluster:

- a table per rack (2 partitions each, 1 standby), each written from its own rack: three jobs, one per zone;
- one table (6 partitions, 1 standby) written from az-a.

The cluster's own traffic between racks (heartbeats, lag reports, metadata) is measured while idle and
its rate times the write time taken off. Needs root (network namespaces); `--rows` sets the rows per
scenario (default 20,000).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

from hotstate.chaos.netns import unavailable_reason
from hotstate.chaos.rack_traffic import BATCH, PAYLOAD, measure, one_table, per_rack_tables, ratio

RESULTS = Path(__file__).parent / "results" / "cross_rack.json"
BY_DESIGN = (
    "Standbys are in another rack than their active (KIP-708 spreads them over racks), so replicating each "
    "row from its active to its standby crosses racks once whatever the strategy. The writer -> active hop "
    "crosses only for actives outside the writer's rack: with min_traffic the assignor puts a table's "
    "actives in its writers' rack as far as balance allows (every server holds floor or ceil of its share "
    "of all actives), so for those only replication crosses; with none the actives are placed rack-blind "
    "and the writer -> active hop crosses for the actives elsewhere. One table with as many partitions as "
    "servers leaves no choice: every balanced placement puts the same number of actives in each rack."
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rows", type=int, default=20_000, help="rows written per scenario")
    args = parser.parse_args(argv)
    reason = unavailable_reason()
    if reason is not None:
        print(f"cross_rack: {reason}", file=sys.stderr)
        return 2
    scenarios = [per_rack_tables(2, args.rows), one_table(6, args.rows)]
    load_before = os.getloadavg()[0]
    runs = {strategy: measure(strategy, scenarios) for strategy in ("none", "min_traffic")}
    ratios = ratio(runs["none"], runs["min_traffic"])
    report = {
        "benchmark": "bytes crossing racks, rack.aware.assignment.strategy none vs min_traffic",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "note": "2 cores shared by 6 servers, the writers and other work: the bytes hardly depend on it",
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "load_average_1m": [round(load_before, 2), round(os.getloadavg()[0], 2)],
        "setup": (
            f"6 servers in 3 racks (2 each), network namespaces; 1 standby; {args.rows} rows per scenario "
            f"of about {len(PAYLOAD) + 50} bytes, batches of {BATCH}, acks=all; writers in their rack's "
            "namespace, registered as the table's writer rack at CreateTable"
        ),
        "by_design": BY_DESIGN,
        "ratios": ratios,
        "runs": runs,
    }
    for line in ratios:
        print(
            f"{line['scenario']}: none {line['none_bytes']:,} B, min_traffic {line['min_traffic_bytes']:,} B,"
            f" ratio {line['min_traffic_over_none']}; actives in the writers' rack"
            f" {line['actives_in_writer_rack']} of {line['partitions']}"
        )
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

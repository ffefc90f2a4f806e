"""Same input, same output: whatever the construction order, dict/set order or PYTHONHASHSEED."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import hashlib, random, sys
    from hotstate.assignor import (
        AssignorConfig, Placement, PartitionId, Server, Table, assign, explain,
    )

    order = random.Random(int(sys.argv[1]))
    gen = random.Random(7)  # the input itself is fixed; only the order it is built in varies
    racks = ["az-a", "az-b", "az-c"]
    servers = [
        Server(f"s{i}", rack=racks[i % 3], tags={"zone": f"z{i % 2}", "cluster": f"k{i % 3 != 0}"},
               capacity=1 + i % 2)
        for i in range(12)
    ]
    tables = [Table(f"t{t}", 20, writer_racks={racks[t], racks[(t + 1) % 3]}) for t in range(3)]
    previous, lags = {}, {}
    for t in tables:
        for p in range(t.partitions):
            pid = PartitionId(t.name, p)
            a, b, c = gen.sample([s.id for s in servers] + ["gone"], 3)
            previous[pid] = Placement(a, (b,), (c,) if p % 5 == 0 else ())
            lags[pid] = {a: 0, b: gen.choice([0, 50, 50_000]), c: gen.choice([0, 20_000])}
    order.shuffle(servers)
    order.shuffle(tables)
    items = list(previous.items()); order.shuffle(items); previous = dict(items)
    items = list(lags.items()); order.shuffle(items)
    lags = {k: dict(reversed(list(v.items()))) for k, v in items}
    for strategy in ("none", "min_traffic", "balance_subtopology"):
        cfg = AssignorConfig(rack_aware_assignment_tags=("cluster", "zone", "rack"),
                             rack_aware_assignment_strategy=strategy, acceptable_recovery_lag=100,
                             num_standby_replicas=2, max_warmup_replicas=3)
        out = assign(servers, tables, previous, lags, cfg)
        print(strategy, hashlib.sha256((repr(out) + explain(out)).encode()).hexdigest())
    """
)


def run(order_seed: int, hash_seed: str) -> str:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(order_seed)], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.mark.parametrize(("order_seed", "hash_seed"), [(1, "1"), (2, "4242"), (3, "random")])
def test_output_is_identical_across_processes_and_input_orders(order_seed: int, hash_seed: str) -> None:
    reference = run(0, "0")
    assert reference.count("\n") == 3
    assert run(order_seed, hash_seed) == reference

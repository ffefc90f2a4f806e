"""explain(): every replica says why it is there."""

from __future__ import annotations

from hypothesis import given, settings

from hotstate.assignor import (
    REASONS,
    AssignorConfig,
    PartitionId,
    Placement,
    Server,
    Table,
    assign,
    explain,
)

from .helpers import Case, cases


@settings(max_examples=60, deadline=None)
@given(cases())
def test_every_replica_has_exactly_one_reason(case: Case) -> None:
    out = assign(case.servers, case.tables, case.previous, case.lags, case.config)
    expected = sorted(
        (pid, role, s)
        for pid, pa in out.partitions.items()
        for role, servers in (("active", (pa.active,)), ("standby", pa.standbys), ("warmup", pa.warmups))
        for s in servers
    )
    got = sorted((r.partition, r.role, r.server) for r in out.explanation.replicas)
    assert got == expected
    for r in out.explanation.replicas:
        assert r.reason in REASONS
        assert r.detail and f"cost {r.cost}" in r.detail
    text = explain(out)
    for pid in out.partitions:
        assert f"\n{pid}:" in text


def test_explain_names_caught_up_warmup_spread_and_cost() -> None:
    servers = [Server("a", rack="az-a"), Server("b", rack="az-b"), Server("c", rack="az-c")]
    prev = {PartitionId("t", i): Placement("a", ("b",)) for i in range(3)}
    lags = {PartitionId("t", i): {"a": 0, "b": 0} for i in range(3)}
    cfg = AssignorConfig(max_warmup_replicas=1, acceptable_recovery_lag=10)
    text = explain(assign(servers, [Table("t", 3, writer_racks=("az-a",))], prev, lags, cfg))
    assert "strategy min_traffic" in text
    assert "caught_up: balanced target, caught up (lag 0 <= 10)" in text
    assert "spread_ideal: ideal spread (new on rack)" in text
    assert "warmup" in text and "takes the active once caught up" in text
    assert "cross-rack: no" in text and "moved: no" in text

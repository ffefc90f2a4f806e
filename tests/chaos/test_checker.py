"""The chaos checker on hand-made histories: clean ones pass, and each kind of violation is caught."""

from __future__ import annotations

from hotstate.chaos.checker import (
    FaultWindow,
    Read,
    Report,
    StoreState,
    Write,
    availability,
    check,
    longest_gap,
    summarize,
)


def w(key: str, value: int, start: float, end: float, acked: bool = True) -> Write:
    return Write(0, key, value, start, end, acked)


def final(key: str, value: int | None, server: int = 1, ok: bool = True) -> Read:
    return Read(f"final-{server}", server, key, "final", 100.0, 100.1, ok, value, "" if ok else "503")


CLEAN_WRITES = [
    w("a", 1, 0.0, 0.1),
    w("a", 2, 0.2, 0.3),
    w("a", 3, 0.4, 5.0, acked=False),
    w("b", 1, 0.0, 0.1),
]


def kinds(report: Report) -> list[str]:
    return [v.kind for v in report.violations]


def test_a_clean_history_passes_including_an_unacknowledged_write_that_took_effect() -> None:
    reads = [
        Read("r", 1, "a", "standby", 0.05, 0.06, True, 1),  # a write in flight may be seen
        Read("r", 2, "a", "standby", 0.5, 0.6, True, 1),  # stale without a token: allowed
        Read("r", 2, "a", "token", 0.7, 0.8, True, 2, chain="r"),
        Read("r", 2, "a", "token", 0.9, 1.0, True, 3, chain="r"),  # the unknown write took effect
        Read("r", 2, "b", "token", 1.1, 1.2, False, error="503", chain="r"),
        Read("w", 1, "a", "ryw", 0.3, 0.35, True, 2, floor=2),
        final("a", 3, 1),
        final("a", 3, 2),
        final("b", 1, 1),
    ]
    stores = {"1-0": [StoreState(1, 10, "x", 2), StoreState(2, 10, "x", 2)]}
    report = check(CLEAN_WRITES, reads, stores=stores)
    assert report.ok, report.violations
    assert (report.writes_acked, report.writes_unknown, report.reads_ok, report.reads_failed) == (3, 1, 8, 1)


def test_a_lost_acknowledged_write_is_caught_on_any_server() -> None:
    report = check(CLEAN_WRITES, [final("a", 3, 1), final("a", 1, 2), final("b", 1)])
    assert kinds(report) == ["lost-write"]
    assert "final value 1 through server 2, but 2 was acknowledged" in report.violations[0].message


def test_a_row_gone_after_an_acknowledged_write_is_a_lost_write() -> None:
    assert kinds(check(CLEAN_WRITES, [final("a", 2), final("b", None)])) == ["lost-write"]


def test_a_value_never_written_or_written_only_after_the_read_is_caught() -> None:
    never = Read("r", 1, "a", "standby", 0.5, 0.6, True, 7)
    future = Read("r", 1, "a", "standby", 0.1, 0.15, True, 2)  # value 2's write began at 0.2
    report = check(CLEAN_WRITES, [never, future, final("a", 3), final("b", 1)])
    assert kinds(report) == ["unwritten-read", "unwritten-read"]


def test_going_back_along_a_token_chain_is_caught_but_not_without_tokens() -> None:
    chained = [
        Read("r", 1, "a", "token", 0.5, 0.6, True, 2, chain="r"),
        Read("r", 2, "a", "token", 0.7, 0.8, True, 1, chain="r"),
        Read("r", 2, "a", "token", 0.9, 1.0, True, None, chain="r"),
    ]
    report = check(CLEAN_WRITES, [*chained, final("a", 3), final("b", 1)])
    assert kinds(report) == ["non-monotonic", "non-monotonic"]
    unchained = [Read(r.reader, r.server, r.key, "standby", r.start, r.end, r.ok, r.value) for r in chained]
    assert check(CLEAN_WRITES, [*unchained, final("a", 3), final("b", 1)]).ok


def test_a_read_older_than_the_writers_token_is_caught() -> None:
    report = check(
        CLEAN_WRITES, [Read("w", 3, "a", "ryw", 0.3, 0.4, True, 1, floor=2), final("a", 3), final("b", 1)]
    )
    assert kinds(report) == ["read-your-writes"]


def test_replicas_that_differ_in_contents_or_position_are_caught() -> None:
    stores = {
        "1-0": [StoreState(1, 10, "x", 2), StoreState(2, 10, "y", 2)],
        "1-1": [StoreState(1, 10, "x", 2), StoreState(3, 9, "x", 2)],
        "1-2": [StoreState(2, 4, "z", 1)],
    }
    report = check(CLEAN_WRITES, [final("a", 3), final("b", 1)], stores=stores)
    assert kinds(report) == ["replicas-differ", "replicas-differ"]


def test_a_cluster_that_does_not_come_back_is_caught() -> None:
    report = check(CLEAN_WRITES, [final("a", 3), final("a", None, 2, ok=False)])
    assert kinds(report) == ["unrecovered", "unrecovered"]  # server 2's read failed; b never read
    report = check(CLEAN_WRITES, [final("a", 3), final("b", 1)], unrecovered=["server 2 never came back"])
    assert [(v.kind, v.message) for v in report.violations] == [("unrecovered", "server 2 never came back")]


def test_a_metadata_verdict_is_a_violation() -> None:
    report = check(CLEAN_WRITES, [final("a", 3), final("b", 1)], metadata_error="not linearizable")
    assert kinds(report) == ["metadata"]


def test_violations_are_capped_per_kind_with_a_count() -> None:
    reads = [Read("r", 1, "a", "standby", 0.5, 0.6, True, 100 + i) for i in range(30)]
    report = check(CLEAN_WRITES, [*reads, final("a", 3), final("b", 1)], limit=5)
    assert len(report.violations) == 6 and report.violations[-1].message == "... and 25 more"


def test_gaps_and_availability_per_fault() -> None:
    assert longest_gap([], 0.0, 4.0) == 4.0
    assert longest_gap([1.0, 1.5, 3.0, 9.0], 0.0, 4.0) == 1.5
    writes = [w("a", i, t - 0.01, t) for i, t in enumerate([1.0, 1.1, 4.0, 4.1, 9.5], start=1)]
    writes += [w("b", 1, 1.5, 1.6), w("b", 2, 1.7, 5.5, acked=False)]
    reads = [Read("r", 1, "a", "standby", t - 0.01, t, True, 1) for t in (1.0, 2.0, 3.0, 6.5)]
    reads += [Read("r", 2, "a", "standby", 2.4, 2.5, True, 1), Read("r", 2, "a", "standby", 5.0, 5.5, False)]
    windows = [FaultWindow("kill", "kill 1", 1.0, 3.0, 6.0), FaultWindow("pause", "pause 2", 6.0, 8.0, 10.0)]
    figures = availability(windows, writes, reads)
    gaps = [
        (f["write_gap_s"], f["key_write_gap_s"], f["read_gap_s"], f["server_read_gap_s"]) for f in figures
    ]
    # kill: writes at 1.1, 1.6, 4.0, 4.1 (key b only at 1.6, then nothing: 4.4); reads at 2.0, 2.5, 3.0
    # (server 2 only at 2.5: 3.5). pause: a write at 9.5 (b: none, the whole 4.0); reads at 6.5 (server 2:
    # none).
    assert gaps == [(2.4, 4.4, 3.0, 3.5), (3.5, 4.0, 3.5, 4.0)]
    assert figures[0]["fault_s"] == 2.0 and figures[0]["window_s"] == 5.0
    summary = summarize([*figures, {**figures[0], "write_gap_s": 0.5, "read_gap_s": 0.1}])
    assert summary["kill"]["n"] == 2
    assert (summary["kill"]["write_gap_p50_s"], summary["kill"]["write_gap_max_s"]) == (1.45, 2.4)
    assert (summary["kill"]["read_gap_p50_s"], summary["kill"]["read_gap_max_s"]) == (1.55, 3.0)
    assert summary["pause"]["key_write_gap_max_s"] == 4.0

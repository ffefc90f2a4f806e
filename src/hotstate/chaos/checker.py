"""The chaos checker: a recorded run in, violations and availability figures out. Pure (no IO, no clock).

What a run must show, after every fault is healed (docs/chaos.md):

- `lost-write`: every acknowledged write survives: each key's final value, read through every server, is
  at least the largest value acknowledged for it (values increase per key, one writer per key);
- `unwritten-read`: no read returns a value that was never written: every value read was sent by a write
  invoked before the read returned (acknowledged or not: an unacknowledged write may have taken effect);
- `non-monotonic`: a reader that passes each answer's consistency token to its next query never reads an
  older value of a key (nor no row after a row) than it read before;
- `read-your-writes`: a read given a writer's token for an acknowledged write sees that value or a newer one;
- `replicas-differ`: after the cluster has settled and stopped, the replicas of each partition hold equal
  stores at equal positions;
- `unrecovered`: after healing, every server is back (in the quorum, unfenced) and answers the final reads;
- `metadata`: the history of table operations is linearizable (hotstate.sim.linearizability).

Availability per fault: the longest time inside the fault's window (from its start to the next fault's
start, so the recovery after healing counts) without an acknowledged write, and without a successful read.
"""

from __future__ import annotations

import itertools
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["FaultWindow", "Read", "Report", "StoreState", "Violation", "Write", "availability", "check"]

VIOLATION_KINDS = (
    "lost-write",
    "unwritten-read",
    "non-monotonic",
    "read-your-writes",
    "replicas-differ",
    "unrecovered",
    "metadata",
)


@dataclass(frozen=True, slots=True)
class Write:
    """One upsert of `key` to `value`; `acked` False means its fate is unknown (error or deadline)."""

    writer: int
    key: str
    value: int
    start: float
    end: float
    acked: bool


@dataclass(frozen=True, slots=True)
class Read:
    """One pull query of `key` through `server`. `ok` False: it failed (503, unreachable: `error`).
    `value` None with `ok`: no row. `chain`: the reader whose tokens chain (None: no token passed).
    `floor`: for a read given a writer's token, the value that write acknowledged."""

    reader: str
    server: int
    key: str
    mode: str  # standby | active | token | ryw | final
    start: float
    end: float
    ok: bool
    value: int | None = None
    error: str = ""
    chain: str | None = None
    floor: int | None = None


@dataclass(frozen=True, slots=True)
class StoreState:
    """One replica's store after the run: its position and a digest of its contents."""

    node: int
    position: int
    digest: str
    rows: int


@dataclass(frozen=True, slots=True)
class FaultWindow:
    kind: str
    detail: str
    start: float
    healed: float
    end: float


@dataclass(frozen=True, slots=True)
class Violation:
    kind: str
    message: str

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "message": self.message}


@dataclass
class Report:
    violations: list[Violation] = field(default_factory=list)
    writes_acked: int = 0
    writes_unknown: int = 0
    reads_ok: int = 0
    reads_failed: int = 0

    @property
    def ok(self) -> bool:
        return not self.violations


def _value_order(value: int | None) -> int:
    return -1 if value is None else value


def check(
    writes: Sequence[Write],
    reads: Sequence[Read],
    *,
    stores: Mapping[str, Sequence[StoreState]] | None = None,
    metadata_error: str | None = None,
    unrecovered: Sequence[str] = (),
    limit: int = 20,
) -> Report:
    """Every violation of the rules in this module's doc (at most `limit` per kind, then a count)."""
    found: dict[str, list[str]] = defaultdict(list)
    written: dict[str, list[Write]] = defaultdict(list)
    acked_max: dict[str, int] = {}
    for write in writes:
        written[write.key].append(write)
        if write.acked:
            acked_max[write.key] = max(acked_max.get(write.key, -1), write.value)
    report = Report(
        writes_acked=sum(w.acked for w in writes),
        writes_unknown=sum(not w.acked for w in writes),
        reads_ok=sum(r.ok for r in reads),
        reads_failed=sum(not r.ok for r in reads),
    )

    for read in reads:
        if not read.ok or read.value is None:
            continue
        if not any(w.value == read.value and w.start <= read.end for w in written[read.key]):
            found["unwritten-read"].append(
                f"{read.reader} read {read.key}={read.value} through server {read.server} at "
                f"{read.start:.3f}-{read.end:.3f}, a value no write sent before then"
            )

    by_chain: dict[tuple[str, str], list[Read]] = defaultdict(list)
    for read in reads:
        if read.ok and read.chain is not None:
            by_chain[(read.chain, read.key)].append(read)
    for (chain, key), chained in sorted(by_chain.items()):
        chained.sort(key=lambda r: r.start)
        highest: Read | None = None
        for read in chained:
            if highest is not None and _value_order(read.value) < _value_order(highest.value):
                found["non-monotonic"].append(
                    f"{chain} read {key}={read.value} through server {read.server} at {read.start:.3f} after "
                    f"reading {highest.value} through server {highest.server} at {highest.start:.3f}"
                )
            if highest is None or _value_order(read.value) >= _value_order(highest.value):
                highest = read

    for read in reads:
        if read.ok and read.floor is not None and _value_order(read.value) < read.floor:
            found["read-your-writes"].append(
                f"{read.reader} read {read.key}={read.value} through server {read.server} at "
                f"{read.start:.3f} with the token of its acknowledged write of {read.floor}"
            )

    found["unrecovered"].extend(unrecovered)
    finals: dict[str, list[Read]] = defaultdict(list)
    for read in reads:
        if read.mode == "final":
            finals[read.key].append(read)
    for read in (r for rs in finals.values() for r in rs):
        if not read.ok:
            found["unrecovered"].append(
                f"final read of {read.key} through server {read.server} failed after healing: {read.error}"
            )
    for key, best in sorted(acked_max.items()):
        for read in finals.get(key, []):
            if read.ok and _value_order(read.value) < best:
                found["lost-write"].append(
                    f"{key}: final value {read.value} through server {read.server}, "
                    f"but {best} was acknowledged"
                )
        if not finals.get(key):
            found["unrecovered"].append(f"{key}: no final read was made ({best} was acknowledged)")

    for name, replicas in sorted((stores or {}).items()):
        states = {(s.position, s.digest) for s in replicas}
        if len(states) > 1:
            detail = ", ".join(f"server {s.node}: position {s.position}, {s.rows} rows" for s in replicas)
            found["replicas-differ"].append(f"replica {name}: {detail}")

    if metadata_error is not None:
        found["metadata"].append(metadata_error)

    for kind in VIOLATION_KINDS:
        messages = found.get(kind, [])
        for message in messages[:limit]:
            report.violations.append(Violation(kind, message))
        if len(messages) > limit:
            report.violations.append(Violation(kind, f"... and {len(messages) - limit} more"))
    return report


def longest_gap(times: Iterable[float], start: float, end: float) -> float:
    """The longest stretch of [start, end] containing none of `times`."""
    points = sorted(t for t in times if start < t < end)
    edges = [start, *points, end]
    return max((b - a for a, b in itertools.pairwise(edges)), default=0.0)


def availability(
    windows: Sequence[FaultWindow], writes: Sequence[Write], reads: Sequence[Read]
) -> list[dict[str, Any]]:
    """Per fault window, the longest stretch (seconds) from its start to its end without: an acknowledged
    write (`write_gap_s`), an acknowledged write of the worst-hit key (`key_write_gap_s`), a successful
    read (`read_gap_s`), a successful read through the worst-hit server (`server_read_gap_s`)."""
    acked = [w for w in writes if w.acked]
    served = [r for r in reads if r.ok and r.mode != "final"]
    keys = sorted({w.key for w in writes})
    servers = sorted({r.server for r in reads})

    def worst(times: Mapping[object, list[float]], start: float, end: float) -> float:
        return max((longest_gap(ts, start, end) for ts in times.values()), default=end - start)

    by_key: dict[object, list[float]] = {k: [w.end for w in acked if w.key == k] for k in keys}
    by_server: dict[object, list[float]] = {s: [r.end for r in served if r.server == s] for s in servers}
    return [
        {
            "kind": w.kind,
            "detail": w.detail,
            "fault_s": round(w.healed - w.start, 3),
            "window_s": round(w.end - w.start, 3),
            "write_gap_s": round(longest_gap([a.end for a in acked], w.start, w.end), 3),
            "key_write_gap_s": round(worst(by_key, w.start, w.end), 3),
            "read_gap_s": round(longest_gap([r.end for r in served], w.start, w.end), 3),
            "server_read_gap_s": round(worst(by_server, w.start, w.end), 3),
        }
        for w in windows
    ]


GAPS = ("write_gap_s", "key_write_gap_s", "read_gap_s", "server_read_gap_s")


def summarize(figures: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, float | int]]:
    """Per fault kind: how many, and the median and largest of each gap."""
    kinds: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for figure in figures:
        kinds[str(figure["kind"])].append(figure)
    out: dict[str, dict[str, float | int]] = {}
    for kind, rows in sorted(kinds.items()):
        summary: dict[str, float | int] = {"n": len(rows)}
        for gap in GAPS:
            values = [float(r[gap]) for r in rows]
            name = gap.removesuffix("_s")
            summary[f"{name}_p50_s"] = round(statistics.median(values), 3)
            summary[f"{name}_max_s"] = round(max(values), 3)
        out[kind] = summary
    return out

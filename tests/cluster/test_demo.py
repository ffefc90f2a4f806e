"""`make demo`'s main job, shortened: the pipeline, the windowed step, the kill, no failed query, nothing
left running."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from collections import Counter

import pytest

pytest.importorskip("pyspark")

from hotstate.cli.demo import WINDOW_RANGE, WINDOW_USER, range_label, sample_clicks


def sample_windows(user: str) -> list[tuple[dt.datetime, int]]:
    """`user`'s 10-minute windows (start, clicks) in the bundled sample clicks, in start order."""
    counts: Counter[dt.datetime] = Counter()
    for path in sorted(sample_clicks().glob("*.json")):
        for line in path.read_text().splitlines():
            click = json.loads(line) if line.strip() else None
            if click and click["user"] == user:
                at = dt.datetime.fromisoformat(click["ts"].replace("Z", "+00:00"))
                counts[at.replace(minute=at.minute - at.minute % 10, second=0, microsecond=0)] += 1
    return sorted(counts.items())


def shown(windows: list[tuple[dt.datetime, int]]) -> str:
    return " ".join(f"{start:%H:%M}={n}" for start, n in windows)


def test_the_demo_streams_kills_the_busiest_server_and_no_query_fails() -> None:
    env = {**os.environ, "HOTSTATE_DEMO_SECONDS": "6", "COLUMNS": "130"}
    done = subprocess.run(
        [sys.executable, "-m", "hotstate.cli.demo"],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        env=env,
    )
    out = " ".join(done.stdout.split())
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-3000:]
    assert "kill -9 server" in out and "after the kill" in out
    assert "console of server" in out and "/ui" in out  # the console's URL, to open while it runs
    assert "micro-batch spanning the kill" in out
    assert "failed pull queries │ 0" in out or "failed pull queries 0" in " ".join(
        out.replace("│", " ").split()
    )
    # The windowed step: its answers are the sample files' clicks counted here, by hand.
    assert "windowed pipeline:" in out and "pull queries on the windowed table" in out
    summary = " ".join(out.replace("│", " ").split())
    assert "equal to a batch groupBy" in summary and "NOT equal" not in summary
    windows = sample_windows(WINDOW_USER)
    assert len(windows) >= 3
    low, high = (dt.datetime.fromisoformat(t).replace(tzinfo=dt.UTC) for t in WINDOW_RANGE)
    in_range = [(start, n) for start, n in windows if low <= start < high]
    assert 0 < len(in_range) < len(windows)  # the range leaves some of the key's windows out
    assert f"(key only), start=count {shown(windows)}" in summary
    assert f"{range_label()} {shown(in_range)}" in summary
    leftovers = subprocess.run(["pgrep", "-f", "hotstate-demo-"], capture_output=True, text=True, check=False)
    assert leftovers.stdout.strip() == "", f"demo left processes running: {leftovers.stdout}"


def test_the_batch_spanning_the_kill_is_the_one_running_then_or_else_the_next() -> None:
    from hotstate.cli.demo import batch_spanning

    progress = [
        {"timestamp": "2026-11-24T00:00:00.000Z", "durationMs": {"triggerExecution": 700}},
        {"timestamp": "2026-11-24T00:00:01.000Z", "durationMs": {"triggerExecution": 2500}},
        {"timestamp": "2026-11-24T00:00:04.000Z", "durationMs": {"triggerExecution": 600}},
    ]
    at = 1_795_478_400.0  # 2026-11-24T00:00:00Z
    assert batch_spanning(progress, at + 1.5) == 2500
    assert batch_spanning(progress, at + 3.7) == 600  # between batches: the next one carries its writes
    assert batch_spanning(progress, at + 9) is None

"""`make demo`'s main job, shortened: the pipeline, the kill, no failed query, nothing left running."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("pyspark")


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

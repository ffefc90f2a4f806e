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
    assert "failed pull queries │ 0" in out or "failed pull queries 0" in " ".join(
        out.replace("│", " ").split()
    )
    leftovers = subprocess.run(["pgrep", "-f", "hotstate-demo-"], capture_output=True, text=True, check=False)
    assert leftovers.stdout.strip() == "", f"demo left processes running: {leftovers.stdout}"

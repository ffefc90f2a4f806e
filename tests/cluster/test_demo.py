from __future__ import annotations

import subprocess
import sys


def test_make_demo_runs_the_real_cluster_failover_and_cleans_up() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hotstate.cli.demo"], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = " ".join(done.stdout.split())
    assert (
        "the active controller" in out and "committed" in out and "every write survived the failover" in out
    )
    leftovers = subprocess.run(["pgrep", "-f", "hotstate-demo-"], capture_output=True, text=True, check=False)
    assert leftovers.stdout.strip() == "", f"demo left servers running: {leftovers.stdout}"

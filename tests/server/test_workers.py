"""A server's worker process dies with the server, even when the server is killed with SIGKILL."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

# The "server": starts its worker, prints the worker's pid, then waits to be killed.
PARENT = """
import os, sys, time
from hotstate.server.workers import worker_pool
if __name__ == "__main__":
    pool = worker_pool()
    print(pool.submit(os.getpid).result(timeout=60), flush=True)
    time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A dead child of init may linger as a zombie for a moment: that is gone too.
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[-1][:1] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_worker_exits_when_its_server_is_killed_with_sigkill() -> None:
    parent = subprocess.Popen([sys.executable, "-c", PARENT], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        worker = int(parent.stdout.readline())
        assert worker != parent.pid and _alive(worker)
        parent.send_signal(signal.SIGKILL)
        parent.wait(timeout=30)
        deadline = time.monotonic() + 30
        while _alive(worker) and time.monotonic() < deadline:
            time.sleep(0.05)  # polling a process we cannot wait on (it is not our child)
        assert not _alive(worker), f"worker {worker} outlived its killed server"
    finally:
        parent.kill()

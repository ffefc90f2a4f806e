"""Worker processes of a server (big placements and reassignments): they die with the server.

A `ProcessPoolExecutor` worker blocks reading its call queue, and holds that queue's write end itself, so a
server killed with SIGKILL left its workers waiting for ever (seen: 42 idle workers, about 3.5 GB, after a
few benchmark runs that killed servers). On Linux the kernel kills a worker when the process that started
it dies (`PR_SET_PDEATHSIG`); elsewhere a thread of the worker watches for its parent to change.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import signal
import sys
import threading
import time
from concurrent.futures import ProcessPoolExecutor

__all__ = ["worker_pool"]

_PR_SET_PDEATHSIG = 1


def worker_pool() -> ProcessPoolExecutor:
    """One spawned worker process, started on first use, that exits when this process dies."""
    return ProcessPoolExecutor(
        max_workers=1,
        mp_context=multiprocessing.get_context("spawn"),
        initializer=die_with_parent,
        initargs=(os.getpid(),),
    )


def die_with_parent(parent: int) -> None:
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) == 0:
            if os.getppid() != parent:  # it died before the request took effect
                os._exit(0)
            return
    threading.Thread(target=_watch, args=(parent,), daemon=True, name="die-with-parent").start()


def _watch(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(1.0)
    os._exit(0)

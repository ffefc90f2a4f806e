"""How a server process runs: its event loop and its garbage collector.

uvloop (from uvicorn[standard]) when installed: the loop and socket calls were 15% of a lookup's CPU on the
stdlib loop. The garbage collector is tuned for a long-lived server: the objects that imports and
start-up create (~83k, and they live as long as the process) are frozen out of every collection, which
otherwise took 45-55 ms each time and set the p99 of pull queries; and the youngest generation is
collected less often, since a request's garbage is almost all freed by reference counting.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from collections.abc import Coroutine
from typing import Any

log = logging.getLogger(__name__)

# Allocations minus deallocations between young collections (CPython's default is 700).
YOUNG_GENERATION_THRESHOLD = 20_000


def run(main: Coroutine[Any, Any, None]) -> None:
    """`asyncio.run(main)` on uvloop when it is installed, else on the stdlib loop."""
    try:
        import uvloop
    except ImportError:  # an install without uvicorn[standard]
        asyncio.run(main)
        return
    uvloop.run(main)


def settle_gc() -> None:
    """Called once start-up is done: what exists now lives as long as the process."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_GENERATION_THRESHOLD, middle, old)
    log.debug("gc: %d start-up objects frozen", gc.get_freeze_count())

"""Turning a hint that a peer died into proof, and proof into a fast failover.

A hint is a connection to or from a peer that the peer's side closed or reset. A kill -9 gives one at once
(the kernel closes the dead process's sockets); a paused process or a network partition gives none. On a
hint this server *probes* the peer: one TCP connect to its RPC address (`probe`). Only a refusal is proof
(`controller.evidence`); what it proves is acted on here:

- the peer led the metadata quorum and this server follows it: stand for election now
  (`RaftDriver.leader_gone`) instead of after `controller.quorum.fetch.timeout.ms`;
- this server hosts the active controller: the controller probes the peer's *registered* address itself
  and fences it (`ControllerHost.suspect`).

At most one probe per peer runs at a time; hints arriving meanwhile join it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence

from hotstate.controller.evidence import ProbeResult

__all__ = ["PROBE_TIMEOUT_S", "Suspects", "probe", "probe_after_hint"]

log = logging.getLogger(__name__)

# A connect on a LAN answers in well under a millisecond; longer than this is silence, which proves
# nothing anyway, so the only cost of a short timeout is a wasted probe.
PROBE_TIMEOUT_S = 0.5


async def probe(host: str, port: int, timeout_s: float = PROBE_TIMEOUT_S) -> ProbeResult:
    """One TCP connect to (host, port), closed at once without a byte sent.

    Refused: nothing listens there (the registered process exited). Connected: some process is there.
    A timeout or any other error is silence: a paused process, a partition and a dead host look alike."""
    loop = asyncio.get_running_loop()
    try:
        async with asyncio.timeout(timeout_s):
            transport, _ = await loop.create_connection(asyncio.Protocol, host, port)
    except ConnectionRefusedError:
        return ProbeResult.REFUSED
    except (TimeoutError, OSError):
        return ProbeResult.SILENT
    with contextlib.suppress(Exception):
        transport.abort()
    return ProbeResult.ANSWERED


# Probes after a hint: at once, then again a little later. A process being killed closes its connections
# and its listening socket in the same instant, but a probe racing that instant can still be answered.
PROBE_DELAYS_S = (0.0, 0.05, 0.2)


async def probe_after_hint(
    host: str, port: int, back: Callable[[], bool], delays_s: Sequence[float] = PROBE_DELAYS_S
) -> ProbeResult:
    """Probe up to `len(delays_s)` times until refused; stop early once `back()` says our connection to
    the peer is up again (it is alive). Returns the last result."""
    result = ProbeResult.SILENT
    for delay in delays_s:
        if delay:
            await asyncio.sleep(delay)
            # Not before the first probe: our own connection to a just-killed peer may not have seen its
            # close yet.
            if back():
                return ProbeResult.ANSWERED
        result = await probe(host, port)
        if result is ProbeResult.REFUSED:
            return result
    return result


class Suspects:
    """Runs `check(node_id)` for each hint, one at a time per node (hints during a check join it)."""

    def __init__(self, check: Callable[[int], Awaitable[None]]) -> None:
        self._check = check
        self._running: dict[int, asyncio.Task[None]] = {}

    def hint(self, node_id: int) -> None:
        if node_id in self._running:
            return
        task = asyncio.get_running_loop().create_task(self._run(node_id), name=f"suspect-{node_id}")
        self._running[node_id] = task

    async def _run(self, node_id: int) -> None:
        try:
            await self._check(node_id)
        except Exception:
            log.exception("checking whether node %d is gone failed", node_id)
        finally:
            self._running.pop(node_id, None)

    async def close(self) -> None:
        tasks = list(self._running.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

"""What evidence of a server's death fences it before its session expires.

The active controller fences a broker at once only on what it saw itself: a TCP connect to the broker's
registered RPC address, made by the controller after a hint (a connection to or from that broker closed or
reset, or the controller just took office), was *refused*. Nothing listens there, so the process that
registered is gone: its actives can move at once, by the same rules as a session expiry. A hint alone is
never enough (a client's or peer's lost connection is hearsay: its own network may be at fault), and
*silence* (the connect times out: a paused process, a network partition, a dead host) proves nothing, so
it waits for `broker.session.timeout.ms` as before.

The rule is pure so that the simulator drives it unchanged (`sim/replication/`).
"""

from __future__ import annotations

import enum

__all__ = ["ProbeResult", "fences_on_probe"]


class ProbeResult(enum.Enum):
    REFUSED = "refused"  # nothing listens on the address: the process is gone
    ANSWERED = "answered"  # something accepted the connection: alive (or restarted, and registering)
    SILENT = "silent"  # no answer in time, or no route: proves nothing


def fences_on_probe(
    result: ProbeResult, *, probed_incarnation: str, registered_incarnation: str | None, fenced: bool
) -> bool:
    """Whether a probe's result fences the server now.

    Only a refusal does, and only of the incarnation that was registered when the probe started: a server
    that registered again meanwhile is another process, and registering already fenced the old one."""
    return (
        result is ProbeResult.REFUSED
        and not fenced
        and registered_incarnation is not None
        and registered_incarnation == probed_incarnation
    )

from __future__ import annotations

import pytest

from hotstate.protocol.replica_state import REPLICA_STATES, as_replica_state


def test_every_state_reads_back_and_nothing_else_does() -> None:
    assert REPLICA_STATES == ("active", "standby", "warmup", "restoring")
    assert [as_replica_state(s) for s in REPLICA_STATES] == list(REPLICA_STATES)
    for text in ("", "Active", "leader", "active "):
        with pytest.raises(ValueError, match="unknown replica state"):
            as_replica_state(text)

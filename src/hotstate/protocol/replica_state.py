"""A replica's state as lag reports and query answers name it (docs/architecture.md section 4, "Replica
states"): `active` (the leader, its store caught up), `restoring` (the leader, store not there yet),
`standby`, `warmup` (a copy the assignor is building on a new owner, KIP-441)."""

from __future__ import annotations

from typing import Final, Literal, get_args

__all__ = ["REPLICA_STATES", "ReplicaState", "as_replica_state"]

ReplicaState = Literal["active", "standby", "warmup", "restoring"]
REPLICA_STATES: Final[tuple[ReplicaState, ...]] = get_args(ReplicaState)


def as_replica_state(text: str) -> ReplicaState:
    """`text` as a ReplicaState; ValueError if it names none (where a str arrives: JSON, the RPC codec)."""
    for state in REPLICA_STATES:
        if text == state:
            return state
    raise ValueError(f"unknown replica state {text!r}: expected one of {', '.join(REPLICA_STATES)}")

"""Pure, deterministic placement of partition replicas (KIP-441, KIP-708, KIP-925).

``assign(cluster, tables, previous, lags, config)`` takes plain frozen data and returns an
``Assignment``; ``explain(assignment)`` says why every replica is where it is. No IO, no clocks, no
randomness: the same input gives the same output whatever the dict order or PYTHONHASHSEED.
"""

from hotstate.assignor.assign import assign
from hotstate.assignor.config import STRATEGIES, AssignorConfig
from hotstate.assignor.errors import AssignorInternalError
from hotstate.assignor.explain import REASONS, explain
from hotstate.assignor.model import (
    Assignment,
    CostSummary,
    Explanation,
    PartitionId,
    Placement,
    ReplicaReason,
    Server,
    Table,
)

__all__ = [
    "REASONS",
    "STRATEGIES",
    "Assignment",
    "AssignorConfig",
    "AssignorInternalError",
    "CostSummary",
    "Explanation",
    "PartitionId",
    "Placement",
    "ReplicaReason",
    "Server",
    "Table",
    "assign",
    "explain",
]

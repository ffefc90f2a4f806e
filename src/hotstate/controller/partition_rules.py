"""The controller's rules for one partition's state, as pure functions of that state.

`QuorumController` decides with these, and the replication simulator (`sim/replication/`) drives the
same functions, so a bug in a rule is a bug the simulator can find: who becomes the active when a server
is fenced (`elect_after_fence`), when an offline partition comes back (`elect_on_unfence`), and whether an
active's ISR change applies (`alter_isr`). The reassignment steps are `reassign.partition_step`, which both
call too.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from dataclasses import dataclass

from hotstate.controller.image import PartitionInfo
from hotstate.controller.records import PartitionChange

__all__ = ["IsrRefusal", "alter_isr", "elect_after_fence", "elect_on_unfence"]

# (table id, partition, node id) -> the log end offset that node last reported for its replica.
ReplicaEnds = Mapping[tuple[int, int, int], int]


def elect_after_fence(
    part: PartitionInfo, node_id: int, fenced: Set[int], ends: ReplicaEnds
) -> PartitionChange | None:
    """The change that takes fenced `node_id` out of a partition's active seat and ISR (None: nothing to
    change). `fenced` holds every fenced server, `node_id` included.

    The ISR is never emptied: its last member stays, so the partition waits for it rather than electing a
    replica that may miss committed records. A new active comes only from the in-sync replicas that are not
    fenced; every one holds every committed record, and the most caught-up one (by its server's last report)
    also keeps the most of what was written but not yet committed, and restores the least. Without one the
    partition has no active until an in-sync replica returns (`elect_on_unfence`)."""
    isr = tuple(r for r in part.isr if r != node_id) or part.isr
    active = part.active
    epoch = part.leader_epoch
    if active == node_id:
        candidates = [r for r in isr if r not in fenced]
        candidates.sort(key=lambda r: -ends.get((part.table_id, part.partition, r), -1))
        active = candidates[0] if candidates else None
        epoch += 1
    if active == part.active and isr == part.isr:
        return None
    return PartitionChange(part.table_id, part.partition, active, epoch, isr)


def elect_on_unfence(part: PartitionInfo, node_id: int) -> PartitionChange | None:
    """An offline partition comes back with the first of its in-sync replicas to return, `node_id`."""
    if part.active is not None or node_id not in part.isr:
        return None
    return PartitionChange(part.table_id, part.partition, node_id, part.leader_epoch + 1, part.isr)


@dataclass(frozen=True, slots=True)
class IsrRefusal:
    # The request was based on an older state of the partition: the requester learns the outcome from the
    # metadata. Otherwise the change itself is not allowed, and the requester stops counting its additions.
    stale: bool
    reason: str


def alter_isr(
    part: PartitionInfo,
    *,
    node_id: int,
    leader_epoch: int,
    partition_epoch: int,
    isr: tuple[int, ...],
    unavailable: Set[int],
) -> PartitionChange | IsrRefusal:
    """An active's request to change the ISR, against the partition as it is now.

    It applies only to the state it was based on (same active, leader epoch and partition epoch), so a late
    or repeated request never changes a newer state. The active stays in the ISR, the ISR names only
    replicas, and no server in `unavailable` (fenced or shutting down) is added: it could not fetch."""
    if part.active != node_id or part.leader_epoch != leader_epoch or part.partition_epoch != partition_epoch:
        return IsrRefusal(
            True,
            f"partition is at leader epoch {part.leader_epoch}, partition epoch {part.partition_epoch}, "
            f"active {part.active}",
        )
    isr = tuple(dict.fromkeys(isr))
    added = set(isr) - set(part.isr)
    if node_id not in isr:
        return IsrRefusal(False, "the active must stay in the ISR")
    if not set(isr) <= set(part.replicas):
        return IsrRefusal(False, f"ISR {isr} names servers that hold no replica (replicas {part.replicas})")
    if added & unavailable:
        return IsrRefusal(False, f"cannot add fenced or stopping servers {sorted(added & unavailable)}")
    return PartitionChange(part.table_id, part.partition, part.active, part.leader_epoch, isr)

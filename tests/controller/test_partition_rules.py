"""The controller's partition rules on their own (the replication simulator drives the same functions)."""

from __future__ import annotations

from hotstate.controller.image import PartitionInfo
from hotstate.controller.partition_rules import IsrRefusal, alter_isr, elect_after_fence, elect_on_unfence
from hotstate.controller.records import PartitionChange


def _part(
    replicas: tuple[int, ...] = (1, 2, 3),
    active: int | None = 1,
    isr: tuple[int, ...] = (1, 2, 3),
    epoch: int = 4,
) -> PartitionInfo:
    return PartitionInfo(7, 0, replicas, active, (), epoch, isr, 10)


def test_fencing_the_active_elects_the_most_caught_up_in_sync_replica() -> None:
    ends = {(7, 0, 2): 50, (7, 0, 3): 80}
    change = elect_after_fence(_part(), 1, {1}, ends)
    assert change == PartitionChange(7, 0, 3, 5, (2, 3))


def test_a_replica_outside_the_isr_is_never_elected_however_far_it_got() -> None:
    ends = {(7, 0, 2): 50, (7, 0, 3): 900}
    change = elect_after_fence(_part(isr=(1, 2)), 1, {1}, ends)
    assert change is not None and change.active == 2


def test_fenced_in_sync_replicas_are_not_elected_and_the_isr_is_never_emptied() -> None:
    change = elect_after_fence(_part(isr=(1, 2)), 1, {1, 2}, {})
    assert change == PartitionChange(7, 0, None, 5, (2,))
    # The last in-sync replica stays in the ISR when it is fenced: the partition waits for it.
    last = elect_after_fence(_part(active=None, isr=(2,), epoch=5), 2, {1, 2}, {})
    assert last is None


def test_fencing_a_standby_only_shrinks_the_isr() -> None:
    assert elect_after_fence(_part(), 3, {3}, {}) == PartitionChange(7, 0, 1, 4, (1, 2))
    assert elect_after_fence(_part(isr=(1, 2)), 3, {3}, {}) is None


def test_an_offline_partition_comes_back_with_its_first_in_sync_replica() -> None:
    offline = _part(active=None, isr=(2,), epoch=5)
    assert elect_on_unfence(offline, 2) == PartitionChange(7, 0, 2, 6, (2,))
    assert elect_on_unfence(offline, 3) is None
    assert elect_on_unfence(_part(), 1) is None


def test_an_isr_change_applies_only_to_the_state_it_was_based_on() -> None:
    part = _part(isr=(1, 2))
    ok = alter_isr(part, node_id=1, leader_epoch=4, partition_epoch=10, isr=(1, 2, 3, 3), unavailable=set())
    assert ok == PartitionChange(7, 0, 1, 4, (1, 2, 3))
    for node_id, epoch, partition_epoch in ((2, 4, 10), (1, 3, 10), (1, 4, 9)):
        stale = alter_isr(
            part,
            node_id=node_id,
            leader_epoch=epoch,
            partition_epoch=partition_epoch,
            isr=(1,),
            unavailable=set(),
        )
        assert isinstance(stale, IsrRefusal) and stale.stale


def test_an_isr_change_keeps_the_active_names_replicas_and_adds_no_unavailable_server() -> None:
    part = _part(replicas=(1, 2, 3), isr=(1, 2))

    def refused(isr: tuple[int, ...], unavailable: set[int]) -> str:
        result = alter_isr(
            part, node_id=1, leader_epoch=4, partition_epoch=10, isr=isr, unavailable=unavailable
        )
        assert isinstance(result, IsrRefusal) and not result.stale
        return result.reason

    assert "active must stay" in refused((2,), set())
    assert "hold no replica" in refused((1, 2, 9), set())
    assert "fenced or stopping" in refused((1, 2, 3), {3})
    # A member that is fenced may stay: only additions are refused.
    assert alter_isr(part, node_id=1, leader_epoch=4, partition_epoch=10, isr=(1, 2), unavailable={2}) == (
        PartitionChange(7, 0, 1, 4, (1, 2))
    )

"""Which partitions lost a copy with a gone broker, and the per-table memory of whether any did."""

from __future__ import annotations

import random

import pytest

from hotstate.controller import replace
from hotstate.controller.image import MetadataImage, PartitionInfo, PerTable
from hotstate.controller.replace import LostCopies, lost_partitions


def _partitions(
    rng: random.Random, table_id: int, number: int, servers: int = 6
) -> tuple[PartitionInfo, ...]:
    parts = []
    for n in range(number):
        replicas = tuple(rng.sample(range(1, servers + 1), rng.randint(1, 3)))
        active = rng.choice([None, *replicas])
        warmups = tuple(r for r in range(1, servers + 1) if r not in replicas and rng.random() < 0.05)
        parts.append(PartitionInfo(table_id, n, replicas, active, warmups, 1, replicas))
    return tuple(parts)


def test_a_partition_is_lost_only_with_a_live_active_and_a_copy_on_a_gone_broker() -> None:
    def part(replicas: tuple[int, ...], active: int | None, warmups: tuple[int, ...] = ()) -> PartitionInfo:
        return PartitionInfo(1, 0, replicas, active, warmups, 1, replicas)

    gone = frozenset({3})
    image = MetadataImage(
        1,
        {},
        {},
        {
            1: (
                part((1, 3), 1),  # a standby on the gone broker: lost
                part((1, 2), 1, (3,)),  # a warmup on it: lost
                part((3, 1), 3),  # its active there: moved at the fence, not re-placed here
                part((1, 3), None),  # offline: nothing to copy from
                part((1, 2), 1),  # untouched
            )
        },
    )
    assert [p.replicas for p in lost_partitions(image, gone)] == [(1, 3), (1, 2)]
    assert lost_partitions(image, frozenset()) == []


@pytest.mark.parametrize("seed", range(20))
def test_the_memory_answers_as_a_full_scan_and_scans_only_changed_tables(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    rng = random.Random(seed)
    scanned: list[int] = []
    real = replace._lost

    def counting(part: PartitionInfo, gone: frozenset[int]) -> bool:
        scanned.append(part.table_id)
        return real(part, gone)

    monkeypatch.setattr(replace, "_lost", counting)
    tables = {t: _partitions(rng, t, rng.randint(0, 30)) for t in range(1, 5)}
    memory = LostCopies()
    gone = frozenset({rng.randint(1, 6)})
    for _ in range(10):
        image = MetadataImage(1, {}, {}, dict(tables))
        scanned.clear()
        assert memory.any(image, gone) == bool(lost_partitions(image, gone))
        scanned.clear()
        # Asked again with nothing changed: no partition is looked at.
        assert memory.any(image, gone) == bool(lost_partitions(image, gone))
        assert len(scanned) == sum(len(p) for p in tables.values())  # only lost_partitions' own scan
        scanned.clear()
        # A changed table (new objects), a table gone, a gone broker more: asked again, answered as a scan.
        changed = rng.choice(list(tables))
        tables[changed] = _partitions(rng, changed, rng.randint(0, 30))
        if rng.random() < 0.3 and len(tables) > 1:
            del tables[rng.choice(list(tables))]
        image = MetadataImage(2, {}, {}, dict(tables))
        before = scanned.copy()
        found = memory.any(image, gone)
        assert set(scanned[len(before) :]) <= {changed}
        assert found == bool(lost_partitions(image, gone))
        if rng.random() < 0.3:
            gone = gone | {rng.randint(1, 6)}


def test_a_value_per_table_is_kept_for_the_same_partitions_objects_only() -> None:
    rng = random.Random(3)
    one, two = _partitions(rng, 1, 4), _partitions(rng, 2, 4)
    memo: PerTable[str] = PerTable()
    memo.keep(1, one, "one")
    memo.keep(2, two, "two")
    assert memo.get(1, one) == "one"
    # Equal partitions that are other objects are a changed table (the image is copy-on-write).
    assert memo.get(1, tuple(one)) == "one"  # tuple() of a tuple is the same object
    assert memo.get(1, tuple(list(one))) is None
    assert memo.get(3, one) is None
    memo.forget_gone(MetadataImage(1, {}, {}, {2: two}))
    assert memo.get(1, one) is None and memo.get(2, two) == "two"

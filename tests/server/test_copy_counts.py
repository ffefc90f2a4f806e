"""The per-server copy counts that describe, /metrics and the console report, kept per table while its
partitions are unchanged."""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from hotstate.controller.image import MetadataImage, PartitionInfo
from hotstate.server import copy_counts
from hotstate.server.copy_counts import Counts, CountsCache, count


def _partitions(rng: random.Random, table_id: int, number: int) -> tuple[PartitionInfo, ...]:
    parts = []
    for n in range(number):
        replicas = tuple(rng.sample(range(1, 7), rng.randint(1, 4)))
        active = rng.choice([None, *replicas])
        warmups = tuple(r for r in replicas if r != active and rng.random() < 0.2)
        isr = replicas if rng.random() < 0.7 else replicas[:1]
        parts.append(PartitionInfo(table_id, n, replicas, active, warmups, 1, isr))
    return tuple(parts)


def _by_definition(image: MetadataImage) -> Counts:
    """Each count written from its definition, one partition at a time."""
    expected = Counts()
    for parts in image.partitions.values():
        for part in parts:
            expected.partitions += 1
            if part.active is None:
                expected.offline += 1
            else:
                expected.actives[part.active] += 1
            expected.standbys.update(part.standbys)
            expected.warmups.update(part.warmups)
            expected.copies.update(part.replicas)
            if part.active is not None and len(part.isr) < len(part.replicas):
                expected.under_replicated[part.active] += 1
    return expected


@pytest.mark.parametrize("seed", range(5))
def test_counts_match_their_definitions(seed: int) -> None:
    rng = random.Random(seed)
    image = MetadataImage(3, {}, {}, {1: _partitions(rng, 1, 40), 2: _partitions(rng, 2, 7)})
    assert count(image) == _by_definition(image)
    assert CountsCache().now(image) == _by_definition(image)
    assert asyncio.run(CountsCache().stepped(image)) == _by_definition(image)


def test_only_new_and_changed_tables_are_counted_again(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(7)
    counted: list[int] = []
    real_add = Counts.add

    def add(self: Counts, parts: tuple[PartitionInfo, ...]) -> None:
        counted.append(len(parts))
        real_add(self, parts)

    monkeypatch.setattr(Counts, "add", add)
    monkeypatch.setattr(copy_counts, "STEP_PARTITIONS", 20)
    big, small, other = _partitions(rng, 1, 50), _partitions(rng, 2, 5), _partitions(rng, 3, 9)
    cache = CountsCache()

    async def scenario() -> None:
        image = MetadataImage(10, {}, {}, {1: big, 2: small})
        assert await cache.stepped(image) == _by_definition(image)
        assert Counter(counted) == Counter([20, 20, 10, 5])  # the big table in steps of 20
        counted.clear()
        assert await cache.stepped(image) == _by_definition(image)
        assert cache.now(image) == _by_definition(image)
        assert counted == []
        changed = MetadataImage(11, {}, {}, {1: big, 2: _partitions(rng, 2, 5), 3: other})
        assert cache.now(changed) == _by_definition(changed)
        assert Counter(counted) == Counter([5, 9])
        counted.clear()
        gone = MetadataImage(12, {}, {}, {3: other})
        assert await cache.stepped(gone) == _by_definition(gone)
        assert counted == []

    asyncio.run(scenario())

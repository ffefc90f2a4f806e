"""How many copies of which kind each server holds, summed over the image's partitions, kept per table.

`describe` (every server's view, `hotstate cluster describe`), `/metrics` and the console report
per-server counts of actives and standbys, offline and under-replicated partitions. Counted over every
partition at each ask, that took 1.45 s of the event loop at 1,000,000 partitions (0.15 s at 100,000):
a client polling describe kept the controller stalled, and its stall guard then extended every broker's
session, so a dead broker was never fenced (bench/control_plane.py over RPC). The image is copy-on-write:
a table whose partitions are the same tuple has not changed, so its counts are kept and only changed
tables are counted again.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field

from hotstate.controller.image import MetadataImage, PartitionInfo, PerTable
from hotstate.server.steps import run_at_once, run_in_steps

# Partitions counted per step when counting on the event loop (about 15 ms at 1.5 us a partition).
STEP_PARTITIONS = 10_000


@dataclass(slots=True)
class Counts:
    """Per server (node id): actives, standbys, warmups, copies of any kind; under-replicated partitions by
    their active; and partitions in all, offline ones (no active)."""

    partitions: int = 0
    offline: int = 0
    actives: Counter[int] = field(default_factory=Counter)
    standbys: Counter[int] = field(default_factory=Counter)
    warmups: Counter[int] = field(default_factory=Counter)
    copies: Counter[int] = field(default_factory=Counter)
    under_replicated: Counter[int] = field(default_factory=Counter)

    def add(self, parts: Iterable[PartitionInfo]) -> None:
        actives, standbys, copies, under = self.actives, self.standbys, self.copies, self.under_replicated
        for part in parts:
            self.partitions += 1
            active = part.active
            replicas = part.replicas
            if active is None:
                self.offline += 1
            else:
                actives[active] += 1
                if len(part.isr) < len(replicas):
                    under[active] += 1
            warmups = part.warmups
            if warmups:
                self.warmups.update(warmups)
            for replica in replicas:
                copies[replica] += 1
                if replica != active and replica not in warmups:
                    standbys[replica] += 1

    def merge(self, other: Counts) -> None:
        self.partitions += other.partitions
        self.offline += other.offline
        self.actives.update(other.actives)
        self.standbys.update(other.standbys)
        self.warmups.update(other.warmups)
        self.copies.update(other.copies)
        self.under_replicated.update(other.under_replicated)


def count(image: MetadataImage) -> Counts:
    """Every partition counted now (what the cache below keeps)."""
    total = Counts()
    for parts in image.partitions.values():
        total.add(parts)
    return total


class CountsCache:
    """`count(image)`, with each table's counts kept while its partitions are the same objects."""

    def __init__(self) -> None:
        self._tables: PerTable[Counts] = PerTable()

    def now(self, image: MetadataImage) -> Counts:
        """Changed tables counted at once (for a caller that cannot wait: a metrics scrape)."""
        return run_at_once(self._steps(image))

    async def stepped(self, image: MetadataImage) -> Counts:
        """Changed tables counted STEP_PARTITIONS at a time with a yield between: the loop is never held."""
        return await run_in_steps(self._steps(image))

    def _steps(self, image: MetadataImage) -> Generator[None, None, Counts]:
        """The image's counts, yielding between steps of a changed table's counting."""
        self._tables.forget_gone(image)
        total = Counts()
        for table_id, parts in list(image.partitions.items()):
            counts = self._tables.get(table_id, parts)
            if counts is None:
                counts = Counts()
                for start in range(0, len(parts), STEP_PARTITIONS):
                    if start:
                        yield
                    counts.add(parts[start : start + STEP_PARTITIONS])
                self._tables.keep(table_id, parts, counts)
            total.merge(counts)
        return total

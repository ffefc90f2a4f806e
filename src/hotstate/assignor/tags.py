"""Server locations for KIP-708 standby spread.

A server's *tag vector* holds its value for each configured ``rack.aware.assignment.tags`` key, in
config order. A server's ``rack`` is the tag ``rack``. Values are compared per key, as (key, value)
pairs: zone=a and cluster=a are different things. A missing tag is the value ``None``: servers that do
not say where they are may be together, so they share that value rather than each counting as new.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hotstate.assignor.model import Server, SpreadLevel

TagVector = tuple[str | None, ...]
# (number of keys on which the value is new, bit mask with the first configured key as the top bit)
SpreadScore = tuple[int, int]

RACK_TAG = "rack"


@dataclass(frozen=True, slots=True)
class Locations:
    racks: tuple[str | None, ...]
    vectors: tuple[TagVector, ...]
    warnings: tuple[str, ...]


def effective_rack(server: Server) -> str | None:
    """The rack used everywhere: the ``rack`` tag wins over ``Server.rack`` (KIP-925 §D, option III)."""
    return server.tags.get(RACK_TAG, server.rack)


def rack_tag_conflict(server: Server) -> str | None:
    """A warning when the server's ``rack`` and its ``rack`` tag disagree, else None."""
    tag_rack = server.tags.get(RACK_TAG)
    if server.rack is None or tag_rack is None or tag_rack == server.rack:
        return None
    return (
        f"server {server.id!r}: rack {server.rack!r} disagrees with tag rack={tag_rack!r}; "
        f"using the tag (as KIP-925 does when client.rack and client.tag.rack differ)"
    )


def tag_vector(server: Server, tag_keys: Sequence[str]) -> TagVector:
    return tuple(effective_rack(server) if key == RACK_TAG else server.tags.get(key) for key in tag_keys)


def resolve_locations(servers: Sequence[Server], tag_keys: Sequence[str]) -> Locations:
    warnings = [w for w in (rack_tag_conflict(s) for s in servers) if w is not None]
    return Locations(
        racks=tuple(effective_rack(s) for s in servers),
        vectors=tuple(tag_vector(s, tag_keys) for s in servers),
        warnings=tuple(warnings),
    )


def used_values(vectors: Sequence[TagVector], num_keys: int) -> list[set[str | None]]:
    """Per tag key, the values already taken by the given replicas' servers."""
    used: list[set[str | None]] = [set() for _ in range(num_keys)]
    for vector in vectors:
        for i, value in enumerate(vector):
            used[i].add(value)
    return used


def spread_score(vector: TagVector, used: Sequence[set[str | None]]) -> SpreadScore:
    """How well a server at ``vector`` spreads a partition whose replicas already use ``used``.

    More new keys is better; among equal counts the earlier configured keys win (their order in
    ``rack.aware.assignment.tags`` is the user's priority), and the mask makes the choice deterministic.
    """
    k = len(vector)
    count = 0
    mask = 0
    for i, value in enumerate(vector):
        if value not in used[i]:
            count += 1
            mask |= 1 << (k - 1 - i)
    return (count, mask)


def spread_level(score: SpreadScore, num_keys: int) -> SpreadLevel:
    """KIP-708's three outcomes: every key new (ideal), some keys new (partial), none (least loaded)."""
    count = score[0]
    if num_keys > 0 and count == num_keys:
        return "ideal"
    if count > 0:
        return "partial"
    return "least_loaded"


def new_keys(score: SpreadScore, tag_keys: Sequence[str]) -> tuple[str, ...]:
    k = len(tag_keys)
    return tuple(key for i, key in enumerate(tag_keys) if score[1] & (1 << (k - 1 - i)))

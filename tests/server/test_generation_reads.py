"""A pull query reads one generation of a table (an overwrite swaps them): every partition it forwards names
the generation it was planned against, and when a server has already dropped that generation's replicas,
the coordinator plans the query again against the generation its image now has, reading every partition
of it: never some partitions of the old table and some of the new."""

from __future__ import annotations

import asyncio
import dataclasses

from hotstate.controller.image import MetadataImage, PartitionInfo
from hotstate.protocol.keys import encode_key
from hotstate.protocol.rows import encode_row
from hotstate.replica.messages import (
    PartitionQueryResponse,
    QueryPartitionsRequest,
    QueryPartitionsResponse,
    ReplicaError,
)
from hotstate.routing.lags import LagTable
from hotstate.server.coordinator import ClusterView
from server.test_query_rounds import PLACEMENT, TABLE, USERS, _coordinator, _in_list, _partition

OLD, NEW = TABLE.table_id, TABLE.table_id + 1


def _image(table_id: int) -> MetadataImage:
    parts = tuple(
        PartitionInfo(table_id, p, (active, standby), active, (), 1, (active, standby))
        for p, (active, standby) in sorted(PLACEMENT.items())
    )
    table = dataclasses.replace(TABLE, table_id=table_id)
    return MetadataImage(1, {}, {"clicks": table}, {table_id: parts})


class Generations:
    """Servers 2 and 3 as they are while an overwrite's swap propagates: node 2 has applied it (it holds
    only the new generation), node 3 has not (it holds both: the new one was staged there)."""

    def __init__(self) -> None:
        self.held = {2: {NEW}, 3: {OLD, NEW}}
        self.asked: list[tuple[int, int, int]] = []  # (node, partition, generation asked for)

    async def request(self, node: int, message: object, timeout_s: float) -> object:
        assert isinstance(message, QueryPartitionsRequest)
        answers = []
        for part in message.parts:
            self.asked.append((node, part.partition, part.table_id))
            if part.table_id not in self.held[node]:
                answers.append(PartitionQueryResponse(ReplicaError.UNKNOWN_PARTITION, "no such generation"))
                continue
            value = "old" if part.table_id == OLD else "new"
            items = tuple(
                sorted(
                    (encode_key((u,)), encode_row({"user": u, "v": value}))
                    for u in USERS
                    if _partition(u) == part.partition and encode_key((u,)) in part.keys
                )
            )
            answers.append(PartitionQueryResponse(ReplicaError.NONE, "", "active", 10, 0, items))
        return QueryPartitionsResponse(tuple(answers))


def test_a_query_planned_on_the_old_generation_is_planned_again_on_the_new_one_in_full() -> None:
    images = [_image(OLD)]
    generations = Generations()
    generations.held[3] = {NEW}  # both servers have applied the swap: the old generation is gone

    async def request(node: int, message: object, timeout_s: float) -> object:
        # The coordinator's own image learns of the swap while its first round is out.
        images.append(_image(NEW))
        return await generations.request(node, message, timeout_s)

    cluster = ClusterView(lambda: images[-1], LagTable(), lambda node: True)
    peers = type("Peers", (), {"request": staticmethod(request)})()
    coordinator = _coordinator(cluster, peers)
    result = asyncio.run(coordinator.execute(_in_list(USERS)))
    assert [row[0] for row in result.rows] == sorted(USERS)
    assert {row[1] for row in result.rows} == {"new"}  # all of the new generation, none of the old
    # Every partition was asked for by generation; the old one only in the first round.
    first = [(node, p) for node, p, g in generations.asked if g == OLD]
    assert first and all(g in (OLD, NEW) for _, _, g in generations.asked)
    assert {p for _, p, g in generations.asked if g == NEW} == set(PLACEMENT)


def test_a_query_whose_generation_is_still_served_reads_it_in_full() -> None:
    """Node 3 still holds the old generation: the partitions node 2 refuses go to it, so the query is
    answered all-old (the image never changed under it)."""
    generations = Generations()
    image = _image(OLD)
    cluster = ClusterView(lambda: image, LagTable(), lambda node: True)
    coordinator = _coordinator(cluster, generations)  # type: ignore[arg-type]
    result = asyncio.run(coordinator.execute(_in_list(USERS)))
    assert [row[0] for row in result.rows] == sorted(USERS)
    assert {row[1] for row in result.rows} == {"old"}
    assert {g for _, _, g in generations.asked} == {OLD}


def test_a_generation_an_overwrite_swapped_in_is_read_only_from_stores_holding_all_of_its_load() -> None:
    """The swap recorded where the load ended: a replica short of it (a standby still applying the load)
    refuses, and the partition is read from one that holds it all."""
    loaded = 10
    table = dataclasses.replace(TABLE, table_id=NEW, loaded_positions=(loaded,) * len(PLACEMENT))
    image = dataclasses.replace(_image(NEW), tables={"clicks": table})
    generations = Generations()
    generations.held = {2: {NEW}, 3: {NEW}}
    behind = {2}  # node 2's stores have applied only part of the load
    wanted: list[int] = []

    async def request(node: int, message: object, timeout_s: float) -> object:
        assert isinstance(message, QueryPartitionsRequest)
        wanted.extend(part.min_position for part in message.parts)
        if node in behind:
            refusal = PartitionQueryResponse(ReplicaError.BEHIND_TOKEN, f"at 4, the token asks for {loaded}")
            return QueryPartitionsResponse(tuple(refusal for _ in message.parts))
        return await generations.request(node, message, timeout_s)

    peers = type("Peers", (), {"request": staticmethod(request)})()
    coordinator = _coordinator(ClusterView(lambda: image, LagTable(), lambda node: True), peers)
    result = asyncio.run(coordinator.execute(_in_list(USERS)))
    assert [row[0] for row in result.rows] == sorted(USERS)
    assert set(wanted) == {loaded}
    assert {p.served_by for p in result.partitions} == {3}

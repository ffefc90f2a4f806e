"""The warmup budget over a whole run of the real controller rules: a server is wiped (it leaves, is taken
for gone, and comes back empty). Every copy it held is rebuilt at once, as a standby on a server left
(a partition never runs below its standbys while a server could host one: issue 29, Kafka Streams always
assigns configured standbys), and at no step do more warmups (replicas that move an active or a standby
to its balanced target) restore at once than max.warmup.replicas.

Unlike test_reassign.py's cluster, replicas here catch up over several rounds: a replica outside the ISR
fetches RATE records a round towards the partition's END and joins the ISR (its active asks for it, as a
real active would) only once it has them all."""

from __future__ import annotations

from collections import Counter

import pytest

from hotstate.assignor import AssignorConfig
from hotstate.controller.controller import ControllerConfig, QuorumController
from hotstate.controller.image import PartitionInfo
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.controller.requests import (
    AlterPartitionRequest,
    ControllerError,
    CreateTableRequest,
    ServerHeartbeatRequest,
)

from .test_controller import SESSION, Harness

KEY = (KeyColumn("user", KeyType.STRING),)
END = 1000
RATE = 250  # a restore takes END / RATE = 4 rounds
ROUND_MS = 250


class RestoringCluster(Harness):
    def __init__(self, racks: dict[int, str], budget: int) -> None:
        super().__init__()
        self.budget = budget
        self.controller = QuorumController(
            self.image,
            ControllerConfig(
                SESSION,
                AssignorConfig(max_warmup_replicas=budget),
                reassign_interval_ms=500,
                broker_removal_delay_ms=5_000,
            ),
            now=0,
            next_offset=1,
        )
        self.racks = dict(racks)
        self.incarnation = dict.fromkeys(racks, "a")
        self.down: set[int] = set()
        # (table id, partition, node) -> records the replica holds; a replica not listed holds none.
        self.position: dict[tuple[int, int, int], int] = {}
        self.most_restoring = 0
        self.most_warming = 0
        # Strict: never more warmups than the budget. Otherwise (a server came back to replicas it no
        # longer has: it restores them all, the controller's doing): no new warmup starts over the budget.
        self.strict = True
        for node_id, rack in racks.items():
            self.register(node_id, rack)

    def partitions(self) -> list[PartitionInfo]:
        return [p for parts in self.image.partitions.values() for p in parts]

    def restoring(self) -> list[tuple[int, int, int]]:
        """Replicas on live servers that are not in sync: each is fetching a copy of its partition."""
        return [
            (p.table_id, p.partition, r)
            for p in self.partitions()
            for r in p.replicas
            if r not in p.isr and r not in self.down
        ]

    def warming(self) -> list[tuple[int, int, int]]:
        """The restoring replicas that are warmups."""
        warmups = {(p.table_id, p.partition, w) for p in self.partitions() for w in p.warmups}
        return [k for k in self.restoring() if k in warmups]

    def commit(self, decision_or_batches: object) -> None:
        before = {(p.table_id, p.partition): set(p.replicas) for p in self.partitions()}
        super().commit(decision_or_batches)  # type: ignore[arg-type]
        self.most_restoring = max(self.most_restoring, len(self.restoring()))
        warming = self.warming()
        self.most_warming = max(self.most_warming, len(warming))
        started = [k for k in warming if k[2] not in before.get(k[:2], set())]
        if started or self.strict:
            assert len(warming) <= self.budget, f"{len(warming)} warm up at once: {warming}"

    def wipe_and_rejoin(self, node_id: int) -> None:
        self.down.discard(node_id)
        self.incarnation[node_id] = chr(ord(self.incarnation[node_id]) + 1)
        for key in [k for k in self.position if k[2] == node_id]:
            del self.position[key]
        self.register(node_id, self.racks[node_id], incarnation=self.incarnation[node_id])

    def round(self) -> None:
        self.now += ROUND_MS
        for node_id in sorted(self.racks):
            if node_id in self.down:
                continue
            ends = []
            for p in self.partitions():
                if node_id in p.replicas:
                    key = (p.table_id, p.partition, node_id)
                    self.position.setdefault(key, END if node_id in p.isr else 0)
                    ends.append((p.table_id, p.partition, self.position[key]))
            request = ServerHeartbeatRequest(
                node_id, f"{self.incarnation[node_id]}{node_id}", self.next_offset, False, tuple(ends)
            )
            self.handle(request)
        self.commit(self.controller.tick(self.now, self.next_offset))
        for p in self.partitions():
            if p.active is None or p.active in self.down:
                continue
            caught_up = []
            for r in p.replicas:
                key = (p.table_id, p.partition, r)
                if r in p.isr or r in self.down:
                    continue
                self.position[key] = min(END, self.position.get(key, 0) + RATE)
                if self.position[key] == END:
                    caught_up.append(r)
            if caught_up:
                isr = (*p.isr, *caught_up)
                alter = AlterPartitionRequest(
                    p.active, p.table_id, p.partition, p.leader_epoch, p.partition_epoch, isr
                )
                assert self.handle(alter).reply.error is ControllerError.NONE

    def settle(self, rounds: int = 400) -> int:
        """Rounds until nothing restores and no placement record was written for 20 rounds in a row."""
        quiet = 0
        for n in range(rounds):
            offset = self.image.offset
            self.round()
            busy = self.restoring() or any(p.warmups for p in self.partitions())
            heartbeats = len(self.racks) - len(self.down)
            quiet = quiet + 1 if not busy and self.image.offset - offset <= heartbeats else 0
            if quiet >= 20:
                return n
        raise AssertionError("placement did not settle")

    def actives(self) -> Counter[int]:
        return Counter(p.active for p in self.partitions() if p.active is not None)

    def standbys(self) -> Counter[int]:
        return Counter(s for p in self.partitions() for s in p.standbys)


@pytest.mark.parametrize("budget", [1, 2])
def test_a_lost_server_s_copies_restore_at_once_and_it_rejoins_wiped_within_the_warmup_budget(
    budget: int,
) -> None:
    cluster = RestoringCluster({1: "az-a", 2: "az-b", 3: "az-c"}, budget)
    cluster.handle(CreateTableRequest("t", 12, 1, KEY, None))
    cluster.settle()
    assert cluster.most_restoring == 0  # a new table restores nothing: every replica starts in sync
    assert cluster.actives() == {1: 4, 2: 4, 3: 4} and cluster.standbys() == {1: 4, 2: 4, 3: 4}

    cluster.down.add(3)  # its disk is lost with it
    first: list[tuple[int, int, int]] = []
    for _ in range(40):  # 10 s: fenced after the 2 s session, taken for gone 5 s later
        cluster.round()
        first = first or cluster.restoring()
    # The first reassignment after 3 is taken for gone rebuilds all 8 copies it held (4 actives, whose
    # standbys took over, and 4 standbys) as standbys on 1 and 2, whatever the budget: none is a warmup.
    assert len(first) == 8 and cluster.most_warming == 0
    cluster.settle()
    for p in cluster.partitions():
        assert set(p.replicas) == set(p.isr) == {1, 2}, p
    assert cluster.most_restoring == 8 and cluster.most_warming == 0

    cluster.most_restoring = 0
    cluster.wipe_and_rejoin(3)
    cluster.settle()
    # Nothing was lost: 3 gets its share of actives and standbys through warmups only, `budget` at once.
    assert cluster.most_restoring == cluster.most_warming == budget
    assert cluster.actives() == {1: 4, 2: 4, 3: 4}
    assert cluster.standbys() == {1: 4, 2: 4, 3: 4}
    for p in cluster.partitions():
        assert len(p.replicas) == 2 and set(p.isr) == set(p.replicas) and p.warmups == (), p
        assert p.active is not None and cluster.racks[p.standbys[0]] != cluster.racks[p.active]


def test_a_server_back_wiped_before_it_is_gone_restores_its_own_replicas_and_no_new_warmup() -> None:
    budget = 2
    cluster = RestoringCluster({1: "az-a", 2: "az-b", 3: "az-c"}, budget)
    cluster.handle(CreateTableRequest("t", 12, 1, KEY, None))
    cluster.settle()
    cluster.strict = False
    cluster.down.add(3)
    for _ in range(12):  # 3 s: fenced, not yet taken for gone
        cluster.round()
    cluster.wipe_and_rejoin(3)
    cluster.round()
    # Its 8 replicas (4 standbys, and the 4 actives it lost when fenced, now warmups to take them back) all
    # restore: none is thrown away for the budget (that would only restore it again later). The 4
    # partitions it was active for have one in-sync copy and a warmup, which is not a standby: each gets a
    # standby on the third server at once. No new warmup starts while 4 are under way over the budget.
    assert len(cluster.restoring()) == 12 and len(cluster.warming()) == 4
    cluster.settle()
    assert cluster.most_restoring == 12 and cluster.most_warming == 4
    assert cluster.actives() == {1: 4, 2: 4, 3: 4} and cluster.standbys() == {1: 4, 2: 4, 3: 4}
    for p in cluster.partitions():
        assert len(p.replicas) == 2 and set(p.isr) == set(p.replicas) and p.warmups == (), p

"""The replication simulator's invariants and their memory: what was committed, acknowledged and answered.

The world calls these after every event (`after_event`), at every commit of the controller, as a store
applies a batch, as a write is acknowledged and a query answered, and once at the end (`converged`); the
first one broken raises ReplicationInvariantViolation, which the kernel turns into a failure with the
command that replays the seed.
"""

from __future__ import annotations

import bisect
from typing import TYPE_CHECKING

from hotstate.assignor import Placement
from hotstate.log.batch import RecordBatch
from hotstate.replica.core import ReplicaRole

if TYPE_CHECKING:
    from hotstate.routing.hedging import HedgePolicy
    from hotstate.sim.replication.controller import SimController
    from hotstate.sim.replication.world import Node


class ReplicationInvariantViolation(Exception):
    pass


class Checker:
    def __init__(self, nodes: dict[int, Node], controller: SimController) -> None:
        self.nodes = nodes
        self.controller = controller
        self.committed: list[bytes] = []  # committed[o] = the record every store applies at offset o
        self.max_hw = 0
        self.epoch_leaders: dict[int, int] = {}
        self.acked: list[tuple[int, tuple[bytes, ...]]] = []
        # key -> [(offset, value)] of the committed records: what a store at a position holds for a key.
        self.key_history: dict[bytes, list[tuple[int, bytes]]] = {}
        self.answered: dict[int, tuple[int, bytes, bytes | None]] = {}  # query -> (replica, key, value)

    def after_event(self) -> None:
        # Runs after every event: written for speed (holds_hw only for a member that fails its test).
        epoch_leaders = self.epoch_leaders
        for node in self.nodes.values():
            core = node.core
            if core is not None and core.role is ReplicaRole.LEADER:
                leader = epoch_leaders.setdefault(core.leader_epoch, node.id)
                if leader != node.id:
                    raise ReplicationInvariantViolation(
                        f"two actives in epoch {core.leader_epoch}: {leader} and {node.id}"
                    )
                hw = core.high_watermark
                if hw > self.max_hw:
                    self.max_hw = hw
        max_hw = self.max_hw
        nodes = self.nodes
        for member in self.controller.isr:
            node = nodes[member]
            if node.store.position < max_hw and node.disk.end < max_hw:
                self.holds_hw(member)

    def holds_hw(self, member: int) -> Node:
        c = self.controller
        node = self.nodes[member]
        held = max(node.disk.end, node.store.position)
        if held < self.max_hw:
            raise ReplicationInvariantViolation(
                f"ISR {c.isr} (epoch {c.leader_epoch}) has replica {member} holding {held} < HW {self.max_hw}"
            )
        return node

    def partition_state(self) -> None:
        """The committed ISR only names replicas and holds the active: an election from it is safe."""
        c = self.controller
        if not c.isr or not set(c.isr) <= set(c.replicas):
            raise ReplicationInvariantViolation(
                f"ISR {c.isr} is not a non-empty subset of replicas {c.replicas}"
            )
        if c.active is not None and c.active not in c.isr:
            raise ReplicationInvariantViolation(f"active {c.active} is not in the ISR {c.isr}")
        if len(set(c.replicas)) != len(c.replicas) or not set(c.warmups) <= set(c.replicas):
            raise ReplicationInvariantViolation(f"replicas {c.replicas} with warmups {c.warmups}")

    def truncation(self, node: Node, offset: int) -> None:
        if offset < node.store.position:
            raise ReplicationInvariantViolation(
                f"replica {node.id} truncates to {offset}, below its store position {node.store.position}"
            )

    def applying(self, node: Node, batch: RecordBatch) -> None:
        if batch.base_offset != node.store.position:
            raise ReplicationInvariantViolation(
                f"replica {node.id} applies {batch.base_offset} but its store is at {node.store.position}"
            )

    def applied(self, node: Node, batch: RecordBatch) -> None:
        if node.store.position > self.max_hw:
            raise ReplicationInvariantViolation(
                f"replica {node.id} store at {node.store.position}, above every HW ({self.max_hw})"
            )
        for offset, record in enumerate(batch.records, start=batch.base_offset):
            if offset < len(self.committed):
                if self.committed[offset] != record:
                    raise ReplicationInvariantViolation(
                        f"replica {node.id} applied {record!r} at {offset}, others applied "
                        f"{self.committed[offset]!r}"
                    )
            elif offset == len(self.committed):
                self.committed.append(record)
                key, _, value = record.partition(b"=")
                self.key_history.setdefault(key, []).append((offset, value))
            else:
                raise ReplicationInvariantViolation(f"replica {node.id} applied {offset} past a gap")

    def acknowledged(self, base: int, end: int, records: tuple[bytes, ...]) -> None:
        """A write of `records` was acknowledged at [base, end)."""
        if end - base != len(records):
            raise ReplicationInvariantViolation("an ack for the wrong number of records")
        self.acked.append((base, records))
        if end > self.max_hw:
            raise ReplicationInvariantViolation(f"ack up to {end} above every HW {self.max_hw}")
        for offset, record in enumerate(records, start=base):
            if offset < len(self.committed) and self.committed[offset] != record:
                raise ReplicationInvariantViolation(
                    f"acked {record!r} at {offset} but {self.committed[offset]!r} committed"
                )

    def _durable_record(self, node: Node, offset: int) -> bytes | None:
        disk = node.disk
        for batch in disk.batches:
            if batch.base_offset <= offset < batch.next_offset:
                return batch.records[offset - batch.base_offset]
        return None

    def isr_complete(self) -> None:
        """Every member of the committed ISR durably holds every record below the highest HW."""
        c = self.controller
        for member in c.isr:
            node = self.holds_hw(member)
            for offset in range(
                max(node.disk.start, node.store.position), min(self.max_hw, len(self.committed))
            ):
                record = self._durable_record(node, offset)
                if record is not None and record != self.committed[offset]:
                    raise ReplicationInvariantViolation(
                        f"ISR replica {member} holds {record!r} at committed offset {offset}"
                    )

    def answer(
        self, node: Node, key: bytes, max_lag: int | None, value: bytes | None, min_position: int = 0
    ) -> None:
        """Every query is answered by a replica within its bound, never from a store ahead of the HW.

        The bound is checked against what the replica heard since it opened, independently of the lag
        rules under test: the committed ends (HWs) in the fetch answers its core took and in the newest lag
        report of each other server; an active also knows its own HW. A follower that heard nothing cannot
        know its lag, so it must not answer a bounded read at all. A query whose token names a committed
        position is answered by a store at or past it."""
        position = node.store.position
        core = node.core
        assert core is not None
        if position > self.max_hw:
            raise ReplicationInvariantViolation(
                f"replica {node.id} answered from its store at {position}, above every HW ({self.max_hw})"
            )
        history = self.key_history.get(key, [])
        before = bisect.bisect_left(history, (position, b""))
        expected = history[before - 1][1] if before else None
        if value != expected:
            raise ReplicationInvariantViolation(
                f"replica {node.id} at {position} answered {key!r}={value!r}, the committed records "
                f"up to there say {expected!r}"
            )
        if position < min_position:
            raise ReplicationInvariantViolation(
                f"replica {node.id} answered from its store at {position} a query whose token names the "
                f"committed position {min_position}"
            )
        if max_lag is None:
            return
        heard = [node.heard_hw] if node.heard_hw is not None else []
        heard += [
            hw
            for src, (at, hw) in node.report_hws.items()
            if src != node.id and hw is not None and at >= node.opened_at
        ]
        if core.role is ReplicaRole.LEADER:
            heard.append(core.high_watermark)
        if not heard:
            acked = max((base + len(records) for base, records in self.acked), default=0)
            raise ReplicationInvariantViolation(
                f"replica {node.id} ({core.role.value}, store at {position}) answered a read bounded by "
                f"{max_lag} with no word of the partition's end since it opened at t={node.opened_at} "
                f"({acked} records were acknowledged)"
            )
        if position < max(heard) - max_lag:
            raise ReplicationInvariantViolation(
                f"replica {node.id} ({core.role.value}) answered a read bounded by {max_lag} from its "
                f"store at {position}, having heard that {max(heard)} records are committed"
            )

    def hedged(
        self,
        query: int,
        asked: int,
        hedge_to: int,
        *,
        hedges_before: int,
        waited_ms: float,
        delay_ms: float | None,
        policy: HedgePolicy,
        forwards: int,
    ) -> None:
        """A forward to `asked` was hedged to `hedge_to` (routing/hedging.py's rules): only a forward sent
        with a hedge delay, once it is unanswered past that delay, at most once, to another replica, and
        within the coordinator's hedge budget (`max_percent` of its forwards, plus the burst)."""
        if delay_ms is None or waited_ms < delay_ms:
            raise ReplicationInvariantViolation(
                f"query {query}: the forward to {asked} was hedged after {waited_ms} ms, before its hedge "
                f"delay ({delay_ms} ms)"
            )
        if hedges_before:
            raise ReplicationInvariantViolation(
                f"query {query}: the forward to {asked} was hedged {hedges_before + 1} times"
            )
        if hedge_to == asked:
            raise ReplicationInvariantViolation(
                f"query {query}: the forward to {asked} was hedged to the same replica"
            )
        config = policy.config
        budget = config.burst + forwards * config.max_percent / 100
        if policy.hedges > budget + 1e-9:
            raise ReplicationInvariantViolation(
                f"{policy.hedges} hedges for {forwards} forwards, over the budget of {budget}"
            )

    def delivered(self, query: int, replica: int, key: bytes, value: bytes | None) -> None:
        """A query's answer reached its client: once, the first answer to reach its coordinator (a hedged
        query has two on their way; the slower is dropped, never sent after the first or in its place)."""
        first = self.answered.get(query)
        if first is not None:
            raise ReplicationInvariantViolation(
                f"query {query} answered twice: by {first[0]} with {first[2]!r}, then by {replica} with "
                f"{value!r}"
            )
        self.answered[query] = (replica, key, value)

    def converged(self, desired: Placement | None) -> None:
        """After the calm: the reassignment under way (`desired`) is done, every replica's store is the
        active's and the replay of the committed records, every acked write is in it, and no other node
        holds anything."""
        c = self.controller
        if desired is not None:
            raise ReplicationInvariantViolation(
                f"the reassignment to {desired} did not finish in the calm period: replicas "
                f"{c.replicas}, active {c.active}, isr {c.isr}"
            )
        assert c.active is not None, "no active after the calm period"
        leader = self.nodes[c.active]
        assert leader.core is not None and leader.core.role is ReplicaRole.LEADER, (
            "the chosen active is not leading"
        )
        end = leader.core.log_end_offset
        for node in self.nodes.values():
            if node.id not in c.replicas:
                if node.core is not None or node.disk.end or node.store.position:
                    raise ReplicationInvariantViolation(f"node {node.id} keeps a replica it is not assigned")
                continue
            if node.store.position != end:
                raise ReplicationInvariantViolation(
                    f"no convergence: replica {node.id} store at {node.store.position}, "
                    f"the active's log ends at {end}"
                )
            if node.store.chain[-1] != leader.store.chain[-1] or node.store.data != leader.store.data:
                raise ReplicationInvariantViolation(f"replica {node.id} store differs from the active's")
        for base, records in self.acked:
            for offset, record in enumerate(records, start=base):
                if offset >= len(self.committed) or self.committed[offset] != record:
                    raise ReplicationInvariantViolation(f"acked {record!r} at {offset} was lost")
        final: dict[bytes, bytes] = {}
        for record in self.committed[:end]:
            key, _, value = record.partition(b"=")
            final[key] = value
        if final != leader.store.data:
            raise ReplicationInvariantViolation("the store is not the replay of the committed records")

"""The deterministic simulator for partition replication: replica cores and their pump, the controller,
routing.

One partition, N replicas on a pool of N + 1 or N + 2 nodes, on the simulator kernel (`sim/kernel.py`). Each
replica's core is driven by the servers' own pump (`replica/shell.py`) over the node's simulated disk and
store, deferred store writes included, and the controller is the real `QuorumController`
(`controller/controller.py`) over a metadata image, fed the registrations, heartbeats, ISR changes, probe
results and ticks the servers would send it. Everything is drawn from the seed: message delays, drops,
duplicates, network partitions (between nodes, and between a node and the controller, which then fences a
replica that is still running: a zombie active), crashes that lose the write in flight (a restarted node
registers again and is fenced first), stale metadata (each node learns the controller's decisions after its
own delay), store snapshots for replicas that fall behind the log start, clients writing upserts with
acks=all, and reassignments: the simulator draws a placement now and then and hands it to the controller as
the assignor's answer, which walks the partition towards it (`apply_reassignment`, `partition_step`: add the
new replicas, let them join the ISR, move the active, drop the old copies). The controller decides
everything else with its own rules: a new active when a server is fenced, an offline partition's return and
ISR changes (`controller/partition_rules.py`), fencing on a probe (`controller/evidence.py`). A node holds a
replica only while the metadata it last learned lists it, as the real server does: it opens an empty one
when it is added and deletes the replica's log and store when it is removed. Every server heartbeats the
others and reports its replica's lag, and clients send pull queries to any server, which routes them with
the real heartbeat status, lag table, router and lag rules and goes through the candidates with the
coordinator's own state machine (`routing/attempts.py`: attempt timeouts, waits for a consistency token)
and hedging policy (`routing/hedging.py`): a forward unanswered past its peer's hedge delay (the p95 of the
answer times that coordinator measured) goes to the next candidate as well, the first answer to reach the
coordinator wins and the other is dropped; some queries carry the end of the last acknowledged write as
their token. Those draw from their own random
stream, so the replicas do what they would without them (they only shift when the controller, which acts
after every event, takes its session decisions).

Invariants, checked after every event:
- one active per leader epoch, and only the one the controller chose;
- the committed ISR is a subset of the replicas and holds the active (checked at every commit);
- every replica of the controller's committed ISR holds every committed record (durably, unchanged):
  this is what makes an acknowledged write survive while any in-sync replica does;
- stores at equal positions are equal (each applied record is the one every other store applied there);
- no store holds a record above the highest HW an active ever reached;
- an acknowledged write's records are the committed records at its offsets;
- every query is answered by a replica within its bound, never from a store ahead of the HW: the store is
  at most at the highest HW and holds the committed value at its position, and a bounded read is served
  only by a replica that heard the partition's end since it opened (an active knows its own HW) and is
  within the bound of the highest committed end it heard; a query whose token names a committed position
  is answered by a store at or past it (a hedge's answer is checked against what the client asked);
- a query is answered once (a hedged query's slower answer is dropped), and a forward is hedged at most
  once, no sooner than its hedge delay, to another replica, within the coordinator's hedge budget.
After the faults stop (a reassignment under way is finished, none is started), every replica of the final
replica set must converge to the same store holding every acknowledged write, and no other node may hold
anything.

The package: `profile.py` (a run's parameters, drawn from the seed), `world.py` (the nodes, their cores,
disks and stores, the network), `controller.py` (the QuorumController and what reaches it), `clients.py`
(writers, heartbeats, lag reports and queries), `invariants.py` (the checks and their memory).

`python -m hotstate.sim.replication --seed N` replays one seed with its event log.
"""

from hotstate.sim.replication.controller import SimController
from hotstate.sim.replication.invariants import Checker, ReplicationInvariantViolation
from hotstate.sim.replication.profile import ReplicationProfile
from hotstate.sim.replication.world import (
    CoreFactory,
    ElectRule,
    FenceRule,
    LagRule,
    Node,
    ReplicationSimFailure,
    ReplicationWorld,
    Stats,
    run_seed,
)

__all__ = [
    "Checker",
    "CoreFactory",
    "ElectRule",
    "FenceRule",
    "LagRule",
    "Node",
    "ReplicationInvariantViolation",
    "ReplicationProfile",
    "ReplicationSimFailure",
    "ReplicationWorld",
    "SimController",
    "Stats",
    "run_seed",
]

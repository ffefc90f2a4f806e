"""The nemesis: a seeded schedule of faults (a pure function of the seed) and the executor that applies it.

A schedule is a list of steps, each a fault held for a while and then healed, followed by a calm
stretch. Which servers a step hits is drawn from the seed, except where it depends on the cluster at
that moment (`partition-leader` isolates whoever leads the metadata quorum then): the executor records
what it actually did, so a run replays by its seed as far as real processes allow (timing does not).

Fault kinds (docs/chaos.md):

    kill               kill -9 one server, restart it when healed
    pause              SIGSTOP one server, SIGCONT when healed
    restart            SIGTERM (controlled shutdown) one server, start it again when healed
    partition-minority cut a minority of the servers off from the rest, both ways
    partition-bridge   two halves that each reach a majority through one bridge server (Jepsen's bridge)
    partition-leader   isolate the metadata leader from every other server
    one-way            packets from one server stop reaching the others (or the reverse), not both
    drop               drop 20-60% of the packets on the link between two servers, both ways
    slow               one server's link down to a low rate (tbf; no netem here: no added latency)
"""

from __future__ import annotations

import asyncio
import random
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from hotstate.chaos.checker import FaultWindow
from hotstate.chaos.netns import Fabric
from hotstate.cli.local_cluster import LocalCluster, LocalServer

# How long a killed or stopped server may take to be gone before it is started again.
RESTART_WAIT_S = 30.0
KINDS = (
    "kill",
    "pause",
    "restart",
    "partition-minority",
    "partition-bridge",
    "partition-leader",
    "one-way",
    "drop",
    "slow",
)


@dataclass(frozen=True, slots=True)
class Step:
    at_s: float  # when the fault starts, from the start of the schedule
    kind: str
    targets: tuple[int, ...]  # the servers it hits (empty: decided when applied)
    hold_s: float  # how long the fault lasts before it is healed
    param: str = ""  # the percentage of `drop`, the direction of `one-way`, the rate of `slow`

    def describe(self) -> str:
        parts = [self.kind]
        if self.targets:
            parts.append(",".join(map(str, self.targets)))
        if self.param:
            parts.append(self.param)
        return " ".join(parts)


def schedule(
    seed: int,
    nodes: Sequence[int],
    duration_s: float,
    *,
    kinds: Sequence[str] = KINDS,
    hold_s: tuple[float, float] = (3.0, 6.0),
    calm_s: tuple[float, float] = (2.0, 4.0),
) -> list[Step]:
    """The faults of run `seed` over servers `nodes`, filling `duration_s`. Pure: the same arguments give
    the same steps."""
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}; known: {', '.join(KINDS)}")
    if len(nodes) < 3:
        raise ValueError("the nemesis needs at least 3 servers")
    rng = random.Random(seed)
    nodes = sorted(nodes)
    steps: list[Step] = []
    at = rng.uniform(*calm_s)
    while True:
        hold = round(rng.uniform(*hold_s), 2)
        if at + hold > duration_s:
            break
        kind = rng.choice(list(kinds))
        param = ""
        if kind in ("kill", "pause", "restart", "slow"):
            targets: tuple[int, ...] = (rng.choice(nodes),)
            if kind == "slow":
                param = rng.choice(["64kbit", "256kbit", "1mbit"])
        elif kind == "partition-minority":
            targets = tuple(sorted(rng.sample(nodes, rng.randint(1, (len(nodes) - 1) // 2))))
        elif kind == "partition-bridge":
            shuffled = rng.sample(nodes, len(nodes))
            targets = tuple(shuffled)  # bridge first, then the two halves in order
        elif kind == "partition-leader":
            targets = ()
        elif kind == "one-way":
            targets = (rng.choice(nodes),)
            param = rng.choice(["out", "in"])
        else:  # drop
            targets = tuple(sorted(rng.sample(nodes, 2)))
            param = str(rng.choice([20, 40, 60]))
        steps.append(Step(round(at, 2), kind, targets, hold, param))
        at += hold + rng.uniform(*calm_s)
    return steps


def bridge_halves(targets: Sequence[int]) -> tuple[int, list[int], list[int]]:
    bridge, rest = targets[0], list(targets[1:])
    half = len(rest) // 2
    return bridge, sorted(rest[:half]), sorted(rest[half:])


@dataclass
class Applied:
    """What the executor did for one step, with wall times on the workload's clock (time.monotonic)."""

    step: Step
    detail: str
    start: float
    healed: float = 0.0


@dataclass
class Nemesis:
    cluster: LocalCluster
    fabric: Fabric
    applied: list[Applied] = field(default_factory=list)
    _killed: set[int] = field(default_factory=set)
    _paused: set[int] = field(default_factory=set)

    def _server(self, node: int) -> LocalServer:
        return next(s for s in self.cluster.servers if s.node_id == node)

    async def leader(self) -> int | None:
        try:
            async with self.cluster.admin(request_timeout_s=1.0) as admin:
                return (await admin.describe(deadline_s=2.0)).leader_id
        except Exception:  # no answer: nobody to isolate
            return None

    async def isolate_leader(self) -> int | None:
        """Cut the metadata leader off from every other server (both ways); which one it was, or None when
        no server named one."""
        leader = await self.leader()
        if leader is not None:
            await asyncio.to_thread(self.fabric.partition, [leader])
        return leader

    async def run(self, steps: Sequence[Step], t0: float) -> None:
        """Apply each step at `t0 + step.at_s` (monotonic), hold it, heal it."""
        try:
            for step in steps:
                await asyncio.sleep(max(0.0, t0 + step.at_s - time.monotonic()))
                applied = Applied(step, await self.apply(step), time.monotonic())
                self.applied.append(applied)
                await asyncio.sleep(step.hold_s)
                await self.heal()
                applied.healed = time.monotonic()
        finally:
            await self.heal()

    async def apply(self, step: Step) -> str:
        fabric, targets = self.fabric, list(step.targets)
        if step.kind == "kill":
            self.cluster.signal(self._server(targets[0]), signal.SIGKILL)
            self._killed.add(targets[0])
        elif step.kind == "pause":
            self.cluster.signal(self._server(targets[0]), signal.SIGSTOP)
            self._paused.add(targets[0])
        elif step.kind == "restart":
            server = self._server(targets[0])
            self._killed.add(targets[0])
            await asyncio.to_thread(self.cluster.stop, server, timeout_s=10.0)
        elif step.kind == "partition-minority":
            await asyncio.to_thread(fabric.partition, targets)
        elif step.kind == "partition-bridge":
            bridge, left, right = bridge_halves(targets)
            await asyncio.to_thread(fabric.partition, left, right)
            return f"{step.kind} bridge {bridge}: {left} | {right}"
        elif step.kind == "partition-leader":
            leader = await self.isolate_leader()
            return (
                f"{step.kind} {leader}"
                if leader is not None
                else f"{step.kind}: no leader known, nothing done"
            )
        elif step.kind == "one-way":
            node, rest = targets[0], [n for n in fabric.hosts if n != targets[0]]
            if step.param == "out":
                await asyncio.to_thread(fabric.block, [node], rest)
            else:
                await asyncio.to_thread(fabric.block, rest, [node])
        elif step.kind == "drop":
            await asyncio.to_thread(fabric.drop, targets[0], targets[1], int(step.param))
        elif step.kind == "slow":
            await asyncio.to_thread(fabric.slow, targets[0], step.param)
        else:
            raise ValueError(f"unknown fault kind {step.kind!r}")
        return step.describe()

    async def heal(self) -> None:
        """Every server running and reachable again."""
        await asyncio.to_thread(self.fabric.heal)
        for node in sorted(self._paused):
            self.cluster.signal(self._server(node), signal.SIGCONT)
        self._paused.clear()
        for node in sorted(self._killed):
            server = self._server(node)
            # Never two processes on one data directory: the old one must be gone (all its threads).
            end = time.monotonic() + RESTART_WAIT_S
            while self.cluster.alive(server):
                if time.monotonic() > end:
                    raise RuntimeError(
                        f"server {node} (pid {server.pid}) still runs {RESTART_WAIT_S} s after it was stopped"
                    )
                self.cluster.signal(server, signal.SIGKILL)
                await asyncio.sleep(0.02)
            self.cluster.start(server)
        self._killed.clear()

    def windows(self, end: float) -> list[FaultWindow]:
        out = []
        for i, applied in enumerate(self.applied):
            until = self.applied[i + 1].start if i + 1 < len(self.applied) else end
            healed = applied.healed or until
            out.append(FaultWindow(applied.step.kind, applied.detail, applied.start, healed, until))
        return out

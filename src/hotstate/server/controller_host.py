"""Hosts the quorum controller while this server leads the metadata quorum, and routes requests to it.

The controller becomes active once the leader-change record of this leader's own epoch is committed:
from then on the committed image holds everything earlier leaders wrote. A reply goes out only once the
proposals it depends on are committed in this leader's epoch; if another leader's entry lands at one of
those offsets, the proposals were lost and the caller hears NOT_CONTROLLER (and retries elsewhere).
A server that does not lead forwards the request to the leader once (a forwarded request is never
forwarded again).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

from hotstate.assignor import Assignment, AssignorInternalError
from hotstate.controller.codec import encode_batch
from hotstate.controller.controller import ControllerConfig, QuorumController
from hotstate.controller.image import MetadataImage, PartitionInfo
from hotstate.controller.placement import (
    BLOCK_PARTITIONS,
    PlacementJob,
    PreparedPlacement,
    place_encoded,
)
from hotstate.controller.reassign import Desired, ReassignJob, decode_desired, reassign_encoded
from hotstate.controller.records import MetadataBatch
from hotstate.controller.replace import ReplaceJob
from hotstate.controller.requests import (
    ControllerError,
    ControllerRequest,
    ControllerResponse,
    error_response,
)
from hotstate.raft.node import NotLeaderError, ProposalRejectedError, RaftNode, RaftRole
from hotstate.raft.records import Entry, EntryKind
from hotstate.server.metadata import MetadataPublisher
from hotstate.server.raft_driver import RaftDriver
from hotstate.server.steps import run_in_steps
from hotstate.server.suspects import probe_after_hint
from hotstate.server.workers import worker_pool

log = logging.getLogger(__name__)

Forward = Callable[[int, ControllerRequest], Awaitable[ControllerResponse]]
_Answer = TypeVar("_Answer")


class ControllerHost:
    def __init__(
        self,
        driver: RaftDriver,
        metadata: MetadataPublisher,
        config: ControllerConfig,
        *,
        forward: Forward,
        clock: Callable[[], int],
        request_timeout_s: float = 5.0,
        tick_interval_s: float = 0.05,
    ) -> None:
        self._driver = driver
        self._metadata = metadata
        self._config = config
        self._forward = forward
        self._clock = clock
        self._request_timeout_s = request_timeout_s
        self._tick_interval_s = tick_interval_s
        self._controller: QuorumController | None = None
        self._epoch = -1
        self._last_proposed = -1  # offset of this controller's latest proposal
        self._proposed_epochs: dict[int, int] = {}
        self._lost_from: int | None = None
        self._waiters: list[tuple[int, asyncio.Future[None]]] = []
        self._tick_task: asyncio.Task[None] | None = None
        self._reassigning: asyncio.Task[None] | None = None
        self._pool: ProcessPoolExecutor | None = None  # big placements (`_place`), started on first use
        self._reassign_pool: ProcessPoolExecutor | None = None  # big reassignments, likewise
        # Set by the server: called for every registered server when this one takes office.
        self.on_activated: Callable[[Sequence[int]], None] | None = None
        metadata.add_listener(self._on_image)

    @property
    def active(self) -> bool:
        return self._controller is not None

    def start(self) -> None:
        self._tick_task = asyncio.create_task(self._tick_loop(), name="controller-tick")

    async def stop(self) -> None:
        for task in (self._tick_task, self._reassigning):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._deactivate("server stopping")
        for pool in (self._pool, self._reassign_pool):
            if pool is not None:
                pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------ events from the quorum
    def on_role_change(self, node: RaftNode) -> None:
        if self._controller is not None and (node.role is not RaftRole.LEADER or node.epoch != self._epoch):
            self._deactivate(f"no longer the metadata leader (now {node.role.value} in epoch {node.epoch})")

    def _on_image(self, image: MetadataImage, entries: Sequence[Entry]) -> None:
        node = self._driver.node
        for entry in entries:
            expected = self._proposed_epochs.pop(entry.offset, None)
            if expected is not None and expected != entry.epoch and self._lost_from is None:
                self._lost_from = entry.offset
            if (
                entry.kind is EntryKind.LEADER_CHANGE
                and node.role is RaftRole.LEADER
                and entry.epoch == node.epoch
                and self._controller is None
            ):
                self._activate(image, node)
        self._release(image)

    def _activate(self, image: MetadataImage, node: RaftNode) -> None:
        self._epoch = node.epoch
        self._lost_from = None
        self._proposed_epochs = {}
        self._last_proposed = image.offset - 1
        self._controller = QuorumController(
            image, self._config, now=self._clock(), next_offset=self._driver.next_proposal_offset()
        )
        log.info("active controller for epoch %d at metadata offset %d", node.epoch, image.offset)
        if self.on_activated is not None:
            # The server that died with the old controller gave this one no hint: look at everyone once.
            others = [n for n, s in image.servers.items() if n != node.id and not s.fenced]
            self.on_activated(others)

    def _deactivate(self, why: str) -> None:
        if self._controller is not None:
            log.info("controller for epoch %d stops: %s", self._epoch, why)
        self._controller = None
        self._proposed_epochs = {}
        for _, future in self._waiters:
            if not future.done():
                # The proposal may still commit under the next leader: the outcome is unknown, not refused.
                future.set_exception(_OutcomeUnknown(why))
        self._waiters = []

    def _release(self, image: MetadataImage) -> None:
        still = []
        for offset, future in self._waiters:
            if future.done():
                continue
            if self._lost_from is not None and offset >= self._lost_from:
                future.set_exception(_NotController("the proposal was lost to a new metadata leader"))
            elif image.offset > offset:
                future.set_result(None)
            else:
                still.append((offset, future))
        self._waiters = still

    # ------------------------------------------------------------------ requests
    async def handle(self, request: ControllerRequest, *, forwarded: bool = False) -> ControllerResponse:
        controller = self._controller
        if controller is None:
            leader = self._driver.node.leader_id
            if forwarded or leader is None or leader == self._driver.node.id:
                hint = f"; the metadata leader is {leader}" if leader is not None else ""
                return error_response(
                    request, ControllerError.NOT_CONTROLLER, f"not the active controller{hint}"
                )
            return await self._forward(leader, request)
        try:
            placed = None
            job = controller.placement_job(request)
            if job is not None:
                # Off the event loop (0.1 s at 10,000 partitions, 1 s at 100,000, 2 cores): heartbeats and
                # the Raft driver go on meanwhile. The controller checks the answer still fits its view.
                try:
                    placed = await self._place(job)
                except ValueError:
                    placed = None  # the controller places it again and answers with the reason
                if self._controller is not controller:
                    return error_response(
                        request, ControllerError.NOT_CONTROLLER, "no longer the active controller"
                    )
            controller.voters = frozenset(self._driver.node.voters)  # as they are now, after the await
            decision = controller.handle(
                request, self._clock(), self._driver.next_proposal_offset(), placed=placed
            )
            self._propose(decision.batches, placed.packed_by_id() if placed is not None else None)
            if decision.wait:
                await asyncio.wait_for(self._committed(self._last_proposed), self._request_timeout_s)
        except _NotController as error:
            return error_response(request, ControllerError.NOT_CONTROLLER, str(error))
        except _OutcomeUnknown as error:
            return error_response(
                request, ControllerError.TIMEOUT, f"{error}; the change may or may not have been applied"
            )
        except (NotLeaderError, ProposalRejectedError) as error:
            self._deactivate(str(error))
            return error_response(request, ControllerError.NOT_CONTROLLER, str(error))
        except TimeoutError:
            return error_response(
                request, ControllerError.TIMEOUT, "the metadata change did not commit in time"
            )
        return decision.reply

    async def _place(self, job: PlacementJob) -> PreparedPlacement:
        """A new table's placement off the event loop. A big one runs in a worker process: a pure-Python
        placement on a thread holds the GIL for seconds, and the loop then waits for it at every wakeup
        (measured: stalls of 150-200 ms at 100,000 partitions on 2 loaded cores). Counting the load and
        building the partitions stay on a thread (they read and make this process's objects)."""
        if job.table.partitions < PROCESS_PLACEMENT_PARTITIONS:
            return await asyncio.to_thread(job.run)
        inputs = await asyncio.to_thread(job.inputs)
        if self._pool is None:
            self._pool = worker_pool()
        answer = await asyncio.get_running_loop().run_in_executor(self._pool, place_encoded, inputs)
        # The partitions are this process's objects: built on the loop in steps, yielding between them,
        # rather than on a thread that would hold the GIL.
        width, flat = job.decode(answer)
        parts: list[PartitionInfo] = []
        count = len(flat) // width
        for start in range(0, count, BUILD_STEP_PARTITIONS):
            parts.extend(job.partitions(width, flat, start, min(count, start + BUILD_STEP_PARTITIONS)))
            await asyncio.sleep(0)
        # The records and their bytes a block at a time too: one msgpack call over the whole table would hold
        # the loop for about 100 ms (the C packer keeps the GIL: a thread would not help).
        blocks = []
        for start in range(0, count, BLOCK_PARTITIONS):
            blocks.append(job.block(width, flat, start, min(count, start + BLOCK_PARTITIONS)))
            await asyncio.sleep(0)
        return job.prepared(parts, blocks)

    async def suspect(self, node_id: int, back: Callable[[], bool]) -> None:
        """Probe `node_id`'s registered RPC address; a refusal fences it now (`QuorumController.on_probe`).
        Does nothing unless this server hosts the active controller before and after the probe. `back()`:
        whether this server's connection to the node is up again (it is alive: stop probing)."""
        controller = self._controller
        server = self._metadata.image.servers.get(node_id)
        if controller is None or server is None or server.fenced:
            return
        result = await probe_after_hint(server.rpc.host, server.rpc.port, back)
        log.info("probe of server %d at %s:%d: %s", node_id, server.rpc.host, server.rpc.port, result.value)
        if self._controller is not controller:
            return
        try:
            batch = controller.on_probe(
                node_id, server.incarnation_id, result, self._driver.next_proposal_offset()
            )
            if batch is not None:
                self._propose([batch])
        except (NotLeaderError, ProposalRejectedError) as error:
            self._deactivate(str(error))

    def _propose(self, batches: Sequence[MetadataBatch], packed: Mapping[int, bytes] | None = None) -> None:
        for batch in batches:
            offset, epoch = self._driver.propose(encode_batch(batch, packed))
            self._proposed_epochs[offset] = epoch
            self._last_proposed = offset

    async def _committed(self, offset: int) -> None:
        if self._metadata.image.offset > offset:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append((offset, future))
        await future

    async def _tick_loop(self) -> None:
        while True:
            await asyncio.sleep(self._tick_interval_s)
            controller = self._controller
            if controller is None:
                continue
            try:
                now = self._clock()
                self._propose(controller.tick(now, self._driver.next_proposal_offset(), reassign=False))
            except (NotLeaderError, ProposalRejectedError) as error:
                self._deactivate(str(error))
                continue
            if self._reassigning is None:
                # Copies lost with a broker taken for gone first, alone; then the periodic rebalance.
                replace = controller.replacement_job(now)
                if replace is not None:
                    self._reassigning = asyncio.create_task(
                        self._replace(controller, replace), name="controller-replace"
                    )
                    continue
                job = controller.reassignment_job(now)
                if job is not None:
                    self._reassigning = asyncio.create_task(
                        self._reassign(controller, job), name="controller-reassign"
                    )

    async def _replace(self, controller: QuorumController, job: ReplaceJob) -> None:
        """Re-place the copies a gone broker held off the event loop, then write them if this controller is
        still the active one (each partition is checked against the view as it is then)."""
        await self._placement(
            controller,
            "re-placing lost copies",
            lambda: asyncio.to_thread(job.run),
            lambda wanted: controller.apply_replacement(job, wanted, self._driver.next_proposal_offset()),
        )

    async def _reassign(self, controller: QuorumController, job: ReassignJob) -> None:
        """Run the assignor off the event loop (heartbeats and requests go on), then apply its answer if
        this controller is still the active one."""

        async def run() -> Assignment | Desired:
            if job.image.partition_count() < PROCESS_PLACEMENT_PARTITIONS:
                return await asyncio.to_thread(job.run)
            return await self._reassign_in_process(job)

        await self._placement(
            controller,
            "reassignment",
            run,
            lambda desired: controller.apply_reassignment(
                job, desired, self._clock(), self._driver.next_proposal_offset()
            ),
        )

    async def _placement(
        self,
        controller: QuorumController,
        what: str,
        run: Callable[[], Awaitable[_Answer]],
        apply: Callable[[_Answer | Exception], MetadataBatch | None],
    ) -> None:
        """One background placement job (`_reassigning`): its answer, or the assignor's refusal, goes to
        `apply` only while `controller` is still the active one. A lost leadership ends the controller; any
        other failure is logged and the job runs again at the next metadata change."""
        try:
            answer: _Answer | Exception
            try:
                answer = await run()
            except (ValueError, AssignorInternalError) as error:
                answer = error
            if self._controller is not controller:
                return
            batch = apply(answer)
            if batch is not None:
                self._propose([batch])
        except (NotLeaderError, ProposalRejectedError) as error:
            self._deactivate(str(error))
        except Exception:
            log.exception("%s failed; it runs again at the next metadata change", what)
        finally:
            self._reassigning = None

    async def _reassign_in_process(self, job: ReassignJob) -> Desired:
        """A big cluster's reassignment in a worker process of its own (a create's placement does not wait
        behind it). On a thread the whole-cluster assignor held the GIL for seconds at 1M partitions, and
        the starved loop missed the metadata quorum's fetch timeouts: elections, one after another, while
        tables were created. The inputs are read from the image on the loop in steps; the answer holds
        only the partitions that change, at most `REASSIGN_STEP_PARTITIONS` of them applied per run."""
        inputs = await run_in_steps(job.input_steps())
        if self._reassign_pool is None:
            self._reassign_pool = worker_pool()
        answer = await asyncio.get_running_loop().run_in_executor(
            self._reassign_pool, reassign_encoded, inputs, REASSIGN_STEP_PARTITIONS
        )
        return decode_desired(answer)


# From this many partitions a new table is placed in a worker process (`ControllerHost._place`); below it,
# on a thread (about 0.1 s at 10,000 partitions: not worth a process round trip).
PROCESS_PLACEMENT_PARTITIONS = 20_000
# Partitions built per step on the loop (a few ms each).
BUILD_STEP_PARTITIONS = 1_000
# A cluster of PROCESS_PLACEMENT_PARTITIONS or more is reassigned in a worker process too
# (`_reassign_in_process`), which applies at most this many partitions' steps per run.
REASSIGN_STEP_PARTITIONS = 10_000


class _NotController(Exception):
    """The request was definitely not applied (safe to retry elsewhere)."""


class _OutcomeUnknown(Exception):
    """The request was proposed but leadership moved before it committed."""

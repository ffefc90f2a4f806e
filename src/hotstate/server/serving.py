"""Local reads: one partition answered from this server's replica, or refused; never forwarded.

Both the coordinator (for the partitions it reads here) and the RPC handler of `QueryPartitionsRequest`
(for a peer's coordinator) read through `LocalReads`. The replica's own server judges its lag against the
query's bound and its position against the query's token, so a replica without a lag report yet at the
coordinator is judged where its data is.

A read never opens, closes or rebuilds a store: a store that fails under it is reported through
`on_store_failure` and the partition is refused; the replica manager decides what becomes of the replica.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Generator, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, Final

from hotstate.controller.image import MetadataImage
from hotstate.protocol.replica_state import ReplicaState
from hotstate.query.execute import MAX_ROWS
from hotstate.query.expressions import EvalError
from hotstate.query.scan import ScanProgram, ScanRun
from hotstate.replica.messages import (
    PartitionQueryRequest,
    PartitionQueryResponse,
    QueryPartitionsRequest,
    QueryPartitionsResponse,
    ReplicaError,
)
from hotstate.replica.store import Store, StoreError
from hotstate.routing.freshness import END_UNKNOWN, bound_refusal, served_lag, token_refusal
from hotstate.routing.lags import LagTable
from hotstate.server.replicas import LocalReplica, replica_state
from hotstate.server.scan_pace import ScanPace

if TYPE_CHECKING:
    from hotstate.server.column_cache import ColumnCacheBuild, ColumnCaches, OffLoop

log = logging.getLogger(__name__)

# The rows a scan feeds its program at a time, between reads of the clock (query.scan.step.ms).
SCAN_CHUNK_ROWS: Final = 256

# What a local replica serves: (state, position, offset lag, items).
LocalRead = tuple[ReplicaState, int, int, tuple[tuple[bytes, bytes], ...]]

# How much lower the OS priority of the scan compute thread is than the rest of the server's: where the
# cores are busy, the event loop's thread (a lookup) takes the CPU from a scan's work first. Not lower:
# the thread holds the GIL between pyarrow's calls, and the loop waits for it while it is preempted.
SCAN_COMPUTE_NICE: Final = 10


def _lower_priority() -> None:
    """In the scan compute thread: below the server's other threads (Linux: a thread's own nice)."""
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), SCAN_COMPUTE_NICE)
    except (AttributeError, OSError) as error:  # not Linux, or not allowed: at the server's priority
        log.info("the scan compute thread keeps the server's priority: %s", error)


class StepTurns:
    """The scans of a server take turns, one step of one scan per turn of the event loop. Each scan yielding
    on its own, N scans ran N steps (N ms) between two polls for IO, which a point lookup waited out.

    `take` and `pass_on` return holding the turn and raise (cancelled) not holding it; the holder `give`s
    it back when it stops."""

    __slots__ = ("_busy", "_waiting")

    def __init__(self) -> None:
        self._busy = False
        self._waiting: deque[asyncio.Future[None]] = deque()

    async def take(self) -> None:
        if not self._busy:
            self._busy = True
            return
        await self._wait()

    async def pass_on(self) -> None:
        """Between two steps of the holder: the next scan waiting gets the turn (its step runs at the next
        turn of the loop, after IO) and the holder waits for it again; none waiting, the holder lets IO in
        and goes on."""
        if not self._hand_over():
            try:
                await asyncio.sleep(0)
            except asyncio.CancelledError:
                self.give()
                raise
            return
        await self._wait()

    def give(self) -> None:
        if not self._hand_over():
            self._busy = False

    def _hand_over(self) -> bool:
        while self._waiting:
            turn = self._waiting.popleft()
            if not turn.done():
                turn.set_result(None)
                return True
        return False

    async def _wait(self) -> None:
        turn = asyncio.get_running_loop().create_future()
        self._waiting.append(turn)
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():
                self.give()  # handed the turn as it was cancelled: pass it on
            raise


class LocalReads:
    def __init__(
        self,
        node_id: int,
        *,
        image: Callable[[], MetadataImage],
        replicas: Callable[[], Mapping[tuple[int, int], LocalReplica]],
        lags: LagTable,
        on_store_failure: Callable[[LocalReplica, StoreError], None],
        scan_max_rows: int = 10_000_000,
        scan_max_concurrent: int = 4,
        scan_step_rows: int = 1000,
        scan_step_ms: int = 1,
        scan_cache_bytes: int = 256 * 1024 * 1024,
        on_scan_cancelled: Callable[[], None] = lambda: None,
    ) -> None:
        """`replicas`: this server's replicas by (table id, partition) now (none on a server that holds
        none); `on_store_failure`: told of a store that failed under a read, after the read refused.
        `scan_*`: the `query.scan.*` settings; `on_scan_cancelled`: told of each scan stopped before its end
        because nobody waits for its answer any more."""
        self.node_id = node_id
        self._image = image
        self._replicas = replicas
        self._lags = lags
        self._on_store_failure = on_store_failure
        self.scan_max_rows = scan_max_rows
        self.scan_max_concurrent = scan_max_concurrent
        self.scan_step_rows = scan_step_rows
        self.scan_step_ms = scan_step_ms
        self.scans = 0  # partition scans running now
        self.scan_cache_bytes = scan_cache_bytes
        # Column copies (server/column_cache.py), once its module is loaded: see `_copies`.
        self.column_caches: ColumnCaches | None = None
        self._engine_loading: threading.Thread | None = None
        self._turns = StepTurns()
        self._on_scan_cancelled = on_scan_cancelled
        self._compute: ThreadPoolExecutor | None = None  # the scan compute thread, made at its first work

    def serve_partitions(self, request: QueryPartitionsRequest) -> QueryPartitionsResponse:
        """Answer a coordinator's partitions from this server's replicas, each on its own."""
        parts = request.parts
        if log.isEnabledFor(logging.DEBUG):
            names = ", ".join(f"{p.table}/{p.partition}" for p in parts)
            log.debug("forwarded partition query for user %r: %s", request.user or "-", names)
        if len(parts) == 1:  # a forwarded lookup: no generator per request
            return QueryPartitionsResponse((self.serve(parts[0]),))
        return QueryPartitionsResponse(tuple(self.serve(part) for part in parts))

    async def serve_partitions_stepped(self, request: QueryPartitionsRequest) -> QueryPartitionsResponse:
        """`serve_partitions` for a request with scans: each runs in steps, yielding between them."""
        answers = []
        for part in request.parts:
            answers.append(await self.scan(part) if part.program else self.serve(part))
        return QueryPartitionsResponse(tuple(answers))

    async def scan(self, request: PartitionQueryRequest) -> PartitionQueryResponse:
        """A scan (`request.program`) of one partition from this server's replica, in steps of at most
        `scan_step_rows` rows and about `scan_step_ms` with a yield to the event loop after each, or a
        refusal."""
        steps = self._scan_steps(request)
        turns = self._turns
        held = False
        result: object = None
        try:
            await turns.take()
            held = True
            while True:
                answer = steps.send(result)
                result = None
                if isinstance(answer, PartitionQueryResponse):
                    return answer
                held = False
                if answer is None:
                    await turns.pass_on()
                else:  # decided off the loop: the other scans' steps take their turns meanwhile
                    turns.give()
                    loop = asyncio.get_running_loop()
                    result = await loop.run_in_executor(self._compute_thread(), answer)
                    await turns.take()
                held = True
        except asyncio.CancelledError:  # its client went away (or its coordinator gave up)
            self._on_scan_cancelled()
            raise
        finally:
            if held:
                turns.give()
            steps.close()

    def _compute_thread(self) -> ThreadPoolExecutor:
        if self._compute is None:
            self._compute = ThreadPoolExecutor(1, "scan-compute", initializer=_lower_priority)
        return self._compute

    def close(self) -> None:
        """Stop the scan compute thread (after the work it has, if any)."""
        if self._compute is not None:
            self._compute.shutdown(wait=False, cancel_futures=True)
            self._compute = None

    def load_column_engine(self) -> None:
        """Load server/column_cache.py (and pyarrow, 0.4 s of CPU and 50 MB) and begin keeping column
        copies; a server that never scans never loads it."""
        try:
            from hotstate.server.column_cache import ColumnCaches
        except ImportError as error:
            log.warning("column copies for scans are off: %s", error)
            self.scan_cache_bytes = 0
            return
        self.column_caches = ColumnCaches(self.scan_cache_bytes)

    def _copies(self) -> ColumnCaches | None:
        """The column copies, or None until their module is loaded: the first scan that could use one
        loads it in a thread (the loop runs on meanwhile: 45 ms at most between its turns, where the import
        on the loop stalled it 0.4-0.9 s) and reads its rows as before."""
        if self.column_caches is not None or self.scan_cache_bytes <= 0:
            return self.column_caches
        if self._engine_loading is None:
            self._engine_loading = threading.Thread(
                target=self.load_column_engine, name="column-engine-import", daemon=True
            )
            self._engine_loading.start()
        return None

    def scan_now(self, request: PartitionQueryRequest) -> PartitionQueryResponse:
        """`scan` without yielding, its off-loop work done in place (the replication simulator, tests)."""
        steps = self._scan_steps(request)
        result: object = None
        try:
            while True:
                answer = steps.send(result)
                if isinstance(answer, PartitionQueryResponse):
                    return answer
                result = None if answer is None else answer()
        finally:
            steps.close()

    def _scan_steps(
        self, request: PartitionQueryRequest
    ) -> Generator[PartitionQueryResponse | OffLoop | None, object, None]:
        """Yields None between steps and work to do off the loop (its result sent back), then the answer."""
        checked = self._checked(request)
        if isinstance(checked, PartitionQueryResponse):
            yield checked
            return
        replica, state, position, offset_lag = checked
        if self.scans >= self.scan_max_concurrent:
            yield PartitionQueryResponse(
                ReplicaError.SCAN_BUSY,
                f"server {self.node_id} runs {self.scans} scans already (query.scan.max.concurrent)",
                state,
                position,
                offset_lag,
            )
            return
        self.scans += 1
        build: ColumnCacheBuild | None = None
        try:
            try:
                program = ScanProgram.decode(request.program)
                run = ScanRun(program, max_scanned=self.scan_max_rows)
            except ValueError as error:
                yield PartitionQueryResponse(ReplicaError.INVALID_REQUEST, f"bad scan program: {error}")
                return
            store = replica.store
            step_rows, step_s = self.scan_step_rows, self.scan_step_ms / 1000
            # A step reads and feeds chunks of at most SCAN_CHUNK_ROWS rows, each sized so reading and
            # feeding it takes about step_s (rows cost what the query and their size make them), until it
            # has fed step_rows or run for step_s, whichever comes first: a clock read a chunk, not a row.
            chunk_rows = min(step_rows, SCAN_CHUNK_ROWS)
            pace = ScanPace(chunk_rows, step_s)
            pid = replica.pid
            try:
                caches = None
                if (
                    request.scan
                    and request.start is None
                    and request.end is None
                    and run.answerable_from_columns
                ):
                    caches = self._copies()
                if caches is not None:
                    from hotstate.server.column_cache import scan_from_cache

                    names = run.column_names
                    cache = caches.usable(pid, store, names)
                    if cache is not None and (yield from scan_from_cache(cache, run, pace)):
                        items, partial = run.answer()
                        yield PartitionQueryResponse(
                            ReplicaError.NONE, "", state, position, offset_lag, items, partial
                        )
                        return
                    wanted = None if cache is not None else caches.to_build(pid, store, names)
                    if wanted is not None:
                        if run.keys_only:  # it reads no values: a copy of keys alone
                            wanted = frozenset()
                        elif wanted != names:  # the other columns of the partition's copy too
                            run = ScanRun(program, max_scanned=self.scan_max_rows, also_decode=wanted - names)
                        # Begun before the scan's iterator is made: the copy knows every key changed after.
                        build = caches.build(pid, store, wanted, run.readers)
                        run.on_decoded = build.add
                # Lists of (key, value) items, or of keys alone for a run that needs no values.
                chunks: Iterator[list[Any]]
                if request.scan:
                    chunks = store.scan_chunks(
                        request.start,
                        request.end,
                        lambda: min(pace.rows, step_rows - fed),  # a step feeds step_rows at most
                        keys_only=run.keys_only,
                        fill_cache=False,
                    )
                else:
                    values = store.get_many(request.keys)
                    found: list[Any] = [
                        (k if run.keys_only else (k, v))
                        for k, v in zip(request.keys, values, strict=True)
                        if v is not None
                    ]
                    chunks = pace.slices(found)
                feed: Callable[[Any], None] = run.feed_keys if run.keys_only else run.feed
                give_up = None if not program.budget_ms else time.monotonic() + program.budget_ms / 1000
                began = time.monotonic()
                fed, step_ends = 0, began + step_s
                for chunk in chunks:  # its read is timed with its feed: big rows cost their read
                    feed(chunk)
                    now = time.monotonic()
                    pace.took(len(chunk), now - began)
                    began = now
                    if run.done:
                        break
                    fed += len(chunk)
                    if fed < step_rows and now < step_ends:
                        continue
                    if give_up is not None and now > give_up:
                        # The coordinator has given up on the query by now: scanning on helps nobody.
                        yield PartitionQueryResponse(
                            ReplicaError.TIMEOUT,
                            f"the scan ran past the query's timeout_ms ({program.budget_ms} ms) after "
                            f"{run.scanned:,} rows",
                        )
                        return
                    yield None
                    began = time.monotonic()
                    fed, step_ends = 0, began + step_s
                else:
                    if build is not None and caches is not None:  # every row read: the copy is whole
                        caches.built(pid, build)
                        build = None
                items, partial = run.answer()
            except EvalError as error:
                yield PartitionQueryResponse(ReplicaError.BAD_QUERY, str(error), state, position, offset_lag)
                return
            except StoreError as error:
                if store.closed or replica.store is not store:
                    # Closed under the scan between two steps (a snapshot installed, the replica dropped):
                    # another replica serves the partition, and nothing is wrong with this one's disk.
                    yield PartitionQueryResponse(
                        ReplicaError.UNKNOWN_PARTITION,
                        f"server {self.node_id}'s replica of it closed mid-scan",
                    )
                    return
                self._on_store_failure(replica, error)
                yield PartitionQueryResponse(
                    ReplicaError.UNKNOWN_PARTITION, f"server {self.node_id}'s replica of it failed: {error}"
                )
                return
            yield PartitionQueryResponse(ReplicaError.NONE, "", state, position, offset_lag, items, partial)
        finally:
            self.scans -= 1
            if build is not None and self.column_caches is not None:  # the scan ended before the store's end
                self.column_caches.abandoned(replica.pid, build)

    def _replica_of(self, request: PartitionQueryRequest) -> LocalReplica | PartitionQueryResponse:
        """This server's replica of the partition, of the generation the query was planned against, or the
        refusal."""
        table_id = request.table_id
        if table_id < 0:
            table = self._image().tables.get(request.table)
            if table is None:
                return PartitionQueryResponse(ReplicaError.UNKNOWN_TABLE, f"no table {request.table!r} here")
            table_id = table.table_id
        # By the generation the query was planned against, whatever this server's image calls the name
        # now: during an overwrite's swap the old generation's replica serves until this server drops it,
        # and the new one's (staged under another name) from before this server hears of the swap.
        replica = self._replicas().get((table_id, request.partition))
        if replica is None:
            return PartitionQueryResponse(
                ReplicaError.UNKNOWN_PARTITION,
                f"server {self.node_id} holds no replica of it (generation {table_id} of the table)",
            )
        return replica

    def _checked(
        self, request: PartitionQueryRequest
    ) -> PartitionQueryResponse | tuple[LocalReplica, ReplicaState, int, int]:
        """The replica that may serve `request` with its state, position and lag, or the refusal."""
        # Every coordinator names the generation (table_id), and this server holds it in the common case:
        # one dict look-up, `_replica_of` only for the rest (its refusal, or a request by name).
        replica = self._replicas().get((request.table_id, request.partition))
        if replica is None:
            found = self._replica_of(request)
            if isinstance(found, PartitionQueryResponse):
                return found
            replica = found
        core = replica.core
        lag = served_lag(core, replica.witness, self._lags, self.node_id)
        state, position = replica_state(replica), core.position
        offset_lag = END_UNKNOWN if lag is None else lag
        refusal = None if request.max_lag is None else bound_refusal(request.max_lag, lag)
        if refusal is not None:
            return PartitionQueryResponse(ReplicaError.LAG_OVER_BOUND, refusal, state, position, offset_lag)
        if request.min_position > position:  # token_refusal's own test, without its call when it passes
            behind = token_refusal(core, request.min_position)
            if behind is not None:
                return PartitionQueryResponse(*behind, state, position)
        return replica, state, position, offset_lag

    def serve(self, request: PartitionQueryRequest) -> PartitionQueryResponse:
        """Answer one partition from this server's replica, or refuse."""
        read = self.read(request)
        if isinstance(read, PartitionQueryResponse):
            return read
        state, position, offset_lag, items = read
        return PartitionQueryResponse(ReplicaError.NONE, "", state, position, offset_lag, items)

    def read(self, request: PartitionQueryRequest) -> PartitionQueryResponse | LocalRead:
        """`serve`'s answer: its refusal, or what it serves as (state, position, offset lag, items), which
        the coordinator takes as it is for its own partitions (no message object in between). A scan
        (`request.program`) is answered by `scan_now`, which the coordinator does not call: it awaits
        `scan`, which yields to the event loop between steps."""
        if request.program:
            return self.scan_now(request)
        checked = self._checked(request)
        if isinstance(checked, PartitionQueryResponse):
            return checked
        replica, state, position, offset_lag = checked
        store = replica.store
        items: tuple[tuple[bytes, bytes], ...]
        try:
            if request.scan:
                limit = MAX_ROWS + 1 if request.limit is None else min(request.limit, MAX_ROWS + 1)
                items = range_items(store, request.start, request.end, limit)
            elif len(request.keys) == 1:
                [key] = request.keys
                value = store.get(key)
                items = () if value is None else ((key, value),)
            else:
                values = store.get_many(request.keys)
                if None in values:
                    items = tuple((k, v) for k, v in zip(request.keys, values, strict=True) if v is not None)
                else:  # every key found (the common case): paired in C
                    items = tuple(zip(request.keys, values, strict=True))  # type: ignore[arg-type]
        except StoreError as error:
            # A damaged block or a failing disk: never a partial answer.
            self._on_store_failure(replica, error)
            return PartitionQueryResponse(
                ReplicaError.UNKNOWN_PARTITION, f"server {self.node_id}'s replica of it failed: {error}"
            )
        return state, position, offset_lag, items


def range_items(
    store: Store, start: bytes | None, end: bytes | None, limit: int
) -> tuple[tuple[bytes, bytes], ...]:
    """`tuple(store.scan(start, end, limit=limit))`, gathered in C: the first `limit` items as one chunk
    (Store.scan_chunks) rather than a generator step and a cursor call per row (261 ns a row instead of
    381-394, measured on 166-row reads; the steps were a third of what a peer spent on a 1,000-key range
    query, profiled). A short chunk is the whole range: the generator is
    run to its end so that the same end-of-range check runs (a damaged block raises StoreError rather than
    cutting the answer short); a full one stops there unchecked, as `scan` does at its limit."""
    if limit <= 0:  # scan_chunks takes no empty chunk size; scan answers (or refuses) these
        return tuple(store.scan(start, end, limit=limit))
    chunks = store.scan_chunks(start, end, limit)
    first: list[tuple[bytes, bytes]] | None = next(chunks, None)
    if first is None:  # no rows: the end was checked already
        return ()
    if len(first) < limit:
        next(chunks, None)  # nothing follows a short chunk but the check
    elif isinstance(chunks, Generator):
        chunks.close()  # stopped at the limit: the RocksDB iterator goes now, not when collected
    return tuple(first)

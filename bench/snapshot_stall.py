"""The longest event-loop stall while a push query's snapshot of one large partition is sent, in-process.

One RocksDB store (hotstate's Store) holds `--rows` rows of about 100 bytes; a FeedHub over a stand-in
replica of it opens `SELECT * FROM t EMIT CHANGES` and a FeedStream writes it as /v1/changes' NDJSON to a
send that keeps the bytes (and never blocks, as a fast client's). A ticker task measures the longest gap
between its turns of the event loop from the open to the stream's `snapshot_end`: what every other request
on that server waits at worst (the garbage collector set up as a server's: server/runtime.py's settle_gc).
Run it against another checkout (PYTHONPATH) to compare.

    python bench/snapshot_stall.py --rows 200000
    python bench/snapshot_stall.py --rows 200000 --remote whole   # the holder of a remote snapshot, before
    python bench/snapshot_stall.py --rows 200000 --remote paged   # ... and read in pages
"""

from __future__ import annotations

import argparse
import asyncio
import inspect
import json
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from hotstate.controller.image import TableInfo
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.protocol.keys import encode_key
from hotstate.protocol.rows import encode_row
from hotstate.protocol.wire import MESSAGES
from hotstate.query.tokens import cluster_tag
from hotstate.replica.core import ReplicaRole
from hotstate.replica.messages import FeedReadRequest
from hotstate.replica.store import Store
from hotstate.server.feeds import FeedHub
from hotstate.server.http.changes import NATIVE, FeedStream
from hotstate.server.runtime import settle_gc

TABLE = TableInfo("t", 1, 1, 1, (KeyColumn("k", KeyType.STRING),), None)


async def measure(store: Store) -> dict[str, float]:
    replica = SimpleNamespace(
        store=store,
        table=TABLE,
        partition=0,
        installing=False,
        core=SimpleNamespace(role=ReplicaRole.LEADER, log_end_offset=store.position),
        log=SimpleNamespace(start_offset=0),
    )
    image = SimpleNamespace(tables={"t": TABLE}, partitions={})
    options: dict[str, Any] = {"max_subscriptions": 10, "buffer_changes": 1000}
    if "step_rows" in inspect.signature(FeedHub).parameters:
        options["step_rows"] = 1000
    hub = FeedHub(1, cluster_tag("c"), lambda: image, lambda: {(1, 0): replica}, **options)  # type: ignore[arg-type]
    longest = 0.0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal longest
        while not done.is_set():
            before = time.perf_counter()
            await asyncio.sleep(0)
            longest = max(longest, time.perf_counter() - before)

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    sent = 0
    started = time.perf_counter()
    feed = hub.open("SELECT * FROM t EMIT CHANGES", {})
    assert not inspect.isawaitable(feed)
    stream = FeedStream(feed, NATIVE)  # type: ignore[arg-type]

    async def send(message: dict[str, Any]) -> None:
        nonlocal sent
        body = message.get("body", b"")
        sent += len(body)
        if b'"snapshot_end"' in body:
            done.set()
            raise asyncio.CancelledError

    async def receive() -> dict[str, Any]:
        await asyncio.Event().wait()
        return {}

    run = asyncio.create_task(stream.run(send, receive))
    await done.wait()
    elapsed = time.perf_counter() - started
    run.cancel()
    await asyncio.gather(run, tick, return_exceptions=True)
    return {"longest_stall_ms": longest * 1000, "snapshot_s": elapsed, "bytes": sent}


async def measure_remote(store: Store, paged: bool) -> dict[str, float]:
    """The holder's side of a snapshot read by a feed on another server: its longest loop stall while it
    reads the rows and encodes its answers (as the RPC layer does, on the loop). `paged`: in pages
    (FeedPageRequest, this checkout); else whole, in one FeedReadRequest answer (before)."""
    replica = SimpleNamespace(store=store, table=TABLE, partition=0, installing=False)
    image = SimpleNamespace(tables={"t": TABLE}, partitions={})
    options: dict[str, Any] = {"max_subscriptions": 10, "buffer_changes": 1000}
    if "step_rows" in inspect.signature(FeedHub).parameters:
        options["step_rows"] = 1000
    hub = FeedHub(1, cluster_tag("c"), lambda: image, lambda: {(1, 0): replica}, **options)  # type: ignore[arg-type]
    longest = 0.0
    done = asyncio.Event()

    async def ticker() -> None:
        nonlocal longest
        while not done.is_set():
            before = time.perf_counter()
            await asyncio.sleep(0)
            longest = max(longest, time.perf_counter() - before)

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    started = time.perf_counter()
    sent = pages = rows = 0
    if paged:
        from hotstate.replica.messages import FeedPageRequest

        view_id, cursor = 0, None
        while True:
            answer = await hub.serve_page(FeedPageRequest(1, 0, view_id, cursor, hub.page_rows, 1 << 20))
            sent += len(MESSAGES.encode(answer))
            pages += 1
            rows += len(answer.rows)
            await asyncio.sleep(0)  # the RPC layer writes it, the next request comes
            if not answer.more:
                break
            view_id, cursor = answer.view_id, answer.cursor
    else:
        whole = await hub.serve_read(FeedReadRequest(1, 0, 0, 0, 0, rows=True))
        sent += len(MESSAGES.encode(whole))
        pages, rows = 1, len(whole.rows)
    elapsed = time.perf_counter() - started
    done.set()
    await tick
    return {
        "longest_stall_ms": longest * 1000,
        "read_s": elapsed,
        "bytes": sent,
        "pages": pages,
        "rows": rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--remote",
        choices=("whole", "paged"),
        help="measure the holder of a snapshot read by a feed on another server instead",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as directory:
        store = Store.open(Path(directory) / "store")
        pad = "x" * 60
        for start in range(0, args.rows, 10_000):
            records = [
                (encode_key((f"k{i:08}",)), encode_row({"k": f"k{i:08}", "v": i, "pad": pad}))
                for i in range(start, min(args.rows, start + 10_000))
            ]
            store.apply(records, store.position + len(records), 1)
        settle_gc()
        if args.remote is None:
            results = [asyncio.run(measure(store)) for _ in range(args.repeat)]
        else:
            paged = args.remote == "paged"
            results = [asyncio.run(measure_remote(store, paged)) for _ in range(args.repeat)]
        store.close()
    print(json.dumps({"rows": args.rows, "runs": results}, indent=1))


if __name__ == "__main__":
    main()

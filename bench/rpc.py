"""RPC throughput: loopback request/response round trips per second (sequential and pipelined, small
message) and encode+decode per second of a Raft FetchResponse carrying 100 entries.

Round trips are measured twice: with server and client on one event loop (one core does everything) and
with the server in a child process (each side has its own core, as between two real servers).

Run: .venv/bin/python bench/rpc.py  (writes bench/results/rpc.json)
"""

from __future__ import annotations

import asyncio
import datetime
import json
import multiprocessing
import os
import platform
import sys
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection as Pipe
from pathlib import Path

from hotstate.raft import messages as raft
from hotstate.raft.records import Entry, EntryKind, SnapshotId
from hotstate.rpc import Connection, PeerInfo, RpcServer, TypeRegistry

RESULTS = Path(__file__).parent / "results" / "rpc.json"
CLUSTER = "bench"
SECRET = b"bench-secret"
SEQUENTIAL_SECONDS = 2.0
PIPELINED_REQUESTS = 20_000
PIPELINE_WINDOW = 256
CODEC_SECONDS = 2.0
ENTRY_BYTES = 100


@dataclass(frozen=True, slots=True)
class Ping:
    seq: int
    body: bytes


@dataclass(frozen=True, slots=True)
class Pong:
    seq: int
    body: bytes


def registry() -> TypeRegistry:
    reg = TypeRegistry("bench")
    reg.register(1, Ping)
    reg.register(2, Pong)
    for type_id, cls in enumerate(
        [raft.Vote, raft.VoteResponse, raft.Fetch, raft.FetchResponse, raft.BeginQuorumEpoch], start=10
    ):
        reg.register(type_id, cls)
    return reg


async def handle(peer: PeerInfo, message: object) -> object | None:
    assert isinstance(message, Ping)
    return Pong(message.seq, message.body)


async def round_trips(port: int) -> dict[str, float]:
    client = Connection("127.0.0.1", port, cluster_id=CLUSTER, secret=SECRET, node_id=2, registry=registry())
    await client.connect(timeout=10)
    body = b"x" * 32
    for i in range(500):  # warm up
        await client.request(Ping(i, body), timeout=10)
    n = 0
    began = time.perf_counter()
    deadline = began + SEQUENTIAL_SECONDS
    while time.perf_counter() < deadline:
        for _ in range(100):
            await client.request(Ping(n, body), timeout=10)
            n += 1
    sequential = n / (time.perf_counter() - began)

    # A sliding window of requests in flight on the one connection.
    semaphore = asyncio.Semaphore(PIPELINE_WINDOW)

    async def one(i: int) -> None:
        async with semaphore:
            result = await client.request(Ping(i, body), timeout=30)
            assert isinstance(result, Pong) and result.seq == i

    began = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(PIPELINED_REQUESTS)))
    pipelined = PIPELINED_REQUESTS / (time.perf_counter() - began)
    await client.close()
    return {"sequential_rps": round(sequential), "pipelined_rps": round(pipelined)}


async def same_loop() -> dict[str, float]:
    server = RpcServer("127.0.0.1", 0, CLUSTER, SECRET, 1, handle, registry())
    await server.start()
    try:
        return await round_trips(server.port)
    finally:
        await server.close()


def serve_in_child(pipe: Pipe) -> None:
    async def main() -> None:
        server = RpcServer(
            "127.0.0.1", 0, CLUSTER, SECRET, 1, handle, registry(), max_concurrent_requests=PIPELINE_WINDOW
        )
        await server.start()
        pipe.send(server.port)
        await asyncio.get_running_loop().run_in_executor(None, pipe.recv)  # until told to stop
        await server.close()

    asyncio.run(main())


def two_processes() -> dict[str, float]:
    context = multiprocessing.get_context("fork")  # before any event loop exists in this process
    parent, child = context.Pipe()
    process = context.Process(target=serve_in_child, args=(child,), daemon=True)
    process.start()
    try:
        port = parent.recv()
        return asyncio.run(round_trips(port))
    finally:
        parent.send("stop")
        process.join(timeout=10)


def fetch_response() -> raft.FetchResponse:
    entries = tuple(Entry(1000 + i, 7, bytes([i % 256]) * ENTRY_BYTES, EntryKind.DATA) for i in range(100))
    return raft.FetchResponse(
        src=1,
        dst=2,
        epoch=7,
        leader_id=1,
        error=raft.ErrorCode.NONE,
        fetch_offset=1000,
        last_fetched_epoch=7,
        high_watermark=1100,
        entries=entries,
        diverging=None,
        snapshot_id=SnapshotId(900, 6),
    )


def rate(fn: object, seconds: float) -> float:
    assert callable(fn)
    for _ in range(50):
        fn()
    n = 0
    began = time.perf_counter()
    deadline = began + seconds
    while time.perf_counter() < deadline:
        for _ in range(50):
            fn()
        n += 50
    return n / (time.perf_counter() - began)


def codec() -> dict[str, float]:
    reg = registry()
    response = fetch_response()
    data = reg.encode(response)
    assert reg.decode(data) == response
    both = rate(lambda: reg.decode(reg.encode(response)), CODEC_SECONDS)
    return {
        "message": "FetchResponse with 100 entries of 100 bytes",
        "encoded_bytes": len(data),
        "encode_decode_per_s": round(both),
        "encode_per_s": round(rate(lambda: reg.encode(response), CODEC_SECONDS)),
        "decode_per_s": round(rate(lambda: reg.decode(data), CODEC_SECONDS)),
        "entries_decoded_per_s": round(both * 100),
    }


def main() -> None:
    codec_result = codec()
    split = two_processes()
    together = asyncio.run(same_loop())
    result = {
        "benchmark": "hotstate.rpc loopback round trips and FetchResponse codec",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "cpu_count": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "load_average_1m": round(os.getloadavg()[0], 2),
        "request": "Ping(seq, 32-byte body) -> Pong, one persistent authenticated connection",
        "pipeline_window": PIPELINE_WINDOW,
        "round_trips_server_in_child_process": split,
        "round_trips_same_event_loop": together,
        "codec": codec_result,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(result, indent=2) + "\n")
    print(
        f"round trips/s, server in child process: sequential {split['sequential_rps']}, "
        f"pipelined {split['pipelined_rps']}"
    )
    print(
        f"round trips/s, same event loop:         sequential {together['sequential_rps']}, "
        f"pipelined {together['pipelined_rps']}"
    )
    print(
        f"FetchResponse(100 entries, {codec_result['encoded_bytes']} bytes): "
        f"{codec_result['encode_decode_per_s']} encode+decode/s "
        f"(encode {codec_result['encode_per_s']}/s, decode {codec_result['decode_per_s']}/s)"
    )
    print(f"cpu_count={result['cpu_count']} load={result['load_average_1m']} -> {RESULTS}")


if __name__ == "__main__":
    main()

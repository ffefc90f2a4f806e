"""The probe that turns a hint into proof (server/suspects.py), against real sockets."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable

from hotstate.controller.evidence import ProbeResult
from hotstate.server.suspects import Suspects, probe, probe_after_hint


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_a_port_nothing_listens_on_is_refused_a_listening_one_answers() -> None:
    async def main() -> None:
        assert await probe("127.0.0.1", _closed_port()) is ProbeResult.REFUSED
        accepted: list[bool] = []
        server = await asyncio.start_server(lambda r, w: accepted.append(True), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        assert await probe("127.0.0.1", port) is ProbeResult.ANSWERED
        server.close()
        await server.wait_closed()
        assert await probe("127.0.0.1", port) is ProbeResult.REFUSED

    asyncio.run(main())


def test_no_answer_in_time_is_silence_not_proof() -> None:
    async def main() -> None:
        # A listening socket whose accept queue is full drops SYNs: the connect hangs, as for a paused or
        # partitioned host. (Linux keeps backlog + 1 pending connections.)
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen(0)
        port = listener.getsockname()[1]
        fillers = []
        try:
            # The first filler connected fills the queue; the others only make sure of it.
            first = socket.socket()
            first.setblocking(False)
            fillers.append(first)
            async with asyncio.timeout(5):
                await asyncio.get_running_loop().sock_connect(first, ("127.0.0.1", port))
            for _ in range(3):
                filler = socket.socket()
                filler.setblocking(False)
                with contextlib.suppress(BlockingIOError):
                    filler.connect(("127.0.0.1", port))
                fillers.append(filler)
            assert await probe("127.0.0.1", port, timeout_s=0.3) is ProbeResult.SILENT
        finally:
            for filler in fillers:
                filler.close()
            listener.close()

    asyncio.run(main())


def test_hints_about_one_node_join_the_probe_already_running() -> None:
    async def main() -> None:
        started: list[int] = []
        ended: list[int] = []
        release = asyncio.Event()
        changed = asyncio.Condition()

        async def check(node_id: int) -> None:
            async with changed:
                started.append(node_id)
                changed.notify_all()
            await release.wait()
            async with changed:
                ended.append(node_id)
                changed.notify_all()

        async def until(condition: Callable[[], bool]) -> None:
            async with asyncio.timeout(5), changed:
                await changed.wait_for(condition)

        suspects = Suspects(check)
        for node_id in (1, 1, 2, 1):
            suspects.hint(node_id)
        await until(lambda: len(started) >= 2)
        assert started == [1, 2]  # a check per hint would have started with these, in the same turn
        release.set()
        await until(lambda: len(ended) == 2)
        release.clear()
        suspects.hint(1)  # the earlier check ended: a new hint runs a new one
        await until(lambda: len(started) >= 3)
        assert started == [1, 2, 1]
        await suspects.close()

    asyncio.run(main())


def test_after_a_hint_the_probe_is_repeated_until_refused_or_the_connection_is_back() -> None:
    async def main() -> None:
        server = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        asked: list[bool] = []

        def dies_after_the_first_probe() -> bool:
            asked.append(True)
            server.close()  # the listener closes between the first and second probe
            return False

        result = await probe_after_hint("127.0.0.1", port, dies_after_the_first_probe, (0.0, 0.01))
        assert result is ProbeResult.REFUSED and asked == [True]

        alive = await asyncio.start_server(lambda r, w: None, "127.0.0.1", 0)
        alive_port = alive.sockets[0].getsockname()[1]
        result = await probe_after_hint("127.0.0.1", alive_port, lambda: True, (0.0, 0.01, 0.01))
        assert result is ProbeResult.ANSWERED  # answered, then our connection was back: no more probes
        alive.close()

    asyncio.run(main())

"""The push streams' send timeout (server/http/changes.py SendWatch): one timer for every stream, which
cancels only the tasks whose send has outlived push.send.timeout.ms, and says which they were."""

from __future__ import annotations

import asyncio

import pytest

from hotstate.server.http.changes import SendWatch


def test_a_send_that_outlives_the_timeout_has_its_task_cancelled_and_named_expired() -> None:
    async def scenario() -> None:
        watch = SendWatch(0.05)
        never: asyncio.Future[None] = asyncio.get_running_loop().create_future()

        async def stuck() -> None:
            task = asyncio.current_task()
            assert task is not None
            watch.begin(task)
            try:
                await never  # a client that reads nothing: the send never finishes
            finally:
                watch.end(task)

        async def quick() -> int:
            task = asyncio.current_task()
            assert task is not None
            sent = 0
            while not stuck_task.done():  # sends that finish at once, while the other one waits
                watch.begin(task)
                await asyncio.sleep(0)
                watch.end(task)
                sent += 1
            return sent

        stuck_task = asyncio.create_task(stuck())
        quick_task = asyncio.create_task(quick())
        with pytest.raises(asyncio.CancelledError):
            await stuck_task
        assert watch.expired(stuck_task) and not watch.expired(stuck_task)  # told once
        assert await quick_task > 0 and not watch.expired(quick_task)

    asyncio.run(scenario())

"""server/steps.py: a generator of steps run to its value, at once or with the loop let in between."""

from __future__ import annotations

import asyncio
from collections.abc import Generator

from hotstate.server.steps import run_at_once, run_in_steps


def _steps(ran: list[str], count: int) -> Generator[None, None, int]:
    for index in range(count):
        if index:
            yield
        ran.append(f"step-{index}")
    return count * 10


def test_at_once_runs_every_step_in_a_row_and_gives_the_value() -> None:
    ran: list[str] = []
    assert run_at_once(_steps(ran, 3)) == 30
    assert ran == ["step-0", "step-1", "step-2"]


def test_in_steps_lets_other_work_run_between_two_steps() -> None:
    async def main() -> tuple[int, list[str]]:
        ran: list[str] = []

        async def other() -> None:
            ran.append("other")

        stepped = asyncio.create_task(run_in_steps(_steps(ran, 3)))
        other_task = asyncio.create_task(other())
        value = await stepped
        await other_task
        return value, ran

    value, ran = asyncio.run(main())
    assert value == 30
    assert ran == ["step-0", "other", "step-1", "step-2"]

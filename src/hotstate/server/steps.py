"""Work written as a generator of steps (it yields between two steps and returns its value), run to its
value: at once, or with the event loop let in between the steps."""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import Final, TypeVar, cast

__all__ = ["run_at_once", "run_in_steps"]

T = TypeVar("T")

_MORE: Final = object()  # `_step`'s answer while steps remain


def run_at_once(steps: Generator[None, None, T]) -> T:
    """The value of `steps`, every step run in a row (for a caller that cannot wait)."""
    while (value := _step(steps)) is _MORE:
        pass
    return cast(T, value)


async def run_in_steps(steps: Generator[None, None, T]) -> T:
    """The value of `steps`, with a turn of the event loop between two steps: the loop is never held longer
    than a step."""
    while (value := _step(steps)) is _MORE:
        await asyncio.sleep(0)
    return cast(T, value)


def _step(steps: Generator[None, None, T]) -> T | object:
    """One step of `steps`: `_MORE` while steps remain, then the generator's value."""
    try:
        next(steps)
    except StopIteration as done:
        return cast(T, done.value)
    return _MORE

"""Histories of concurrent operations, as recorded by test clients, for the linearizability checker.

An operation is one client's request with the interval in which it was outstanding: `call_time` is read just
before the request is sent and `return_time` just after its answer arrives. Its output is either a definite
answer, which the model checks (including definite failures such as "table exists"), or `UNKNOWN`, for a
request whose fate the client never learned (a timeout, a dropped connection, a leader that died mid-request):
it may have taken effect at any moment after its call, or never. Such an operation normally has
`return_time = inf`; a finite one is a deadline: it took effect before then, or never.
"""

from __future__ import annotations

import enum
import math
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Generic, TypeVar

__all__ = ["UNKNOWN", "HistoryRecorder", "Operation", "Unknown"]


class Unknown(enum.Enum):
    """The type of `UNKNOWN`; an enum so that it is a singleton that survives copying and pickling."""

    UNKNOWN = "UNKNOWN"

    def __repr__(self) -> str:
        return "UNKNOWN"

    __str__ = __repr__


UNKNOWN: Final = Unknown.UNKNOWN

InputT = TypeVar("InputT")
OutputT = TypeVar("OutputT")


@dataclass(frozen=True, slots=True)
class Operation(Generic[InputT, OutputT]):
    """One request of one client: `output` is a definite answer, or `UNKNOWN` (see the module's doc)."""

    client_id: int
    input: InputT
    call_time: float
    output: OutputT | Unknown
    return_time: float

    def __post_init__(self) -> None:
        if math.isnan(self.call_time) or math.isinf(self.call_time):
            raise ValueError(f"call_time must be finite: {self!r}")
        if self.output is UNKNOWN:
            if not self.call_time <= self.return_time:
                raise ValueError(f"need call_time <= return_time: {self!r}")
        elif not self.call_time <= self.return_time < math.inf:
            raise ValueError(f"need call_time <= return_time < inf for a definite output: {self!r}")

    @classmethod
    def timed_out(
        cls, client_id: int, input: InputT, call_time: float, effect_deadline: float = math.inf
    ) -> Operation[InputT, OutputT]:
        """An operation whose outcome the client never learned.

        `effect_deadline`, if known, is when it must have taken effect by if it ever did (say, the
        request carried an expiry time the servers enforce); it is the operation's return time.
        """
        return cls(client_id, input, call_time, UNKNOWN, effect_deadline)

    @property
    def unknown(self) -> bool:
        return self.output is UNKNOWN


@dataclass(slots=True)
class _Pending(Generic[InputT, OutputT]):
    client_id: int
    input: InputT
    call_time: float
    done: Operation[InputT, OutputT] | None = None


class HistoryRecorder(Generic[InputT, OutputT]):
    """Records a history from many client threads or tasks.

    Call `invoke` just before sending a request and `ok`/`fail`/`timeout` just after learning its fate;
    the clock is read under a lock, so recorded times are ordered as the calls were. The lock is held only
    for a few list operations, so using it from asyncio tasks is fine. `fail` is for *definite* failures
    (the server answered "exists"): anything that leaves the outcome in doubt must be a `timeout`.
    Operations never completed count as timeouts: the client cannot know whether they took effect.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._lock = threading.Lock()
        self._ops: list[_Pending[InputT, OutputT]] = []

    def invoke(self, client_id: int, input: InputT) -> int:
        with self._lock:
            self._ops.append(_Pending(client_id, input, self._clock()))
            return len(self._ops) - 1

    def ok(self, token: int, output: OutputT) -> None:
        self._complete(token, output)

    def fail(self, token: int, output: OutputT) -> None:
        self._complete(token, output)

    def timeout(self, token: int, effect_deadline: float = math.inf) -> None:
        """The outcome is unknown; `effect_deadline` as for `Operation.timed_out`."""
        self._complete(token, UNKNOWN, effect_deadline)

    def _complete(self, token: int, output: OutputT | Unknown, effect_deadline: float = math.inf) -> None:
        with self._lock:
            pending = self._ops[token]
            if pending.done is not None:
                raise ValueError(f"operation {token} was already completed: {pending.done!r}")
            if output is UNKNOWN:
                pending.done = Operation.timed_out(
                    pending.client_id, pending.input, pending.call_time, effect_deadline
                )
            else:
                returned = max(self._clock(), pending.call_time)
                pending.done = Operation(
                    pending.client_id, pending.input, pending.call_time, output, returned
                )

    def operations(self) -> list[Operation[InputT, OutputT]]:
        """Every operation in invocation order; those still outstanding as timeouts."""
        with self._lock:
            return [
                p.done if p.done is not None else Operation.timed_out(p.client_id, p.input, p.call_time)
                for p in self._ops
            ]

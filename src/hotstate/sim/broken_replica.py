"""Replica cores with one replication rule broken, and replica shells (replica/shell.py) with their pump
broken: the simulator must catch each of them."""

from __future__ import annotations

import dataclasses

from hotstate.replica.core import AppendBatches, Ready, ReplicaCore
from hotstate.replica.messages import FetchRequest, FetchResponse
from hotstate.replica.shell import ReplicaShell


class HwIgnoresIsr(ReplicaCore):
    """Commits what the active alone holds: an ack then dies with the active."""

    def _high_watermark_candidate(self) -> int:
        return self._durable_end


class ExpandsIsrEarly(ReplicaCore):
    """Asks to add a follower to the ISR as soon as it fetches, caught up or not."""

    def _desired_isr(self) -> tuple[int, ...]:
        view = self._view
        assert view is not None
        return tuple(
            r for r in view.replicas if r == self.id or r in view.isr or self._followers.get(r) is not None
        )


class SkipsDivergenceCheck(ReplicaCore):
    """Serves any fetch from its offset without checking the fetcher's last epoch."""

    def _fetch_answer(self, request: FetchRequest) -> FetchResponse:
        if request.fetch_offset < self._log.start_offset or request.fetch_offset > self._log.end_offset:
            return super()._fetch_answer(request)
        forged = FetchRequest(
            request.src,
            request.dst,
            request.table_id,
            request.partition,
            request.leader_epoch,
            request.fetch_id,
            request.fetch_offset,
            self._log.epoch_at(request.fetch_offset - 1) if request.fetch_offset else 0,
            request.high_watermark,
            request.max_bytes,
        )
        return super()._fetch_answer(forged)


class AppliesAboveHw(ReplicaCore):
    """A follower applies everything it fetched, committed or not."""

    def _on_fetch_response(self, response: FetchResponse) -> None:
        super()._on_fetch_response(response)
        if self._leader is not None and self._leader != self.id:
            self._hw = max(self._hw, self._log.end_offset)


BROKEN_REPLICA_RULES: dict[str, type[ReplicaCore]] = {
    "hw-ignores-isr": HwIgnoresIsr,
    "expands-isr-early": ExpandsIsrEarly,
    "skips-divergence-check": SkipsDivergenceCheck,
    "applies-above-hw": AppliesAboveHw,
}
for _name, _cls in BROKEN_REPLICA_RULES.items():
    _cls.rule = _name  # type: ignore[attr-defined]


class SendsBeforeTheWrite(ReplicaShell):
    """Sends a Ready's messages as soon as it has it, before its log write is durable: a follower's fetch
    then tells the active it holds records that a crash can still take from its disk."""

    def _carry_out(self, ready: Ready) -> bool:
        for message in ready.messages:
            self.effects.send(message)
        return super()._carry_out(ready)

    def _finish(self) -> bool:
        effects = self.effects
        self.effects = dataclasses.replace(effects, send=lambda message: None)  # sent already
        try:
            return super()._finish()
        finally:
            self.effects = effects


class AppliesWhatItAppends(ReplicaShell):
    """Applies the batches it appends to the log as soon as they are durable, committed or not."""

    def _finish(self) -> bool:
        ready = self.writing
        assert ready is not None
        appended = tuple(b for op in ready.log_ops if isinstance(op, AppendBatches) for b in op.batches)
        if appended:
            self.writing = dataclasses.replace(ready, committed=(*ready.committed, *appended))
        return super()._finish()


class ForgetsDeferredApply(ReplicaShell):
    """Holds back the store write of a Ready that answers writers or peers, as the real pump does, but
    tells the core the held-back batches were applied: the store never gets them."""

    def _carry_out(self, ready: Ready) -> bool:
        self._whole = ready
        return super()._carry_out(ready)

    def _finish(self) -> bool:
        core = self.core
        self.core = _AdvancesWith(core, self._whole)  # type: ignore[assignment]
        try:
            return super()._finish()
        finally:
            self.core = core


class _AdvancesWith:
    def __init__(self, core: ReplicaCore, whole: Ready) -> None:
        self._core = core
        self._whole = whole

    def advance(self, ready: Ready) -> None:
        self._core.advance(self._whole)


BROKEN_SHELLS: dict[str, type[ReplicaShell]] = {
    "sends-before-the-write": SendsBeforeTheWrite,
    "applies-what-it-appends": AppliesWhatItAppends,
    "forgets-deferred-apply": ForgetsDeferredApply,
}
for _name, _shell in BROKEN_SHELLS.items():
    _shell.rule = _name  # type: ignore[attr-defined]

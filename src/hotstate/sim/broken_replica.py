"""Replica cores with one replication rule broken: the simulator must catch each of them."""

from __future__ import annotations

from hotstate.replica.core import ReplicaCore
from hotstate.replica.messages import FetchRequest, FetchResponse


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

"""A replica's lag for a bounded read: unknown until it has heard the partition's end since it opened."""

from __future__ import annotations

import dataclasses

from hotstate.log.batch import RecordBatch
from hotstate.replica.batchlog import BatchLog
from hotstate.replica.core import PartitionView, ReplicaConfig, ReplicaCore
from hotstate.replica.messages import FetchRequest, FetchResponse, LagInfo, ReplicaError
from hotstate.routing.freshness import (
    END_UNKNOWN,
    UNKNOWN_LAG_REASON,
    EndWitness,
    bound_refusal,
    lag_report,
    replica_state,
    served_lag,
    token_refusal,
)
from hotstate.routing.lags import LagTable

T, P = 7, 0
CONFIG = ReplicaConfig(min_insync_replicas=1)


def batch(base: int, epoch: int, count: int) -> RecordBatch:
    return RecordBatch(base, epoch, tuple(b"k=%d" % (base + i) for i in range(count)))


def restarted_standby(end: int, *, now: int = 1_000) -> ReplicaCore:
    """Node 2's replica reopened with `end` records in its log and store; node 1 is the active."""
    log = BatchLog(0, 0, [batch(0, 1, end)] if end else [])
    core = ReplicaCore(2, T, P, CONFIG, log=log, store_position=end, store_epoch=1 if end else 0, now=now)
    core.set_metadata(PartitionView(1, 2, (1,), (1, 2), 5), now)
    return core


def fetch_sent(core: ReplicaCore) -> FetchRequest:
    ready = core.ready()
    core.advance(ready)
    [request] = [m for m in ready.messages if isinstance(m, FetchRequest)]
    return request


def answer(request: FetchRequest, *, hw: int, end: int) -> FetchResponse:
    batches = (
        (batch(request.fetch_offset, 2, end - request.fetch_offset),) if end > request.fetch_offset else ()
    )
    return FetchResponse(1, 2, T, P, 2, request.fetch_id, ReplicaError.NONE, hw, 0, end, batches)


def report(node: int, *, end: int, hw: int, position: int | None = None) -> LagInfo:
    at = end if position is None else position
    return LagInfo("clicks", T, P, "standby", at, end, end - at, 2, hw, True)


def test_a_restarted_standby_cannot_know_its_lag_until_it_hears_the_active() -> None:
    core = restarted_standby(121)
    witness, lags = EndWitness(1_000), LagTable()
    # Its own log end is all it has: taking that for the partition's end would claim lag 0.
    assert served_lag(core, witness, lags, 2) is None
    assert bound_refusal(0, None) == UNKNOWN_LAG_REASON
    assert bound_refusal(None, None) is None  # an unbounded read may still use it
    info = lag_report(core, witness, lags, 2, table="clicks", state="standby", in_sync=False)
    assert (info.end_offset_position, info.offset_lag) == (END_UNKNOWN, END_UNKNOWN)
    # The active's answer tells it the partition's end: 15 records it has not applied.
    response = answer(fetch_sent(core), hw=136, end=136)
    core.step(response, 1_010)
    witness.observe(response, core)
    assert witness.heard_active
    assert served_lag(core, witness, lags, 2) == 15
    assert bound_refusal(0, 15) == "lag 15 > bound 0"
    assert bound_refusal(15, 15) is None


def test_a_new_empty_replica_is_not_caught_up_by_default() -> None:
    core = restarted_standby(0)
    assert served_lag(core, EndWitness(1_000), LagTable(), 2) is None


def test_a_fetch_answer_the_core_did_not_take_is_not_word_of_the_end() -> None:
    core = restarted_standby(121)
    witness = EndWitness(1_000)
    request = fetch_sent(core)
    # An answer to a fetch it no longer waits for (a duplicate, or sent to an earlier core): dropped.
    late = dataclasses.replace(answer(request, hw=136, end=136), fetch_id=request.fetch_id + 1)
    core.step(late, 1_010)
    witness.observe(late, core)
    assert not witness.heard_active


def test_a_lag_report_from_another_server_since_it_opened_tells_the_end() -> None:
    core = restarted_standby(121)
    witness, lags = EndWitness(1_000), LagTable()
    lags.update(1, [report(1, end=130, hw=130)], now_ms=999)  # arrived before it opened: not enough
    lags.update(2, [report(2, end=121, hw=121)], now_ms=1_001)  # its own report says nothing new
    assert served_lag(core, witness, lags, 2) is None
    lags.update(3, [report(3, end=140, hw=136, position=120)], now_ms=1_002)
    assert served_lag(core, witness, lags, 2) == 140 - 121


def test_an_active_knows_its_lag_unless_a_newer_active_committed_more() -> None:
    log = BatchLog(0, 0, [batch(0, 1, 200)])
    core = ReplicaCore(1, T, P, CONFIG, log=log, store_position=200, store_epoch=1, now=0)
    core.set_metadata(PartitionView(1, 1, (1,), (1, 2), 3), 0)
    core.advance(core.ready())
    witness, lags = EndWitness(0), LagTable()
    assert core.high_watermark == 200
    assert served_lag(core, witness, lags, 1) == 0
    # Deposed without knowing it: the new active (node 2, epoch 2) reports 202 records committed.
    lags.update(2, [LagInfo("clicks", T, P, "active", 202, 204, 0, 2, 202, True)], now_ms=5)
    assert served_lag(core, witness, lags, 1) == 2


def test_an_active_is_restoring_until_its_store_applied_what_it_held_when_it_became_active() -> None:
    """Not while its store merely trails its HW by the records being applied (under load, thousands): a
    lag report taken then made routers skip a running active (routing/router.py judges a restoring one).
    Between a Ready and its Advance the shell is applying the Ready's committed records."""
    log = BatchLog(0, 0, [batch(0, 1, 200)])
    core = ReplicaCore(1, T, P, CONFIG, log=log, store_position=100, store_epoch=1, now=0)
    core.set_metadata(PartitionView(1, 1, (1,), (1, 2), 3), 0)
    ready = core.ready()  # the records from 100 to be applied
    assert (core.high_watermark, core.epoch_start_offset, core.position) == (200, 200, 100)
    assert replica_state(core, ()) == "restoring"
    core.advance(ready)
    assert replica_state(core, ()) == "active"
    core.produce([b"k=%d" % i for i in range(50)], 1, 1, 1_000)
    core.advance(core.ready())  # appended
    ready = core.ready()  # committed (the ISR is itself alone), being applied
    assert (core.high_watermark, core.position) == (250, 200)
    assert replica_state(core, ()) == "active"


def test_a_token_ahead_of_the_store_is_refused_and_the_active_tells_one_no_write_reached() -> None:
    log = BatchLog(0, 0, [batch(0, 1, 200)])
    active = ReplicaCore(1, T, P, CONFIG, log=log, store_position=150, store_epoch=1, now=0)
    active.set_metadata(PartitionView(1, 1, (1,), (1, 2), 3), 0)
    assert token_refusal(active, 150) is None
    behind = (ReplicaError.BEHIND_TOKEN, "at position 150, the token asks for 180")
    assert token_refusal(active, 180) == behind
    error, message = token_refusal(active, 201) or (None, "")
    assert error is ReplicaError.TOKEN_AHEAD and "beyond the partition's log end 200" in message
    # A standby cannot tell: behind, whatever the position asked for.
    standby = restarted_standby(100)
    behind = (ReplicaError.BEHIND_TOKEN, "at position 100, the token asks for 500")
    assert token_refusal(standby, 500) == behind

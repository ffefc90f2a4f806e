"""A partition's attempts (routing/attempts.py): the pure decisions of the coordinator's loop."""

from __future__ import annotations

from hotstate.controller.image import PartitionInfo
from hotstate.replica.messages import PartitionQueryRequest, PartitionQueryResponse, ReplicaError
from hotstate.routing.attempts import (
    NOT_TRIED_IN_TIME,
    UNCONNECTED_ATTEMPT_S,
    WAIT_FOR_TOKEN,
    Attempts,
    Fail,
    Forward,
    ServeHere,
    attempt_timeout,
)
from hotstate.routing.lags import LagTable
from hotstate.routing.router import Skip, route

# Active on 2, standbys on 1 (the coordinator) and 3.
PART = PartitionInfo(1, 0, (2, 1, 3), 2, (), 1, (2, 1, 3))
SPEC = PartitionQueryRequest("clicks", 0, (b"k",), False, None, None, None, None)


def _attempts(
    *,
    local: int = 1,
    down: frozenset[int] = frozenset(),
    standby_reads: bool = True,
    spec: PartitionQueryRequest = SPEC,
) -> Attempts:
    decision = route(
        PART, table="clicks", alive=lambda n: n not in down, lags=LagTable(), local_node=local, max_lag=None
    )
    return Attempts(0, spec, decision, local, standby_reads)


def _refusal(error: ReplicaError, message: str) -> PartitionQueryResponse:
    return PartitionQueryResponse(error, message)


def test_the_candidates_in_route_order_local_ones_served_here() -> None:
    attempts = _attempts()
    assert attempts.next(0.0, 10.0) == Forward(2)  # the active first
    attempts.failed("timed out")
    step = attempts.next(0.0, 10.0)
    assert isinstance(step, ServeHere) and step.candidate.node_id == 1
    attempts.refused(_refusal(ReplicaError.LAG_OVER_BOUND, "lag 9 > bound 0"))
    assert attempts.next(0.0, 10.0) == Forward(3)
    attempts.failed("unreachable (NotConnected)")
    step = attempts.next(0.0, 10.0)
    assert isinstance(step, Fail) and step.token_ahead is None
    assert str(step.error) == (
        "no replica of clicks/0 can serve: 2 (active): timed out; 1 (standby): refused: lag 9 > bound 0; "
        "3 (standby): unreachable (NotConnected)"
    )


def test_standbys_are_passed_over_when_standby_reads_are_off() -> None:
    attempts = _attempts(standby_reads=False)
    assert attempts.next(0.0, 10.0) == Forward(2)
    attempts.failed("timed out")
    step = attempts.next(0.0, 10.0)
    assert isinstance(step, Fail)
    assert "1 (standby): standby reads are off for this query" in str(step.error)
    assert "3 (standby): standby reads are off for this query" in str(step.error)


def test_a_down_active_is_tried_after_the_live_standbys_and_its_failure_says_so() -> None:
    attempts = _attempts(local=3, down=frozenset({2}))
    assert isinstance(attempts.next(0.0, 10.0), ServeHere)  # equal lags: the local standby first
    attempts.refused(_refusal(ReplicaError.LAG_OVER_BOUND, "lag 9 > bound 0"))
    assert attempts.next(0.0, 10.0) == Forward(1)
    attempts.failed("timed out")
    assert attempts.next(0.0, 10.0) == Forward(2)
    attempts.failed("unreachable (NotConnected)")
    step = attempts.next(0.0, 10.0)
    assert isinstance(step, Fail) and "2 (active): down, tried anyway: unreachable" in str(step.error)


def test_nothing_is_tried_past_the_deadline() -> None:
    attempts = _attempts()
    step = attempts.next(10.0, 10.0)
    assert isinstance(step, Fail)
    assert [s.reason for s in step.error.skipped] == [NOT_TRIED_IN_TIME] * 3


def test_replicas_behind_the_token_are_waited_for_while_time_remains() -> None:
    spec = PartitionQueryRequest("clicks", 0, (b"k",), False, None, None, None, None, min_position=80)
    attempts = _attempts(spec=spec)
    attempts.next(0.0, 10.0)
    attempts.refused(_refusal(ReplicaError.BEHIND_TOKEN, "at 50, the token asks for 80"))
    for _ in range(2):
        attempts.next(0.0, 10.0)
        attempts.refused(_refusal(ReplicaError.BEHIND_TOKEN, "at 60, the token asks for 80"))
    assert attempts.next(0.0, 10.0) is WAIT_FOR_TOKEN
    # Too little time left for another round: the error names each position.
    last = _attempts(spec=spec)
    for _ in range(3):
        last.next(9.995, 10.0)
        last.refused(_refusal(ReplicaError.BEHIND_TOKEN, "at 60, the token asks for 80"))
    step = last.next(9.995, 10.0)
    assert isinstance(step, Fail) and "at 60, the token asks for 80" in str(step.error)


def test_a_token_wait_that_runs_out_between_rounds_names_the_positions_of_the_last_round() -> None:
    """On a loaded machine the wait between two rounds can overrun the timeout: the round after it tries no
    one, and the error still names each replica's position against the token, not "timed out before
    trying it"."""
    first = _attempts()
    first.skipped = [
        Skip(2, "refused: at 50, wants 80", "active"),
        Skip(3, "refused: at 60, wants 80", "standby"),
    ]
    again = first.again(first.route)
    step = again.next(1.0, 0.0)  # the time is up before it starts
    assert isinstance(step, Fail)
    assert "at 50, wants 80" in str(step.error) and "at 60, wants 80" in str(step.error)
    assert "before trying it" not in str(step.error)


def test_a_token_beyond_the_log_end_fails_as_the_callers_mistake() -> None:
    attempts = _attempts()
    attempts.next(0.0, 10.0)
    attempts.refused(_refusal(ReplicaError.TOKEN_AHEAD, "beyond the partition's log end 7"))
    for _ in range(2):
        attempts.next(0.0, 10.0)
        attempts.refused(_refusal(ReplicaError.BEHIND_TOKEN, "at 7, the token asks for 9"))
    step = attempts.next(0.0, 10.0)
    assert isinstance(step, Fail) and step.token_ahead == "beyond the partition's log end 7"


def test_a_hedge_goes_on_from_the_next_candidate_and_shares_the_failures() -> None:
    attempts = _attempts(standby_reads=False)
    assert attempts.next(0.0, 10.0) == Forward(2)
    copy = attempts.hedged()
    assert isinstance(copy.next(0.0, 10.0), Fail)  # nothing else may serve: the forward already sent stays
    assert attempts.skipped == []  # the copy records no passes: the original does when it gets there
    attempts = _attempts()
    attempts.next(0.0, 10.0)
    copy = attempts.hedged()
    assert isinstance(copy.next(0.0, 10.0), ServeHere)
    copy.refused(_refusal(ReplicaError.LAG_OVER_BOUND, "lag 9 > bound 0"))
    assert attempts.skipped == [Skip(1, "refused: lag 9 > bound 0", "standby")]


def test_one_attempt_gets_half_the_budget_unless_it_is_the_last_hope() -> None:
    attempts = _attempts()
    attempts.next(0.0, 10.0)  # the active, two candidates after it
    assert attempt_timeout([attempts], 8.0, connected=True) == 4.0
    assert attempt_timeout([attempts], 0.6, connected=True) == 0.5  # never less than MIN_ATTEMPT_S...
    assert attempt_timeout([attempts], 0.2, connected=True) == 0.2  # ...nor more than what is left
    assert attempt_timeout([attempts], 8.0, connected=False) == UNCONNECTED_ATTEMPT_S
    for _ in range(2):
        attempts.failed("timed out")
        attempts.next(0.0, 10.0)
    assert attempts.on_last
    assert attempt_timeout([attempts], 8.0, connected=True) == 8.0


def test_a_down_last_candidate_gets_half_and_only_a_connect_while_a_live_one_catches_up() -> None:
    attempts = _attempts(local=3, down=frozenset({2}))
    for _ in range(2):  # both live standbys are behind the token
        attempts.next(0.0, 10.0)
        attempts.refused(_refusal(ReplicaError.BEHIND_TOKEN, "at 5, the token asks for 9"))
    assert attempts.next(0.0, 10.0) == Forward(2) and attempts.on_last
    assert attempts.candidate.node_id == 2 and attempts.candidate.down
    assert attempt_timeout([attempts], 8.0, connected=True) == UNCONNECTED_ATTEMPT_S
    attempts.behind = False
    assert attempt_timeout([attempts], 8.0, connected=True) == 4.0

"""One partition's way through its route, as a sans-IO state machine: what the coordinator does next.

Given the partition's route (routing/router.py), the query's deadline and whether standbys may answer, it
says what to do next: serve here (the candidate is this server's replica), forward to a peer, wait for a
replica to reach the query's token, or fail with every replica named and why. The coordinator's shell
(server/coordinator.py) does the IO and feeds back what came of it: a refusal (`refused`), a failed forward
(`failed`). The clock is passed in; nothing here sleeps, sends or reads a store, so the replication
simulator drives the same rules as the servers.

How long one attempt may take (`attempt_timeout`) is decided here too: one slow or dead peer must not eat
a query's whole budget while others could answer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from hotstate.replica.messages import PartitionQueryRequest, PartitionQueryResponse, ReplicaError
from hotstate.routing.router import Candidate, NoReplicaError, Route, Skip

# A partition whose replicas are all behind the query's token is asked again this often (they apply what
# the active commits within milliseconds) until the query's timeout.
BEHIND_RETRY_S = 0.01
# Heartbeats keep a connection open to every live peer, so one that is not connected is most likely dead:
# it gets this long to connect before the next candidate is tried (and so does a server down by heartbeats
# while a live replica waits to catch up with the query's token).
UNCONNECTED_ATTEMPT_S = 0.3
# The least a peer that is not a partition's last hope gets, however little of the budget is left.
MIN_ATTEMPT_S = 0.5
NOT_TRIED_IN_TIME = "query timed out before trying it"
STANDBY_READS_OFF = "standby reads are off for this query"


@dataclass(frozen=True, slots=True)
class ServeHere:
    """Read the partition from this server's replica, then report a refusal with `Attempts.refused`."""

    candidate: Candidate


@dataclass(frozen=True, slots=True)
class Forward:
    """Ask `node_id` (with the other partitions going there this round); report a refusal or failure."""

    node_id: int


@dataclass(frozen=True, slots=True)
class WaitForToken:
    """Every replica that answered is behind the query's token: route again after BEHIND_RETRY_S."""


@dataclass(frozen=True, slots=True)
class Fail:
    """No candidate is left. `token_ahead`: the active said no write ever reached the token's position,
    which is the caller's mistake (a 400), not the cluster's (a 503 with `error`)."""

    error: NoReplicaError
    token_ahead: str | None = None


Action = ServeHere | Forward | WaitForToken | Fail
WAIT_FOR_TOKEN = WaitForToken()
_FORWARDS: dict[int, Forward] = {}  # by node id (a Forward is immutable)


@dataclass(slots=True)
class Attempts:
    """One partition's attempts: the candidate being tried and what went wrong so far."""

    partition: int
    spec: PartitionQueryRequest
    route: Route
    local_node: int
    standby_reads: bool = True
    index: int = -1
    skipped: list[Skip] = field(default_factory=list)
    behind: bool = False  # some replica refused as behind the query's token
    # The previous round's failures, when the query waits for a replica to reach its token: what the error
    # says if time runs out before this round tries anyone.
    earlier: Sequence[Skip] = ()  # (a tuple, not a list per partition per query: most never wait)
    ahead: str | None = None  # the active refused the token as beyond the partition's log end
    # A hedge's copy: it shares `skipped` with the original, which records the candidates it passes over.
    hedge: bool = False

    def next(self, now: float, deadline: float) -> Action:
        """The next thing to do for this partition at `now` (seconds, the deadline's clock)."""
        while True:
            self.index += 1
            if self.index >= len(self.route.candidates):
                return self._exhausted(now, deadline)
            candidate = self.route.candidates[self.index]
            if not self.standby_reads and candidate.role != "active":
                if not self.hedge:
                    self.skipped.append(candidate.passed(STANDBY_READS_OFF))
                continue
            if deadline - now <= 0:
                if not self.hedge:
                    self.skipped.append(candidate.passed(NOT_TRIED_IN_TIME))
                continue
            if candidate.node_id == self.local_node:
                return ServeHere(candidate)
            forward = _FORWARDS.get(candidate.node_id)
            if forward is None:  # one per peer, made once: this runs on every forward
                forward = _FORWARDS[candidate.node_id] = Forward(candidate.node_id)
            return forward

    def refused(self, answer: PartitionQueryResponse) -> None:
        """The candidate being tried refused the partition (over the bound, behind the token, ...)."""
        if answer.error is ReplicaError.BEHIND_TOKEN:
            self.behind = True
        elif answer.error is ReplicaError.TOKEN_AHEAD:
            self.ahead = answer.message
        self.skipped.append(self.candidate.skip(f"refused: {answer.message}"))

    def failed(self, reason: str) -> None:
        """Asking the candidate being tried failed: unreachable, timed out, a broken answer."""
        self.skipped.append(self.candidate.skip(reason))

    def hedged(self) -> Attempts:
        """A copy that goes on from the next candidate while this one waits for its answer."""
        return Attempts(
            self.partition,
            self.spec,
            self.route,
            self.local_node,
            self.standby_reads,
            self.index,
            self.skipped,
            hedge=True,
        )

    def again(self, route: Route) -> Attempts:
        """This partition's next round after a wait for its token, freshly routed."""
        return Attempts(
            self.partition, self.spec, route, self.local_node, self.standby_reads, earlier=self.skipped
        )

    @property
    def candidate(self) -> Candidate:
        return self.route.candidates[self.index]

    @property
    def on_last(self) -> bool:
        return self.index == len(self.route.candidates) - 1

    def _exhausted(self, now: float, deadline: float) -> Action:
        if self.ahead is not None:
            return Fail(self.route.error(self.skipped), self.ahead)
        if self.behind and deadline - now > BEHIND_RETRY_S:
            return WAIT_FOR_TOKEN
        if self.earlier and all(skip.reason == NOT_TRIED_IN_TIME for skip in self.skipped):
            return Fail(self.route.error(self.earlier))  # each replica's position against the token's
        return Fail(self.route.error(self.skipped))


def attempt_timeout(group: Sequence[Attempts], remaining: float, connected: bool) -> float:
    """How long the peer asked for `group`'s partitions (each on it as its candidate) may take, with
    `remaining` seconds of the query's budget left.

    One slow or dead server must not eat the whole budget while others could answer. Nor may one that looks
    down, even as a partition's last candidate: it may be paused, and while a live replica is behind the
    query's token it is only a moment from serving (asked again once this one failed), so such a server gets
    no longer than a connect. One that only flapped answers in milliseconds."""
    if len(group) == 1:  # a lookup's one partition (most forwards): no generators
        [only] = group
        down, on_last, behind = only.candidate.down, only.on_last, only.behind
    else:
        down = any(a.candidate.down for a in group)
        on_last = any(a.on_last for a in group)
        behind = any(a.behind for a in group)
    attempt = remaining if on_last and not down else max(MIN_ATTEMPT_S, remaining / 2)
    if not connected or (down and behind):
        attempt = min(attempt, UNCONNECTED_ATTEMPT_S)
    return min(attempt, remaining)


def on_last(group: Sequence[Attempts]) -> bool:
    """Whether every partition of `group` is on its last candidate: a hedge of it has no one to ask."""
    if len(group) == 1:
        return group[0].on_last
    return all(a.on_last for a in group)

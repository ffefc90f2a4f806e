"""Push queries from Python: `client.subscribe(sql)` iterates a table's changes (`AsyncClient`: `async for`,
`Client`: a blocking iterator), resuming by itself on another server when its server dies or ends the feed.

    async with hotstate.AsyncClient(["127.0.0.1:8088", "127.0.0.1:8089"]) as client:
        async for change in client.subscribe("SELECT * FROM clicks WHERE user = 'u1' EMIT CHANGES"):
            print(change.kind, change.key, change.row)  # row None: deleted

The feed (`POST /v1/changes`, docs/queries.md "Push queries") starts with the current rows (`kind`
"snapshot", given once the snapshot is whole) and goes on with every committed change (`kind` "change"), in
log order per partition. The client keeps the position it reached per partition (a change's offset + 1);
when the stream breaks or ends (the server was killed, its replica moved, the subscriber fell behind) it
subscribes again, on the next server of its list, from those positions, and drops any change below them, so
every change is delivered exactly once. Where the log no longer holds the changes after a position (a
retention, a replica rebuilt), the server sends the partition's current rows instead: a `kind`
"resync_begin" marker for the partition, then its rows as `kind` "resync" (a key of that partition held
before and missing among them was deleted meanwhile; a large resync comes in parts, one marker for all). A
dropped table ends the iteration (`subscription.end_reason == "dropped"`). `subscription.token` is where it
is: `from_token=` resumes there later.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncGenerator, Generator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from hotstate.query.tokens import decode, encode, tag_of

if TYPE_CHECKING:
    from hotstate.client.query import AsyncClient, Client, QueryFailed

__all__ = ["AsyncSubscription", "Change", "FeedState", "Subscription"]

# A server sends something (at least a progress event) every few seconds; silence this long means it is
# gone (a network cut or a paused process: a killed one resets the connection at once).
READ_TIMEOUT_S = 15.0
# Every server refused or was unreachable: the next round after this long.
ROUND_PAUSE_S = 0.2


@dataclass(frozen=True, slots=True)
class Change:
    """One item of a feed. `kind`: "snapshot" (a current row at the start), "change" (a committed change
    at `offset`, in leader epoch `epoch`), "resync_begin" (the partition's current rows follow, replacing
    what was known of it) or "resync" (one of those rows). `row` None: the key was deleted, or (`left`)
    its row no longer matches the feed's WHERE: either way it is out of the feed's view."""

    kind: str
    partition: int
    key: tuple[Any, ...]
    row: dict[str, Any] | None
    offset: int | None = None
    epoch: int | None = None
    left: bool = False

    @property
    def deleted(self) -> bool:
        return self.row is None and self.kind == "change"


class FeedState:
    """Sans-IO: a subscription's positions, what each event means, and which server to ask next."""

    def __init__(self, sql: str, from_token: str | None, snapshot: bool, servers: int, first: int) -> None:
        self.sql = sql
        self.from_token = from_token
        self.snapshot = snapshot
        self.tag: bytes | None = None
        self.table_id: int | None = None
        self.positions: dict[int, int] | None = None  # None until the feed's start is known
        self.start: dict[int, int] | None = None  # where its first server started it, per partition
        self.end_reason: str | None = None  # the last end event's reason
        self.ends: list[str] = []  # the reasons of the end events so far (the last 100)
        self.end_message = ""
        self.final = False
        self.resumes = 0
        self._snapshot: list[Change] = []
        # Whether the feed's start is whole (its snapshot ended): until then a resume starts it again.
        self._started = from_token is not None
        self._servers = servers
        self.server = first
        self._failed_in_round = 0

    # ------------------------------------------------------------------------------------- requests
    @property
    def token(self) -> str | None:
        """Where the subscription is: a token to resume from (None before its start is known)."""
        if self.positions is None or self.tag is None or self.table_id is None:
            return self.from_token
        table_id = self.table_id
        return encode({(table_id, p): position for p, position in self.positions.items()}, self.tag)

    def body(self) -> dict[str, object]:
        token = self.token
        if token is not None:
            return {"sql": self.sql, "from_token": token}
        return {"sql": self.sql, "snapshot": self.snapshot}

    def moved_on(self, same_server: bool = False) -> float:
        """The stream ended or failed: the next server to ask (unless `same_server`), and how long to wait
        first (a pause once every server failed in a row)."""
        self.resumes += 1
        self._snapshot.clear()
        if not self._started:  # the snapshot broke off: take it again, whole
            self.positions = self.start = None
        if same_server:
            return 0.0
        self.server = (self.server + 1) % self._servers
        self._failed_in_round += 1
        if self._failed_in_round >= self._servers:
            self._failed_in_round = 0
            return ROUND_PAUSE_S
        return 0.0

    # ------------------------------------------------------------------------------------- events
    def on_line(self, line: str) -> list[Change]:
        """The changes an event line delivers (after dropping any the subscription had)."""
        if not line:
            return []
        event = json.loads(line)
        kind = event.get("type")
        if kind == "header":
            self._failed_in_round = 0
            self.tag = tag_of(event["token"])
            self.table_id = int(event["table_id"])
            start = {p: pos for (t, p), pos in decode(event["token"], self.tag).items() if t == self.table_id}
            if self.start is None:
                self.start = dict(start)
            self.positions = (
                start
                if self.positions is None
                else self.positions | {p: max(pos, self.positions.get(p, 0)) for p, pos in start.items()}
            )
            return []
        if kind == "row":
            row = Change("snapshot", int(event["partition"]), tuple(event["key"]), event["row"])
            self._snapshot.append(row)
            return []
        if kind == "snapshot_end":
            self._started = True
            self._advance(event["positions"])
            rows, self._snapshot = self._snapshot, []
            return rows
        if kind == "change":
            self._started = True  # (a feed started without a snapshot has no snapshot_end)
            partition, offset = int(event["partition"]), int(event["offset"])
            positions = self._positions()
            if offset < positions.get(partition, 0):
                return []  # had it before a resume
            positions[partition] = offset + 1
            return [
                Change(
                    "change",
                    partition,
                    tuple(event["key"]),
                    event["row"],
                    offset,
                    int(event["epoch"]),
                    bool(event.get("left", False)),
                )
            ]
        if kind == "resync":
            partition, position = int(event["partition"]), int(event["position"])
            positions = self._positions()
            if position < positions.get(partition, 0):
                return []
            if not event.get("more"):  # its last part (a resume before it takes the whole resync again)
                positions[partition] = position
            rows = [Change("resync", partition, tuple(r["key"]), r["row"]) for r in event["rows"]]
            if event.get("continued"):
                return rows
            return [Change("resync_begin", partition, (), None), *rows]
        if kind == "progress":
            self._advance(event["positions"])
            return []
        if kind == "end":
            self._advance(event["positions"])
            self.end_reason = str(event["reason"])
            self.ends = [*self.ends[-99:], self.end_reason]
            self.end_message = str(event.get("message", ""))
            self.final = bool(event.get("final"))
            return []
        return []  # an event of a newer server: nothing this client acts on

    def _positions(self) -> dict[int, int]:
        if self.positions is None:
            self.positions = {}
        return self.positions

    def _advance(self, given: dict[str, int]) -> None:
        positions = self._positions()
        for p, position in given.items():
            partition = int(p)
            if position > positions.get(partition, -1):
                positions[partition] = position


def _refusal(response: httpx.Response, server: str) -> QueryFailed:
    # Imported here: client/query.py imports this module.
    from hotstate.client.query import query_failure

    return query_failure(response, server)


class _Position:
    """Where a subscription is, read from its FeedState: what both kinds of subscription show."""

    state: FeedState

    @property
    def token(self) -> str | None:
        return self.state.token

    @property
    def end_reason(self) -> str | None:
        return self.state.end_reason

    @property
    def resumes(self) -> int:
        return self.state.resumes


class AsyncSubscription(_Position):
    """`async for change in subscription`; `token`, `end_reason` and `resumes` say where it is."""

    def __init__(self, client: AsyncClient, state: FeedState, timeout_s: float) -> None:
        self._client = client
        self.state = state
        self._timeout_s = timeout_s
        self._changes = self._run()

    def __aiter__(self) -> AsyncSubscription:
        return self

    async def __anext__(self) -> Change:
        return await self._changes.__anext__()

    async def aclose(self) -> None:
        await self._changes.aclose()

    async def _run(self) -> AsyncGenerator[Change, None]:
        import asyncio

        client, state = self._client, self.state
        http = client._http
        failing_since: float | None = None
        last: BaseException | None = None
        while True:
            url = client._urls[state.server]
            same = False
            state.end_reason = None
            try:
                timeout = httpx.Timeout(READ_TIMEOUT_S, connect=client.connect_timeout_s)
                request = http.stream("POST", url + "/v1/changes", json=state.body(), timeout=timeout)
                async with request as response:
                    if response.status_code != 200:
                        await response.aread()
                        failure = _refusal(response, client.servers[state.server])
                        if response.status_code < 500:
                            raise failure
                        last = failure
                    else:
                        async for line in response.aiter_lines():
                            changes = state.on_line(line)
                            failing_since = None
                            for change in changes:
                                yield change
                        if state.final:
                            return
                        same = state.end_reason == "fell_behind"
            except (httpx.TransportError, httpx.StreamError, json.JSONDecodeError) as error:
                last = error
            now = time.monotonic()
            if failing_since is None:
                failing_since = now
            elif now - failing_since > self._timeout_s:
                raise _gave_up(client.servers, last)
            pause = state.moved_on(same_server=same)
            if pause:
                await asyncio.sleep(pause)


class Subscription(_Position):
    """The blocking twin of AsyncSubscription: `for change in subscription`."""

    def __init__(self, client: Client, state: FeedState, timeout_s: float) -> None:
        self._client = client
        self.state = state
        self._timeout_s = timeout_s
        self._changes = self._run()

    def __iter__(self) -> Subscription:
        return self

    def __next__(self) -> Change:
        return next(self._changes)

    def close(self) -> None:
        self._changes.close()

    def _run(self) -> Generator[Change, None, None]:
        client, state = self._client, self.state
        http = client._http
        failing_since: float | None = None
        last: BaseException | None = None
        while True:
            url = client._urls[state.server]
            same = False
            state.end_reason = None
            try:
                timeout = httpx.Timeout(READ_TIMEOUT_S, connect=client.connect_timeout_s)
                request = http.stream("POST", url + "/v1/changes", json=state.body(), timeout=timeout)
                with request as response:
                    if response.status_code != 200:
                        response.read()
                        failure = _refusal(response, client.servers[state.server])
                        if response.status_code < 500:
                            raise failure
                        last = failure
                    else:
                        for line in response.iter_lines():
                            changes = state.on_line(line)
                            failing_since = None
                            yield from changes
                        if state.final:
                            return
                        same = state.end_reason == "fell_behind"
            except (httpx.TransportError, httpx.StreamError, json.JSONDecodeError) as error:
                last = error
            now = time.monotonic()
            if failing_since is None:
                failing_since = now
            elif now - failing_since > self._timeout_s:
                raise _gave_up(client.servers, last)
            pause = state.moved_on(same_server=same)
            if pause:
                time.sleep(pause)


def _gave_up(servers: list[str], last: BaseException | None) -> Exception:
    from hotstate.client.query import ClusterUnreachable, QueryFailed

    if isinstance(last, QueryFailed):
        return last
    return ClusterUnreachable(servers, last)

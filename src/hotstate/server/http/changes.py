"""Push queries over HTTP: a feed (server/feeds.py) written as ksqlDB's `/query-stream` formats, as the native
newline-delimited JSON of `POST /v1/changes`, and as Server-Sent Events (`GET /v1/tables/{t}/changes`).

Native events (`/v1/changes`, and each SSE event's `data`, its `event` the type):
  {"type": "header", "query_id", "table", "table_id", "key_columns", "columns", "partitions", "token"}
  {"type": "row", "partition", "key", "row"}                    a current row (the feed's snapshot)
  {"type": "snapshot_end", "positions", "token"}                every change after these positions follows
  {"type": "change", "partition", "offset", "epoch", "key", "row"}   row null: the key was deleted
                                  (with "left": true, a filtered feed's row stopped matching its WHERE)
  {"type": "resync", "partition", "position", "epoch", "rows": [{"key", "row"}], "token"}
                                              the log no longer held the changes: the current rows instead
                    (read in steps: each part but the last has "more": true, and its token the positions
                    before the resync; the parts after the first have "continued": true)
  {"type": "progress", "positions", "token"}                    positions passed (changes not taken move them)
  {"type": "end", "reason", "final", "positions", "token", "message"}   the last event
A change's position is its offset + 1; `token` is a consistency token of the positions so far, the
`from_token` to resume with (SSE: each event's `id`, so EventSource's Last-Event-ID resumes it).

ksqlDB's delimited format is its header, then each upserted row as a JSON array (a delete: the key and nulls),
each line its own chunk or HTTP/2 DATA frame, and the end as an error object; `application/json` is the
same as one JSON array that closes when the feed ends.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from hotstate.controller.records import KEY_SQL_TYPES
from hotstate.protocol.keys import decode_key
from hotstate.protocol.rows import decode_row, may_hold_non_finite
from hotstate.query.execute import QueryError
from hotstate.query.expressions import EvalError, encode_node, evaluator
from hotstate.query.feed import Change, End, Event, Progress, Resync, SnapshotEnd, SnapshotRow
from hotstate.server.feeds import Feed, FeedHub
from hotstate.server.http.asgi import Receive, Send
from hotstate.server.http.queries import (
    DELIMITED,
    JSON,
    NOT_FOUND,
    Answer,
    BadRequest,
    dumps,
    json_object,
    known_types,
    plain_json,
    query_error,
    refuse_unknown_fields,
    string_field,
)

log = logging.getLogger(__name__)

NDJSON = "application/x-ndjson"
EVENT_STREAM = "text/event-stream"
# A stream with nothing to send says where it is (a progress event) after about PROGRESS_S, spread over
# [PROGRESS_S, 1.5 PROGRESS_S) by its subscription id: feeds opened together (a dead server's subscribers
# resuming here) would otherwise wake in the same turn of the loop every period, all of them. Measured
# (bench/push.py, 10,000 feeds, 2 cores): at 1 s and unspread, 10,000 progress events a second, in bursts,
# more sends than the changes themselves at 250 changes/s. A resume replays from the last position told,
# at most a period's changes, read once per server for all feeds (server/feed_log.py).
PROGRESS_S = 5.0
PROGRESS_SPREAD = 16
CHANGES_FIELDS = ("sql", "from_token", "snapshot")

SSE = "sse"
NATIVE = "native"


class SendWatch:
    """Drops the streams whose client has read nothing for `timeout_s` (push.send.timeout.ms): one timer for
    all the streams of a server, armed while a send is under way and checking every WATCH_S the sends that
    have not finished, instead of a timer made and cancelled around every send (`asyncio.timeout`: two
    operations on the loop's heap of timers, ten thousand deep, for every delivery to every subscriber;
    py-spy: 12% of a serving server's CPU at 10,000 feeds). A send that outlives the timeout has its
    stream's task cancelled; the stream sees it as a TimeoutError (`expired`)."""

    WATCH_S = 0.5

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self._sending: dict[asyncio.Task[Any], float] = {}  # the sends under way: since when
        self._expired: set[asyncio.Task[Any]] = set()
        self._timer: asyncio.TimerHandle | None = None

    def begin(self, task: asyncio.Task[Any]) -> None:
        loop = task.get_loop()
        self._sending[task] = loop.time()
        if self._timer is None:
            self._timer = loop.call_later(min(self.WATCH_S, self.timeout_s), self._check, loop)

    def end(self, task: asyncio.Task[Any]) -> None:
        self._sending.pop(task, None)

    def expired(self, task: asyncio.Task[Any]) -> bool:
        """Whether `task` was cancelled for a send that took too long (once: it is forgotten)."""
        if task in self._expired:
            self._expired.discard(task)
            return True
        return False

    def _check(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        due = loop.time() - self.timeout_s
        for task, since in list(self._sending.items()):
            if since <= due:
                del self._sending[task]
                self._expired.add(task)
                task.cancel()
        if self._sending:
            self._timer = loop.call_later(min(self.WATCH_S, self.timeout_s), self._check, loop)


class FeedStream:
    """A streaming answer: the feed's events written in `media` until its End or the client goes."""

    def __init__(self, feed: Feed, media: str, watch: SendWatch) -> None:
        self.feed = feed
        self.media = media
        self._watch = watch  # the server's one watch over every stream's sends
        table = feed.table
        self._key_names = [c.name for c in table.key_columns]
        if feed.columns is not None:
            self._columns: list[str] = list(feed.columns)
        else:
            self._columns = self._key_names + [
                c.name for c in table.value_columns if c.name not in self._key_names
            ]
        # ksqlDB's formats name the columns in their header: SELECT * of a table whose writer declared
        # none waits for the first row to name them.
        undeclared = feed.columns is None and not table.value_columns
        self._columns_from_row = undeclared and media not in (NATIVE, SSE)
        self._sent: dict[int, int] = dict(feed.subscription.reported)
        spread = feed.subscription.subscription_id % PROGRESS_SPREAD
        self._idle_s = PROGRESS_S * (1 + spread / (2 * PROGRESS_SPREAD))
        # SELECT's computed columns, evaluated over each row (none: the columns are read by name).
        self._outputs = [(o.name, evaluator(o.node)) for o in feed.outputs]
        self._projection = tuple(str(encode_node(o.node)) for o in feed.outputs)
        self._memo = self._encoding()

    def _encoding(self) -> tuple[object, ...]:
        """What a change's encoding depends on beyond the change (its memo's key): the shape (native and
        SSE send the same JSON object, ksqlDB's formats an array), the columns and the computed ones."""
        if self.media in (NATIVE, SSE):  # SELECT * sends each row whole, whatever the columns declared
            columns = tuple(self._columns) if self.feed.columns is not None else None
            return (NATIVE, columns, self._projection)
        return (DELIMITED, tuple(self._columns), self._projection)

    def close(self) -> None:
        self.feed.close()

    async def run(self, send: Send, receive: Receive, abort: Callable[[], None] | None = None) -> None:
        task = asyncio.current_task()
        assert task is not None
        try:
            try:
                await self._run(send, receive, task)
            except asyncio.CancelledError:
                if not self._watch.expired(task):
                    raise
                task.uncancel()
                raise TimeoutError from None
        except TimeoutError:
            if abort is not None:
                abort()  # not a close: that would wait for the unread data to leave first
            # A client that stopped reading: its feed ended (fell behind) long ago and even that could not
            # be written; the connection is dropped rather than held open for it.
            self.feed.hub.on_drop()
            log.info(
                "push query %s: the client read nothing for %g s; dropping it",
                self.feed.query_id,
                self.feed.hub.send_timeout_s,
            )

    async def _run(self, raw_send: Send, receive: Receive, task: asyncio.Task[Any]) -> None:
        feed = self.feed
        sends = self._watch

        async def send(message: dict[str, Any]) -> None:
            sends.begin(task)  # this runs for every delivery to every subscriber: no timer of its own
            try:
                await raw_send(message)
            finally:
                sends.end(task)

        content_type = {SSE: EVENT_STREAM, NATIVE: NDJSON}.get(self.media, self.media)
        headers = [(b"content-type", content_type.encode()), (b"cache-control", b"no-cache")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        # The head leaves now (HTTP/2 sends it with the first body), though the first event may wait.
        await send({"type": "http.response.body", "body": b"", "more_body": True})
        gone = asyncio.Event()

        async def watch() -> None:
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    gone.set()
                    feed.wake.set()
                    return

        watcher = asyncio.create_task(watch())
        try:
            pending: list[Event] = []
            while self._columns_from_row and not gone.is_set():
                pending += await feed.next_events(self._idle_s)
                row = next((e.row for e in pending if isinstance(e, Change | SnapshotRow) and e.row), None)
                if row is None:
                    row = next((r for e in pending if isinstance(e, Resync) for _, r in e.rows), None)
                if row is not None:
                    self._columns += [name for name in decode_row(row) if name not in self._columns]
                if row is not None or any(isinstance(e, End) for e in pending):
                    break
            self._memo = self._encoding()  # the columns may have come from the first row
            first = self._first()
            for chunk in first:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            while not gone.is_set():
                events = pending or await feed.next_events(self._idle_s)
                pending = []
                if not events and self.media in (NATIVE, SSE):
                    # A period with nothing to send: still here, and where. A client's read timeout tells a
                    # live server from a silent one.
                    events = [Progress(dict(self._sent))]
                chunks: list[bytes] = []
                end: End | None = None
                for event in events:
                    chunks.extend(self._encode(event))
                    if isinstance(event, End):
                        end = event
                if end is not None:
                    chunks.extend(self._last())
                if self.media == DELIMITED:
                    for chunk in chunks:  # ksqlDB's clients read a line per chunk or DATA frame
                        await send({"type": "http.response.body", "body": chunk, "more_body": True})
                elif chunks:
                    await send({"type": "http.response.body", "body": b"".join(chunks), "more_body": True})
                if end is not None:
                    await send({"type": "http.response.body", "body": b"", "more_body": False})
                    return
        finally:
            watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watcher
            feed.close()

    # ------------------------------------------------------------------------------------------ encoding
    def _first(self) -> list[bytes]:
        feed = self.feed
        if self.media in (NATIVE, SSE):
            header = {
                "type": "header",
                "query_id": feed.query_id,
                "table": feed.table.name,
                "table_id": feed.table.table_id,
                "key_columns": [
                    {"name": c.name, "type": KEY_SQL_TYPES[c.type]} for c in feed.table.key_columns
                ],
                "columns": self._columns,
                "partitions": sorted(feed.subscription.filter.partitions),
                "token": feed.token(self._sent),
            }
            return [self._line("header", header, None)]
        known = known_types(feed.table)
        header = {
            "queryId": feed.query_id,
            "columnNames": self._columns,
            "columnTypes": [known.get(name.lower(), ("STRING", False))[0] for name in self._columns],
        }
        if self.media == JSON:
            return [b"[" + dumps(header)]
        return [dumps(header) + b"\n"]

    def _last(self) -> list[bytes]:
        return [b"]\n"] if self.media == JSON else []

    def _encode(self, event: Event) -> list[bytes]:
        if self.media in (NATIVE, SSE):
            return self._native(event)
        return self._ksql(event)

    def _line(self, kind: str, body: object, token: str | None) -> bytes:
        data = dumps(body)
        if self.media == SSE:
            head = b"event: " + kind.encode() + b"\n"
            if token is not None:
                head += b"id: " + token.encode() + b"\n"
            return head + b"data: " + data + b"\n\n"
        return data + b"\n"

    def _native(self, event: Event) -> list[bytes]:
        feed = self.feed
        if isinstance(event, Change):
            self._sent[event.partition] = event.position
            # One encoding per change for every subscriber of the same shape and columns: the same bytes
            # are written to each (SSE: all but the `id` line, the subscriber's own token).
            memo = self._memo
            encoded = event.encoded.get(memo)
            if encoded is None:
                encoded = event.encoded[memo] = dumps(self._change_body(event)) + b"\n"
            if self.media == SSE:
                head = b"event: change\nid: " + feed.token(self._sent).encode()
                return [head + b"\ndata: " + encoded + b"\n"]
            return [encoded]
        if isinstance(event, SnapshotRow):
            body = {
                "type": "row",
                "partition": event.partition,
                "key": self._key(event.key),
                "row": self._row(event.row),
            }
            return [self._line("row", body, None)]
        if isinstance(event, SnapshotEnd | Progress):
            kind = "snapshot_end" if isinstance(event, SnapshotEnd) else "progress"
            self._sent.update(event.positions)
            token = feed.token(self._sent)
            body = {"type": kind, "positions": dict(event.positions), "token": token}
            return [self._line(kind, body, token)]
        if isinstance(event, Resync):
            if not event.more:  # a resumed feed must not skip the parts still to come
                self._sent[event.partition] = max(self._sent.get(event.partition, 0), event.position)
            token = feed.token(self._sent)
            body = {
                "type": "resync",
                "partition": event.partition,
                "position": event.position,
                "epoch": event.epoch,
                "rows": [{"key": self._key(k), "row": self._row(r)} for k, r in event.rows],
                "token": token,
            }
            if event.more:
                body["more"] = True
            if event.continued:
                body["continued"] = True
            return [self._line("resync", body, token)]
        assert isinstance(event, End)
        self._sent.update(event.positions)
        token = feed.token(self._sent)
        body = {
            "type": "end",
            "reason": str(event.reason),
            "final": event.final,
            "positions": dict(event.positions),
            "token": token,
            "message": event.message,
        }
        return [self._line("end", body, token)]

    def _change_body(self, event: Change) -> dict[str, object]:
        body: dict[str, object] = {
            "type": "change",
            "partition": event.partition,
            "offset": event.offset,
            "epoch": event.epoch,
            "key": self._key(event.key),
            "row": None if event.row is None else self._row(event.row),
        }
        if event.left:
            body["left"] = True
        return body

    def _ksql(self, event: Event) -> list[bytes]:
        prefix = b",\n" if self.media == JSON else b""
        suffix = b"" if self.media == JSON else b"\n"
        if isinstance(event, Change):
            memo = self._memo  # one encoding per change for every subscriber of this shape and columns
            encoded = event.encoded.get(memo)
            if encoded is None:
                encoded = event.encoded[memo] = dumps(self._values(event.key, event.row))
            return [prefix + encoded + suffix]
        if isinstance(event, SnapshotRow):
            return [prefix + dumps(self._values(event.key, event.row)) + suffix]
        if isinstance(event, Resync):
            return [prefix + dumps(self._values(k, r)) + suffix for k, r in event.rows]
        if isinstance(event, End):
            body = {
                "@type": "generic_error",
                "error_code": 50300 if not event.final else NOT_FOUND,
                "message": f"push query ended ({event.reason}): {event.message}",
                "reason": str(event.reason),
                "token": self.feed.token(event.positions),
            }
            return [prefix + dumps(body) + suffix]
        return []  # snapshot ends and progress have no place in ksqlDB's formats

    def _key(self, key: bytes) -> list[object]:
        return [plain_json(v) for v in decode_key(key)]

    def _row(self, row: bytes) -> dict[str, object]:
        values = decode_row(row)
        if may_hold_non_finite(row):
            values = {k: plain_json(v) for k, v in values.items()}
        if self._outputs:
            return dict(zip(self._columns, self._computed(values), strict=True))
        if self.feed.columns is None:
            return values
        return {name: _value(values, name) for name in self._columns}

    def _computed(self, row: Mapping[str, object]) -> list[object]:
        """SELECT's values of `row`; one its expression fails on (a value of another type) is null."""
        values: list[object] = []
        for _, value in self._outputs:
            try:
                values.append(plain_json(value(row)))
            except (EvalError, TypeError, ValueError):
                values.append(None)
        return values

    def _values(self, key: bytes, row: bytes | None) -> list[object]:
        named: dict[str, object]
        if row is None:
            named = dict(zip(self._key_names, decode_key(key), strict=False))
        else:
            named = decode_row(row)
            if may_hold_non_finite(row):
                named = {k: plain_json(v) for k, v in named.items()}
            if self._outputs:
                return self._computed(named)
        return [_value(named, name) for name in self._columns]


def _value(row: Mapping[str, object], name: str) -> object:
    if name in row:
        return row[name]
    lowered = name.lower()
    return next((v for k, v in row.items() if k.lower() == lowered), None)


class ChangeEndpoints:
    """The push-query answers: a FeedStream, or an error before it starts."""

    def __init__(self, hub: FeedHub, on_error: Callable[[QueryError], None] = lambda error: None) -> None:
        self.hub = hub
        self._on_error = on_error
        self._watch = SendWatch(hub.send_timeout_s)  # one for every stream of this server

    def open(self, statement: str, properties: dict[str, object], media: str) -> Answer | Awaitable[Answer]:
        try:
            feed = self.hub.open(statement, properties)
        except QueryError as error:
            self._on_error(error)
            return query_error(error, statement)
        if isinstance(feed, Feed):
            return 200, FeedStream(feed, media, self._watch)
        return self._opened(feed, statement, media)

    async def _opened(self, opening: Awaitable[Feed], statement: str, media: str) -> Answer:
        """A feed whose start is read from other servers (partitions this one does not hold)."""
        try:
            feed = await opening
        except QueryError as error:
            self._on_error(error)
            return query_error(error, statement)
        return 200, FeedStream(feed, media, self._watch)

    def native(self, body: bytes) -> Answer | Awaitable[Answer]:
        """`POST /v1/changes` with {"sql", "from_token", "snapshot"}: newline-delimited JSON events."""
        try:
            data = json_object(body)
            refuse_unknown_fields(data, CHANGES_FIELDS)
            sql = string_field(data, "sql")
        except BadRequest as error:
            return error.refusal()
        properties = {name: data[name] for name in ("from_token", "snapshot") if data.get(name) is not None}
        return self.open(sql, properties, NATIVE)

    def sse(
        self, table: str, query_string: bytes, headers: list[tuple[bytes, bytes]]
    ) -> Answer | Awaitable[Answer]:
        """`GET /v1/tables/{table}/changes?where=...&from=<token>&snapshot=true|false`: Server-Sent Events;
        a reconnecting EventSource's Last-Event-ID resumes it."""
        params: dict[str, Any] = {}
        for name, value in urllib.parse.parse_qsl(query_string.decode("latin-1"), keep_blank_values=True):
            if name not in ("where", "from", "snapshot"):
                return BadRequest(f"unknown query parameter {name!r}; known: where, from, snapshot").refusal()
            params[name] = value
        last_event = next((v for n, v in headers if n == b"last-event-id"), None)
        properties: dict[str, object] = {}
        token = last_event.decode("latin-1") if last_event else params.get("from")
        if token:
            properties["from_token"] = token
        if "snapshot" in params:
            if params["snapshot"] not in ("true", "false"):
                return BadRequest("snapshot: must be true or false").refusal()
            properties["snapshot"] = params["snapshot"] == "true"
        quoted = "`" + table.replace("`", "``") + "`"
        where = params.get("where")
        statement = f"SELECT * FROM {quoted}{f' WHERE {where}' if where else ''} EMIT CHANGES"
        return self.open(statement, properties, SSE)

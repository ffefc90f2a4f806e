"""Every server setting, described once: key, kind of value, bounds, unit, meaning and where it lives.

The package `server/config/` derives from SETTINGS its key maps (keys.py), defaults (model.py), parsing
and per-value rules (kinds.py), the building of ServerConfig (build.py) and `render_toml` (render.py); the
tables of keys in docs/configuration.md are generated from it (`python scripts/update_config_docs.py`,
checked by tests/server/test_config_docs.py). A default is not written here: it is the default of the typed
config's field the setting names (RaftConfig, ServerConfig, ...), which the code that uses those configs on
their own needs anyway.

Rules that compare settings with each other are named functions in config/rules.py.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal

from hotstate.assignor.config import STRATEGIES
from hotstate.tls import CLIENT_AUTH_CHOICES

MAX_INT32: Final = 2**31 - 1
_KIB: Final = 1024
_MIB: Final = 1024 * 1024
MIN_SECRET_CHARS: Final = 16
# `rack` and tag values, which travel in comma-separated `key=value` lists.
MAX_LABEL_CHARS: Final = 255
# Room for message headers on top of the largest payload the quorum puts in one frame.
FRAME_HEADROOM_BYTES: Final = 64 * 1024
# Partition data (a Produce request's rows, a replica fetch answer's batches) may fill at most 1/N of a frame:
# the rest is room for the framing of every row and batch, which grows with the row count, not the bytes.
FRAME_DATA_SHARE: Final = 2
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR")
# A query's time budget, given or by default (query/execute.py refuses a larger timeout_ms).
MAX_QUERY_TIMEOUT_MS: Final = 300_000
REPLICA_LOG_FSYNC_POLICIES: Final = ("never", "always")

# The kind of a value: how its text is parsed, checked and written back (config/kinds.py has one of each).
Kind = Literal[
    "int",
    "roles",
    "listeners",
    "voters",
    "path",
    "label",
    "tags",
    "cluster_id",
    "secret",
    "fsync",
    "strategy",
    "tag_keys",
    "log_level",
    "file",
    "client_auth",
]


@dataclass(frozen=True, slots=True)
class Setting:
    key: str  # the dotted Kafka-style name, as in files, HOTSTATE_* variables and flags
    # Where the typed value lives: an attribute path of ServerConfig ("raft.fetch_timeout_ms"), or one per
    # part for a value split over several attributes (listeners: rpc and http).
    target: str | tuple[str, ...]
    doc: str  # what it means, the last column of its table in docs/configuration.md
    kind: Kind = "int"
    # Integers only: the bounds (every integer is at most MAX_INT32) and the unit shown in errors.
    minimum: int = 1
    unit: str = ""
    shape: str = ""  # other kinds only: what the value looks like, for the docs' type column
    # Set for a required setting, which has no default: the shape its "is required" error shows.
    required: str = ""

    @property
    def targets(self) -> tuple[str, ...]:
        return (self.target,) if isinstance(self.target, str) else self.target


@dataclass(frozen=True, slots=True)
class Section:
    """A group of settings with one table in docs/configuration.md, between `<!-- settings: NAME -->`
    and `<!-- end of settings -->`."""

    name: str
    settings: tuple[Setting, ...]


def _choices_shape(choices: Sequence[str]) -> str:
    quoted = [f"`{choice}`" for choice in choices]
    return f"{', '.join(quoted[:-1])} or {quoted[-1]}"


_IDENTITY: Final = (
    Setting(
        "node.id",
        "node_id",
        required="a positive integer",
        doc="This server's id, unique in the cluster. A controller's id is its voter id.",
    ),
    Setting(
        "process.roles",
        "process_roles",
        kind="roles",
        shape="`controller`, `broker` or `controller,broker`",
        required="controller, broker or controller,broker",
        doc=(
            "`controller`: a voter of the metadata quorum (use 3 or 5 of them). `broker`: hosts partition "
            'replicas, answers queries, follows the metadata log. Both: "combined mode", as `hotstate '
            "cluster up` runs."
        ),
    ),
    Setting(
        "listeners",
        ("rpc", "http"),
        kind="listeners",
        shape="`rpc://HOST:PORT[,http://HOST:PORT]`",
        required="rpc://HOST:PORT, optionally followed by ,http://HOST:PORT",
        doc=(
            "Where the server listens. `rpc` (required) carries server-to-server traffic and the Spark "
            "sink's writes; `http` (optional) serves queries and status. HOST is a name, an IPv4 address "
            "or an IPv6 address in brackets (`[::1]`); `0.0.0.0` or `[::]` listens on every interface. "
            "PORT is 0 to 65535; 0 picks a free port (not for a controller's rpc listener, see below). rpc "
            "and http need different ports."
        ),
    ),
    Setting(
        "controller.quorum.voters",
        "voters",
        kind="voters",
        shape="`ID@HOST:PORT,...`",
        required="ID@HOST:PORT,ID@HOST:PORT,...",
        doc=(
            "The bootstrap voters of the metadata quorum, the same list on every server (brokers use it to "
            "find the controllers); once the quorum is reconfigured (`hotstate cluster voters add|remove`) "
            "the voter set in the metadata log wins. A controller in it has the port of its rpc listener; "
            "a controller not in it starts as an observer until it is added as a voter; a broker-only "
            "server must not be in it. Ids and addresses are unique; hosts must be addresses other servers "
            "can connect to (no `0.0.0.0`)."
        ),
    ),
    Setting(
        "data.dir",
        "data_dir",
        kind="path",
        shape="path",
        required="a directory path",
        doc=(
            "Where the server keeps the metadata log, snapshots and partition stores. Relative paths are "
            "relative to the working directory. It is created when the server starts, not when the "
            "configuration is read."
        ),
    ),
    Setting(
        "rack",
        "rack",
        kind="label",
        shape="string",
        doc=(
            "The server's rack or availability zone. Standbys are spread over racks (KIP-708) and the "
            "assignor prefers actives in the racks the Spark writers report (KIP-925). At most "
            f"{MAX_LABEL_CHARS} printable characters, no `,` or `=`, no leading or trailing spaces."
        ),
    ),
    Setting(
        "tags",
        "tags",
        kind="tags",
        shape="`key=value,...` or a TOML table",
        doc=(
            "More placement tags for `rack.aware.assignment.tags` (e.g. `zone=eu1,cluster=k8s-1`). Keys: "
            "1-64 letters, digits, `.`, `_`, `-`; values as for `rack`. A key may appear once; `rack` is "
            "not a tag key here, use `rack`."
        ),
    ),
    Setting(
        "cluster.id",
        "cluster_id",
        kind="cluster_id",
        shape="string",
        required="1-64 letters, digits, '-' or '_', the same on every server",
        doc=(
            "The cluster's id, the same on every server; servers refuse peers with another id. 1-64 "
            "letters, digits, `-`, `_` (a Kafka-style base64 UUID fits)."
        ),
    ),
    Setting(
        "cluster.secret",
        "cluster_secret",
        kind="secret",
        shape="string",
        required=f"at least {MIN_SECRET_CHARS} characters, the same on every server",
        doc=(
            "Shared by every server of the cluster; servers prove with it that they belong to the cluster. "
            f"At least {MIN_SECRET_CHARS} characters, because a short secret can be guessed."
        ),
    ),
)
_QUORUM: Final = (
    Setting(
        "controller.quorum.election.timeout.ms",
        "raft.election_timeout_ms",
        unit="ms",
        doc=(
            "An election lasts a random time in [T, 2T) before it is retried; an unattached voter waits as "
            "long before standing."
        ),
    ),
    Setting(
        "controller.quorum.fetch.timeout.ms",
        "raft.fetch_timeout_ms",
        unit="ms",
        doc=(
            "A follower with no answer from the leader for this long stands for election; a leader without "
            "fetches from a majority for 1.5x this long resigns."
        ),
    ),
    Setting(
        "controller.quorum.election.backoff.max.ms",
        "raft.election_backoff_max_ms",
        unit="ms",
        doc="Cap of the exponential backoff (with jitter) after a lost election.",
    ),
    Setting(
        "controller.quorum.append.linger.ms",
        "raft.append_linger_ms",
        minimum=0,
        unit="ms",
        doc="How long the leader gathers proposals into one batch.",
    ),
    Setting(
        "controller.quorum.request.timeout.ms",
        "raft.request_timeout_ms",
        unit="ms",
        doc="An unanswered request is sent again after this long.",
    ),
    Setting(
        "controller.quorum.fetch.max.wait.ms",
        "raft.fetch_max_wait_ms",
        unit="ms",
        doc=(
            "How long the leader holds a fetch that has nothing new (long poll). Must be below "
            "`controller.quorum.fetch.timeout.ms`, or healthy followers time out."
        ),
    ),
    Setting(
        "controller.quorum.fetch.max.bytes",
        "raft.fetch_max_bytes",
        unit="bytes",
        doc="Most a fetch answer carries.",
    ),
    Setting(
        "controller.quorum.snapshot.chunk.bytes",
        "raft.snapshot_chunk_bytes",
        unit="bytes",
        doc="Chunk size of FetchSnapshot, which sends a snapshot to a far-behind or new member.",
    ),
)
_REPLICAS: Final = (
    Setting(
        "replica.fetch.max.wait.ms",
        "replica.fetch_max_wait_ms",
        unit="ms",
        doc=(
            "How long the active holds a follower's fetch that has nothing new (long poll). Must be below "
            "`replica.fetch.timeout.ms`, or an idle follower's fetch times out before the active answers "
            "it."
        ),
    ),
    Setting(
        "replica.fetch.hw.delay.ms",
        "replica.fetch_hw_delay_ms",
        minimum=0,
        unit="ms",
        doc=(
            "How long the active holds a follower's fetch whose only news is a newer high watermark, so "
            "that the next write's data carries it: under steady writes a write then costs two fetch "
            "messages per follower instead of four (a third less server CPU at batches of 100), but a "
            "follower's store stays a write behind, so standbys rarely serve reads with max_lag=0, and "
            "with no later write it applies the last one up to this long (plus the 10 ms tick) after it "
            "committed. 0 (the default) answers at once; never longer than `replica.fetch.max.wait.ms`."
        ),
    ),
    Setting(
        "replica.fetch.max.bytes",
        "replica.fetch_max_bytes",
        unit="bytes",
        doc=(
            "Most a fetch answer carries; an answer always carries at least one whole batch, so one "
            "Produce's batch may exceed it. At most half of `rpc.max.frame.bytes` (see there)."
        ),
    ),
    Setting(
        "replica.fetch.timeout.ms",
        "replica.fetch_timeout_ms",
        unit="ms",
        doc=(
            "A follower with no answer to its fetch for this long fetches again (the answer was lost). "
            "Must be greater than `replica.fetch.max.wait.ms`."
        ),
    ),
    Setting(
        "replica.fetch.backoff.ms",
        "replica.fetch_backoff_ms",
        minimum=0,
        unit="ms",
        doc=(
            "How long a follower waits before fetching again after an error answer (its metadata or the "
            "active's is stale)."
        ),
    ),
    Setting(
        "replica.lag.time.max.ms",
        "replica.replica_lag_time_max_ms",
        unit="ms",
        doc=(
            "An in-sync replica that has not caught up with the active's log end for this long is dropped "
            "from the ISR."
        ),
    ),
    Setting(
        "replica.isr.change.retry.ms",
        "replica.isr_change_retry_ms",
        unit="ms",
        doc=(
            "How long the active waits before it sends an ISR change to the controller again, while the "
            "committed metadata does not show it yet."
        ),
    ),
    Setting(
        "min.insync.replicas",
        "replica.min_insync_replicas",
        unit="replicas",
        doc=(
            "The fewest in-sync replicas (the active included) with which the active accepts a write; with "
            "fewer, a Produce fails with NOT_ENOUGH_REPLICAS rather than being acknowledged by too few "
            "copies."
        ),
    ),
    Setting(
        "replica.log.retention.records",
        "replica.log_retention_records",
        minimum=0,
        unit="records",
        doc=(
            "Records kept in a partition log below what the store has applied, for followers that fall a "
            "little behind (the log start moves in steps of half of this, so up to 1.5 times as many are "
            "kept); a follower further back is sent a snapshot of the store instead."
        ),
    ),
    Setting(
        "replica.log.fsync",
        "replica_log_fsync",
        kind="fsync",
        shape=_choices_shape(REPLICA_LOG_FSYNC_POLICIES),
        doc=(
            "When a partition log is fsynced. `never`: the operating system writes the log out in its own "
            "time; acknowledged writes are protected by replication to the ISR (every in-sync replica "
            "holds a write before it is acknowledged, and a crashed server process loses nothing the "
            "operating system already has), so they are lost only if every in-sync replica loses power at "
            "once. `always`: appends are fsynced before they count, so acknowledged writes also survive a "
            "power loss of every in-sync replica at once, at a large cost in throughput. Case does not "
            "matter."
        ),
    ),
    Setting(
        "produce.max.bytes",
        "produce_max_bytes",
        unit="bytes",
        doc=(
            "The largest Produce request (the sum of its rows' bytes) the server accepts; a larger one is "
            "refused with TOO_LARGE and nothing of it is written. At most half of `rpc.max.frame.bytes` "
            "(see there)."
        ),
    ),
    Setting(
        "replica.move.throttle.bytes.per.sec",
        "move_throttle_bytes_per_sec",
        minimum=0,
        unit="bytes/s",
        doc=(
            "The most a broker's replicas outside the ISR (warmups moving a partition here, new copies, "
            "copies restoring after they fell behind) fetch per second, log fetches and store snapshots "
            "together: Kafka's reassignment throttle, on the receiving side. In-sync standbys are never "
            "held back. 0 (the default): no limit. A move of B "
            "bytes takes at least B / this (docs/operations.md)."
        ),
    ),
)
_LIVENESS: Final = (
    Setting(
        "heartbeat.send.interval.ms",
        "liveness.heartbeat.send_interval_ms",
        unit="ms",
        doc=(
            "How often the server sends a heartbeat to every other registered server; also the width of "
            "one slot when a peer's heartbeats are judged."
        ),
    ),
    Setting(
        "heartbeat.check.interval.ms",
        "liveness.heartbeat.check_interval_ms",
        unit="ms",
        doc=(
            "How often the server decides each peer's status from the heartbeats that arrived. A peer is "
            "marked down or up at most this long after the thresholds below are reached."
        ),
    ),
    Setting(
        "heartbeat.window.ms",
        "liveness.heartbeat.window_ms",
        unit="ms",
        doc=(
            "How far back a check looks: the arrivals of the last this long, as `heartbeat.window.ms / "
            "heartbeat.send.interval.ms` whole slots. Must hold at least as many slots as the larger of "
            "the two thresholds (`heartbeat.window.ms` >= `heartbeat.send.interval.ms` x "
            "max(`heartbeat.missed.threshold`, `heartbeat.received.threshold`)), or a peer could never be "
            "marked down (or up again). Only the runs of slots ending at now count, so a longer window "
            "changes no decision."
        ),
    ),
    Setting(
        "heartbeat.missed.threshold",
        "liveness.heartbeat.missed_threshold",
        unit="send intervals",
        doc=(
            "A peer that is up is marked down after this many consecutive send intervals without a "
            "heartbeat from it. Lower: faster failover, more false alarms on a slow network."
        ),
    ),
    Setting(
        "heartbeat.received.threshold",
        "liveness.heartbeat.received_threshold",
        unit="send intervals",
        doc=(
            "A peer that is down is marked up again after this many consecutive send intervals with a "
            "heartbeat from it."
        ),
    ),
    Setting(
        "lag.reporting.send.interval.ms",
        "liveness.lag_report_interval_ms",
        unit="ms",
        doc=(
            "How often the server sends the lags of its local replicas to every peer that is up. Longer: "
            "less traffic, but queries are routed by older lags."
        ),
    ),
)
_PLACEMENT: Final = (
    Setting(
        "rack.aware.assignment.strategy",
        "assignor.rack_aware_assignment_strategy",
        kind="strategy",
        shape=_choices_shape(STRATEGIES),
        doc=(
            "`none`: balanced placement that ignores the writer racks; standbys spread over the tags only. "
            "`min_traffic`: of the balanced placements, the one with the fewest replicas outside the "
            "writer racks (a min-cost flow, never worse than `none`). `balance_subtopology`: as "
            "`min_traffic`, but each table's actives are also balanced over the servers on their own "
            "(Kafka's name: a table is a subtopology here), at some cost in traffic. Case does not matter."
        ),
    ),
    Setting(
        "rack.aware.assignment.tags",
        "assignor.rack_aware_assignment_tags",
        kind="tag_keys",
        shape="tag keys, comma-separated, or a TOML array",
        doc=(
            "The keys standbys are spread over, the first ones first (e.g. `rack,zone`). `rack` is a "
            "server's `rack` key; any other key is one of its `tags`. A server without a value for a key "
            "counts as one shared unknown location for it. Keys as for `tags` (1-64 letters, digits, `.`, "
            '`_`, `-`), each once. Empty (`""` or `[]` in the file, `--rack.aware.assignment.tags=`) '
            "spreads over nothing: standbys go to the least loaded servers. An empty environment variable "
            "counts as not set, so it keeps the default."
        ),
    ),
    Setting(
        "rack.aware.assignment.traffic_cost",
        "assignor.traffic_cost",
        minimum=0,
        doc=(
            "The cost of a replica outside its table's writer racks. 0 makes placement ignore the writer "
            "racks, as `none` does. Its size weighs traffic against "
            "`rack.aware.assignment.non_overlap_cost` when existing partitions are moved."
        ),
    ),
    Setting(
        "rack.aware.assignment.non_overlap_cost",
        "assignor.non_overlap_cost",
        minimum=0,
        doc=(
            "The cost of a replica on a server that did not hold it before, which then has to copy the "
            "partition's data (for a new table only the existing partitions' moves count: those are never "
            "made while placing it)."
        ),
    ),
    Setting(
        "acceptable.recovery.lag",
        "assignor.acceptable_recovery_lag",
        minimum=0,
        unit="records",
        doc=(
            "The assignor's bound for *caught up* (KIP-441). The controller reports every in-sync replica "
            "as caught up and every other one as behind by more than this, so in a hotstate cluster the "
            "ISR decides; the setting matters to the assignor used as a library."
        ),
    ),
    # Kafka requires at least one warmup: with none, an active could never move to a new server.
    Setting(
        "max.warmup.replicas",
        "assignor.max_warmup_replicas",
        unit="replicas",
        doc=(
            "The most warmup replicas in the whole cluster at one time, which bounds the extra copying "
            "traffic of a reassignment: the replicas that move an active or a standby to a new server. "
            "Standbys that rebuild a lost copy are not warmups and are never held back."
        ),
    ),
    Setting(
        "num.standby.replicas",
        "default_standby_replicas",
        minimum=0,
        unit="replicas",
        doc=(
            "The standbys per partition of a table created without a count: over HTTP (`POST /v1/tables` "
            "without `standby_replicas`), with `hotstate table create` without `--standby-replicas`, or "
            "with `AdminClient.create_table` without `standby_replicas` (Kafka Streams' name; there every "
            "application sets it, here every table may set its own). Read by the server that takes the "
            "request, so give every server the same value. The Spark sink always names its count (1 unless "
            "`standby_replicas` says otherwise)."
        ),
    ),
    Setting(
        "reassign.interval.ms",
        "reassign_interval_ms",
        minimum=0,
        unit="ms",
        doc=(
            "How often the active controller may take a step of moving existing partitions towards the "
            "assignor's placement (it runs the assignor only when the metadata changed since the last "
            "run). 0: never move existing partitions; new tables are still placed by the assignor."
        ),
    ),
    Setting(
        "broker.removal.delay.ms",
        "broker_removal_delay_ms",
        unit="ms",
        doc=(
            "A broker fenced for longer than this is taken for gone: its replicas are placed on the other "
            "brokers. While any broker has been fenced for less (it may be restarting), nothing is moved."
        ),
    ),
)
_SERVER: Final = (
    Setting(
        "broker.heartbeat.interval.ms",
        "heartbeat_interval_ms",
        unit="ms",
        doc=(
            "How often the server sends a heartbeat to the active controller. Must be below "
            "`broker.session.timeout.ms`."
        ),
    ),
    Setting(
        "broker.session.timeout.ms",
        "session_timeout_ms",
        unit="ms",
        doc="A server whose last heartbeat is older than this is fenced by the active controller.",
    ),
    Setting(
        "metadata.snapshot.max.records",
        "snapshot_max_records",
        unit="records",
        doc="Snapshot the metadata image after this many new records of the metadata log.",
    ),
    Setting(
        "metadata.snapshot.interval.ms",
        "snapshot_interval_ms",
        unit="ms",
        doc="...or after this long, whichever comes first.",
    ),
    Setting(
        "rpc.max.frame.bytes",
        "max_frame_bytes",
        minimum=1024,
        unit="bytes",
        doc=(
            "Largest RPC frame the server sends or accepts. Must be at least the larger of "
            "`controller.quorum.fetch.max.bytes` and `controller.quorum.snapshot.chunk.bytes` plus "
            f"{FRAME_HEADROOM_BYTES // _KIB} KiB for headers, and at least {FRAME_DATA_SHARE} times the "
            "larger of `replica.fetch.max.bytes` and `produce.max.bytes` (room for the framing of every row "
            "and batch)."
        ),
    ),
    Setting(
        "log.level",
        "log_level",
        kind="log_level",
        shape=_choices_shape(LOG_LEVELS),
        doc="Level of the server's log. Case does not matter; `WARN` means `WARNING`.",
    ),
)
_QUERIES: Final = (
    Setting(
        "query.timeout.ms",
        "query_timeout_ms",
        unit="ms",
        doc=(
            "The time budget of a query that gives no `timeout_ms` of its own: planning, routing, forwards "
            "and retries on the next replica all happen within it, then the query fails with 504. At most "
            f"{MAX_QUERY_TIMEOUT_MS:,}. The Python client waits for a query's own `timeout_ms`, or 10 s, "
            "plus 2 s: with a longer default here, give the client's queries a `timeout_ms`."
        ),
    ),
    Setting(
        "query.hedge.delay.floor.ms",
        "hedging.delay_floor_ms",
        unit="ms",
        doc=(
            "Hedged forwards (docs/queries.md): the shortest wait for a peer's answer before a forward's "
            "partitions also go to their next replica. The wait is the p95 of the peer's recent answer "
            "times, at least this."
        ),
    ),
    Setting(
        "query.hedge.delay.cap.ms",
        "hedging.delay_cap_ms",
        unit="ms",
        doc="The longest wait before a hedge, whatever the peer's history (and the wait until it has one).",
    ),
    Setting(
        "query.hedge.max.percent",
        "hedging.max_percent",
        minimum=0,
        unit="percent",
        doc=(
            "At most this many hedges per 100 forwards over any long run (plus a burst of 10). 0: never "
            "hedge (the `hedging` query property turns it off for one query)."
        ),
    ),
    Setting(
        "push.max.subscriptions",
        "push_max_subscriptions",
        unit="subscriptions",
        doc=(
            "Push queries (docs/queries.md): most feeds this server serves at once; one more is refused "
            "(503, naming this limit), and the Python client subscribes on another server."
        ),
    ),
    Setting(
        "push.buffer.max.changes",
        "push_buffer_max_changes",
        unit="changes",
        doc=(
            "Most changes a feed holds for a subscriber that reads slower than its table changes; past "
            "it the feed ends with a `fell_behind` event naming its positions, to resume from (the "
            "writes and the other feeds never wait for it)."
        ),
    ),
    Setting(
        "push.send.timeout.ms",
        "push_send_timeout_ms",
        minimum=1,
        unit="ms",
        doc=(
            "A push query's connection whose client reads nothing for this long (a write to it waits "
            "that long) is dropped (`/metrics`: hotstate_push_clients_dropped_total)."
        ),
    ),
    Setting(
        "query.scan.max.rows",
        "scan_max_rows",
        unit="rows",
        doc=(
            "Scans (queries that filter on any column, aggregate or sort, docs/queries.md): the most rows "
            "one query may read, over all its partitions; each replica stops a partition's scan past it too. "
            "Beyond it the query fails with a 400 that says to narrow the WHERE on key columns."
        ),
    ),
    Setting(
        "query.scan.max.concurrent",
        "scan_max_concurrent",
        unit="scans",
        doc=(
            "The most partition scans this server runs at once (for its own queries and its peers'). One "
            "more is refused, and tried on another replica; when none has room, the query fails with a 503."
        ),
    ),
    Setting(
        "query.scan.cache.bytes",
        "scan_cache_bytes",
        minimum=0,
        unit="bytes",
        doc=(
            "Column copies of partitions for scans, at most this many bytes on this server in all (the "
            "least recently used dropped first; 0 keeps none). A full scan that filters, or counts the rows "
            "a filter keeps, leaves the columns it read behind as Arrow arrays, and the next such scan of "
            "the partition decides its WHERE over them instead of reading every row (docs/queries.md, the "
            "cost model)."
        ),
    ),
    Setting(
        "query.scan.step.rows",
        "scan_step_rows",
        unit="rows",
        doc=(
            "A scan reads at most this many rows between yields to the event loop, so that lookups, "
            "heartbeats and replication keep their latency while it runs (query.scan.step.ms may end a "
            "step sooner)."
        ),
    ),
    Setting(
        "query.scan.step.ms",
        "scan_step_ms",
        unit="ms",
        doc=(
            "A scan yields to the event loop once a step has run this long, or after query.scan.step.rows "
            "rows, whichever comes first; it reads and feeds its rows in chunks sized from the last chunk's "
            "time per row, so a step of costly rows (a WHERE over big strings) overruns this by about a "
            "row. A feed's snapshot, resync or replay takes steps of this length too. The scans of a "
            "server take turns, one step per turn of its event loop, so a lookup waits about one step "
            "however many scans run (docs/queries.md, the cost model)."
        ),
    ),
)
_TLS: Final = (
    Setting(
        "rpc.tls.cert.file",
        "rpc_tls.cert_file",
        kind="file",
        shape="path",
        doc=(
            "PEM certificate of the rpc listener; setting it turns TLS on for all RPC traffic: the listener, "
            "and this server's connections to other servers (which present it as their client certificate "
            "too). Its names (SANs) must cover the host other servers and clients reach it at. TLS is all "
            "or nothing across a cluster, and the HMAC handshake over `cluster.secret` still runs inside it."
        ),
    ),
    Setting(
        "rpc.tls.key.file",
        "rpc_tls.key_file",
        kind="file",
        shape="path",
        doc="PEM private key of `rpc.tls.cert.file` (unencrypted); required with it.",
    ),
    Setting(
        "rpc.tls.ca.file",
        "rpc_tls.ca_file",
        kind="file",
        shape="path",
        doc=(
            "PEM CA certificate(s) other servers' certificates must chain to. Unset: the system's CAs. "
            "Needs `rpc.tls.cert.file`."
        ),
    ),
    Setting(
        "rpc.tls.client.auth",
        "rpc_tls.client_auth",
        kind="client_auth",
        shape=_choices_shape(CLIENT_AUTH_CHOICES),
        doc=(
            "`required`: every RPC client (servers, the Spark sink, admin tools) must present a certificate "
            "from `rpc.tls.ca.file` (mutual TLS). Needs `rpc.tls.cert.file` and `rpc.tls.ca.file`."
        ),
    ),
    Setting(
        "http.tls.cert.file",
        "http_tls.cert_file",
        kind="file",
        shape="path",
        doc="PEM certificate of the http listener; setting it makes the HTTP API HTTPS only.",
    ),
    Setting(
        "http.tls.key.file",
        "http_tls.key_file",
        kind="file",
        shape="path",
        doc="PEM private key of `http.tls.cert.file` (unencrypted); required with it.",
    ),
    Setting(
        "http.tls.ca.file",
        "http_tls.ca_file",
        kind="file",
        shape="path",
        doc=(
            "PEM CA certificate(s) the server trusts when it calls other servers' HTTP API (the console's "
            "`/v1/cluster/rates`). Unset: the system's CAs. Needs `http.tls.cert.file`."
        ),
    ),
)
_HTTP: Final = (
    Setting(
        "http.auth.credentials.file",
        "http_auth_credentials_file",
        kind="file",
        shape="path",
        doc=(
            "Turns on authentication on the HTTP API: the TOML file of users (scrypt password hashes) and "
            "bearer tokens (SHA-256 hashes), each with the role `read` or `admin` (docs/security.md). Unset: "
            "the HTTP API answers anyone who reaches it. The file is re-read within a second of a change; "
            "a server does not start with a file it cannot read."
        ),
    ),
    Setting(
        "http.max.connections",
        "http_max_connections",
        unit="connections",
        doc=(
            "Most HTTP connections (HTTP/1.1 and HTTP/2) open at once; a new connection over it is answered "
            "503 at once and closed, without reading its request. Keep it below the process's open-files "
            "limit (`ulimit -n`), which replicas' RocksDB files share."
        ),
    ),
    Setting(
        "http.header.max.bytes",
        "http_header_max_bytes",
        minimum=1024,
        unit="bytes",
        doc="A request line and headers larger than this are refused with 431 and the connection closed.",
    ),
    Setting(
        "http.request.timeout.ms",
        "http_request_timeout_ms",
        unit="ms",
        doc=(
            "A request (head and body) must arrive within this of its first byte, and a new connection "
            "must send a whole request within this; else 408 and the connection is closed (a slow client "
            "trickling bytes cannot hold a connection)."
        ),
    ),
    Setting(
        "http.idle.timeout.ms",
        "http_idle_timeout_ms",
        unit="ms",
        doc=(
            "A keep-alive connection with no request for this long is closed (HTTP/2: GOAWAY). Longer than "
            "the 5 s the hotstate client keeps an idle connection, so the server is not the one closing a "
            "connection the client is about to reuse."
        ),
    ),
)
SECTIONS: Final = (
    Section("identity", _IDENTITY),
    Section("quorum", _QUORUM),
    Section("replicas", _REPLICAS),
    Section("liveness", _LIVENESS),
    Section("placement", _PLACEMENT),
    Section("queries", _QUERIES),
    Section("server", _SERVER),
    Section("tls", _TLS),
    Section("http", _HTTP),
)
# In the order render_toml writes them and load_config reports their parsing errors.
SETTINGS: Final = tuple(setting for section in SECTIONS for setting in section.settings)
assert len({setting.key for setting in SETTINGS}) == len(SETTINGS), "a key is described twice"


@dataclass(frozen=True, slots=True)
class Alias:
    """A name the anchors (Kafka Streams, ksqlDB) give a setting, accepted wherever a key is (file,
    environment, flags) and turned into hotstate's settings before anything else reads them
    (config/aliases.py). `key` ending in `.` is a prefix: `client.tag.` stands for `client.tag.KEY`."""

    key: str
    shape: str
    doc: str


CLIENT_TAG_PREFIX: Final = "client.tag."
ALIASES: Final = (
    Alias(
        CLIENT_TAG_PREFIX,
        "string",
        (
            "`client.tag.KEY=VALUE` (KIP-708's client tags) is the tag `KEY=VALUE` of `tags`, and "
            "`client.tag.rack` is `rack`. As environment variables `HOTSTATE_CLIENT_TAG_KEY` (KEY in lower "
            "case). A tag given both here and in `tags`, or `rack` both ways with different values, is an "
            "error."
        ),
    ),
    Alias(
        "rack.aware.assignment.enabled",
        "`true` or `false`",
        (
            "`false`: placement ignores racks and tags altogether (`rack.aware.assignment.strategy=none` "
            "and `rack.aware.assignment.tags` empty); `true`: as those two settings say (their defaults: "
            "rack-aware). Setting either of them to the opposite as well is an error."
        ),
    ),
    Alias(
        "ksql.query.pull.forwarding.timeout.ms",
        "integer >= 1",
        (
            "ksqlDB's name for `query.timeout.ms`. Given with it, the value from the higher-precedence "
            "source wins (flags, then environment, then file); from the same source they must agree."
        ),
    ),
)
assert not {alias.key for alias in ALIASES} & {setting.key for setting in SETTINGS}, "an alias is a key"


# ---------------------------------------------------------------------------------------------------------
# docs/configuration.md

_TABLE_RE: Final = re.compile(r"(<!-- settings: (\w+) -->\n).*?(?=<!-- end of settings -->)", re.DOTALL)


def _doc_default(setting: Setting, defaults: Mapping[str, object]) -> str:
    if setting.required:
        return "required"
    value = defaults[setting.key]
    if value is None or value == "":
        return "none"
    if setting.unit == "bytes" and isinstance(value, int) and value % _KIB == 0:
        size = f"{value // _MIB} MiB" if value % _MIB == 0 else f"{value // _KIB} KiB"
        return f"{value} ({size})"
    return str(value)


def doc_table(section: Section, defaults: Mapping[str, object]) -> str:
    """The markdown table of `section`'s settings; `defaults` maps each optional key to its default."""
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for setting in section.settings:
        shape = f"integer >= {setting.minimum}" if setting.kind == "int" else setting.shape
        rows.append(f"| `{setting.key}` | {shape} | {_doc_default(setting, defaults)} | {setting.doc} |")
    return "\n".join(rows) + "\n"


def alias_table() -> str:
    """The markdown table of ALIASES."""
    rows = ["| key | type | meaning |", "|---|---|---|"]
    for alias in ALIASES:
        key = f"{alias.key}KEY" if alias.key.endswith(".") else alias.key
        rows.append(f"| `{key}` | {alias.shape} | {alias.doc} |")
    return "\n".join(rows) + "\n"


_ALIAS_TABLE: Final = "aliases"


def update_doc(text: str, defaults: Mapping[str, object]) -> str:
    """`text` (docs/configuration.md) with every section's table, and the aliases' table, generated afresh
    between their markers."""
    by_name = {section.name: section for section in SECTIONS}
    found = [match[2] for match in _TABLE_RE.finditer(text)]
    if sorted(found) != sorted([*by_name, _ALIAS_TABLE]):
        raise ValueError(
            f"the document must have one table of settings per section ({', '.join(by_name)}) and one "
            f"of {_ALIAS_TABLE}, each between <!-- settings: NAME --> and <!-- end of settings -->; it has "
            f"{found}"
        )

    def table(match: re.Match[str]) -> str:
        name = match[2]
        return match[1] + (alias_table() if name == _ALIAS_TABLE else doc_table(by_name[name], defaults))

    return _TABLE_RE.sub(table, text)

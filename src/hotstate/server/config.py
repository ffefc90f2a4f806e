"""A server's configuration: a TOML file, then `HOTSTATE_*` environment variables, then flags (flags win).

Keys are dotted Kafka-style names (`node.id`, `controller.quorum.voters`); docs/configuration.md
describes each. Loading does no IO beyond reading the TOML file, so `hotstate server` can refuse a bad
configuration before it binds a port or touches `data.dir`.

Checks are split in two on purpose: parsing (text or TOML value -> typed value) happens only in
`load_config`, while every rule about typed values lives in `ServerConfig.__post_init__`, so a config
built in code (as `hotstate cluster up` does before `render_toml`) obeys the same rules as a loaded one.
"""

from __future__ import annotations

import difflib
import ipaddress
import logging
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, Literal, TypeVar

from hotstate.assignor.config import PROPERTY_NAMES, STRATEGIES, AssignorConfig
from hotstate.raft.config import RaftConfig
from hotstate.replica.core import ReplicaConfig
from hotstate.routing.heartbeat import HeartbeatConfig
from hotstate.server.liveness import LivenessConfig

logger = logging.getLogger(__name__)

Role = Literal["controller", "broker"]
ListenerName = Literal["rpc", "http"]

ROLES: Final[tuple[Role, ...]] = ("controller", "broker")
LOG_LEVELS: Final = ("DEBUG", "INFO", "WARNING", "ERROR")
ENV_PREFIX: Final = "HOTSTATE_"
MAX_INT32: Final = 2**31 - 1
MIN_SECRET_CHARS: Final = 16
# Room for message headers on top of the largest payload the quorum puts in one frame.
FRAME_HEADROOM_BYTES: Final = 64 * 1024
# Partition data (a Produce request's rows, a replica fetch answer's batches) may fill at most 1/N of a frame:
# the rest is room for the framing of every row and batch, which grows with the row count, not the bytes.
FRAME_DATA_SHARE: Final = 2
REPLICA_LOG_FSYNC_POLICIES: Final = ("never", "always")
MAX_LABEL_CHARS: Final = 255

REQUIRED_KEYS: Final = (
    "node.id",
    "process.roles",
    "listeners",
    "controller.quorum.voters",
    "data.dir",
    "cluster.id",
    "cluster.secret",
)
# Kafka name -> RaftConfig field.
RAFT_KEYS: Final[Mapping[str, str]] = {
    "controller.quorum.election.timeout.ms": "election_timeout_ms",
    "controller.quorum.fetch.timeout.ms": "fetch_timeout_ms",
    "controller.quorum.election.backoff.max.ms": "election_backoff_max_ms",
    "controller.quorum.append.linger.ms": "append_linger_ms",
    "controller.quorum.request.timeout.ms": "request_timeout_ms",
    "controller.quorum.fetch.max.wait.ms": "fetch_max_wait_ms",
    "controller.quorum.fetch.max.bytes": "fetch_max_bytes",
    "controller.quorum.snapshot.chunk.bytes": "snapshot_chunk_bytes",
}
# Kafka name -> ServerConfig field, for the plain integer settings.
INT_KEYS: Final[Mapping[str, str]] = {
    "broker.heartbeat.interval.ms": "heartbeat_interval_ms",
    "broker.session.timeout.ms": "session_timeout_ms",
    "metadata.snapshot.max.records": "snapshot_max_records",
    "metadata.snapshot.interval.ms": "snapshot_interval_ms",
    "rpc.max.frame.bytes": "max_frame_bytes",
    "produce.max.bytes": "produce_max_bytes",
    "reassign.interval.ms": "reassign_interval_ms",
    "broker.removal.delay.ms": "broker_removal_delay_ms",
}
# Kafka name -> ReplicaConfig field.
REPLICA_KEYS: Final[Mapping[str, str]] = {
    "replica.fetch.max.wait.ms": "fetch_max_wait_ms",
    "replica.fetch.max.bytes": "fetch_max_bytes",
    "replica.fetch.timeout.ms": "fetch_timeout_ms",
    "replica.fetch.backoff.ms": "fetch_backoff_ms",
    "replica.lag.time.max.ms": "replica_lag_time_max_ms",
    "replica.isr.change.retry.ms": "isr_change_retry_ms",
    "min.insync.replicas": "min_insync_replicas",
    "replica.log.retention.records": "log_retention_records",
}
# Kafka name -> HeartbeatConfig field (failure detection, KLIP-12): LivenessConfig.heartbeat.
HEARTBEAT_KEYS: Final[Mapping[str, str]] = {
    "heartbeat.send.interval.ms": "send_interval_ms",
    "heartbeat.check.interval.ms": "check_interval_ms",
    "heartbeat.window.ms": "window_ms",
    "heartbeat.missed.threshold": "missed_threshold",
    "heartbeat.received.threshold": "received_threshold",
}
# Kafka name -> LivenessConfig field, for its settings outside `heartbeat` (lag reporting, KIP-535).
LAG_REPORTING_KEYS: Final[Mapping[str, str]] = {
    "lag.reporting.send.interval.ms": "lag_report_interval_ms",
}
# Every key of ServerConfig.liveness.
LIVENESS_KEYS: Final = (*HEARTBEAT_KEYS, *LAG_REPORTING_KEYS)
# Kafka Streams name -> AssignorConfig field (the names are AssignorConfig.PROPERTY_NAMES'). Not
# num.standby.replicas: every table sets its own standby count.
ASSIGNOR_KEYS: Final[Mapping[str, str]] = {
    PROPERTY_NAMES[name]: name
    for name in (
        "rack_aware_assignment_strategy",
        "rack_aware_assignment_tags",
        "traffic_cost",
        "non_overlap_cost",
        "acceptable_recovery_lag",
        "max_warmup_replicas",
    )
}
STRATEGY_KEY: Final = "rack.aware.assignment.strategy"
ASSIGNMENT_TAGS_KEY: Final = "rack.aware.assignment.tags"
# The integer keys of ServerConfig.assignor.
ASSIGNOR_INT_KEYS: Final = tuple(
    key for key in ASSIGNOR_KEYS if key not in (STRATEGY_KEY, ASSIGNMENT_TAGS_KEY)
)
OPTIONAL_KEYS: Final = (
    "rack",
    "tags",
    *RAFT_KEYS,
    *INT_KEYS,
    *REPLICA_KEYS,
    "replica.log.fsync",
    *LIVENESS_KEYS,
    *ASSIGNOR_KEYS,
    "log.level",
)
KNOWN_KEYS: Final = (*REQUIRED_KEYS, *OPTIONAL_KEYS)

_RAFT_DEFAULTS: Final = RaftConfig()
_REPLICA_DEFAULTS: Final = ReplicaConfig()
_LIVENESS_DEFAULTS: Final = LivenessConfig()
_ASSIGNOR_DEFAULTS: Final = AssignorConfig()
DEFAULTS: Final[Mapping[str, object]] = {
    "rack": None,
    "tags": "",
    **{key: getattr(_RAFT_DEFAULTS, name) for key, name in RAFT_KEYS.items()},
    "broker.heartbeat.interval.ms": 250,
    "broker.session.timeout.ms": 2000,
    "metadata.snapshot.max.records": 10_000,
    "metadata.snapshot.interval.ms": 60_000,
    "rpc.max.frame.bytes": 16 * 1024 * 1024,
    "produce.max.bytes": 8 * 1024 * 1024,
    "reassign.interval.ms": 2000,
    "broker.removal.delay.ms": 30_000,
    **{key: getattr(_REPLICA_DEFAULTS, name) for key, name in REPLICA_KEYS.items()},
    "replica.log.fsync": "never",
    **{key: getattr(_LIVENESS_DEFAULTS.heartbeat, name) for key, name in HEARTBEAT_KEYS.items()},
    **{key: getattr(_LIVENESS_DEFAULTS, name) for key, name in LAG_REPORTING_KEYS.items()},
    STRATEGY_KEY: _ASSIGNOR_DEFAULTS.rack_aware_assignment_strategy,
    ASSIGNMENT_TAGS_KEY: ",".join(_ASSIGNOR_DEFAULTS.rack_aware_assignment_tags),
    **{key: getattr(_ASSIGNOR_DEFAULTS, ASSIGNOR_KEYS[key]) for key in ASSIGNOR_INT_KEYS},
    "log.level": "INFO",
}

# Integer keys -> (minimum, unit shown in errors).
_INT_RULES: Final[Mapping[str, tuple[int, str]]] = {
    "node.id": (1, ""),
    **{
        key: (0 if key == "controller.quorum.append.linger.ms" else 1, key.rsplit(".", 1)[1])
        for key in RAFT_KEYS
    },
    "broker.heartbeat.interval.ms": (1, "ms"),
    "broker.session.timeout.ms": (1, "ms"),
    "metadata.snapshot.max.records": (1, "records"),
    "metadata.snapshot.interval.ms": (1, "ms"),
    "rpc.max.frame.bytes": (1024, "bytes"),
    "produce.max.bytes": (1, "bytes"),
    "reassign.interval.ms": (0, "ms"),
    "broker.removal.delay.ms": (1, "ms"),
    "replica.fetch.max.wait.ms": (1, "ms"),
    "replica.fetch.max.bytes": (1, "bytes"),
    "replica.fetch.timeout.ms": (1, "ms"),
    "replica.fetch.backoff.ms": (0, "ms"),
    "replica.lag.time.max.ms": (1, "ms"),
    "replica.isr.change.retry.ms": (1, "ms"),
    "min.insync.replicas": (1, "replicas"),
    "replica.log.retention.records": (0, "records"),
    "heartbeat.send.interval.ms": (1, "ms"),
    "heartbeat.check.interval.ms": (1, "ms"),
    "heartbeat.window.ms": (1, "ms"),
    "heartbeat.missed.threshold": (1, "send intervals"),
    "heartbeat.received.threshold": (1, "send intervals"),
    "lag.reporting.send.interval.ms": (1, "ms"),
    "rack.aware.assignment.traffic_cost": (0, ""),
    "rack.aware.assignment.non_overlap_cost": (0, ""),
    "acceptable.recovery.lag": (0, "records"),
    # Kafka requires at least one warmup: with none, an active could never move to a new server.
    "max.warmup.replicas": (1, "replicas"),
}


def env_var_name(key: str) -> str:
    """`controller.quorum.voters` -> `HOTSTATE_CONTROLLER_QUORUM_VOTERS`."""
    return ENV_PREFIX + key.upper().replace(".", "_")


ENV_VARS: Final[Mapping[str, str]] = {env_var_name(key): key for key in KNOWN_KEYS}
assert len(ENV_VARS) == len(KNOWN_KEYS), "two keys map to one environment variable"


class _Missing:
    def __repr__(self) -> str:
        return "<not set>"


MISSING: Final = _Missing()


class _Redacted:
    """Stands in for the secret in errors, which end up in logs."""

    def __init__(self, value: object) -> None:
        self.description = f"{len(value)} characters" if isinstance(value, str) else type(value).__name__

    def __repr__(self) -> str:
        return f"<redacted: {self.description}>"


class ConfigError(Exception):
    """A bad configuration value: `key`, the `value` given and `allowed`, what the key accepts.

    `str(error)` reads `node.id='abc': must be a positive integer`, followed by ` (from env HOTSTATE_NODE_ID)`
    when the source is known. When several values are bad, the first error is raised and `errors` holds
    all of them; `str()` then gives one line each.
    """

    key: str
    value: object
    allowed: str
    source: str | None
    errors: tuple[ConfigError, ...]

    def __init__(
        self,
        key: str,
        value: object,
        allowed: str,
        *,
        source: str | None = None,
        others: Sequence[ConfigError] = (),
    ) -> None:
        if key == "cluster.secret" and not isinstance(value, _Missing | _Redacted):
            value = _Redacted(value)
        self.key = key
        self.value = value
        self.allowed = allowed
        self.source = source
        self.errors = (self, *others)
        super().__init__(str(self))

    def line(self) -> str:
        head = f"{self.key} is not set" if isinstance(self.value, _Missing) else f"{self.key}={self.value!r}"
        tail = f" (from {self.source})" if self.source else ""
        return f"{head}: {self.allowed}{tail}"

    def __str__(self) -> str:
        return "\n".join(error.line() for error in self.errors)

    @staticmethod
    def combine(errors: Sequence[ConfigError]) -> ConfigError:
        # A raised error carries the others in `errors`; a list may hold it and its others too.
        singles = list({id(single): single for error in errors for single in error.errors}.values())
        first = singles[0]
        return ConfigError(first.key, first.value, first.allowed, source=first.source, others=singles[1:])

    def with_sources(self, sources: Mapping[str, str]) -> ConfigError:
        return ConfigError.combine(
            [
                ConfigError(e.key, e.value, e.allowed, source=e.source or sources.get(e.key))
                for e in self.errors
            ]
        )


@dataclass(frozen=True, slots=True)
class Listener:
    """Where the server listens: `rpc` for servers and Spark executors, `http` for queries and status."""

    name: ListenerName
    host: str  # an IPv6 address without brackets
    port: int  # 0: any free port

    def __str__(self) -> str:
        return f"{self.name}://{_host_port(self.host, self.port)}"


@dataclass(frozen=True, slots=True)
class Voter:
    """A member of the metadata quorum, as listed in `controller.quorum.voters`."""

    node_id: int
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.node_id}@{_host_port(self.host, self.port)}"


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """A validated server configuration; constructing one checks every rule (raises ConfigError).

    `tags` is stored sorted, so two configs with the same tags compare equal.
    """

    node_id: int
    process_roles: frozenset[Role]
    rpc: Listener
    http: Listener | None = None
    voters: tuple[Voter, ...]
    data_dir: Path
    rack: str | None = None
    tags: tuple[tuple[str, str], ...] = ()
    cluster_id: str
    cluster_secret: str = field(repr=False)
    raft: RaftConfig = field(default_factory=RaftConfig)
    heartbeat_interval_ms: int = 250
    session_timeout_ms: int = 2000
    snapshot_max_records: int = 10_000
    snapshot_interval_ms: int = 60_000
    max_frame_bytes: int = 16 * 1024 * 1024
    replica: ReplicaConfig = field(default_factory=ReplicaConfig)
    replica_log_fsync: str = "never"
    produce_max_bytes: int = 8 * 1024 * 1024
    reassign_interval_ms: int = 2000
    broker_removal_delay_ms: int = 30_000
    liveness: LivenessConfig = field(default_factory=LivenessConfig)
    assignor: AssignorConfig = field(default_factory=AssignorConfig)
    log_level: str = "INFO"

    def __post_init__(self) -> None:
        roles: object = self.process_roles  # typed loosely: callers outside mypy may pass a list
        if isinstance(roles, Iterable) and not isinstance(roles, str):
            object.__setattr__(self, "process_roles", frozenset(roles))
        if isinstance(self.tags, Iterable) and all(_is_tag_pair(tag) for tag in self.tags):
            object.__setattr__(self, "tags", tuple(sorted(self.tags)))
        problems = _problems(self)
        if problems:
            raise ConfigError.combine(problems)

    @property
    def is_controller(self) -> bool:
        return "controller" in self.process_roles

    @property
    def is_broker(self) -> bool:
        return "broker" in self.process_roles

    def find_voter(self, node_id: int) -> Voter | None:
        return next((voter for voter in self.voters if voter.node_id == node_id), None)


# ---------------------------------------------------------------------------------------------------------
# Rules on typed values (ServerConfig.__post_init__)


def _int_allowed(key: str) -> str:
    minimum, unit = _INT_RULES[key]
    base = "must be a positive integer" if minimum == 1 else f"must be an integer >= {minimum}"
    return f"{base} ({unit})" if unit else base


def _check_int(key: str, value: object, errors: list[ConfigError]) -> bool:
    minimum, _ = _INT_RULES[key]
    # bool is an int subclass; `true` for a timeout is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        errors.append(ConfigError(key, value, _int_allowed(key)))
        return False
    if value > MAX_INT32:
        errors.append(ConfigError(key, value, f"{_int_allowed(key)}, at most {MAX_INT32}"))
        return False
    return True


_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME_RE: Final = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
_HOST_ALLOWED: Final = "a host name, an IPv4 address or an IPv6 address in brackets, e.g. [::1]"
_PORT_ALLOWED: Final = "a port from 0 to 65535 (0: any free port)"


def _host_problem(host: object) -> str | None:
    if not isinstance(host, str) or not host:
        return f"must name {_HOST_ALLOWED}"
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return f"{host!r} is not an IPv6 address; must name {_HOST_ALLOWED}"
        return None
    if re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return f"{host!r} is not an IPv4 address; must name {_HOST_ALLOWED}"
        return None
    if len(host) > 253 or not _HOSTNAME_RE.fullmatch(host):
        return f"{host!r} is not a valid host name; must name {_HOST_ALLOWED}"
    return None


def _is_unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_unspecified
    except ValueError:
        return False


def _is_utf8(text: str) -> bool:
    # Undecodable bytes in an environment variable arrive as lone surrogates, which TOML cannot hold.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_path_text(text: str) -> bool:
    return bool(text.strip()) and "\0" not in text and _is_utf8(text)


def _is_port(port: object, minimum: int) -> bool:
    return isinstance(port, int) and not isinstance(port, bool) and minimum <= port <= 65535


def _label_problem(value: object) -> str | None:
    """Rules shared by `rack` and tag values: they travel in comma-separated `key=value` lists."""
    if not isinstance(value, str) or not value:
        return "must be a non-empty string"
    if len(value) > MAX_LABEL_CHARS:
        return f"must be at most {MAX_LABEL_CHARS} characters"
    if value != value.strip() or not value.isprintable() or "," in value or "=" in value:
        return "must be printable, without ',' or '=' and without leading or trailing spaces"
    return None


_TAG_KEY_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")
_TAG_KEY_ALLOWED: Final = (
    "a tag key must be 1-64 letters, digits, '.', '_' or '-', starting with a letter or digit"
)
_CLUSTER_ID_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")


def _is_tag_pair(tag: object) -> bool:
    return isinstance(tag, tuple) and len(tag) == 2 and all(isinstance(part, str) for part in tag)


def _format_tags(tags: Iterable[tuple[str, str]]) -> str:
    return ",".join(f"{k}={v}" for k, v in tags)


def _format_roles(roles: Iterable[str]) -> str:
    return ",".join(sorted(roles, key=lambda role: (ROLES.index(role) if role in ROLES else 2, role)))


def _problems(c: ServerConfig) -> list[ConfigError]:
    errors: list[ConfigError] = []
    _check_int("node.id", c.node_id, errors)

    roles = c.process_roles
    if not roles or not all(role in ROLES for role in roles):
        shown = _format_roles(roles) if isinstance(roles, frozenset) else roles
        errors.append(ConfigError("process.roles", shown, "must be controller, broker or controller,broker"))

    listeners_ok = _check_listeners(c, errors)
    voters_ok = _check_voters(c, errors)
    if listeners_ok and voters_ok and not errors:
        _check_membership(c, errors)

    data_dir: object = c.data_dir
    if not isinstance(data_dir, Path) or not _is_path_text(str(data_dir)):
        errors.append(
            ConfigError(
                "data.dir", data_dir, "must be a directory path in UTF-8 without NUL (it need not exist yet)"
            )
        )
    if c.rack is not None and (problem := _label_problem(c.rack)):
        errors.append(ConfigError("rack", c.rack, problem))
    _check_tags(c.tags, errors)
    if not isinstance(c.cluster_id, str) or not _CLUSTER_ID_RE.fullmatch(c.cluster_id):
        errors.append(
            ConfigError(
                "cluster.id", c.cluster_id, "must be 1-64 letters, digits, '-' or '_' (e.g. a base64 UUID)"
            )
        )
    if not isinstance(c.cluster_secret, str) or not _is_utf8(c.cluster_secret):
        errors.append(ConfigError("cluster.secret", c.cluster_secret, "must be a string in UTF-8"))
    elif len(c.cluster_secret) < MIN_SECRET_CHARS:
        errors.append(
            ConfigError(
                "cluster.secret",
                c.cluster_secret,
                f"must be a string of at least {MIN_SECRET_CHARS} characters: servers prove to each other "
                "with it that they belong to the cluster, and a short secret can be guessed",
            )
        )
    raft: object = c.raft
    if not isinstance(raft, RaftConfig):
        errors.append(ConfigError("controller.quorum", raft, "must be a RaftConfig"))

    heartbeat_ok = _check_int("broker.heartbeat.interval.ms", c.heartbeat_interval_ms, errors)
    session_ok = _check_int("broker.session.timeout.ms", c.session_timeout_ms, errors)
    if heartbeat_ok and session_ok and c.heartbeat_interval_ms >= c.session_timeout_ms:
        errors.append(
            ConfigError(
                "broker.heartbeat.interval.ms",
                c.heartbeat_interval_ms,
                f"must be below broker.session.timeout.ms={c.session_timeout_ms}, "
                "or a healthy server is fenced between two heartbeats",
            )
        )
    _check_int("metadata.snapshot.max.records", c.snapshot_max_records, errors)
    _check_int("metadata.snapshot.interval.ms", c.snapshot_interval_ms, errors)
    _check_int("reassign.interval.ms", c.reassign_interval_ms, errors)
    _check_int("broker.removal.delay.ms", c.broker_removal_delay_ms, errors)
    data_sizes_ok = _check_replica(c, errors)
    data_sizes_ok = _check_int("produce.max.bytes", c.produce_max_bytes, errors) and data_sizes_ok
    if _check_int("rpc.max.frame.bytes", c.max_frame_bytes, errors):
        _check_frame(c, quorum_ok=isinstance(raft, RaftConfig), data_ok=data_sizes_ok, errors=errors)
    if c.replica_log_fsync not in REPLICA_LOG_FSYNC_POLICIES:
        errors.append(ConfigError("replica.log.fsync", c.replica_log_fsync, _FSYNC_ALLOWED))
    _check_liveness(c, errors)
    _check_assignor(c, errors)
    if c.log_level not in LOG_LEVELS:
        errors.append(ConfigError("log.level", c.log_level, f"must be one of {', '.join(LOG_LEVELS)}"))
    return errors


_FSYNC_ALLOWED: Final = f"must be {' or '.join(REPLICA_LOG_FSYNC_POLICIES)}"


def _check_replica(c: ServerConfig, errors: list[ConfigError]) -> bool:
    """The ReplicaConfig keys (REPLICA_KEYS); True if replica.fetch.max.bytes is valid."""
    replica: object = c.replica
    if not isinstance(replica, ReplicaConfig):
        errors.append(ConfigError("replica", replica, "must be a ReplicaConfig"))
        return False
    ok = {key: _check_int(key, getattr(replica, name), errors) for key, name in REPLICA_KEYS.items()}
    wait, timeout = replica.fetch_max_wait_ms, replica.fetch_timeout_ms
    if ok["replica.fetch.max.wait.ms"] and ok["replica.fetch.timeout.ms"] and wait >= timeout:
        errors.append(
            ConfigError(
                "replica.fetch.max.wait.ms",
                wait,
                f"must be below replica.fetch.timeout.ms={timeout}, or an idle follower's fetch times out "
                "before the active answers it",
            )
        )
    return ok["replica.fetch.max.bytes"]


def _check_liveness(c: ServerConfig, errors: list[ConfigError]) -> None:
    """The LivenessConfig keys (LIVENESS_KEYS)."""
    liveness: object = c.liveness
    if not isinstance(liveness, LivenessConfig):
        errors.append(ConfigError("liveness", liveness, "must be a LivenessConfig"))
        return
    heartbeat: object = liveness.heartbeat
    if not isinstance(heartbeat, HeartbeatConfig):
        errors.append(ConfigError("heartbeat", heartbeat, "must be a HeartbeatConfig"))
        values = {key: getattr(liveness, name) for key, name in LAG_REPORTING_KEYS.items()}
    else:
        values = _liveness_values(liveness)
    errors += _liveness_problems(values)


def _liveness_values(liveness: LivenessConfig) -> dict[str, object]:
    """Kafka name -> value, for every key in LIVENESS_KEYS."""
    return {
        **{key: getattr(liveness.heartbeat, name) for key, name in HEARTBEAT_KEYS.items()},
        **{key: getattr(liveness, name) for key, name in LAG_REPORTING_KEYS.items()},
    }


def _liveness_problems(values: Mapping[str, object]) -> list[ConfigError]:
    """The rules on the liveness keys given in `values` (Kafka name -> value).

    They include every rule of HeartbeatConfig.__post_init__, which raises a bare ValueError: `load_config`
    checks them before it builds a HeartbeatConfig, so a bad value is reported naming its key.
    """
    errors: list[ConfigError] = []
    valid: dict[str, int] = {}
    for key, value in values.items():
        if _check_int(key, value, errors) and isinstance(value, int):
            valid[key] = value
    if all(key in valid for key in _WINDOW_RULE_KEYS):
        send, window = valid["heartbeat.send.interval.ms"], valid["heartbeat.window.ms"]
        missed, received = valid["heartbeat.missed.threshold"], valid["heartbeat.received.threshold"]
        # HeartbeatConfig's rule: the window holds window // send whole slots, at least the larger threshold.
        if window // send < max(missed, received):
            slots = max(missed, received)
            why = (
                f"heartbeat.missed.threshold={missed}, or a dead peer is never marked down"
                if missed >= received
                else f"heartbeat.received.threshold={received}, or a peer marked down never comes back up"
            )
            errors.append(
                ConfigError(
                    "heartbeat.window.ms",
                    window,
                    f"must be at least {send * slots}: {slots} slots of heartbeat.send.interval.ms={send}, "
                    f"the larger of the thresholds, {why}",
                )
            )
    return errors


_WINDOW_RULE_KEYS: Final = (
    "heartbeat.send.interval.ms",
    "heartbeat.window.ms",
    "heartbeat.missed.threshold",
    "heartbeat.received.threshold",
)


def _check_assignor(c: ServerConfig, errors: list[ConfigError]) -> None:
    """The AssignorConfig keys (ASSIGNOR_KEYS)."""
    assignor: object = c.assignor
    if not isinstance(assignor, AssignorConfig):
        errors.append(ConfigError("assignor", assignor, "must be an AssignorConfig"))
        return
    standbys = assignor.num_standby_replicas
    if standbys != _ASSIGNOR_DEFAULTS.num_standby_replicas:
        # Not a server key, so render_toml could not write it: keep every valid config round-tripping.
        errors.append(
            ConfigError(
                "assignor",
                f"num_standby_replicas={standbys}",
                f"must leave num_standby_replicas at {_ASSIGNOR_DEFAULTS.num_standby_replicas}: "
                "it is not a server setting, every table sets its own standby count",
            )
        )
    errors += _assignor_problems(_assignor_values(assignor))


def _assignor_values(assignor: AssignorConfig) -> dict[str, object]:
    """Kafka Streams name -> value, for every key in ASSIGNOR_KEYS."""
    return {key: getattr(assignor, name) for key, name in ASSIGNOR_KEYS.items()}


_STRATEGY_ALLOWED: Final = f"must be {', '.join(STRATEGIES[:-1])} or {STRATEGIES[-1]}"
_ASSIGNMENT_TAGS_ALLOWED: Final = (
    "must be tag keys, comma-separated (e.g. rack,zone), or empty for no spread over tags"
)


def _assignor_problems(values: Mapping[str, object]) -> list[ConfigError]:
    """The rules on the assignor keys given in `values` (Kafka Streams name -> value).

    They include every rule of AssignorConfig.__post_init__, which raises a bare ValueError: `load_config`
    checks them before it builds an AssignorConfig, so a bad value is reported naming its key.
    """
    errors: list[ConfigError] = []
    for key, value in values.items():
        if key == STRATEGY_KEY:
            if value not in STRATEGIES:
                errors.append(ConfigError(key, value, _STRATEGY_ALLOWED))
        elif key == ASSIGNMENT_TAGS_KEY:
            _check_assignment_tags(value, errors)
        else:
            _check_int(key, value, errors)
    return errors


def _check_assignment_tags(tags: object, errors: list[ConfigError]) -> None:
    key = ASSIGNMENT_TAGS_KEY
    if not isinstance(tags, tuple) or not all(isinstance(tag, str) for tag in tags):
        errors.append(ConfigError(key, tags, "must be a tuple of tag keys"))
        return
    seen: set[str] = set()
    for tag in tags:
        # `rack` is allowed here: it is the tag that stands for a server's rack key.
        if not _TAG_KEY_RE.fullmatch(tag):
            errors.append(ConfigError(key, tag, f"{_ASSIGNMENT_TAGS_ALLOWED}; {_TAG_KEY_ALLOWED}"))
        elif tag in seen:
            errors.append(
                ConfigError(key, ",".join(tags), f"must give each tag key once; {tag!r} is repeated")
            )
        seen.add(tag)


def _check_frame(c: ServerConfig, *, quorum_ok: bool, data_ok: bool, errors: list[ConfigError]) -> None:
    """rpc.max.frame.bytes must hold the largest quorum message and the largest partition message."""
    needs: list[tuple[int, str]] = []
    if quorum_ok:
        largest = max(c.raft.fetch_max_bytes, c.raft.snapshot_chunk_bytes)
        needs.append(
            (
                largest + FRAME_HEADROOM_BYTES,
                "the largest of controller.quorum.fetch.max.bytes and controller.quorum.snapshot.chunk.bytes "
                f"({largest}) plus {FRAME_HEADROOM_BYTES} bytes for headers, or quorum messages do not fit",
            )
        )
    if data_ok:
        # A fetch answer carries at least one whole batch, and a batch can be as large as a Produce.
        largest = max(c.replica.fetch_max_bytes, c.produce_max_bytes)
        needs.append(
            (
                largest * FRAME_DATA_SHARE,
                f"{FRAME_DATA_SHARE} times the largest of replica.fetch.max.bytes and produce.max.bytes "
                f"({largest}), to leave room for the framing of every row and batch, or Produce requests "
                "and replica fetch answers do not fit",
            )
        )
    unmet = [(need, why) for need, why in needs if c.max_frame_bytes < need]
    if unmet:
        errors.append(
            ConfigError(
                "rpc.max.frame.bytes",
                c.max_frame_bytes,
                f"must be at least {max(need for need, _ in unmet)}: "
                + "; and ".join(why for _, why in unmet),
            )
        )


def _check_listeners(c: ServerConfig, errors: list[ConfigError]) -> bool:
    count = len(errors)
    for expected, listener in (("rpc", c.rpc), ("http", c.http)):
        if listener is None and expected == "http":
            continue
        if not isinstance(listener, Listener) or listener.name != expected:
            errors.append(
                ConfigError("listeners", listener, f"the {expected} listener must be a {expected} Listener")
            )
            continue
        if problem := _host_problem(listener.host):
            errors.append(ConfigError("listeners", str(listener), problem))
        elif not _is_port(listener.port, 0):
            errors.append(ConfigError("listeners", str(listener), f"must give {_PORT_ALLOWED}"))
    if len(errors) > count:
        return False
    http = c.http
    if (
        http is not None
        and http.port == c.rpc.port != 0
        and (http.host == c.rpc.host or _is_unspecified(http.host) or _is_unspecified(c.rpc.host))
    ):
        errors.append(
            ConfigError(
                "listeners",
                f"{c.rpc},{http}",
                "must give rpc and http different ports (or port 0): both cannot bind one address",
            )
        )
        return False
    return True


def _check_voters(c: ServerConfig, errors: list[ConfigError]) -> bool:
    count = len(errors)
    allowed = "must be a comma-separated list of ID@HOST:PORT, e.g. 1@10.0.0.1:9092,2@10.0.0.2:9092"
    voters: object = c.voters
    if not isinstance(voters, tuple) or not voters:
        shown = "" if voters == () else voters  # as it was written when loaded
        errors.append(ConfigError("controller.quorum.voters", shown, allowed))
        return False
    seen_ids: set[int] = set()
    seen_addresses: set[tuple[str, int]] = set()
    for voter in voters:
        if not isinstance(voter, Voter):
            errors.append(ConfigError("controller.quorum.voters", voter, allowed))
            continue
        if (
            isinstance(voter.node_id, bool)
            or not isinstance(voter.node_id, int)
            or not 1 <= voter.node_id <= MAX_INT32
        ):
            errors.append(
                ConfigError(
                    "controller.quorum.voters", str(voter), "must give each voter a positive integer id"
                )
            )
        elif problem := _host_problem(voter.host):
            errors.append(ConfigError("controller.quorum.voters", str(voter), problem))
        elif _is_unspecified(voter.host):
            errors.append(
                ConfigError(
                    "controller.quorum.voters",
                    str(voter),
                    "must give an address other servers can connect to, not a wildcard like 0.0.0.0 or [::]",
                )
            )
        elif not _is_port(voter.port, 1):
            errors.append(
                ConfigError("controller.quorum.voters", str(voter), "must give a port from 1 to 65535")
            )
        elif voter.node_id in seen_ids:
            errors.append(
                ConfigError(
                    "controller.quorum.voters", str(voter), f"must list node {voter.node_id} only once"
                )
            )
        elif (voter.host.lower(), voter.port) in seen_addresses:
            errors.append(
                ConfigError(
                    "controller.quorum.voters",
                    str(voter),
                    f"must give each voter its own address; "
                    f"{_host_port(voter.host, voter.port)} is listed twice",
                )
            )
        else:
            seen_ids.add(voter.node_id)
            seen_addresses.add((voter.host.lower(), voter.port))
    return len(errors) == count


def _check_membership(c: ServerConfig, errors: list[ConfigError]) -> None:
    me = c.find_voter(c.node_id)
    voters = ",".join(str(voter) for voter in c.voters)
    if c.is_controller and me is None:
        errors.append(
            ConfigError(
                "controller.quorum.voters",
                voters,
                f"must include this node (node.id={c.node_id}) because process.roles includes controller: "
                f"add {c.node_id}@HOST:PORT, or make the node broker-only",
            )
        )
    elif c.is_controller and me is not None and me.port != c.rpc.port:
        errors.append(
            ConfigError(
                "controller.quorum.voters",
                str(me),
                f"must give this controller the port of its rpc listener ({c.rpc}); "
                "the other voters connect to it there"
                + (" (a controller cannot use port 0)" if c.rpc.port == 0 else ""),
            )
        )
    elif not c.is_controller and me is not None:
        errors.append(
            ConfigError(
                "controller.quorum.voters",
                voters,
                f"must not include this node (node.id={c.node_id}): it is broker-only, so it would count "
                "toward the quorum without ever voting; add controller to process.roles "
                "or drop it from the voters",
            )
        )


def _check_tags(tags: object, errors: list[ConfigError]) -> None:
    if not isinstance(tags, tuple) or not all(_is_tag_pair(tag) for tag in tags):
        errors.append(ConfigError("tags", tags, "must be a tuple of (key, value) string pairs"))
        return
    seen: set[str] = set()
    for key, value in tags:
        if not _TAG_KEY_RE.fullmatch(key):
            errors.append(ConfigError("tags", f"{key}={value}", f"{_TAG_KEY_ALLOWED}"))
        elif key == "rack":
            errors.append(
                ConfigError(
                    "tags", f"{key}={value}", "must not contain rack: set the server's rack with the rack key"
                )
            )
        elif key in seen:
            errors.append(
                ConfigError("tags", _format_tags(tags), f"must give each key once; {key!r} is repeated")
            )
        elif problem := _label_problem(value):
            errors.append(ConfigError("tags", f"{key}={value}", f"the value {problem}"))
        seen.add(key)


# ---------------------------------------------------------------------------------------------------------
# Parsing raw values (TOML values, or strings from the environment and flags)

T = TypeVar("T")


def _to_int(key: str, raw: object) -> int:
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and re.fullmatch(r"[+-]?[0-9][0-9_]*", raw.strip()) and "__" not in raw:
        return int(raw.strip())
    raise ConfigError(key, raw, _int_allowed(key))


def _to_str(key: str, raw: object, allowed: str) -> str:
    if not isinstance(raw, str):
        raise ConfigError(key, raw, allowed)
    if not _is_utf8(raw):
        raise ConfigError(key, raw, f"{allowed} in UTF-8")
    return raw


def _split_list(key: str, raw: object, allowed: str) -> list[str]:
    """A list may be one comma-separated string or, in TOML, an array of strings."""
    if isinstance(raw, list) and all(isinstance(item, str) for item in raw):
        items = [str(item) for item in raw]
    elif isinstance(raw, str):
        items = raw.split(",")
    else:
        raise ConfigError(key, raw, allowed)
    # A trailing comma is harmless; an otherwise empty list is caught by the rules on the typed value.
    return [_to_str(key, item, allowed).strip() for item in items if item.strip()]


def _parse_roles(raw: object) -> frozenset[Role]:
    allowed = "must be controller, broker or controller,broker"
    roles: set[Role] = set()
    for item in _split_list("process.roles", raw, allowed):
        name = item.lower()
        if name not in ROLES:
            raise ConfigError("process.roles", raw, f"{allowed}; {item!r} is not a role")
        role: Role = "controller" if name == "controller" else "broker"
        if role in roles:
            raise ConfigError("process.roles", raw, f"{allowed}; {item!r} is given twice")
        roles.add(role)
    if not roles:
        raise ConfigError("process.roles", raw, allowed)
    return frozenset(roles)


def _parse_host_port(key: str, text: str, allowed: str) -> tuple[str, int]:
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or text[end + 1 : end + 2] != ":":
            raise ConfigError(key, text, allowed)
        host, port_text = text[1:end], text[end + 2 :]
        if ":" not in host:
            raise ConfigError(key, text, f"{allowed}; brackets are only for IPv6 addresses")
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ConfigError(key, text, f"{allowed}; the port is missing")
        if ":" in host:
            raise ConfigError(key, text, f"{allowed}; put an IPv6 address in brackets, e.g. [::1]:9092")
    if not re.fullmatch(r"[0-9]{1,5}", port_text):
        raise ConfigError(key, text, f"{allowed}; {port_text!r} is not a port number")
    return host, int(port_text)


_LISTENERS_ALLOWED: Final = (
    "must be rpc://HOST:PORT (required) and optionally http://HOST:PORT, comma-separated; "
    f"HOST is {_HOST_ALLOWED}, PORT is {_PORT_ALLOWED}"
)


def _parse_listeners(raw: object) -> tuple[Listener, Listener | None]:
    found: dict[str, Listener] = {}
    for item in _split_list("listeners", raw, _LISTENERS_ALLOWED):
        scheme, sep, rest = item.partition("://")
        name = scheme.lower()
        if not sep or name not in ("rpc", "http"):
            raise ConfigError("listeners", item, f"{_LISTENERS_ALLOWED}; the name must be rpc or http")
        if name in found:
            raise ConfigError("listeners", raw, f"{_LISTENERS_ALLOWED}; {name} is given twice")
        host, port = _parse_host_port("listeners", rest, _LISTENERS_ALLOWED)
        found[name] = Listener("rpc" if name == "rpc" else "http", host, port)
    if "rpc" not in found:
        raise ConfigError("listeners", raw, f"{_LISTENERS_ALLOWED}; the rpc listener is missing")
    return found["rpc"], found.get("http")


_VOTERS_ALLOWED: Final = (
    "must be a comma-separated list of ID@HOST:PORT, e.g. 1@10.0.0.1:9092,2@10.0.0.2:9092, "
    f"with positive integer ids and HOST {_HOST_ALLOWED}"
)


def _parse_voters(raw: object) -> tuple[Voter, ...]:
    voters = []
    for item in _split_list("controller.quorum.voters", raw, _VOTERS_ALLOWED):
        id_text, sep, address = item.partition("@")
        if not sep or not re.fullmatch(r"[0-9]+", id_text.strip()):
            raise ConfigError("controller.quorum.voters", item, _VOTERS_ALLOWED)
        host, port = _parse_host_port("controller.quorum.voters", address.strip(), _VOTERS_ALLOWED)
        voters.append(Voter(int(id_text), host, port))
    return tuple(voters)


_TAGS_ALLOWED: Final = (
    "must be key=value pairs, comma-separated (e.g. zone=eu1,cluster=k8s-1), or a TOML table"
)


def _parse_tags(raw: object) -> tuple[tuple[str, str], ...]:
    pairs: list[tuple[str, str]] = []
    if isinstance(raw, dict):
        for key, value in raw.items():
            if not isinstance(value, str):
                raise ConfigError("tags", {key: value}, f"{_TAGS_ALLOWED}; tag values are strings")
            pairs.append((key, value))
    else:
        for item in _split_list("tags", raw, _TAGS_ALLOWED):
            key, sep, value = item.partition("=")
            if not sep:
                raise ConfigError("tags", item, _TAGS_ALLOWED)
            pairs.append((key.strip(), value.strip()))
    # Duplicates must survive until the rules see them, so no dict here.
    return tuple(pairs)


def _parse_log_level(raw: object) -> str:
    allowed = f"must be one of {', '.join(LOG_LEVELS)}"
    level = _to_str("log.level", raw, allowed).strip().upper()
    # Kafka's log4j and many operators say WARN.
    level = "WARNING" if level == "WARN" else level
    if level not in LOG_LEVELS:
        raise ConfigError("log.level", raw, allowed)
    return level


def _parse_fsync(raw: object) -> str:
    policy = _to_str("replica.log.fsync", raw, _FSYNC_ALLOWED).strip().lower()
    if policy not in REPLICA_LOG_FSYNC_POLICIES:
        raise ConfigError("replica.log.fsync", raw, _FSYNC_ALLOWED)
    return policy


def _parse_strategy(raw: object) -> str:
    strategy = _to_str(STRATEGY_KEY, raw, _STRATEGY_ALLOWED).strip().lower()
    if strategy not in STRATEGIES:
        near = _nearest(strategy, STRATEGIES)
        hint = f"; did you mean {near!r}?" if near else ""
        raise ConfigError(STRATEGY_KEY, raw, _STRATEGY_ALLOWED + hint)
    return strategy


def _parse_assignment_tags(raw: object) -> tuple[str, ...]:
    """One comma-separated string or, in TOML, an array of strings; empty (`""`, `[]`) for no tags.

    Unlike the other lists, an empty item is an error rather than skipped: an empty value means something
    here (no spread over tags), so `rack,,zone` is more likely a mistake than a shortcut."""
    key = ASSIGNMENT_TAGS_KEY
    if isinstance(raw, list) and all(isinstance(item, str) for item in raw):
        items = [str(item) for item in raw]
    elif isinstance(raw, str):
        items = raw.split(",") if raw.strip() else []
    else:
        raise ConfigError(key, raw, _ASSIGNMENT_TAGS_ALLOWED)
    tags = tuple(_to_str(key, item, _ASSIGNMENT_TAGS_ALLOWED).strip() for item in items)
    if "" in tags:
        raise ConfigError(key, raw, f"{_ASSIGNMENT_TAGS_ALLOWED}; a tag key must not be empty")
    # Order matters (the earlier keys are spread over first) and duplicates must survive until the rules
    # see them, so the tags stay as given.
    return tags


def _parse_raft(raw: Mapping[str, object], errors: list[ConfigError]) -> RaftConfig:
    values: dict[str, int] = {}
    for key, name in RAFT_KEYS.items():
        if key not in raw:
            continue
        try:
            value = _to_int(key, raw[key])
        except ConfigError as error:
            errors.append(error)
            continue
        if _check_int(key, value, errors):
            values[name] = value
    if len(values) < sum(key in raw for key in RAFT_KEYS):
        return _RAFT_DEFAULTS
    try:
        return RaftConfig(**values)
    except ValueError as error:
        errors.append(_raft_error(error, values))
        return _RAFT_DEFAULTS


def _parse_liveness(raw: Mapping[str, object], errors: list[ConfigError]) -> LivenessConfig:
    """HeartbeatConfig checks itself and raises a bare ValueError, so its rules are checked first, here,
    naming the key; with any bad liveness key the defaults stand in (ServerConfig finds nothing wrong with
    them) and the bad keys are reported from `errors`."""
    values: dict[str, int] = {}
    count = len(errors)
    for key in LIVENESS_KEYS:
        try:
            values[key] = _to_int(key, raw.get(key, DEFAULTS[key]))
        except ConfigError as error:
            errors.append(error)
    errors += _liveness_problems(values)
    if len(errors) > count:
        return _LIVENESS_DEFAULTS
    return LivenessConfig(
        heartbeat=HeartbeatConfig(**{name: values[key] for key, name in HEARTBEAT_KEYS.items()}),
        **{name: values[key] for key, name in LAG_REPORTING_KEYS.items()},
    )


def _parse_assignor(raw: Mapping[str, object], errors: list[ConfigError]) -> AssignorConfig:
    """AssignorConfig checks itself and raises a bare ValueError, so its rules are checked first, here,
    naming the key; with any bad assignor key the defaults stand in (ServerConfig finds nothing wrong with
    them) and the bad keys are reported from `errors`."""
    count = len(errors)
    values: dict[str, object] = {}
    parsers: dict[str, Callable[[object], object]] = {
        STRATEGY_KEY: _parse_strategy,
        ASSIGNMENT_TAGS_KEY: _parse_assignment_tags,
    }
    for key in ASSIGNOR_KEYS:
        value = raw.get(key, DEFAULTS[key])
        try:
            values[key] = parsers[key](value) if key in parsers else _to_int(key, value)
        except ConfigError as error:
            errors.append(error)
    # The values that did parse are checked too, so one run reports every bad key.
    errors += _assignor_problems(values)
    if len(errors) > count:
        return _ASSIGNOR_DEFAULTS
    try:
        # ASSIGNOR_KEYS are AssignorConfig's property names.
        return AssignorConfig.from_properties(values)
    except ValueError as error:  # a rule of AssignorConfig's that the rules above do not have
        errors.append(_assignor_error(error, values))
        return _ASSIGNOR_DEFAULTS


def _assignor_error(error: ValueError, values: Mapping[str, object]) -> ConfigError:
    # AssignorConfig words its errors as "FIELD (KEY) = VALUE is invalid: allowed is RULE".
    match = re.fullmatch(r"\w+ \(([a-z._]+)\) = .*? is invalid: allowed is (.*)", str(error), re.DOTALL)
    if match is None or match[1] not in values:
        return ConfigError("assignor", dict(values), str(error))
    return ConfigError(match[1], values[match[1]], f"must be {match[2]}")


def _raft_error(error: ValueError, values: Mapping[str, int]) -> ConfigError:
    # RaftConfig words its errors as "controller.quorum.KEY=VALUE: RULE"; keep its rule text.
    match = re.fullmatch(r"(controller\.quorum\.[a-z.]+)=(.*?): (.*)", str(error), re.DOTALL)
    if match is None or match[1] not in RAFT_KEYS:
        return ConfigError("controller.quorum", dict(values), str(error))
    key = match[1]
    return ConfigError(key, values.get(RAFT_KEYS[key], match[2]), match[3])


# ---------------------------------------------------------------------------------------------------------
# Sources


_REQUIRED_SHAPES: Final[Mapping[str, str]] = {
    "node.id": "a positive integer",
    "process.roles": "controller, broker or controller,broker",
    "listeners": "rpc://HOST:PORT, optionally followed by ,http://HOST:PORT",
    "controller.quorum.voters": "ID@HOST:PORT,ID@HOST:PORT,...",
    "data.dir": "a directory path",
    "cluster.id": "1-64 letters, digits, '-' or '_', the same on every server",
    "cluster.secret": f"at least {MIN_SECRET_CHARS} characters, the same on every server",
}


def _nearest(key: str, candidates: Sequence[str]) -> str | None:
    matches = difflib.get_close_matches(key, candidates, n=1, cutoff=0.6)
    return matches[0] if matches else None


def _unknown_key(key: str, value: object) -> ConfigError:
    near = _nearest(key.replace("_", ".").replace("-", ".").lower(), KNOWN_KEYS)
    hint = f"did you mean {near!r}?" if near else "see docs/configuration.md for the keys"
    return ConfigError(key, value, f"is not a known key; {hint}")


def _read_toml(path: Path) -> dict[str, object]:
    try:
        with open(path, "rb") as file:
            document = tomllib.load(file)
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as error:
        raise ConfigError("--config", str(path), f"must be a readable TOML file: {error}") from None
    flat: dict[str, object] = {}
    errors: list[ConfigError] = []
    _flatten(document, "", flat, errors)
    if errors:
        raise ConfigError.combine(errors).with_sources({e.key: str(path) for e in errors})
    return flat


def _flatten(
    table: Mapping[str, object], prefix: str, out: dict[str, object], errors: list[ConfigError]
) -> None:
    """`[controller.quorum] voters = ...` and `"controller.quorum.voters" = ...` both give one dotted key."""
    for name, value in table.items():
        key = prefix + name
        # A table is read as one first: `rack` is a key, and `[rack.aware.assignment]` a table of keys.
        if isinstance(value, dict) and any(known.startswith(key + ".") for known in KNOWN_KEYS):
            _flatten(value, key + ".", out, errors)
        elif key in KNOWN_KEYS:
            if key in out:
                errors.append(
                    ConfigError(
                        key, value, "must be set once; the file gives it both as a dotted key and in a table"
                    )
                )
            out[key] = value
        else:
            errors.append(_unknown_key(key, value))


def _from_env(env: Mapping[str, str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for name, value in env.items():
        if not name.startswith(ENV_PREFIX):
            continue
        key = ENV_VARS.get(name)
        if key is None:
            # Other hotstate tools (the Spark sink, the client) read HOTSTATE_* variables too.
            # Compare without the shared prefix, or every name looks close to every other.
            near = _nearest(
                name.removeprefix(ENV_PREFIX), [known.removeprefix(ENV_PREFIX) for known in ENV_VARS]
            )
            hint = f" (did you mean {ENV_PREFIX}{near}?)" if near else ""
            logger.warning("ignoring environment variable %s: not a server setting%s", name, hint)
        elif value != "":
            # `HOTSTATE_RACK= hotstate server` or an unset compose variable means "not set".
            values[key] = value
    return values


def parse_flag_overrides(args: Sequence[str]) -> dict[str, str]:
    """Turn `--node.id=1`, `--node.id 1` and `--set node.id=1` into `{"node.id": "1"}`; the last one wins.

    Raises ConfigError for malformed arguments and unknown keys.
    """
    values: dict[str, str] = {}
    errors: list[ConfigError] = []
    shape = "must be --KEY=VALUE, --KEY VALUE or --set KEY=VALUE"
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--set" or arg.startswith("--set="):
            if arg == "--set":
                if i + 1 >= len(args):
                    errors.append(ConfigError("--set", MISSING, "must be followed by KEY=VALUE"))
                    break
                pair, i = args[i + 1], i + 2
            else:
                pair, i = arg.removeprefix("--set="), i + 1
            key, sep, value = pair.partition("=")
            if not sep or not key.strip():
                errors.append(
                    ConfigError("--set", pair, "must be followed by KEY=VALUE, e.g. --set node.id=1")
                )
                continue
        elif arg.startswith("--") and len(arg) > 2:
            key, sep, value = arg[2:].partition("=")
            if sep:
                i += 1
            elif i + 1 < len(args) and not args[i + 1].startswith("--"):
                value, i = args[i + 1], i + 2
            else:
                errors.append(
                    ConfigError(key, MISSING, f"--{key} needs a value (--{key}=VALUE or --{key} VALUE)")
                )
                i += 1
                continue
        else:
            errors.append(ConfigError("flags", arg, shape))
            i += 1
            continue
        key = key.strip()
        if key not in KNOWN_KEYS:
            errors.append(_unknown_key(key, value).with_sources({key: f"flag --{key}"}))
            continue
        values[key] = value
    if errors:
        raise ConfigError.combine(errors)
    return values


def load_config(
    config_file: Path | None = None,
    *,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, str] | None = None,
) -> ServerConfig:
    """Read, merge and check the configuration; raise ConfigError naming every bad key.

    `env` defaults to `os.environ`; pass `{}` to ignore the environment. Reads nothing but `config_file`.
    """
    raw: dict[str, object] = {}
    sources: dict[str, str] = {}
    if config_file is not None:
        for key, value in _read_toml(config_file).items():
            raw[key], sources[key] = value, str(config_file)
    for key, value in _from_env(os.environ if env is None else env).items():
        raw[key], sources[key] = value, f"env {env_var_name(key)}"
    unknown = []
    for key, value in (flags or {}).items():
        if key in KNOWN_KEYS:
            raw[key], sources[key] = value, f"flag --{key}"
        else:
            unknown.append(_unknown_key(key, value).with_sources({key: f"flag --{key}"}))
    if unknown:
        raise ConfigError.combine(unknown)
    try:
        return _build(raw)
    except ConfigError as error:
        raise error.with_sources(sources) from None


def _build(raw: Mapping[str, object]) -> ServerConfig:
    errors: list[ConfigError] = []

    def get(key: str, parse: Callable[[object], T], placeholder: T) -> T:
        value = raw.get(key, DEFAULTS.get(key, MISSING))
        if isinstance(value, _Missing):
            how = f"set it in the config file, as {env_var_name(key)} or with --{key}"
            errors.append(ConfigError(key, MISSING, f"is required ({_REQUIRED_SHAPES[key]}); {how}"))
            return placeholder
        try:
            return parse(value)
        except ConfigError as error:
            errors.append(error)
            return placeholder

    def to_int(key: str) -> int:
        return get(key, lambda value: _to_int(key, value), 0)

    def optional_label(key: str) -> Callable[[object], str | None]:
        # An empty string clears an optional value set by a lower-precedence source.
        return lambda value: None if value in (None, "") else _to_str(key, value, "must be a string")

    node_id = to_int("node.id")
    no_roles: frozenset[Role] = frozenset()
    roles = get("process.roles", _parse_roles, no_roles)
    # An invalid placeholder, so that rules comparing the rpc port with the voters are skipped.
    no_listeners: tuple[Listener, Listener | None] = (Listener("rpc", "", 0), None)
    rpc, http = get("listeners", _parse_listeners, no_listeners)
    no_voters: tuple[Voter, ...] = ()
    voters = get("controller.quorum.voters", _parse_voters, no_voters)
    data_dir = get(
        "data.dir", lambda value: Path(_non_empty("data.dir", value, "must be a directory path")), Path(".")
    )
    rack = get("rack", optional_label("rack"), None)
    no_tags: tuple[tuple[str, str], ...] = ()
    tags = get("tags", _parse_tags, no_tags)
    cluster_id = get("cluster.id", lambda value: _to_str("cluster.id", value, "must be a string"), "")
    secret = get(
        "cluster.secret",
        lambda value: _to_str(
            "cluster.secret", value, f"must be a string of at least {MIN_SECRET_CHARS} characters"
        ),
        "",
    )
    ints = {name: to_int(key) for key, name in INT_KEYS.items()}
    log_level = get("log.level", _parse_log_level, "INFO")
    raft = _parse_raft(raw, errors)
    # ReplicaConfig checks nothing itself: its rules are ServerConfig's, so a bad value stays as given.
    replica = ReplicaConfig(**{name: to_int(key) for key, name in REPLICA_KEYS.items()})
    fsync = get("replica.log.fsync", _parse_fsync, "never")
    liveness = _parse_liveness(raw, errors)
    assignor = _parse_assignor(raw, errors)
    # Check the values that did parse too, so one run reports every bad key. A placeholder stands in for
    # each value that did not parse; errors about placeholders are dropped below.
    failed = {error.key for error in errors}
    try:
        config = ServerConfig(
            node_id=node_id,
            process_roles=roles,
            rpc=rpc,
            http=http,
            voters=voters,
            data_dir=data_dir,
            rack=rack,
            tags=tags,
            cluster_id=cluster_id,
            cluster_secret=secret,
            raft=raft,
            heartbeat_interval_ms=ints["heartbeat_interval_ms"],
            session_timeout_ms=ints["session_timeout_ms"],
            snapshot_max_records=ints["snapshot_max_records"],
            snapshot_interval_ms=ints["snapshot_interval_ms"],
            max_frame_bytes=ints["max_frame_bytes"],
            replica=replica,
            replica_log_fsync=fsync,
            produce_max_bytes=ints["produce_max_bytes"],
            reassign_interval_ms=ints["reassign_interval_ms"],
            broker_removal_delay_ms=ints["broker_removal_delay_ms"],
            liveness=liveness,
            assignor=assignor,
            log_level=log_level,
        )
    except ConfigError as error:
        raft_failed = not failed.isdisjoint(RAFT_KEYS)
        # Copied alone: the first of `error.errors` carries all the others, the dropped ones too.
        errors += [
            ConfigError(e.key, e.value, e.allowed, source=e.source)
            for e in error.errors
            if e.key not in failed and not (raft_failed and e.key == "rpc.max.frame.bytes")
        ]
    if errors:
        raise ConfigError.combine(errors)
    return config


def _non_empty(key: str, value: object, allowed: str) -> str:
    text = _to_str(key, value, allowed)
    if not text.strip():
        raise ConfigError(key, value, allowed)
    return text


# ---------------------------------------------------------------------------------------------------------
# Writing


def _host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _toml_string(text: str) -> str:
    out = []
    for char in text:
        if char in '"\\':
            out.append("\\" + char)
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def render_toml(config: ServerConfig, *, include_defaults: bool = False) -> str:
    """A TOML file that `load_config` reads back to a config equal to `config`.

    Optional settings equal to their defaults are left out unless `include_defaults`, so a written file
    keeps following the defaults of the hotstate that reads it.
    """
    listeners = [str(config.rpc)] + ([str(config.http)] if config.http else [])
    values: dict[str, object] = {
        "node.id": config.node_id,
        "process.roles": _format_roles(config.process_roles),
        "listeners": ",".join(listeners),
        "controller.quorum.voters": ",".join(str(voter) for voter in config.voters),
        "data.dir": str(config.data_dir),
        "rack": config.rack,
        "tags": _format_tags(config.tags),
        "cluster.id": config.cluster_id,
        "cluster.secret": config.cluster_secret,
        **{key: getattr(config.raft, name) for key, name in RAFT_KEYS.items()},
        **{key: getattr(config, name) for key, name in INT_KEYS.items()},
        **{key: getattr(config.replica, name) for key, name in REPLICA_KEYS.items()},
        "replica.log.fsync": config.replica_log_fsync,
        **_liveness_values(config.liveness),
        **{
            key: ",".join(value) if isinstance(value, tuple) else value
            for key, value in _assignor_values(config.assignor).items()
        },
        "log.level": config.log_level,
    }
    lines = ["# hotstate server configuration; docs/configuration.md describes every key."]
    for key, value in values.items():
        if value is None or (key in DEFAULTS and value == DEFAULTS[key] and not include_defaults):
            continue
        shown = str(value) if isinstance(value, int) else _toml_string(str(value))
        lines.append(f"{_toml_string(key)} = {shown}")
    return "\n".join(lines) + "\n"


__all__ = [
    "ASSIGNMENT_TAGS_KEY",
    "ASSIGNOR_INT_KEYS",
    "ASSIGNOR_KEYS",
    "DEFAULTS",
    "HEARTBEAT_KEYS",
    "KNOWN_KEYS",
    "LAG_REPORTING_KEYS",
    "LIVENESS_KEYS",
    "LOG_LEVELS",
    "OPTIONAL_KEYS",
    "REPLICA_KEYS",
    "REPLICA_LOG_FSYNC_POLICIES",
    "REQUIRED_KEYS",
    "ROLES",
    "STRATEGY_KEY",
    "ConfigError",
    "Listener",
    "ServerConfig",
    "Voter",
    "env_var_name",
    "load_config",
    "parse_flag_overrides",
    "render_toml",
]

"""A server's configuration: a TOML file, then `HOTSTATE_*` environment variables, then flags (flags win).

Keys are dotted Kafka-style names (`node.id`, `controller.quorum.voters`). Each is described once, in
`server/settings.py` (SETTINGS): this module derives the key maps, defaults, parsing, rules on single values,
the building of ServerConfig and `render_toml` from that table, and docs/configuration.md's tables of keys
are generated from it. Loading does no IO beyond reading the TOML file, so `hotstate server` can refuse a
bad configuration before it binds a port or touches `data.dir`.

Checks are split in two on purpose: parsing (text or TOML value -> typed value) happens only in
`load_config`, while every rule about typed values lives in `ServerConfig.__post_init__`, so a config
built in code (as `hotstate cluster up` does before `render_toml`) obeys the same rules as a loaded one.
"""

from __future__ import annotations

import dataclasses
import difflib
import ipaddress
import logging
import os
import re
import tomllib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, get_args

from hotstate.assignor.config import STRATEGIES, AssignorConfig
from hotstate.raft.config import RaftConfig
from hotstate.replica.core import ReplicaConfig
from hotstate.routing.heartbeat import HeartbeatConfig
from hotstate.routing.hedging import HedgeConfig
from hotstate.server.liveness import LivenessConfig
from hotstate.server.settings import (
    FRAME_DATA_SHARE,
    FRAME_HEADROOM_BYTES,
    LOG_LEVELS,
    MAX_INT32,
    MAX_LABEL_CHARS,
    MIN_SECRET_CHARS,
    REPLICA_LOG_FSYNC_POLICIES,
    SETTINGS,
    Kind,
    Setting,
)
from hotstate.tls import CLIENT_AUTH_CHOICES, TlsFiles

logger = logging.getLogger(__name__)

ProcessRole = Literal["controller", "broker"]
ListenerName = Literal["rpc", "http"]

ROLES: Final[tuple[ProcessRole, ...]] = ("controller", "broker")
ENV_PREFIX: Final = "HOTSTATE_"

# ---------------------------------------------------------------------------------------------------------
# Keys, from SETTINGS

SETTING: Final[Mapping[str, Setting]] = {setting.key: setting for setting in SETTINGS}
REQUIRED_KEYS: Final = tuple(setting.key for setting in SETTINGS if setting.required)
OPTIONAL_KEYS: Final = tuple(setting.key for setting in SETTINGS if not setting.required)
KNOWN_KEYS: Final = (*REQUIRED_KEYS, *OPTIONAL_KEYS)


def _fields_of(path: str) -> dict[str, str]:
    """Kafka name -> field, for the settings held by the typed config at attribute path `path` itself."""
    return {
        setting.key: target.rpartition(".")[2]
        for setting in SETTINGS
        for target in setting.targets
        if target.rpartition(".")[0] == path
    }


RAFT_KEYS: Final = _fields_of("raft")
REPLICA_KEYS: Final = _fields_of("replica")
# Failure detection (KLIP-12): LivenessConfig.heartbeat.
HEARTBEAT_KEYS: Final = _fields_of("liveness.heartbeat")
# LivenessConfig's settings outside `heartbeat` (lag reporting, KIP-535).
LAG_REPORTING_KEYS: Final = _fields_of("liveness")
LIVENESS_KEYS: Final = (*HEARTBEAT_KEYS, *LAG_REPORTING_KEYS)
# Kafka Streams names (AssignorConfig's PROPERTY_NAMES). Not num.standby.replicas: every table sets its own.
ASSIGNOR_KEYS: Final = _fields_of("assignor")
(STRATEGY_KEY,) = (setting.key for setting in SETTINGS if setting.kind == "strategy")
(ASSIGNMENT_TAGS_KEY,) = (setting.key for setting in SETTINGS if setting.kind == "tag_keys")
ASSIGNOR_INT_KEYS: Final = tuple(key for key in ASSIGNOR_KEYS if SETTING[key].kind == "int")


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

    `tags` is stored sorted, so two configs with the same tags compare equal. The defaults of these fields,
    and of the typed configs' fields, are the settings' defaults: SETTINGS names the field of each setting.
    """

    node_id: int
    process_roles: frozenset[ProcessRole]
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
    hedging: HedgeConfig = field(default_factory=HedgeConfig)
    log_level: str = "INFO"
    rpc_tls: TlsFiles = field(default_factory=TlsFiles)
    http_tls: TlsFiles = field(default_factory=TlsFiles)
    http_auth_credentials_file: Path | None = None
    http_max_connections: int = 512
    http_header_max_bytes: int = 64 * 1024
    http_request_timeout_ms: int = 30_000
    http_idle_timeout_ms: int = 30_000

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
# Rules on typed values (ServerConfig.__post_init__): one per kind of value, then the rules that compare
# settings with each other.


def _int_allowed(setting: Setting) -> str:
    base = (
        "must be a positive integer" if setting.minimum == 1 else f"must be an integer >= {setting.minimum}"
    )
    return f"{base} ({setting.unit})" if setting.unit else base


def _int_problems(setting: Setting, value: object) -> list[ConfigError]:
    # bool is an int subclass; `true` for a timeout is a mistake, not 1.
    if isinstance(value, bool) or not isinstance(value, int) or value < setting.minimum:
        return [ConfigError(setting.key, value, _int_allowed(setting))]
    if value > MAX_INT32:
        return [ConfigError(setting.key, value, f"{_int_allowed(setting)}, at most {MAX_INT32}")]
    return []


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


_ROLES_ALLOWED: Final = "must be controller, broker or controller,broker"


def _roles_problems(setting: Setting, roles: object) -> list[ConfigError]:
    if isinstance(roles, frozenset) and roles and all(role in ROLES for role in roles):
        return []
    return [
        ConfigError(
            setting.key, _format_roles(roles) if isinstance(roles, frozenset) else roles, _ROLES_ALLOWED
        )
    ]


def _data_dir_problems(setting: Setting, data_dir: object) -> list[ConfigError]:
    if isinstance(data_dir, Path) and _is_path_text(str(data_dir)):
        return []
    allowed = "must be a directory path in UTF-8 without NUL (it need not exist yet)"
    return [ConfigError(setting.key, data_dir, allowed)]


def _file_problems(setting: Setting, path: object) -> list[ConfigError]:
    if path is None or (isinstance(path, Path) and _is_path_text(str(path))):
        return []
    return [ConfigError(setting.key, path, "must be a file path in UTF-8 without NUL (checked at start)")]


def _rack_problems(setting: Setting, rack: object) -> list[ConfigError]:
    problem = None if rack is None else _label_problem(rack)
    return [ConfigError(setting.key, rack, problem)] if problem else []


def _cluster_id_problems(setting: Setting, cluster_id: object) -> list[ConfigError]:
    if isinstance(cluster_id, str) and _CLUSTER_ID_RE.fullmatch(cluster_id):
        return []
    return [
        ConfigError(setting.key, cluster_id, "must be 1-64 letters, digits, '-' or '_' (e.g. a base64 UUID)")
    ]


def _secret_problems(setting: Setting, secret: object) -> list[ConfigError]:
    if not isinstance(secret, str) or not _is_utf8(secret):
        return [ConfigError(setting.key, secret, "must be a string in UTF-8")]
    if len(secret) < MIN_SECRET_CHARS:
        return [
            ConfigError(
                setting.key,
                secret,
                f"must be a string of at least {MIN_SECRET_CHARS} characters: servers prove to each other "
                "with it that they belong to the cluster, and a short secret can be guessed",
            )
        ]
    return []


_FSYNC_ALLOWED: Final = f"must be {' or '.join(REPLICA_LOG_FSYNC_POLICIES)}"
_STRATEGY_ALLOWED: Final = f"must be {', '.join(STRATEGIES[:-1])} or {STRATEGIES[-1]}"
_LOG_LEVEL_ALLOWED: Final = f"must be one of {', '.join(LOG_LEVELS)}"
_CLIENT_AUTH_ALLOWED: Final = f"must be {' or '.join(CLIENT_AUTH_CHOICES)}"


def _choice_problems(choices: Sequence[str], allowed: str) -> Callable[[Setting, object], list[ConfigError]]:
    def problems(setting: Setting, value: object) -> list[ConfigError]:
        return [] if value in choices else [ConfigError(setting.key, value, allowed)]

    return problems


_ASSIGNMENT_TAGS_ALLOWED: Final = (
    "must be tag keys, comma-separated (e.g. rack,zone), or empty for no spread over tags"
)


def _assignment_tags_problems(setting: Setting, tags: object) -> list[ConfigError]:
    key = setting.key
    if not isinstance(tags, tuple) or not all(isinstance(tag, str) for tag in tags):
        return [ConfigError(key, tags, "must be a tuple of tag keys")]
    errors: list[ConfigError] = []
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
    return errors


def _listeners_problems(setting: Setting, listeners: object) -> list[ConfigError]:
    """`listeners` is the pair (rpc, http) of ServerConfig's fields."""
    key = setting.key
    rpc, http = listeners if isinstance(listeners, tuple) and len(listeners) == 2 else (listeners, None)
    errors: list[ConfigError] = []
    for expected, listener in (("rpc", rpc), ("http", http)):
        if listener is None and expected == "http":
            continue
        if not isinstance(listener, Listener) or listener.name != expected:
            errors.append(
                ConfigError(key, listener, f"the {expected} listener must be a {expected} Listener")
            )
        elif problem := _host_problem(listener.host):
            errors.append(ConfigError(key, str(listener), problem))
        elif not _is_port(listener.port, 0):
            errors.append(ConfigError(key, str(listener), f"must give {_PORT_ALLOWED}"))
    if errors or not isinstance(rpc, Listener) or not isinstance(http, Listener):
        return errors
    if http.port == rpc.port != 0 and (
        http.host == rpc.host or _is_unspecified(http.host) or _is_unspecified(rpc.host)
    ):
        return [
            ConfigError(
                key,
                f"{rpc},{http}",
                "must give rpc and http different ports (or port 0): both cannot bind one address",
            )
        ]
    return []


def _voters_problems(setting: Setting, voters: object) -> list[ConfigError]:
    key = setting.key
    allowed = "must be a comma-separated list of ID@HOST:PORT, e.g. 1@10.0.0.1:9092,2@10.0.0.2:9092"
    if not isinstance(voters, tuple) or not voters:
        shown = "" if voters == () else voters  # as it was written when loaded
        return [ConfigError(key, shown, allowed)]
    errors: list[ConfigError] = []
    seen_ids: set[int] = set()
    seen_addresses: set[tuple[str, int]] = set()
    for voter in voters:
        if not isinstance(voter, Voter):
            errors.append(ConfigError(key, voter, allowed))
        elif (
            isinstance(voter.node_id, bool)
            or not isinstance(voter.node_id, int)
            or not 1 <= voter.node_id <= MAX_INT32
        ):
            errors.append(ConfigError(key, str(voter), "must give each voter a positive integer id"))
        elif problem := _host_problem(voter.host):
            errors.append(ConfigError(key, str(voter), problem))
        elif _is_unspecified(voter.host):
            errors.append(
                ConfigError(
                    key,
                    str(voter),
                    "must give an address other servers can connect to, not a wildcard like 0.0.0.0 or [::]",
                )
            )
        elif not _is_port(voter.port, 1):
            errors.append(ConfigError(key, str(voter), "must give a port from 1 to 65535"))
        elif voter.node_id in seen_ids:
            errors.append(ConfigError(key, str(voter), f"must list node {voter.node_id} only once"))
        elif (voter.host.lower(), voter.port) in seen_addresses:
            errors.append(
                ConfigError(
                    key,
                    str(voter),
                    f"must give each voter its own address; "
                    f"{_host_port(voter.host, voter.port)} is listed twice",
                )
            )
        else:
            seen_ids.add(voter.node_id)
            seen_addresses.add((voter.host.lower(), voter.port))
    return errors


def _tags_problems(setting: Setting, tags: object) -> list[ConfigError]:
    name = setting.key
    if not isinstance(tags, tuple) or not all(_is_tag_pair(tag) for tag in tags):
        return [ConfigError(name, tags, "must be a tuple of (key, value) string pairs")]
    errors: list[ConfigError] = []
    seen: set[str] = set()
    for key, value in tags:
        if not _TAG_KEY_RE.fullmatch(key):
            errors.append(ConfigError(name, f"{key}={value}", f"{_TAG_KEY_ALLOWED}"))
        elif key == "rack":
            errors.append(
                ConfigError(
                    name, f"{key}={value}", "must not contain rack: set the server's rack with the rack key"
                )
            )
        elif key in seen:
            errors.append(
                ConfigError(name, _format_tags(tags), f"must give each key once; {key!r} is repeated")
            )
        elif problem := _label_problem(value):
            errors.append(ConfigError(name, f"{key}={value}", f"the value {problem}"))
        seen.add(key)
    return errors


# The rules that compare settings. Each gets the values that passed the rules of their kind (Kafka name
# -> typed value) and runs only when all of its `keys` are among them, so a bad value is reported once,
# not again by every rule that compares it with others.


def _membership_problem(values: Mapping[str, Any]) -> ConfigError | None:
    node_id: int = values["node.id"]
    controller = "controller" in values["process.roles"]
    rpc: Listener = values["listeners"][0]
    voters: tuple[Voter, ...] = values["controller.quorum.voters"]
    me = next((voter for voter in voters if voter.node_id == node_id), None)
    listed = ",".join(str(voter) for voter in voters)
    if controller and me is None:
        return ConfigError(
            "controller.quorum.voters",
            listed,
            f"must include this node (node.id={node_id}) because process.roles includes controller: "
            f"add {node_id}@HOST:PORT, or make the node broker-only",
        )
    if controller and me is not None and me.port != rpc.port:
        return ConfigError(
            "controller.quorum.voters",
            str(me),
            f"must give this controller the port of its rpc listener ({rpc}); "
            "the other voters connect to it there"
            + (" (a controller cannot use port 0)" if rpc.port == 0 else ""),
        )
    if not controller and me is not None:
        return ConfigError(
            "controller.quorum.voters",
            listed,
            f"must not include this node (node.id={node_id}): it is broker-only, so it would count "
            "toward the quorum without ever voting; add controller to process.roles "
            "or drop it from the voters",
        )
    return None


def _broker_heartbeat_problem(values: Mapping[str, Any]) -> ConfigError | None:
    heartbeat, session = values["broker.heartbeat.interval.ms"], values["broker.session.timeout.ms"]
    if heartbeat < session:
        return None
    return ConfigError(
        "broker.heartbeat.interval.ms",
        heartbeat,
        f"must be below broker.session.timeout.ms={session}, "
        "or a healthy server is fenced between two heartbeats",
    )


def _replica_fetch_wait_problem(values: Mapping[str, Any]) -> ConfigError | None:
    wait, timeout = values["replica.fetch.max.wait.ms"], values["replica.fetch.timeout.ms"]
    if wait < timeout:
        return None
    return ConfigError(
        "replica.fetch.max.wait.ms",
        wait,
        f"must be below replica.fetch.timeout.ms={timeout}, or an idle follower's fetch times out "
        "before the active answers it",
    )


def _heartbeat_window_problem(values: Mapping[str, Any]) -> ConfigError | None:
    """HeartbeatConfig's rule: the window holds window // send whole slots, at least the larger threshold."""
    send, window = values["heartbeat.send.interval.ms"], values["heartbeat.window.ms"]
    missed, received = values["heartbeat.missed.threshold"], values["heartbeat.received.threshold"]
    slots = max(missed, received)
    if window // send >= slots:
        return None
    why = (
        f"heartbeat.missed.threshold={missed}, or a dead peer is never marked down"
        if missed >= received
        else f"heartbeat.received.threshold={received}, or a peer marked down never comes back up"
    )
    return ConfigError(
        "heartbeat.window.ms",
        window,
        f"must be at least {send * slots}: {slots} slots of heartbeat.send.interval.ms={send}, "
        f"the larger of the thresholds, {why}",
    )


_QUORUM_SIZE_KEYS: Final = ("controller.quorum.fetch.max.bytes", "controller.quorum.snapshot.chunk.bytes")
_DATA_SIZE_KEYS: Final = ("replica.fetch.max.bytes", "produce.max.bytes")


def _frame_problem(values: Mapping[str, Any]) -> ConfigError | None:
    """rpc.max.frame.bytes must hold the largest quorum message and the largest partition message; each
    part is checked when its sizes are valid."""
    needs: list[tuple[int, str]] = []
    if all(key in values for key in _QUORUM_SIZE_KEYS):
        largest = max(values[key] for key in _QUORUM_SIZE_KEYS)
        needs.append(
            (
                largest + FRAME_HEADROOM_BYTES,
                "the largest of controller.quorum.fetch.max.bytes and controller.quorum.snapshot.chunk.bytes "
                f"({largest}) plus {FRAME_HEADROOM_BYTES} bytes for headers, or quorum messages do not fit",
            )
        )
    if all(key in values for key in _DATA_SIZE_KEYS):
        # A fetch answer carries at least one whole batch, and a batch can be as large as a Produce.
        largest = max(values[key] for key in _DATA_SIZE_KEYS)
        needs.append(
            (
                largest * FRAME_DATA_SHARE,
                f"{FRAME_DATA_SHARE} times the largest of replica.fetch.max.bytes and produce.max.bytes "
                f"({largest}), to leave room for the framing of every row and batch, or Produce requests "
                "and replica fetch answers do not fit",
            )
        )
    frame = values["rpc.max.frame.bytes"]
    unmet = [(need, why) for need, why in needs if frame < need]
    if not unmet:
        return None
    return ConfigError(
        "rpc.max.frame.bytes",
        frame,
        f"must be at least {max(need for need, _ in unmet)}: " + "; and ".join(why for _, why in unmet),
    )


def _tls_problem(listener: str) -> Callable[[Mapping[str, Any]], ConfigError | None]:
    """`{listener}.tls.*`: a certificate comes with its key, and the rest needs a certificate."""
    cert, key, ca = (f"{listener}.tls.{name}.file" for name in ("cert", "key", "ca"))

    def problem(values: Mapping[str, Any]) -> ConfigError | None:
        if values[cert] is not None and values[key] is None:
            return ConfigError(key, MISSING, f"must be set with {cert} (the certificate's private key)")
        if values[cert] is None:
            for other in (key, ca):
                if values[other] is not None:
                    return ConfigError(
                        other,
                        str(values[other]),
                        f"needs {cert}: TLS is on only with a certificate (and its key)",
                    )
        return None

    return problem


def _client_auth_problem(values: Mapping[str, Any]) -> ConfigError | None:
    if values["rpc.tls.client.auth"] != "required":
        return None
    for needed in ("rpc.tls.cert.file", "rpc.tls.ca.file"):
        if values[needed] is None:
            return ConfigError(
                "rpc.tls.client.auth",
                "required",
                f"needs {needed}: client certificates are checked against the CA, over TLS",
            )
    return None


_RULES: Final[Sequence[tuple[tuple[str, ...], Callable[[Mapping[str, Any]], ConfigError | None]]]] = (
    (("node.id", "process.roles", "listeners", "controller.quorum.voters"), _membership_problem),
    (("broker.heartbeat.interval.ms", "broker.session.timeout.ms"), _broker_heartbeat_problem),
    (("replica.fetch.max.wait.ms", "replica.fetch.timeout.ms"), _replica_fetch_wait_problem),
    (
        (
            "heartbeat.send.interval.ms",
            "heartbeat.window.ms",
            "heartbeat.missed.threshold",
            "heartbeat.received.threshold",
        ),
        _heartbeat_window_problem,
    ),
    (("rpc.max.frame.bytes",), _frame_problem),
    (("rpc.tls.cert.file", "rpc.tls.key.file", "rpc.tls.ca.file"), _tls_problem("rpc")),
    (("http.tls.cert.file", "http.tls.key.file", "http.tls.ca.file"), _tls_problem("http")),
    (("rpc.tls.client.auth", "rpc.tls.cert.file", "rpc.tls.ca.file"), _client_auth_problem),
)


def _rule_problems(valid: Mapping[str, object]) -> list[ConfigError]:
    problems = (rule(valid) for keys, rule in _RULES if all(key in valid for key in keys))
    return [problem for problem in problems if problem is not None]


def _check_values(values: Mapping[str, object], errors: list[ConfigError]) -> dict[str, object]:
    """The rules of each value's kind; returns the values that pass them."""
    valid: dict[str, object] = {}
    for key, value in values.items():
        setting = SETTING[key]
        problems = _KINDS[setting.kind].problems(setting, value)
        errors += problems
        if not problems:
            valid[key] = value
    return valid


def _standby_count_problem(assignor: AssignorConfig) -> ConfigError | None:
    standbys, default = assignor.num_standby_replicas, _default_at("assignor.num_standby_replicas")
    if standbys == default:
        return None
    # Not a server setting, so render_toml could not write it: keep every valid config round-tripping.
    return ConfigError(
        "assignor",
        f"num_standby_replicas={standbys}",
        f"must leave num_standby_replicas at {default}: "
        "it is not a server setting, every table sets its own standby count",
    )


def _problems(c: ServerConfig) -> list[ConfigError]:
    errors: list[ConfigError] = []
    broken = _broken_groups(c, errors)
    values = {
        setting.key: _value_of(c, setting)
        for setting in SETTINGS
        if not any(target.startswith(f"{path}.") for target in setting.targets for path in broken)
    }
    errors += _rule_problems(_check_values(values, errors))
    if "assignor" not in broken and (problem := _standby_count_problem(c.assignor)):
        errors.append(problem)
    return errors


# ---------------------------------------------------------------------------------------------------------
# Parsing raw values (TOML values, or strings from the environment and flags)


def _parse_int(setting: Setting, raw: object) -> int:
    """The bounds are left to the rules, which a config built in code goes through too."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        return raw
    if isinstance(raw, str) and re.fullmatch(r"[+-]?[0-9][0-9_]*", raw.strip()) and "__" not in raw:
        return int(raw.strip())
    raise ConfigError(setting.key, raw, _int_allowed(setting))


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


def _parse_roles(setting: Setting, raw: object) -> frozenset[ProcessRole]:
    allowed = _ROLES_ALLOWED
    roles: set[ProcessRole] = set()
    for item in _split_list(setting.key, raw, allowed):
        name = item.lower()
        if name not in ROLES:
            raise ConfigError(setting.key, raw, f"{allowed}; {item!r} is not a role")
        role: ProcessRole = "controller" if name == "controller" else "broker"
        if role in roles:
            raise ConfigError(setting.key, raw, f"{allowed}; {item!r} is given twice")
        roles.add(role)
    if not roles:
        raise ConfigError(setting.key, raw, allowed)
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


def _parse_listeners(setting: Setting, raw: object) -> tuple[Listener, Listener | None]:
    found: dict[str, Listener] = {}
    for item in _split_list(setting.key, raw, _LISTENERS_ALLOWED):
        scheme, sep, rest = item.partition("://")
        name = scheme.lower()
        if not sep or name not in ("rpc", "http"):
            raise ConfigError(setting.key, item, f"{_LISTENERS_ALLOWED}; the name must be rpc or http")
        if name in found:
            raise ConfigError(setting.key, raw, f"{_LISTENERS_ALLOWED}; {name} is given twice")
        host, port = _parse_host_port(setting.key, rest, _LISTENERS_ALLOWED)
        found[name] = Listener("rpc" if name == "rpc" else "http", host, port)
    if "rpc" not in found:
        raise ConfigError(setting.key, raw, f"{_LISTENERS_ALLOWED}; the rpc listener is missing")
    return found["rpc"], found.get("http")


_VOTERS_ALLOWED: Final = (
    "must be a comma-separated list of ID@HOST:PORT, e.g. 1@10.0.0.1:9092,2@10.0.0.2:9092, "
    f"with positive integer ids and HOST {_HOST_ALLOWED}"
)


def _parse_voters(setting: Setting, raw: object) -> tuple[Voter, ...]:
    voters = []
    for item in _split_list(setting.key, raw, _VOTERS_ALLOWED):
        id_text, sep, address = item.partition("@")
        if not sep or not re.fullmatch(r"[0-9]+", id_text.strip()):
            raise ConfigError(setting.key, item, _VOTERS_ALLOWED)
        host, port = _parse_host_port(setting.key, address.strip(), _VOTERS_ALLOWED)
        voters.append(Voter(int(id_text), host, port))
    return tuple(voters)


_TAGS_ALLOWED: Final = (
    "must be key=value pairs, comma-separated (e.g. zone=eu1,cluster=k8s-1), or a TOML table"
)


def _parse_tags(setting: Setting, raw: object) -> tuple[tuple[str, str], ...]:
    pairs: list[tuple[str, str]] = []
    if isinstance(raw, dict):
        for key, value in raw.items():
            if not isinstance(value, str):
                raise ConfigError(setting.key, {key: value}, f"{_TAGS_ALLOWED}; tag values are strings")
            pairs.append((key, value))
    else:
        for item in _split_list(setting.key, raw, _TAGS_ALLOWED):
            key, sep, value = item.partition("=")
            if not sep:
                raise ConfigError(setting.key, item, _TAGS_ALLOWED)
            pairs.append((key.strip(), value.strip()))
    # Duplicates must survive until the rules see them, so no dict here.
    return tuple(pairs)


def _parse_log_level(setting: Setting, raw: object) -> str:
    allowed = _LOG_LEVEL_ALLOWED
    level = _to_str(setting.key, raw, allowed).strip().upper()
    # Kafka's log4j and many operators say WARN.
    level = "WARNING" if level == "WARN" else level
    if level not in LOG_LEVELS:
        raise ConfigError(setting.key, raw, allowed)
    return level


def _parse_fsync(setting: Setting, raw: object) -> str:
    policy = _to_str(setting.key, raw, _FSYNC_ALLOWED).strip().lower()
    if policy not in REPLICA_LOG_FSYNC_POLICIES:
        raise ConfigError(setting.key, raw, _FSYNC_ALLOWED)
    return policy


def _parse_strategy(setting: Setting, raw: object) -> str:
    strategy = _to_str(setting.key, raw, _STRATEGY_ALLOWED).strip().lower()
    if strategy not in STRATEGIES:
        near = _nearest(strategy, STRATEGIES)
        hint = f"; did you mean {near!r}?" if near else ""
        raise ConfigError(setting.key, raw, _STRATEGY_ALLOWED + hint)
    return strategy


def _parse_assignment_tags(setting: Setting, raw: object) -> tuple[str, ...]:
    """One comma-separated string or, in TOML, an array of strings; empty (`""`, `[]`) for no tags.

    Unlike the other lists, an empty item is an error rather than skipped: an empty value means something
    here (no spread over tags), so `rack,,zone` is more likely a mistake than a shortcut."""
    key = setting.key
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


def _parse_data_dir(setting: Setting, raw: object) -> Path:
    allowed = "must be a directory path"
    text = _to_str(setting.key, raw, allowed)
    if not text.strip():
        raise ConfigError(setting.key, raw, allowed)
    return Path(text)


def _parse_file(setting: Setting, raw: object) -> Path | None:
    # An empty string clears a path set by a lower-precedence source.
    text = _to_str(setting.key, raw, "must be a file path")
    return Path(text) if text.strip() else None


def _parse_client_auth(setting: Setting, raw: object) -> str:
    choice = _to_str(setting.key, raw, _CLIENT_AUTH_ALLOWED).strip().lower()
    if choice not in CLIENT_AUTH_CHOICES:
        raise ConfigError(setting.key, raw, _CLIENT_AUTH_ALLOWED)
    return choice


def _write_file(path: Path | None) -> str | None:
    return None if path is None else str(path)


def _parse_string(setting: Setting, raw: object) -> str:
    return _to_str(setting.key, raw, "must be a string")


def _parse_secret(setting: Setting, raw: object) -> str:
    return _to_str(setting.key, raw, f"must be a string of at least {MIN_SECRET_CHARS} characters")


def _parse_label(setting: Setting, raw: object) -> str | None:
    # An empty string clears an optional value set by a lower-precedence source.
    return None if raw in (None, "") else _to_str(setting.key, raw, "must be a string")


def _write_listeners(listeners: tuple[Listener, Listener | None]) -> str:
    return ",".join(str(listener) for listener in listeners if listener is not None)


def _write_voters(voters: tuple[Voter, ...]) -> str:
    return ",".join(str(voter) for voter in voters)


# ---------------------------------------------------------------------------------------------------------
# Kinds of values and the typed configs that hold them


@dataclass(frozen=True, slots=True)
class _Kind:
    parse: Callable[[Setting, object], object]  # a TOML value or text -> the typed value; raises ConfigError
    problems: Callable[[Setting, object], list[ConfigError]]  # the rules on one typed value
    write: Callable[[Any], object]  # the typed value -> what render_toml writes (None: nothing)
    # Stands in for a value that did not parse; invalid where a rule would compare it with other values.
    placeholder: object


def _same(value: object) -> object:
    return value


_KINDS: Final[Mapping[Kind, _Kind]] = {
    "int": _Kind(_parse_int, _int_problems, _same, 0),
    "roles": _Kind(_parse_roles, _roles_problems, _format_roles, frozenset()),
    # The placeholder's empty host is invalid, so the rules comparing the rpc port with the voters skip it.
    "listeners": _Kind(
        _parse_listeners, _listeners_problems, _write_listeners, (Listener("rpc", "", 0), None)
    ),
    "voters": _Kind(_parse_voters, _voters_problems, _write_voters, ()),
    "path": _Kind(_parse_data_dir, _data_dir_problems, str, Path(".")),
    "label": _Kind(_parse_label, _rack_problems, _same, None),
    "tags": _Kind(_parse_tags, _tags_problems, _format_tags, ()),
    "cluster_id": _Kind(_parse_string, _cluster_id_problems, _same, ""),
    "secret": _Kind(_parse_secret, _secret_problems, _same, ""),
    "fsync": _Kind(_parse_fsync, _choice_problems(REPLICA_LOG_FSYNC_POLICIES, _FSYNC_ALLOWED), _same, ""),
    "strategy": _Kind(_parse_strategy, _choice_problems(STRATEGIES, _STRATEGY_ALLOWED), _same, ""),
    "tag_keys": _Kind(_parse_assignment_tags, _assignment_tags_problems, ",".join, ()),
    "log_level": _Kind(_parse_log_level, _choice_problems(LOG_LEVELS, _LOG_LEVEL_ALLOWED), _same, ""),
    "file": _Kind(_parse_file, _file_problems, _write_file, None),
    "client_auth": _Kind(
        _parse_client_auth, _choice_problems(CLIENT_AUTH_CHOICES, _CLIENT_AUTH_ALLOWED), _same, ""
    ),
}
assert set(_KINDS) == set(get_args(Kind)), "a kind of value has no parser"


def _raft_error(error: ValueError, values: Mapping[str, object]) -> ConfigError:
    # RaftConfig words its errors as "controller.quorum.KEY=VALUE: RULE"; keep its rule text.
    match = re.fullmatch(r"(controller\.quorum\.[a-z.]+)=(.*?): (.*)", str(error), re.DOTALL)
    if match is None or match[1] not in values:
        return ConfigError("controller.quorum", dict(values), str(error))
    return ConfigError(match[1], values[match[1]], match[3])


def _assignor_error(error: ValueError, values: Mapping[str, object]) -> ConfigError:
    # AssignorConfig words its errors as "FIELD (KEY) = VALUE is invalid: allowed is RULE".
    match = re.fullmatch(r"\w+ \(([a-z._]+)\) = .*? is invalid: allowed is (.*)", str(error), re.DOTALL)
    if match is None or match[1] not in values:
        return ConfigError("assignor", dict(values), str(error))
    return ConfigError(match[1], values[match[1]], f"must be {match[2]}")


def _hedge_error(error: ValueError, values: Mapping[str, object]) -> ConfigError:
    # HedgeConfig words its errors as "query.hedge.KEY=VALUE: RULE", as RaftConfig does.
    match = re.fullmatch(r"(query\.hedge\.[a-z.]+)=(.*?): (.*)", str(error), re.DOTALL)
    if match is None or match[1] not in values:
        return ConfigError("query.hedge", dict(values), str(error))
    return ConfigError(match[1], values[match[1]], match[3])


def _heartbeat_error(error: ValueError, values: Mapping[str, object]) -> ConfigError:
    return ConfigError("heartbeat", dict(values), str(error))


@dataclass(frozen=True, slots=True)
class _Group:
    """A typed config inside ServerConfig that holds settings."""

    path: str  # its attribute path in ServerConfig
    name: str  # the key of an error about it as a whole
    type: type[Any]
    # For a config that checks itself, raising a bare ValueError: turns the error into a ConfigError, given
    # the values it was built from. load_config runs the rules of its settings before building one, so a bad
    # value is reported naming its key.
    explain: Callable[[ValueError, Mapping[str, object]], ConfigError] | None = None


# A group comes after the group that holds it.
_GROUPS: Final = (
    _Group("raft", "controller.quorum", RaftConfig, _raft_error),
    _Group("replica", "replica", ReplicaConfig),
    _Group("liveness", "liveness", LivenessConfig),
    _Group("liveness.heartbeat", "heartbeat", HeartbeatConfig, _heartbeat_error),
    _Group("assignor", "assignor", AssignorConfig, _assignor_error),
    _Group("hedging", "query.hedge", HedgeConfig, _hedge_error),
    _Group("rpc_tls", "rpc.tls", TlsFiles),
    _Group("http_tls", "http.tls", TlsFiles),
)


def _at(config: object, path: str) -> object:
    for name in path.split("."):
        config = getattr(config, name)
    return config


def _value_of(config: ServerConfig, setting: Setting) -> object:
    parts = tuple(_at(config, target) for target in setting.targets)
    return parts[0] if len(parts) == 1 else parts


def _broken_groups(c: ServerConfig, errors: list[ConfigError]) -> set[str]:
    """The paths of the groups that are not of their type (each reported), and of the groups inside them."""
    broken: set[str] = set()
    for group in _GROUPS:
        if any(group.path.startswith(f"{path}.") for path in broken):
            broken.add(group.path)
            continue
        value = _at(c, group.path)
        if not isinstance(value, group.type):
            article = "an" if group.type.__name__[0] in "AEIOU" else "a"
            errors.append(ConfigError(group.name, value, f"must be {article} {group.type.__name__}"))
            broken.add(group.path)
    return broken


def _default_at(path: str) -> object:
    """The default of the field at attribute path `path` of ServerConfig: each setting's default."""
    first, *rest = path.split(".")
    (top,) = (f for f in dataclasses.fields(ServerConfig) if f.name == first)
    if top.default is not dataclasses.MISSING:
        value: object = top.default
    elif top.default_factory is not dataclasses.MISSING:
        value = top.default_factory()
    else:
        raise LookupError(f"ServerConfig.{first} has no default")
    return _at(value, ".".join(rest)) if rest else value


_DEFAULT_VALUES: Final[Mapping[str, object]] = {
    setting.key: _default_at(setting.target)
    for setting in SETTINGS
    if not setting.required and isinstance(setting.target, str)
}
# Kafka name -> default, as render_toml writes it (None for `rack`: no rack).
DEFAULTS: Final[Mapping[str, object]] = {
    key: _KINDS[SETTING[key].kind].write(value) for key, value in _DEFAULT_VALUES.items()
}
assert set(DEFAULTS) == set(OPTIONAL_KEYS), "an optional setting must live in one field"


# ---------------------------------------------------------------------------------------------------------
# Sources


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


def _parse_setting(setting: Setting, raw: Mapping[str, object], errors: list[ConfigError]) -> object:
    kind = _KINDS[setting.kind]
    if setting.key not in raw:
        if not setting.required:
            return _DEFAULT_VALUES[setting.key]
        how = f"set it in the config file, as {env_var_name(setting.key)} or with --{setting.key}"
        errors.append(ConfigError(setting.key, MISSING, f"is required ({setting.required}); {how}"))
        return kind.placeholder
    try:
        return kind.parse(setting, raw[setting.key])
    except ConfigError as error:
        errors.append(error)
        return kind.placeholder


def _build_group(
    group: _Group, fields: Mapping[str, object], values: Mapping[str, object], errors: list[ConfigError]
) -> object:
    if group.explain is None:
        # It checks nothing itself: its values stay as given, and ServerConfig's rules report the bad ones.
        return group.type(**fields)
    keys = [
        setting.key
        for setting in SETTINGS
        if any(target.startswith(f"{group.path}.") for target in setting.targets)
    ]
    failed = {error.key for error in errors}
    count = len(errors)
    valid = _check_values({key: values[key] for key in keys if key not in failed}, errors)
    errors += _rule_problems(valid)
    if len(valid) < len(keys) or len(errors) > count:
        # Its defaults stand in (ServerConfig finds nothing wrong with them); the bad keys are in `errors`.
        return _default_at(group.path)
    try:
        return group.type(**fields)
    except ValueError as error:  # a rule of the group's own that the rules here do not have
        errors.append(group.explain(error, {key: values[key] for key in keys}))
        return _default_at(group.path)


def _build(raw: Mapping[str, object]) -> ServerConfig:
    errors: list[ConfigError] = []
    values = {setting.key: _parse_setting(setting, raw, errors) for setting in SETTINGS}
    # ServerConfig's keyword arguments, with each value at its target inside the typed configs built for it.
    fields: dict[str, dict[str, Any]] = {"": {}, **{group.path: {} for group in _GROUPS}}
    for setting in SETTINGS:
        value = values[setting.key]
        parts = value if isinstance(value, tuple) and len(setting.targets) > 1 else (value,)
        for target, part in zip(setting.targets, parts, strict=True):
            path, _, name = target.rpartition(".")
            fields[path][name] = part
    for group in reversed(_GROUPS):  # a group held by another is built first
        path, _, name = group.path.rpartition(".")
        fields[path][name] = _build_group(group, fields[group.path], values, errors)
    # Check the values that did parse too, so one run reports every bad key. A placeholder stands in for
    # each value that did not parse, and the defaults for a typed config with a bad value; errors about
    # them are dropped below.
    failed = {error.key for error in errors}
    raft_failed = not failed.isdisjoint(RAFT_KEYS)
    try:
        config = ServerConfig(**fields[""])
    except ConfigError as error:
        # Copied alone: the first of `error.errors` carries all the others, the dropped ones too. The frame
        # rule compared with the quorum's sizes, which RaftConfig's defaults may stand in for.
        errors += [
            ConfigError(e.key, e.value, e.allowed, source=e.source)
            for e in error.errors
            if e.key not in failed and not (raft_failed and e.key == "rpc.max.frame.bytes")
        ]
    if errors:
        raise ConfigError.combine(errors)
    return config


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
    lines = ["# hotstate server configuration; docs/configuration.md describes every key."]
    for setting in SETTINGS:
        value = _KINDS[setting.kind].write(_value_of(config, setting))
        if value is None or (
            setting.key in DEFAULTS and value == DEFAULTS[setting.key] and not include_defaults
        ):
            continue
        shown = str(value) if isinstance(value, int) else _toml_string(str(value))
        lines.append(f"{_toml_string(setting.key)} = {shown}")
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
    "MAX_INT32",
    "OPTIONAL_KEYS",
    "RAFT_KEYS",
    "REPLICA_KEYS",
    "REPLICA_LOG_FSYNC_POLICIES",
    "REQUIRED_KEYS",
    "ROLES",
    "SETTING",
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

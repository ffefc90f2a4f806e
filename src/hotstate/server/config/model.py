"""ServerConfig, the typed configuration, and the check of a whole one that its constructor runs.

The typed configs inside it that hold settings (RaftConfig, LivenessConfig, ...) are its groups; the
default of each optional setting is the default of the field SETTINGS names for it (DEFAULTS).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from hotstate.assignor.config import AssignorConfig
from hotstate.protocol.http_api import DEFAULT_QUERY_TIMEOUT_MS
from hotstate.raft.config import RaftConfig
from hotstate.replica.core import ReplicaConfig
from hotstate.routing.heartbeat import HeartbeatConfig, LivenessConfig
from hotstate.routing.hedging import HedgeConfig
from hotstate.server.config.addresses import Listener, Voter
from hotstate.server.config.errors import ConfigError
from hotstate.server.config.keys import OPTIONAL_KEYS, SETTING
from hotstate.server.config.kinds import KINDS, ProcessRole, check_values, is_tag_pair
from hotstate.server.config.rules import rule_problems
from hotstate.server.settings import SETTINGS, Setting
from hotstate.tls import TlsFiles


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
    # Catch-up traffic (warmups, new and restoring copies) a broker's replicas may fetch per second; 0: no
    # limit. In-sync replicas are never held back (server/replicas.py, replica/throttle.py).
    move_throttle_bytes_per_sec: int = 0
    reassign_interval_ms: int = 2000
    default_standby_replicas: int = 1
    query_timeout_ms: int = DEFAULT_QUERY_TIMEOUT_MS
    broker_removal_delay_ms: int = 30_000
    liveness: LivenessConfig = field(default_factory=LivenessConfig)
    assignor: AssignorConfig = field(default_factory=AssignorConfig)
    hedging: HedgeConfig = field(default_factory=HedgeConfig)
    scan_max_rows: int = 10_000_000
    scan_max_concurrent: int = 4
    scan_step_rows: int = 1000
    scan_step_ms: int = 1
    scan_cache_bytes: int = 256 * 1024 * 1024
    log_level: str = "INFO"
    rpc_tls: TlsFiles = field(default_factory=TlsFiles)
    http_tls: TlsFiles = field(default_factory=TlsFiles)
    http_auth_credentials_file: Path | None = None
    http_max_connections: int = 512
    push_max_subscriptions: int = 10_000
    push_buffer_max_changes: int = 1000
    push_send_timeout_ms: int = 60_000
    http_header_max_bytes: int = 64 * 1024
    http_request_timeout_ms: int = 30_000
    http_idle_timeout_ms: int = 30_000

    def __post_init__(self) -> None:
        roles: object = self.process_roles  # typed loosely: callers outside mypy may pass a list
        if isinstance(roles, Iterable) and not isinstance(roles, str):
            object.__setattr__(self, "process_roles", frozenset(roles))
        if isinstance(self.tags, Iterable) and all(is_tag_pair(tag) for tag in self.tags):
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
# The typed configs inside ServerConfig that hold settings


def _named_key_error(group: str) -> Callable[[ValueError, Mapping[str, object]], ConfigError]:
    """The `explain` of a config that words its errors as "GROUP.KEY=VALUE: RULE" (RaftConfig, HedgeConfig):
    the error names the key and keeps the rule's text."""
    pattern = re.compile(rf"({re.escape(group)}\.[a-z.]+)=(.*?): (.*)", re.DOTALL)

    def explain(error: ValueError, values: Mapping[str, object]) -> ConfigError:
        match = pattern.fullmatch(str(error))
        if match is None or match[1] not in values:
            return ConfigError(group, dict(values), str(error))
        return ConfigError(match[1], values[match[1]], match[3])

    return explain


def _assignor_error(error: ValueError, values: Mapping[str, object]) -> ConfigError:
    # AssignorConfig words its errors as "FIELD (KEY) = VALUE is invalid: allowed is RULE".
    match = re.fullmatch(r"\w+ \(([a-z._]+)\) = .*? is invalid: allowed is (.*)", str(error), re.DOTALL)
    if match is None or match[1] not in values:
        return ConfigError("assignor", dict(values), str(error))
    return ConfigError(match[1], values[match[1]], f"must be {match[2]}")


def _heartbeat_error(error: ValueError, values: Mapping[str, object]) -> ConfigError:
    return ConfigError("heartbeat", dict(values), str(error))


@dataclass(frozen=True, slots=True)
class Group:
    """A typed config inside ServerConfig that holds settings."""

    path: str  # its attribute path in ServerConfig
    name: str  # the key of an error about it as a whole
    type: type[Any]
    # For a config that checks itself, raising a bare ValueError: turns the error into a ConfigError, given
    # the values it was built from. load_config runs the rules of its settings before building one, so a bad
    # value is reported naming its key.
    explain: Callable[[ValueError, Mapping[str, object]], ConfigError] | None = None


# A group comes after the group that holds it.
GROUPS: Final = (
    Group("raft", "controller.quorum", RaftConfig, _named_key_error("controller.quorum")),
    Group("replica", "replica", ReplicaConfig),
    Group("liveness", "liveness", LivenessConfig),
    Group("liveness.heartbeat", "heartbeat", HeartbeatConfig, _heartbeat_error),
    Group("assignor", "assignor", AssignorConfig, _assignor_error),
    Group("hedging", "query.hedge", HedgeConfig, _named_key_error("query.hedge")),
    Group("rpc_tls", "rpc.tls", TlsFiles),
    Group("http_tls", "http.tls", TlsFiles),
)


def _at(config: object, path: str) -> object:
    for name in path.split("."):
        config = getattr(config, name)
    return config


def value_of(config: ServerConfig, setting: Setting) -> object:
    parts = tuple(_at(config, target) for target in setting.targets)
    return parts[0] if len(parts) == 1 else parts


def _broken_groups(c: ServerConfig, errors: list[ConfigError]) -> set[str]:
    """The paths of the groups that are not of their type (each reported), and of the groups inside them."""
    broken: set[str] = set()
    for group in GROUPS:
        if any(group.path.startswith(f"{path}.") for path in broken):
            broken.add(group.path)
            continue
        value = _at(c, group.path)
        if not isinstance(value, group.type):
            article = "an" if group.type.__name__[0] in "AEIOU" else "a"
            errors.append(ConfigError(group.name, value, f"must be {article} {group.type.__name__}"))
            broken.add(group.path)
    return broken


def default_at(path: str) -> object:
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


DEFAULT_VALUES: Final[Mapping[str, object]] = {
    setting.key: default_at(setting.target)
    for setting in SETTINGS
    if not setting.required and isinstance(setting.target, str)
}
# Kafka name -> default, as render_toml writes it (None for `rack`: no rack).
DEFAULTS: Final[Mapping[str, object]] = {
    key: KINDS[SETTING[key].kind].write(value) for key, value in DEFAULT_VALUES.items()
}
assert set(DEFAULTS) == set(OPTIONAL_KEYS), "an optional setting must live in one field"


# ---------------------------------------------------------------------------------------------------------
# The check of a whole ServerConfig


def _standby_count_problem(assignor: AssignorConfig) -> ConfigError | None:
    standbys, default = assignor.num_standby_replicas, default_at("assignor.num_standby_replicas")
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
        setting.key: value_of(c, setting)
        for setting in SETTINGS
        if not any(target.startswith(f"{path}.") for target in setting.targets for path in broken)
    }
    errors += rule_problems(check_values(values, errors))
    if "assignor" not in broken and (problem := _standby_count_problem(c.assignor)):
        errors.append(problem)
    return errors

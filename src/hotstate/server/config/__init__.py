"""A server's configuration: a TOML file, then `HOTSTATE_*` environment variables, then flags (flags win).

Keys are dotted Kafka-style names (`node.id`, `controller.quorum.voters`). Each is described once, in
`server/settings.py` (SETTINGS): this package derives the key maps, defaults, parsing, rules on single values,
the building of ServerConfig and `render_toml` from that table, and docs/configuration.md's tables of keys
are generated from it. Loading does no IO beyond reading the TOML file, so `hotstate server` can refuse a
bad configuration before it binds a port or touches `data.dir`.

Checks are split in two on purpose: parsing (text or TOML value -> typed value) happens only in
`load_config`, while every rule about typed values runs in `ServerConfig.__post_init__`, so a config
built in code (as `hotstate cluster up` does before `render_toml`) obeys the same rules as a loaded one.

Its parts, each importing only those listed before it:
  errors.py     ConfigError, and the secret's redaction in it
  keys.py       the Kafka names from SETTINGS (key maps per typed config, environment variable names)
  addresses.py  Listener and Voter, and the rules on one host or port
  kinds.py      each kind of value: parsed, checked alone, written back (KINDS)
  rules.py      the rules that compare settings with each other
  model.py      ServerConfig, the typed configs it holds (its groups), its check, DEFAULTS
  build.py      raw values -> ServerConfig, every bad key reported at once
  aliases.py    the anchors' names (settings.ALIASES) turned into hotstate's keys
  sources.py    the TOML file, the environment, the flags; load_config
  render.py     render_toml
  advice.py     warnings about a valid configuration, logged at startup
"""

from hotstate.server.config.addresses import Listener, ListenerName, Voter
from hotstate.server.config.advice import config_warnings
from hotstate.server.config.errors import ConfigError
from hotstate.server.config.keys import (
    ASSIGNMENT_TAGS_KEY,
    ASSIGNOR_INT_KEYS,
    ASSIGNOR_KEYS,
    ENV_PREFIX,
    ENV_VARS,
    HEARTBEAT_KEYS,
    KNOWN_KEYS,
    LAG_REPORTING_KEYS,
    LIVENESS_KEYS,
    OPTIONAL_KEYS,
    RAFT_KEYS,
    REPLICA_KEYS,
    REQUIRED_KEYS,
    SETTING,
    STRATEGY_KEY,
    env_var_name,
)
from hotstate.server.config.kinds import ROLES, ProcessRole
from hotstate.server.config.model import DEFAULTS, ServerConfig
from hotstate.server.config.render import render_toml
from hotstate.server.config.sources import load_config, parse_flag_overrides
from hotstate.server.settings import LOG_LEVELS, MAX_INT32, REPLICA_LOG_FSYNC_POLICIES

__all__ = [
    "ASSIGNMENT_TAGS_KEY",
    "ASSIGNOR_INT_KEYS",
    "ASSIGNOR_KEYS",
    "DEFAULTS",
    "ENV_PREFIX",
    "ENV_VARS",
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
    "ListenerName",
    "ProcessRole",
    "ServerConfig",
    "Voter",
    "config_warnings",
    "env_var_name",
    "load_config",
    "parse_flag_overrides",
    "render_toml",
]

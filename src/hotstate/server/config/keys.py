"""The settings' Kafka-style names, derived from SETTINGS, and the environment variables that carry them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from hotstate.server.settings import SETTINGS, Setting

ENV_PREFIX: Final = "HOTSTATE_"

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
# Kafka Streams names (AssignorConfig's PROPERTY_NAMES). Not num.standby.replicas: every table sets its own
# count, and the server-level `num.standby.replicas` is only the default of a table made over HTTP.
ASSIGNOR_KEYS: Final = _fields_of("assignor")
(STRATEGY_KEY,) = (setting.key for setting in SETTINGS if setting.kind == "strategy")
(ASSIGNMENT_TAGS_KEY,) = (setting.key for setting in SETTINGS if setting.kind == "tag_keys")
ASSIGNOR_INT_KEYS: Final = tuple(key for key in ASSIGNOR_KEYS if SETTING[key].kind == "int")


def env_var_name(key: str) -> str:
    """`controller.quorum.voters` -> `HOTSTATE_CONTROLLER_QUORUM_VOTERS`."""
    return ENV_PREFIX + key.upper().replace(".", "_")


ENV_VARS: Final[Mapping[str, str]] = {env_var_name(key): key for key in KNOWN_KEYS}
assert len(ENV_VARS) == len(KNOWN_KEYS), "two keys map to one environment variable"

"""Raw values (Kafka name -> TOML value or text, merged from the sources) -> a ServerConfig.

Every bad key is reported at once: a value that does not parse is replaced by a placeholder, a typed config
with a bad value by its defaults, and the errors about those stand-ins are dropped.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hotstate.server.config.errors import MISSING, ConfigError
from hotstate.server.config.keys import RAFT_KEYS, env_var_name
from hotstate.server.config.kinds import KINDS, check_values
from hotstate.server.config.model import DEFAULT_VALUES, GROUPS, Group, ServerConfig, default_at
from hotstate.server.config.rules import rule_problems
from hotstate.server.settings import SETTINGS, Setting


def _parse_setting(setting: Setting, raw: Mapping[str, object], errors: list[ConfigError]) -> object:
    kind = KINDS[setting.kind]
    if setting.key not in raw:
        if not setting.required:
            return DEFAULT_VALUES[setting.key]
        how = f"set it in the config file, as {env_var_name(setting.key)} or with --{setting.key}"
        errors.append(ConfigError(setting.key, MISSING, f"is required ({setting.required}); {how}"))
        return kind.placeholder
    try:
        return kind.parse(setting, raw[setting.key])
    except ConfigError as error:
        errors.append(error)
        return kind.placeholder


def _build_group(
    group: Group, fields: Mapping[str, object], values: Mapping[str, object], errors: list[ConfigError]
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
    valid = check_values({key: values[key] for key in keys if key not in failed}, errors)
    errors += rule_problems(valid)
    if len(valid) < len(keys) or len(errors) > count:
        # Its defaults stand in (ServerConfig finds nothing wrong with them); the bad keys are in `errors`.
        return default_at(group.path)
    try:
        return group.type(**fields)
    except ValueError as error:  # a rule of the group's own that the rules here do not have
        errors.append(group.explain(error, {key: values[key] for key in keys}))
        return default_at(group.path)


def build(raw: Mapping[str, object]) -> ServerConfig:
    """The ServerConfig of `raw` (Kafka name -> raw value); raises ConfigError naming every bad key."""
    errors: list[ConfigError] = []
    values = {setting.key: _parse_setting(setting, raw, errors) for setting in SETTINGS}
    # ServerConfig's keyword arguments, with each value at its target inside the typed configs built for it.
    fields: dict[str, dict[str, Any]] = {"": {}, **{group.path: {} for group in GROUPS}}
    for setting in SETTINGS:
        value = values[setting.key]
        parts = value if isinstance(value, tuple) and len(setting.targets) > 1 else (value,)
        for target, part in zip(setting.targets, parts, strict=True):
            path, _, name = target.rpartition(".")
            fields[path][name] = part
    for group in reversed(GROUPS):  # a group held by another is built first
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

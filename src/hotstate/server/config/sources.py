"""Where the raw values come from: a TOML file, then `HOTSTATE_*` environment variables, then flags (flags
win); `load_config` merges them, remembering where each value came from, and builds the ServerConfig."""

from __future__ import annotations

import logging
import os
import tomllib
from collections.abc import Mapping, Sequence
from pathlib import Path

from hotstate.server.config.aliases import env_alias, holds_aliases, is_alias, resolve
from hotstate.server.config.build import build
from hotstate.server.config.errors import MISSING, ConfigError, nearest
from hotstate.server.config.keys import ENV_PREFIX, ENV_VARS, KNOWN_KEYS, env_var_name
from hotstate.server.config.model import ServerConfig

# Named for the package: the warnings about stray environment variables come from "the config".
logger = logging.getLogger("hotstate.server.config")


def _unknown_key(key: str, value: object) -> ConfigError:
    near = nearest(key.replace("_", ".").replace("-", ".").lower(), KNOWN_KEYS)
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
        if isinstance(value, dict) and (
            any(known.startswith(key + ".") for known in KNOWN_KEYS) or holds_aliases(key)
        ):
            _flatten(value, key + ".", out, errors)
        elif key in KNOWN_KEYS or is_alias(key):
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
        key = ENV_VARS.get(name) or env_alias(name)
        if key is None:
            # Other hotstate tools (the Spark sink, the client) read HOTSTATE_* variables too.
            # Compare without the shared prefix, or every name looks close to every other.
            near = nearest(
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
        if key not in KNOWN_KEYS and not is_alias(key):
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
        if key in KNOWN_KEYS or is_alias(key):
            raw[key], sources[key] = value, f"flag --{key}"
        else:
            unknown.append(_unknown_key(key, value).with_sources({key: f"flag --{key}"}))
    if unknown:
        raise ConfigError.combine(unknown)
    raw, sources = resolve(raw, sources)
    try:
        return build(raw)
    except ConfigError as error:
        raise error.with_sources(sources) from None

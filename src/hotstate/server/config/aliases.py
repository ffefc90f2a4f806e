"""The anchors' names for settings (settings.ALIASES), turned into hotstate's settings.

`resolve` takes the raw values merged from the sources (file, environment, flags; an alias's value is kept
under its own name) and gives the raw values of hotstate's keys alone, before anything parses them: so a
value given through an alias is parsed, checked and reported as the setting it stands for.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

from hotstate.server.config.errors import ConfigError
from hotstate.server.config.keys import ENV_PREFIX, KNOWN_KEYS
from hotstate.server.settings import ALIASES, CLIENT_TAG_PREFIX

ENABLED_KEY: Final = "rack.aware.assignment.enabled"
FORWARDING_TIMEOUT_KEY: Final = "ksql.query.pull.forwarding.timeout.ms"
_NAMED: Final = frozenset(alias.key for alias in ALIASES if not alias.key.endswith("."))
_ENV_NAMED: Final = {ENV_PREFIX + key.upper().replace(".", "_"): key for key in _NAMED}
_ENV_CLIENT_TAG: Final = ENV_PREFIX + "CLIENT_TAG_"
_TRUE: Final = frozenset({"true", "yes", "on", "1"})
_FALSE: Final = frozenset({"false", "no", "off", "0"})


def is_alias(key: str) -> bool:
    """`key` is an alias: one of the named ones, or `client.tag.KEY`."""
    return key in _NAMED or (key.startswith(CLIENT_TAG_PREFIX) and len(key) > len(CLIENT_TAG_PREFIX))


def holds_aliases(prefix: str) -> bool:
    """A TOML table named `prefix` (`client`, `client.tag`, `ksql.query`) may hold aliases."""
    table = prefix + "."
    return CLIENT_TAG_PREFIX.startswith(table) or any(key.startswith(table) for key in _NAMED)


def env_alias(name: str) -> str | None:
    """The alias an environment variable carries: HOTSTATE_CLIENT_TAG_ZONE -> client.tag.zone."""
    if name.startswith(_ENV_CLIENT_TAG) and len(name) > len(_ENV_CLIENT_TAG):
        return CLIENT_TAG_PREFIX + name.removeprefix(_ENV_CLIENT_TAG).lower()
    return _ENV_NAMED.get(name)


def _rank(source: str | None) -> int:
    """Which source wins: flags, then the environment, then the file (load_config's order)."""
    if source is None:
        return 0
    if source.startswith("flag "):
        return 2
    return 1 if source.startswith("env ") else 0


def resolve(
    raw: Mapping[str, object], sources: Mapping[str, str]
) -> tuple[dict[str, object], dict[str, str]]:
    """The raw values and their sources with every alias replaced by the keys it stands for; raises
    ConfigError (every problem at once) where an alias contradicts a key given as well."""
    out = {key: value for key, value in raw.items() if not is_alias(key)}
    where = {key: source for key, source in sources.items() if key in out}
    errors: list[ConfigError] = []

    def source(key: str) -> str | None:
        return sources.get(key)

    # ksqlDB's forwarding timeout is query.timeout.ms.
    if FORWARDING_TIMEOUT_KEY in raw:
        value = raw[FORWARDING_TIMEOUT_KEY]
        target = "query.timeout.ms"
        given = target in raw
        if given and _rank(source(FORWARDING_TIMEOUT_KEY)) == _rank(source(target)):
            if str(raw[target]).strip() != str(value).strip():
                errors.append(
                    _error(
                        FORWARDING_TIMEOUT_KEY,
                        value,
                        f"must equal {target}={raw[target]!r}, given too (it is ksqlDB's name for it)",
                        source(FORWARDING_TIMEOUT_KEY),
                    )
                )
        elif not given or _rank(source(FORWARDING_TIMEOUT_KEY)) > _rank(source(target)):
            out[target] = value
            _set_source(where, target, source(FORWARDING_TIMEOUT_KEY))

    # rack.aware.assignment.enabled=false: no rack awareness at all.
    if ENABLED_KEY in raw:
        value = raw[ENABLED_KEY]
        enabled = _boolean(value)
        strategy_key, tags_key = "rack.aware.assignment.strategy", "rack.aware.assignment.tags"
        if enabled is None:
            errors.append(_error(ENABLED_KEY, value, "must be true or false", source(ENABLED_KEY)))
        elif not enabled:
            strategy = str(raw.get(strategy_key, "none")).strip().lower()
            tags = raw.get(tags_key, "")
            if strategy != "none" or tags not in ("", []):
                errors.append(
                    _error(
                        ENABLED_KEY,
                        value,
                        f"cannot be false while {strategy_key} or {tags_key} asks for rack awareness "
                        f"(given: {strategy_key}={raw.get(strategy_key)!r}, "
                        f"{tags_key}={raw.get(tags_key)!r})",
                        source(ENABLED_KEY),
                    )
                )
            else:
                out[strategy_key], out[tags_key] = "none", ""
                _set_source(where, strategy_key, source(ENABLED_KEY))
                _set_source(where, tags_key, source(ENABLED_KEY))
        elif str(raw.get(strategy_key, "")).strip().lower() == "none":
            errors.append(
                _error(
                    ENABLED_KEY,
                    value,
                    f"cannot be true while {strategy_key}=none (placement ignoring racks) is given",
                    source(ENABLED_KEY),
                )
            )

    # client.tag.KEY=VALUE: the tag KEY=VALUE; client.tag.rack: rack.
    client_tags = {
        key.removeprefix(CLIENT_TAG_PREFIX): value
        for key, value in sorted(raw.items())
        if key.startswith(CLIENT_TAG_PREFIX) and is_alias(key)
    }
    if "rack" in client_tags:
        value = client_tags.pop("rack")
        key = CLIENT_TAG_PREFIX + "rack"
        if "rack" in raw and str(raw["rack"]).strip() != str(value).strip():
            errors.append(_error(key, value, f"must equal rack={raw['rack']!r}, given too", source(key)))
        else:
            out["rack"] = value
            _set_source(where, "rack", source(key))
    if client_tags:
        items = _tag_items(raw.get("tags"))
        named = {item.partition("=")[0].strip() for item in items}
        for name, value in client_tags.items():
            key = CLIENT_TAG_PREFIX + name
            if not isinstance(value, str):
                errors.append(_error(key, value, "must be a string (a tag's value)", source(key)))
            elif name in named:
                refusal = f"must not name a tag `tags` gives too ({name})"
                errors.append(_error(key, value, refusal, source(key)))
            else:
                items.append(f"{name}={value}")
                _set_source(where, "tags", source(key))
        out["tags"] = ",".join(items)
    if errors:
        raise ConfigError.combine(errors)
    assert all(key in KNOWN_KEYS for key in out), "an alias resolved to an unknown key"
    return out, where


def _boolean(value: object) -> bool | None:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    return True if text in _TRUE else False if text in _FALSE else None


def _tag_items(tags: object) -> list[str]:
    """`tags` as given (text, TOML table or array), as `key=value` items."""
    if tags is None or tags == "":
        return []
    if isinstance(tags, dict):
        return [f"{key}={value}" for key, value in tags.items()]
    if isinstance(tags, list):
        return [str(item) for item in tags]
    return [str(tags)]


def _set_source(where: dict[str, str], key: str, source: str | None) -> None:
    if source is not None:
        where[key] = source


def _error(key: str, value: object, allowed: str, source: str | None) -> ConfigError:
    return ConfigError(key, value, allowed, source=source)

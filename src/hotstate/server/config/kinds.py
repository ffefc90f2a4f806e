"""Kinds of values: for each `Kind` of SETTINGS, how a raw value is parsed, which rules one typed value must
obey, and how it is written back.

Parsing (a TOML value or text -> the typed value) runs only when loading; the rules run on every
ServerConfig, so a config built in code obeys them too. Rules that compare settings are in rules.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, get_args

from hotstate.assignor.config import STRATEGIES
from hotstate.server.config.addresses import (
    HOST_ALLOWED,
    PORT_ALLOWED,
    Listener,
    Voter,
    host_port,
    host_problem,
    is_port,
    is_unspecified,
    parse_host_port,
)
from hotstate.server.config.errors import ConfigError, nearest
from hotstate.server.config.keys import SETTING
from hotstate.server.settings import (
    LOG_LEVELS,
    MAX_INT32,
    MAX_LABEL_CHARS,
    MIN_SECRET_CHARS,
    REPLICA_LOG_FSYNC_POLICIES,
    Kind,
    Setting,
)
from hotstate.tls import CLIENT_AUTH_CHOICES

ProcessRole = Literal["controller", "broker"]

ROLES: Final[tuple[ProcessRole, ...]] = ("controller", "broker")

# ---------------------------------------------------------------------------------------------------------
# The rules on one typed value


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


def _is_utf8(text: str) -> bool:
    # Undecodable bytes in an environment variable arrive as lone surrogates, which TOML cannot hold.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _is_path_text(text: str) -> bool:
    return bool(text.strip()) and "\0" not in text and _is_utf8(text)


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


def is_tag_pair(tag: object) -> bool:
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
        elif problem := host_problem(listener.host):
            errors.append(ConfigError(key, str(listener), problem))
        elif not is_port(listener.port, 0):
            errors.append(ConfigError(key, str(listener), f"must give {PORT_ALLOWED}"))
    if errors or not isinstance(rpc, Listener) or not isinstance(http, Listener):
        return errors
    if http.port == rpc.port != 0 and (
        http.host == rpc.host or is_unspecified(http.host) or is_unspecified(rpc.host)
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
        elif problem := host_problem(voter.host):
            errors.append(ConfigError(key, str(voter), problem))
        elif is_unspecified(voter.host):
            errors.append(
                ConfigError(
                    key,
                    str(voter),
                    "must give an address other servers can connect to, not a wildcard like 0.0.0.0 or [::]",
                )
            )
        elif not is_port(voter.port, 1):
            errors.append(ConfigError(key, str(voter), "must give a port from 1 to 65535"))
        elif voter.node_id in seen_ids:
            errors.append(ConfigError(key, str(voter), f"must list node {voter.node_id} only once"))
        elif (voter.host.lower(), voter.port) in seen_addresses:
            errors.append(
                ConfigError(
                    key,
                    str(voter),
                    f"must give each voter its own address; "
                    f"{host_port(voter.host, voter.port)} is listed twice",
                )
            )
        else:
            seen_ids.add(voter.node_id)
            seen_addresses.add((voter.host.lower(), voter.port))
    return errors


def _tags_problems(setting: Setting, tags: object) -> list[ConfigError]:
    name = setting.key
    if not isinstance(tags, tuple) or not all(is_tag_pair(tag) for tag in tags):
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


_LISTENERS_ALLOWED: Final = (
    "must be rpc://HOST:PORT (required) and optionally http://HOST:PORT, comma-separated; "
    f"HOST is {HOST_ALLOWED}, PORT is {PORT_ALLOWED}"
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
        host, port = parse_host_port(setting.key, rest, _LISTENERS_ALLOWED)
        found[name] = Listener("rpc" if name == "rpc" else "http", host, port)
    if "rpc" not in found:
        raise ConfigError(setting.key, raw, f"{_LISTENERS_ALLOWED}; the rpc listener is missing")
    return found["rpc"], found.get("http")


_VOTERS_ALLOWED: Final = (
    "must be a comma-separated list of ID@HOST:PORT, e.g. 1@10.0.0.1:9092,2@10.0.0.2:9092, "
    f"with positive integer ids and HOST {HOST_ALLOWED}"
)


def _parse_voters(setting: Setting, raw: object) -> tuple[Voter, ...]:
    voters = []
    for item in _split_list(setting.key, raw, _VOTERS_ALLOWED):
        id_text, sep, address = item.partition("@")
        if not sep or not re.fullmatch(r"[0-9]+", id_text.strip()):
            raise ConfigError(setting.key, item, _VOTERS_ALLOWED)
        host, port = parse_host_port(setting.key, address.strip(), _VOTERS_ALLOWED)
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
        near = nearest(strategy, STRATEGIES)
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
# The kinds


@dataclass(frozen=True, slots=True)
class ValueKind:
    parse: Callable[[Setting, object], object]  # a TOML value or text -> the typed value; raises ConfigError
    problems: Callable[[Setting, object], list[ConfigError]]  # the rules on one typed value
    write: Callable[[Any], object]  # the typed value -> what render_toml writes (None: nothing)
    # Stands in for a value that did not parse; invalid where a rule would compare it with other values.
    placeholder: object


def _same(value: object) -> object:
    return value


KINDS: Final[Mapping[Kind, ValueKind]] = {
    "int": ValueKind(_parse_int, _int_problems, _same, 0),
    "roles": ValueKind(_parse_roles, _roles_problems, _format_roles, frozenset()),
    # The placeholder's empty host is invalid, so the rules comparing the rpc port with the voters skip it.
    "listeners": ValueKind(
        _parse_listeners, _listeners_problems, _write_listeners, (Listener("rpc", "", 0), None)
    ),
    "voters": ValueKind(_parse_voters, _voters_problems, _write_voters, ()),
    "path": ValueKind(_parse_data_dir, _data_dir_problems, str, Path(".")),
    "label": ValueKind(_parse_label, _rack_problems, _same, None),
    "tags": ValueKind(_parse_tags, _tags_problems, _format_tags, ()),
    "cluster_id": ValueKind(_parse_string, _cluster_id_problems, _same, ""),
    "secret": ValueKind(_parse_secret, _secret_problems, _same, ""),
    "fsync": ValueKind(_parse_fsync, _choice_problems(REPLICA_LOG_FSYNC_POLICIES, _FSYNC_ALLOWED), _same, ""),
    "strategy": ValueKind(_parse_strategy, _choice_problems(STRATEGIES, _STRATEGY_ALLOWED), _same, ""),
    "tag_keys": ValueKind(_parse_assignment_tags, _assignment_tags_problems, ",".join, ()),
    "log_level": ValueKind(_parse_log_level, _choice_problems(LOG_LEVELS, _LOG_LEVEL_ALLOWED), _same, ""),
    "file": ValueKind(_parse_file, _file_problems, _write_file, None),
    "client_auth": ValueKind(
        _parse_client_auth, _choice_problems(CLIENT_AUTH_CHOICES, _CLIENT_AUTH_ALLOWED), _same, ""
    ),
}
assert set(KINDS) == set(get_args(Kind)), "a kind of value has no parser"


def check_values(values: Mapping[str, object], errors: list[ConfigError]) -> dict[str, object]:
    """The rules of each value's kind; returns the values that pass them."""
    valid: dict[str, object] = {}
    for key, value in values.items():
        setting = SETTING[key]
        problems = KINDS[setting.kind].problems(setting, value)
        errors += problems
        if not problems:
            valid[key] = value
    return valid

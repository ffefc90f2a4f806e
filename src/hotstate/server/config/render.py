"""render_toml: a ServerConfig written as the TOML file that loads back to it."""

from __future__ import annotations

from hotstate.server.config.kinds import KINDS
from hotstate.server.config.model import DEFAULTS, ServerConfig, value_of
from hotstate.server.settings import SETTINGS


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
        value = KINDS[setting.kind].write(value_of(config, setting))
        if value is None or (
            setting.key in DEFAULTS and value == DEFAULTS[setting.key] and not include_defaults
        ):
            continue
        shown = str(value) if isinstance(value, int) else _toml_string(str(value))
        lines.append(f"{_toml_string(setting.key)} = {shown}")
    return "\n".join(lines) + "\n"

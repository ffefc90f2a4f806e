"""The hotstate server process. Only its configuration is importable from here, to keep imports light."""

from hotstate.server.config import (
    ConfigError,
    Listener,
    ServerConfig,
    Voter,
    load_config,
    parse_flag_overrides,
    render_toml,
)

__all__ = [
    "ConfigError",
    "Listener",
    "ServerConfig",
    "Voter",
    "load_config",
    "parse_flag_overrides",
    "render_toml",
]

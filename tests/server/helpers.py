"""A valid base configuration and checks shared by the config tests."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from hotstate.server.config import ConfigError, ServerConfig, load_config
from hotstate.server.http.direct_lane import LimitedHttpToolsProtocol

# Node 1 of a 3-node combined cluster on one machine.
BASE: Mapping[str, str] = {
    "node.id": "1",
    "process.roles": "controller,broker",
    "listeners": "rpc://127.0.0.1:9092,http://127.0.0.1:8080",
    "controller.quorum.voters": "1@127.0.0.1:9092,2@127.0.0.1:9093,3@127.0.0.1:9094",
    "data.dir": "/var/lib/hotstate/1",
    "cluster.id": "hs-test",
    "cluster.secret": "0123456789abcdef",
}

BASE_TOML = """\
"node.id" = 1
"process.roles" = "controller,broker"
listeners = "rpc://127.0.0.1:9092,http://127.0.0.1:8080"
"controller.quorum.voters" = "1@127.0.0.1:9092,2@127.0.0.1:9093,3@127.0.0.1:9094"
"data.dir" = "/var/lib/hotstate/1"
"cluster.id" = "hs-test"
"cluster.secret" = "0123456789abcdef"
"""


def load(overrides: Mapping[str, str] | None = None, *, drop: tuple[str, ...] = ()) -> ServerConfig:
    """Load BASE with `overrides` given as flags and the keys in `drop` left out; no environment."""
    flags = {key: value for key, value in {**BASE, **(overrides or {})}.items() if key not in drop}
    return load_config(env={}, flags=flags)


def built_in_code(loaded: ServerConfig) -> ServerConfig:
    """A ServerConfig built in code with only the required settings of `loaded`: the rest defaulted."""
    return ServerConfig(
        node_id=loaded.node_id,
        process_roles=loaded.process_roles,
        rpc=loaded.rpc,
        http=loaded.http,
        voters=loaded.voters,
        data_dir=loaded.data_dir,
        cluster_id=loaded.cluster_id,
        cluster_secret=loaded.cluster_secret,
    )


def load_toml(
    tmp_path: Path,
    text: str,
    *,
    env: Mapping[str, str] | None = None,
    flags: Mapping[str, str] | None = None,
) -> ServerConfig:
    path = tmp_path / "server.toml"
    path.write_text(text, encoding="utf-8")
    return load_config(path, env=env or {}, flags=flags)


def error_for(error: ConfigError, key: str) -> ConfigError:
    """The one of `error`'s reports about `key`."""
    matching = [single for single in error.errors if single.key == key]
    assert matching, f"no error about {key!r} in:\n{error}"
    return matching[0]


def assert_reports(
    excinfo: pytest.ExceptionInfo[ConfigError], key: str, allowed_fragment: str, value: object = None
) -> ConfigError:
    """The error names the key, the value and what is allowed, in its message as well as its fields."""
    single = error_for(excinfo.value, key)
    line = single.line()
    assert line.startswith(key)
    assert allowed_fragment in single.allowed
    assert single.allowed in line
    if value is not None:
        assert single.value == value
    if single.value is not None and not line.startswith(f"{key} is not set"):
        assert repr(single.value) in line
    assert line in str(excinfo.value)
    return single


@asynccontextmanager
async def serving(
    app: Any, *, http: Any = LimitedHttpToolsProtocol, **config: Any
) -> AsyncIterator[tuple[int, uvicorn.Server]]:
    """`app` on uvicorn in this loop, with hotstate's HTTP protocol, on a free loopback port: (port, server),
    stopped on the way out."""
    server = uvicorn.Server(
        uvicorn.Config(app, host="127.0.0.1", port=0, http=http, log_level="error", lifespan="off", **config)
    )
    task = asyncio.create_task(server.serve())
    async with asyncio.timeout(10):  # uvicorn sets a flag, no event: poll it
        while not server.started:
            await asyncio.sleep(0.01)
    try:
        yield server.servers[0].sockets[0].getsockname()[1], server
    finally:
        server.should_exit = True
        await task

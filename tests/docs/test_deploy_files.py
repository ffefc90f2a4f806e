"""The files docs/deploy.md ships are what it says: every config file under deploy/config parses as a
server configuration (with the secret from the environment, as the unit and compose give it), the
compose file runs each of them as a service, and the systemd unit does not restart a removed server."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hotstate.server.config import load_config

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
CONFIGS = sorted((DEPLOY / "config").glob("*.toml"))
SECRET = {"HOTSTATE_CLUSTER_SECRET": "a-secret-of-at-least-16-chars"}


def test_the_documented_files_exist() -> None:
    doc = (ROOT / "docs" / "deploy.md").read_text()
    named = set(re.findall(r"deploy/[\w./-]+\.(?:toml|service|yaml|py)|deploy/Dockerfile", doc))
    assert named, "docs/deploy.md names no file of deploy/"
    # What the operator makes (certificates, credentials) is git-ignored, not shipped.
    made = [line.rstrip("/") for line in (DEPLOY / ".gitignore").read_text().split()]
    shipped = {n for n in named if not any(n.startswith(f"deploy/{m}") for m in made)}
    assert [n for n in sorted(shipped) if not (ROOT / n).exists()] == []
    assert {f"deploy/config/{c.name}" for c in CONFIGS} <= named


@pytest.mark.parametrize("path", CONFIGS, ids=[c.stem for c in CONFIGS])
def test_every_config_file_is_valid(path: Path) -> None:
    config = load_config(path, env=SECRET)
    assert config.cluster_secret == SECRET["HOTSTATE_CLUSTER_SECRET"]
    assert config.rpc_tls.cert_file is not None and config.http_tls.cert_file is not None
    assert config.rpc_tls.client_auth == "required"
    assert config.http_auth_credentials_file is not None
    # The host a server listens on is its file's name, which the compose file and the certificates use.
    assert config.rpc.host == path.stem


def test_the_servers_agree_with_each_other() -> None:
    configs = [load_config(path, env=SECRET) for path in CONFIGS]
    assert len({c.voters for c in configs}) == 1 and len({c.cluster_id for c in configs}) == 1
    assert len({c.node_id for c in configs}) == len(configs)
    controllers = {c.node_id for c in configs if "controller" in c.process_roles}
    assert {v.node_id for v in configs[0].voters} == controllers and len(controllers) == 3
    assert {(v.host, v.port) for v in configs[0].voters} == {
        (c.rpc.host, c.rpc.port) for c in configs if c.node_id in controllers
    }


def test_compose_runs_every_config_file() -> None:
    compose = (DEPLOY / "compose.yaml").read_text()
    services = re.findall(r"^  ([\w-]+):\n    <<: \*server", compose, re.MULTILINE)
    assert sorted(services) == sorted(c.stem for c in CONFIGS)
    for name in services:
        assert f"./config/{name}.toml:/etc/hotstate/hotstate.toml:ro" in compose


def test_the_unit_does_not_restart_a_removed_server() -> None:
    unit = (DEPLOY / "systemd" / "hotstate.service").read_text()
    from hotstate.server.app import REMOVED_EXIT_CODE

    prevent = re.search(r"^RestartPreventExitStatus=(.*)$", unit, re.MULTILINE)
    assert prevent is not None and str(REMOVED_EXIT_CODE) in prevent.group(1).split()
    assert "ExecStart=/opt/hotstate/bin/hotstate server --config /etc/hotstate/hotstate.toml" in unit

"""rpc.tls.* and http.tls.*: parsed into TlsFiles, written back by render_toml, and the rules that tie a
certificate to its key and the rest to a certificate."""

from __future__ import annotations

from pathlib import Path

import pytest

from hotstate.server.config import ConfigError, load_config, render_toml
from hotstate.tls import TlsFiles

from .helpers import BASE, assert_reports, load

MUTUAL = {
    "rpc.tls.cert.file": "/etc/hotstate/server.crt",
    "rpc.tls.key.file": "/etc/hotstate/server.key",
    "rpc.tls.ca.file": "/etc/hotstate/ca.crt",
    "rpc.tls.client.auth": "Required",
    "http.tls.cert.file": "/etc/hotstate/server.crt",
    "http.tls.key.file": "/etc/hotstate/server.key",
}


def test_tls_settings_load_into_tls_files_and_round_trip(tmp_path: Path) -> None:
    config = load(MUTUAL)
    assert config.rpc_tls == TlsFiles(
        Path("/etc/hotstate/server.crt"),
        Path("/etc/hotstate/server.key"),
        Path("/etc/hotstate/ca.crt"),
        "required",
    )
    assert config.http_tls == TlsFiles(Path("/etc/hotstate/server.crt"), Path("/etc/hotstate/server.key"))
    assert config.rpc_tls.enabled and config.http_tls.enabled and not load().rpc_tls.enabled
    written = tmp_path / "server.toml"
    written.write_text(render_toml(config))
    assert load_config(written, env={}) == config
    assert "tls" not in render_toml(load())  # off: nothing written
    # An empty value clears a path set by a lower-precedence source.
    env = {"HOTSTATE_HTTP_TLS_CERT_FILE": "/x.crt", "HOTSTATE_HTTP_TLS_KEY_FILE": "/x.key"}
    flags = {**BASE, "http.tls.cert.file": "", "http.tls.key.file": ""}
    assert not load_config(env=env, flags=flags).http_tls.enabled


@pytest.mark.parametrize(
    ("overrides", "key", "allowed"),
    [
        ({"rpc.tls.cert.file": "/a.crt"}, "rpc.tls.key.file", "must be set with rpc.tls.cert.file"),
        ({"http.tls.cert.file": "/a.crt"}, "http.tls.key.file", "must be set with http.tls.cert.file"),
        ({"rpc.tls.key.file": "/a.key"}, "rpc.tls.key.file", "needs rpc.tls.cert.file"),
        ({"rpc.tls.ca.file": "/ca.crt"}, "rpc.tls.ca.file", "needs rpc.tls.cert.file"),
        ({"http.tls.ca.file": "/ca.crt"}, "http.tls.ca.file", "needs http.tls.cert.file"),
        ({"rpc.tls.client.auth": "required"}, "rpc.tls.client.auth", "needs rpc.tls.cert.file"),
        (
            {"rpc.tls.client.auth": "required", "rpc.tls.cert.file": "/a.crt", "rpc.tls.key.file": "/a.key"},
            "rpc.tls.client.auth",
            "needs rpc.tls.ca.file",
        ),
        ({"rpc.tls.client.auth": "sometimes"}, "rpc.tls.client.auth", "must be none or required"),
    ],
)
def test_tls_rules_name_the_key_and_what_is_missing(
    overrides: dict[str, str], key: str, allowed: str
) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load(overrides)
    assert_reports(excinfo, key, allowed)

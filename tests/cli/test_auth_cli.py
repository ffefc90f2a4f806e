"""`hotstate auth hash-password | new-token` print entries the credentials file takes; `cluster up
--auth`'s local cluster keeps its secrets where the CLI finds them."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from typer.testing import CliRunner

from hotstate.cli.local_cluster import LocalCluster
from hotstate.cli.main import app
from hotstate.server.http.credentials import parse_credentials


def test_hash_password_prints_an_entry_that_checks_the_password() -> None:
    result = CliRunner().invoke(
        app, ["auth", "hash-password", "alice", "--role", "admin", "--password", "pw"]
    )
    assert result.exit_code == 0, result.output
    user = parse_credentials(result.stdout).users["alice"]
    assert user.role == "admin" and user.password.matches("pw") and not user.password.matches("px")


def test_new_token_prints_the_token_once_and_an_entry_with_its_hash() -> None:
    result = CliRunner().invoke(app, ["auth", "new-token", "dash board"])
    assert result.exit_code == 0, result.output
    token = re.search(r"it is not stored\): (\S+)", result.stderr)
    assert token is not None
    assert token[1] not in result.stdout
    credentials = parse_credentials(result.stdout)
    principal = credentials.token(token[1])
    assert principal is not None and principal.name == "dash board" and principal.role == "read"
    assert next(iter(credentials.tokens)) == hashlib.sha256(token[1].encode()).digest()


def test_a_wrong_role_is_refused() -> None:
    result = CliRunner().invoke(app, ["auth", "new-token", "x", "--role", "root"])
    assert result.exit_code == 2 and "must be one of read, admin" in result.stderr


def test_a_local_cluster_with_auth_keeps_its_secrets_beside_its_own(tmp_path: Path) -> None:
    cluster = LocalCluster.create(tmp_path, 1)
    path = cluster.enable_auth()
    cluster.save()
    assert (tmp_path / "cluster.json").stat().st_mode & 0o777 == 0o600
    loaded = LocalCluster.load(tmp_path)
    assert loaded.auth == cluster.auth and loaded.auth is not None
    credentials = parse_credentials(path.read_text())
    assert credentials.users["admin"].password.matches(loaded.auth.admin_password)
    assert credentials.token(loaded.auth.reader_token) is not None
    assert loaded.auth.admin_password not in path.read_text()

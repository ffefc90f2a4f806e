"""HttpAuth (server/http/auth.py) on its own: which paths need which role, the refusals' shapes and
counts, the cache of verified headers, and reloading the credentials file."""

from __future__ import annotations

import asyncio
import base64
import logging
import os
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any

import orjson
import pytest

from hotstate.server.http.auth import HttpAuth, needed_role, server_token
from hotstate.server.http.credentials import CredentialsError, PasswordHash, hash_password, new_token
from hotstate.server.http.metrics import Metrics

SECRET = "cluster-secret-0123456789"
FAST_N = 2**4


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _write(path: Path, **tokens: tuple[str, str]) -> None:
    lines = [f'[users.alice]\nrole = "admin"\npassword = "{hash_password("pw-alice", n=FAST_N)}"\n']
    lines += [
        f'[tokens.{name}]\nrole = "{role}"\nsha256 = "{digest}"\n' for name, (role, digest) in tokens.items()
    ]
    path.write_text("\n".join(lines))
    stat = path.stat()  # a new modification time even within the file system's time granularity
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))


def _basic(user: str, password: str) -> bytes:
    return b"Basic " + base64.b64encode(f"{user}:{password}".encode())


async def _ask(auth: HttpAuth, method: str, path: str, header: bytes | None) -> tuple[int | None, Any]:
    sent: list[MutableMapping[str, Any]] = []

    async def send(message: MutableMapping[str, Any]) -> None:
        sent.append(message)

    headers = [(b"host", b"x")] + ([(b"authorization", header)] if header is not None else [])
    scope = {"type": "http", "method": method, "path": path, "headers": headers, "client": ("127.0.0.1", 1)}
    if await auth.admit(scope, send):
        assert not sent
        return None, None
    start, body = sent
    return start["status"], (start["headers"], orjson.loads(body["body"]))


def _failures(metrics: Metrics) -> dict[str, float]:
    return {
        sample.labels["reason"]: sample.value
        for metric in metrics.auth_failures.collect()
        for sample in metric.samples
        if sample.name.endswith("_total")
    }


def test_paths_and_roles() -> None:
    assert needed_role("GET", "/healthcheck") is None
    assert needed_role("GET", "/ui") is None and needed_role("GET", "/ui/app.js") is None
    assert needed_role("GET", "/info") == "read"
    assert needed_role("GET", "/metrics") == "read"
    assert needed_role("POST", "/v1/query") == "read" and needed_role("POST", "/query-stream") == "read"
    assert needed_role("GET", "/v1/tables") == "read"
    assert needed_role("POST", "/v1/tables") == "admin"
    assert needed_role("DELETE", "/v1/tables/t") == "admin"
    assert needed_role("POST", "/v1/servers/4/remove") == "admin"
    assert needed_role("GET", "/v1/cluster/voters") == "read"
    assert needed_role("POST", "/v1/cluster/voters") == "admin"
    assert needed_role("DELETE", "/v1/cluster/voters/3") == "admin"
    assert needed_role("GET", "/uix") == "read"


def test_refusals_have_ksqldb_shapes_and_are_counted(tmp_path: Path) -> None:
    token, digest = new_token()
    path = tmp_path / "credentials.toml"
    _write(path, reader=("read", digest))
    metrics = Metrics()

    async def run() -> None:
        auth = HttpAuth(path, metrics, SECRET)
        assert await _ask(auth, "GET", "/healthcheck", None) == (None, None)
        status, (headers, body) = await _ask(auth, "POST", "/v1/query", None)
        assert status == 401 and body["error_code"] == 40100 and body["@type"] == "generic_error"
        assert (b"www-authenticate", b'Basic realm="hotstate", charset="UTF-8"') in headers
        assert (b"www-authenticate", b'Bearer realm="hotstate"') in headers
        assert await _ask(auth, "POST", "/v1/query", f"Bearer {token}".encode()) == (None, None)
        status, (_, body) = await _ask(auth, "POST", "/v1/tables", f"bearer {token}".encode())
        assert status == 403 and body["error_code"] == 40300
        assert body["message"] == "reader has the role read; POST /v1/tables needs admin"
        for wrong in (
            b"Bearer nope",
            _basic("alice", "wrong"),
            _basic("bob", "pw-alice"),
            b"Basic !!",
            b"Digest x",
        ):
            status, (_, body) = await _ask(auth, "GET", "/v1/lag", wrong)
            assert status == 401 and body["message"] == "wrong user name, password or token"
        assert await _ask(auth, "DELETE", "/v1/tables/t", _basic("alice", "pw-alice")) == (None, None)

    asyncio.run(run())
    assert _failures(metrics) == {"missing": 1.0, "bad_credentials": 5.0, "forbidden": 1.0}


def test_a_password_is_hashed_once_per_header_value(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "credentials.toml"
    _write(path)
    checks: list[str] = []
    matches = PasswordHash.matches

    def counting(self: PasswordHash, password: str) -> bool:
        checks.append(password)
        return matches(self, password)

    monkeypatch.setattr(PasswordHash, "matches", counting)

    async def run() -> None:
        auth = HttpAuth(path, Metrics(), SECRET)
        for _ in range(5):
            assert await _ask(auth, "GET", "/v1/lag", _basic("alice", "pw-alice")) == (None, None)
            assert (await _ask(auth, "GET", "/v1/lag", _basic("alice", "nope")))[0] == 401
            # An unknown user is hashed as well (a refusal's time does not say who exists).
            assert (await _ask(auth, "GET", "/v1/lag", _basic("mallory", "guess")))[0] == 401

    asyncio.run(run())
    assert checks == ["pw-alice", "nope", "guess"]


def test_the_servers_token_reads_and_cannot_administer(tmp_path: Path) -> None:
    path = tmp_path / "credentials.toml"
    _write(path)
    header = f"Bearer {server_token(SECRET)}".encode()

    async def run() -> None:
        auth = HttpAuth(path, Metrics(), SECRET)
        assert await _ask(auth, "GET", "/v1/rates", header) == (None, None)
        assert (await _ask(auth, "POST", "/v1/tables", header))[0] == 403
        other = HttpAuth(path, Metrics(), SECRET + "-other-cluster")
        assert (await _ask(other, "GET", "/v1/rates", header))[0] == 401

    asyncio.run(run())


def test_the_file_is_reloaded_and_a_broken_one_keeps_the_old_credentials(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first, first_hash = new_token()
    second, second_hash = new_token()
    path = tmp_path / "credentials.toml"
    _write(path, one=("read", first_hash))
    clock = Clock()

    async def run() -> None:
        auth = HttpAuth(path, Metrics(), SECRET, clock=clock)
        one, two = f"Bearer {first}".encode(), f"Bearer {second}".encode()
        assert await _ask(auth, "GET", "/info", one) == (None, None)
        _write(path, two=("admin", second_hash))
        clock.now += 0.5  # not looked at yet: at most once a second
        assert await _ask(auth, "GET", "/info", one) == (None, None)
        clock.now += 0.6
        assert (await _ask(auth, "GET", "/info", one))[0] == 401  # removed: the cache went with the file
        assert await _ask(auth, "POST", "/v1/tables", two) == (None, None)
        path.write_text(f'[tokens.two]\nrole = "read"\nsha256 = "{second_hash}"\n[users\n')
        os.utime(path, ns=(0, path.stat().st_mtime_ns + 2_000_000_000))
        clock.now += 1.1
        with caplog.at_level(logging.WARNING, logger="hotstate.server.http.auth"):
            assert await _ask(auth, "POST", "/v1/tables", two) == (None, None)  # still admin
            clock.now += 1.1
            assert await _ask(auth, "POST", "/v1/tables", two) == (None, None)
        reloads = [r.getMessage() for r in caplog.records if "not reloaded" in r.getMessage()]
        assert len(reloads) == 1 and "not valid TOML" in reloads[0]
        assert second_hash not in reloads[0]

    asyncio.run(run())


def test_a_server_does_not_start_with_a_file_it_cannot_use(tmp_path: Path) -> None:
    with pytest.raises(CredentialsError, match="cannot read"):
        HttpAuth(tmp_path / "missing.toml", Metrics(), SECRET)
    broken = tmp_path / "broken.toml"
    broken.write_text('[tokens.t]\nrole = "read"\nsha256 = "00"\n')
    with pytest.raises(CredentialsError, match=r"broken.toml: tokens.t.sha256 must be 64 hex digits"):
        HttpAuth(broken, Metrics(), SECRET)

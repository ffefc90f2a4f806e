"""Authentication and authorization on the HTTP API (`http.auth.credentials.file`; docs/security.md).

Every HTTP request but `/healthcheck` and the console's static page (`/ui`, `/ui/*`) must carry HTTP Basic
(a user of the credentials file) or a bearer token; `POST /v1/tables` and `DELETE /v1/tables/NAME` need
the `admin` role, and so do `POST /v1/cluster/voters` and `DELETE /v1/cluster/voters/ID`; everything else
`read`. Refusals have ksqlDB's shapes: 401 (error_code 40100, with
`WWW-Authenticate` for Basic and Bearer) and 403 (40300); each is counted in `/metrics` by reason
(`missing`, `bad_credentials`, `forbidden`). No password or token is ever logged.

A lookup pays one dict lookup for this: a verified `Authorization` header's bytes map to its principal
(cleared when the file changes). A password is checked with scrypt once per header value, on a worker
thread (at most two at a time, so a flood of guesses cannot take every core from the queries).

The servers call each other over HTTP for the console's `/v1/cluster/rates`, and the Spark sink reads
`/v1/tables`; they authenticate with a bearer token derived from `cluster.secret`
(protocol/cluster_token.py), read-only, logged as `cluster-server`. Heartbeats, lag reports and
forwarded partition queries go over RPC, which the cluster's HMAC handshake already authenticates, so
user-facing auth never touches them.

The file is re-read when its modification time, size or inode changes (looked at most once a second, at
a request); a file that no longer parses keeps the previous credentials and logs one line naming the
problem.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Final

import orjson

from hotstate.protocol.cluster_token import cluster_token
from hotstate.server.coordinator import CURRENT_USER
from hotstate.server.http.asgi import Scope, Send
from hotstate.server.http.credentials import (
    SCRYPT_N,
    SCRYPT_P,
    SCRYPT_R,
    SERVER_PRINCIPAL,
    Credentials,
    CredentialsError,
    HttpRole,
    PasswordHash,
    Principal,
    parse_credentials,
)
from hotstate.server.http.metrics import Metrics

log = logging.getLogger(__name__)

UNAUTHORIZED: Final = 40100  # ksqlDB's Errors.ERROR_CODE_UNAUTHORIZED
FORBIDDEN: Final = 40300  # ksqlDB's Errors.ERROR_CODE_FORBIDDEN
RELOAD_CHECK_S: Final = 1.0
MAX_CACHED: Final = 4096  # header values remembered (verified or refused); a flood of new ones clears it
MAX_HASHING: Final = 2  # scrypt checks running at once
LOG_EVERY_S: Final = 1.0  # at most one line about refused requests per second
OPEN_PATHS: Final = frozenset({"/healthcheck", "/ui"})
CHALLENGES: Final = [
    (b"www-authenticate", b'Basic realm="hotstate", charset="UTF-8"'),
    (b"www-authenticate", b'Bearer realm="hotstate"'),
]


def server_token(cluster_secret: str) -> str:
    """The bearer token servers of one cluster present to each other's HTTP API (never to users)."""
    return cluster_token(cluster_secret)


def _authorization(headers: Iterable[tuple[bytes, bytes]]) -> bytes | None:
    """The request's Authorization header (the first), None without one."""
    return next((value for name, value in headers if name == b"authorization"), None)


def needed_role(method: str, path: str) -> HttpRole | None:
    """What a request needs: None for the open paths."""
    if path in OPEN_PATHS or path.startswith("/ui/"):
        return None
    if (path == "/v1/tables" or path.startswith("/v1/tables/")) and method not in ("GET", "HEAD"):
        return "admin"
    if (
        path.startswith("/v1/servers/")
        or path == "/v1/cluster/voters"
        or path.startswith("/v1/cluster/voters/")
    ) and method not in ("GET", "HEAD"):
        return "admin"
    return "read"


def load_credentials(path: Path) -> Credentials:
    """The file's credentials; raises CredentialsError naming the file (OSError too becomes one)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise CredentialsError(f"{path}: cannot read: {error}") from None
    try:
        return parse_credentials(text)
    except CredentialsError as error:
        raise CredentialsError(f"{path}: {error}") from None


_NOBODY: Final = PasswordHash(SCRYPT_N, SCRYPT_R, SCRYPT_P, bytes(16), bytes(32))  # matches no password
_MISS: Final = Principal("", "read")  # not in the cache (a sentinel: never admitted)


class HttpAuth:
    """Admits or refuses each HTTP request (see the module's doc). Raises CredentialsError at
    construction when the file cannot be used: a server must not start open by mistake."""

    def __init__(
        self,
        path: Path,
        metrics: Metrics,
        cluster_secret: str,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._path = path
        self._clock = clock
        self._credentials = load_credentials(path)
        self._version = self._file_version()
        self._next_check = clock() + RELOAD_CHECK_S
        self._server_header = b"Bearer " + server_token(cluster_secret).encode()
        self._cache: dict[bytes, Principal | None] = {}
        self._seed()
        self._hashing = asyncio.Semaphore(MAX_HASHING)
        self._missing = metrics.auth_failures.labels("missing")
        self._bad = metrics.auth_failures.labels("bad_credentials")
        self._forbidden = metrics.auth_failures.labels("forbidden")
        self._logged_at = 0.0
        self._unlogged = 0

    def admitted_now(self, method: str, path: str, headers: Iterable[tuple[bytes, bytes]]) -> str | None:
        """The user a request runs as ("" for an open path), when it is admitted without a wait: its
        credentials were checked before (the cache) and allow it. None: `admit` decides (it refuses, or
        hashes a password first), so nothing is counted or logged here."""
        needed = needed_role(method, path)
        if needed is None:
            return ""
        if self._clock() >= self._next_check:
            return None
        header = _authorization(headers)
        principal = None if header is None else self._cache.get(header)
        if principal is None or not principal.may(needed):
            return None
        return principal.name

    async def admit(self, scope: Scope, send: Send) -> bool:
        """True when the request may go on; else the refusal has been sent."""
        needed = needed_role(scope["method"], scope["path"])
        if needed is None:
            return True
        if self._clock() >= self._next_check:
            self._reload_if_changed()
        header = _authorization(scope["headers"])
        if header is None:
            self._missing.inc()
            await _refuse(send, 401, UNAUTHORIZED, _MISSING_MESSAGE)
            return False
        principal = self._cache.get(header, _MISS)
        if principal is _MISS:
            credentials = self._credentials
            principal = await self._verify(credentials, header)
            if credentials is self._credentials:  # not reloaded meanwhile
                if len(self._cache) >= MAX_CACHED:
                    self._cache.clear()
                    self._seed()
                self._cache[header] = principal
        if principal is None:
            self._bad.inc()
            self._note(scope, f"wrong credentials ({_who(header)})")
            await _refuse(send, 401, UNAUTHORIZED, "wrong user name, password or token")
            return False
        if not principal.may(needed):
            self._forbidden.inc()
            message = (
                f"{principal.name} has the role {principal.role}; {scope['method']} {scope['path']} "
                f"needs {needed}"
            )
            self._note(scope, message)
            await _refuse(send, 403, FORBIDDEN, message)
            return False
        CURRENT_USER.set(principal.name)
        return True

    async def _verify(self, credentials: Credentials, header: bytes) -> Principal | None:
        scheme, _, value = header.partition(b" ")
        scheme = scheme.lower()
        value = value.strip()
        if scheme == b"bearer":
            try:
                return credentials.token(value.decode("ascii"))
            except UnicodeDecodeError:
                return None
        if scheme != b"basic":
            return None
        try:
            user_name, sep, password = base64.b64decode(value, validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return None
        if not sep:
            return None
        user = credentials.users.get(user_name)
        # An unknown user costs a hash too, so the time of a refusal does not tell which users exist.
        checked = _NOBODY if user is None else user.password
        async with self._hashing:
            ok = await asyncio.to_thread(checked.matches, password)
        return Principal(user.name, user.role) if ok and user is not None else None

    def _seed(self) -> None:
        self._cache[self._server_header] = Principal(SERVER_PRINCIPAL, "read")

    def _file_version(self) -> tuple[int, int, int] | None:
        try:
            stat = os.stat(self._path)
        except OSError:
            return None
        return stat.st_mtime_ns, stat.st_size, stat.st_ino

    def _reload_if_changed(self) -> None:
        self._next_check = self._clock() + RELOAD_CHECK_S
        version = self._file_version()
        if version == self._version:
            return
        self._version = version
        try:
            credentials = load_credentials(self._path)
        except CredentialsError as error:
            log.warning("credentials file not reloaded, the previous credentials stay: %s", error)
            return
        self._credentials = credentials
        self._cache.clear()
        self._seed()
        log.info(
            "credentials reloaded from %s: %d users, %d tokens",
            self._path,
            len(credentials.users),
            len(credentials.tokens),
        )

    def _note(self, scope: Scope, why: str) -> None:
        """One log line per second at most about refused requests (a flood must not flood the log)."""
        now = self._clock()
        if now - self._logged_at < LOG_EVERY_S:
            self._unlogged += 1
            return
        more = f" (and {self._unlogged} more refusals)" if self._unlogged else ""
        client = scope.get("client")
        source = f"{client[0]}:{client[1]}" if client else "?"
        log.warning("refused %s %s from %s: %s%s", scope["method"], scope["path"], source, why, more)
        self._logged_at, self._unlogged = now, 0


_MISSING_MESSAGE: Final = (
    "authentication required: send Authorization: Basic (user and password) or Bearer (a token)"
)


def _who(header: bytes) -> str:
    """The user name of a Basic header, or the scheme alone: never the password or the token."""
    scheme, _, value = header.partition(b" ")
    if scheme.lower() == b"basic":
        try:
            name = base64.b64decode(value.strip(), validate=True).decode("utf-8").partition(":")[0]
        except (binascii.Error, UnicodeDecodeError):
            return "malformed Basic credentials"
        return f"user {name[:64]!r}"
    if scheme.lower() == b"bearer":
        return "a bearer token"
    return f"scheme {scheme[:16].decode('latin-1')!r}"


async def _refuse(send: Send, status: int, code: int, message: str) -> None:
    body = orjson.dumps({"@type": "generic_error", "error_code": code, "message": message})
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers += CHALLENGES
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})

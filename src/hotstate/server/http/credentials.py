"""Who may use the HTTP API: the credentials file (users with scrypt password hashes, bearer tokens with
SHA-256 hashes, each with a role) parsed and checked, and what each role may do. Pure: the text of the
file in, a `Credentials` out; http/auth.py reads the file, reloads it and answers HTTP.

The file is TOML:

    [users.alice]
    password = "scrypt$16384$8$1$<salt, base64>$<hash, base64>"   # `hotstate auth hash-password`
    role = "admin"

    [tokens.dashboard]                                            # the name is what logs and errors show
    sha256 = "<64 hex digits>"                                    # `hotstate auth new-token`
    role = "read"

A password is hashed with scrypt (a slow, memory-hard KDF, in the standard library) and its own random
salt, so a stolen file does not give passwords away cheaply; a token is 32 random bytes, far beyond
guessing, so one SHA-256 is enough for it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import secrets
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final, Literal

HttpRole = Literal["read", "admin"]
ROLES: Final = ("read", "admin")
# scrypt's cost: N=2^14, r=8, p=1 is the usual interactive-login choice (16 MiB, ~50 ms on one core).
SCRYPT_N: Final = 2**14
SCRYPT_R: Final = 8
SCRYPT_P: Final = 1
SCRYPT_MAX_N: Final = 2**20  # a file asking for more would make every check a denial of service
SALT_BYTES: Final = 16
HASH_BYTES: Final = 32
TOKEN_BYTES: Final = 32
MAX_NAME_CHARS: Final = 128
# The name the servers' own HTTP calls to each other (the console's /v1/cluster/rates) are logged under.
SERVER_PRINCIPAL: Final = "cluster-server"


class CredentialsError(Exception):
    """A credentials file that cannot be used; the message names the entry and what is wrong (never a
    secret)."""


@dataclass(frozen=True, slots=True)
class Principal:
    """Who a request is: a user's or a token's name (or the cluster's servers), and its role."""

    name: str
    role: HttpRole

    def may(self, needed: HttpRole) -> bool:
        return needed == "read" or self.role == "admin"


@dataclass(frozen=True, slots=True)
class PasswordHash:
    n: int
    r: int
    p: int
    salt: bytes
    hash: bytes

    def matches(self, password: str) -> bool:
        """Runs scrypt: tens of milliseconds, so callers run it off the event loop."""
        return hmac.compare_digest(self.derive(password), self.hash)

    def derive(self, password: str) -> bytes:
        return hashlib.scrypt(
            password.encode(),
            salt=self.salt,
            n=self.n,
            r=self.r,
            p=self.p,
            maxmem=256 * self.n * self.r + 1024 * 1024,
            dklen=len(self.hash),
        )


@dataclass(frozen=True, slots=True)
class User:
    name: str
    password: PasswordHash
    role: HttpRole


@dataclass(frozen=True, slots=True)
class Credentials:
    users: Mapping[str, User]
    tokens: Mapping[bytes, Principal]  # SHA-256 of the token -> who presents it

    def token(self, token: str) -> Principal | None:
        return self.tokens.get(hashlib.sha256(token.encode()).digest())


def hash_password(password: str, *, salt: bytes | None = None, n: int = SCRYPT_N) -> str:
    """The `password` value of a user in the credentials file."""
    salt = secrets.token_bytes(SALT_BYTES) if salt is None else salt
    derived = PasswordHash(n, SCRYPT_R, SCRYPT_P, salt, bytes(HASH_BYTES)).derive(password)
    return f"scrypt${n}${SCRYPT_R}${SCRYPT_P}${_b64(salt)}${_b64(derived)}"


def new_token() -> tuple[str, str]:
    """A new bearer token and the `sha256` value that goes in the credentials file."""
    token = secrets.token_urlsafe(TOKEN_BYTES)
    return token, hashlib.sha256(token.encode()).hexdigest()


def parse_credentials(text: str) -> Credentials:
    """The credentials file's TOML text, checked entry by entry; raises CredentialsError."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise CredentialsError(f"not valid TOML: {error}") from None
    unknown = sorted(set(data) - {"users", "tokens"})
    if unknown:
        raise CredentialsError(f"unknown table(s) {unknown}: the file has [users.NAME] and [tokens.NAME]")
    users = {name: _user(name, entry) for name, entry in _entries(data, "users")}
    tokens: dict[bytes, Principal] = {}
    for name, entry in _entries(data, "tokens"):
        digest, role = _token(name, entry)
        if digest in tokens:
            raise CredentialsError(f"tokens.{name}: the same token as tokens.{tokens[digest].name}")
        tokens[digest] = Principal(name, role)
    return Credentials(users, tokens)


def _entries(data: Mapping[str, object], table: str) -> list[tuple[str, Mapping[str, object]]]:
    entries = data.get(table, {})
    if not isinstance(entries, dict):
        raise CredentialsError(f"{table} must be a table of [{table}.NAME] entries")
    out: list[tuple[str, Mapping[str, object]]] = []
    for name, entry in entries.items():
        if not 1 <= len(name) <= MAX_NAME_CHARS or not name.isprintable() or ":" in name:
            raise CredentialsError(
                f"{table}.{name!r}: a name is 1-{MAX_NAME_CHARS} printable characters without ':'"
            )
        if not isinstance(entry, dict):
            raise CredentialsError(f"{table}.{name}: must be a table with a role and a hash")
        out.append((name, entry))
    return out


def _role(where: str, entry: Mapping[str, object]) -> HttpRole:
    role = entry.get("role")
    if role == "read" or role == "admin":
        return role
    raise CredentialsError(f"{where}.role must be one of {', '.join(ROLES)}, not {role!r}")


def _known(where: str, entry: Mapping[str, object], fields: tuple[str, ...]) -> None:
    unknown = sorted(set(entry) - set(fields))
    if unknown:
        raise CredentialsError(f"{where}: unknown field(s) {unknown}; the fields are {', '.join(fields)}")


def _user(name: str, entry: Mapping[str, object]) -> User:
    where = f"users.{name}"
    _known(where, entry, ("password", "role"))
    role = _role(where, entry)
    text = entry.get("password")
    allowed = f"{where}.password must be scrypt$N$R$P$SALT$HASH, as `hotstate auth hash-password` writes"
    if not isinstance(text, str):
        raise CredentialsError(allowed)
    parts = text.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        raise CredentialsError(allowed)
    try:
        n, r, p = (int(part) for part in parts[1:4])
        salt, digest = _unb64(parts[4]), _unb64(parts[5])
    except (ValueError, binascii.Error):
        raise CredentialsError(allowed) from None
    if not (2 <= n <= SCRYPT_MAX_N and n & (n - 1) == 0 and 1 <= r <= 32 and 1 <= p <= 16):
        raise CredentialsError(
            f"{where}.password: N must be a power of 2 up to {SCRYPT_MAX_N}, R 1-32, P 1-16"
        )
    if len(salt) < 8 or len(digest) < 16:
        raise CredentialsError(f"{where}.password: the salt must be at least 8 bytes and the hash 16")
    return User(name, PasswordHash(n, r, p, salt, digest), role)


def _token(name: str, entry: Mapping[str, object]) -> tuple[bytes, HttpRole]:
    where = f"tokens.{name}"
    _known(where, entry, ("sha256", "role"))
    role = _role(where, entry)
    text = entry.get("sha256")
    try:
        digest = bytes.fromhex(text) if isinstance(text, str) else b""
    except ValueError:
        digest = b""
    if len(digest) != 32:
        raise CredentialsError(f"{where}.sha256 must be 64 hex digits, as `hotstate auth new-token` writes")
    return digest, role


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.b64decode(text + "=" * (-len(text) % 4), validate=True)

"""The credentials file (server/http/credentials.py): what parses, what is refused and how, and checking a
password or a token against it."""

from __future__ import annotations

import hashlib

import pytest

from hotstate.server.http.credentials import (
    CredentialsError,
    Principal,
    hash_password,
    new_token,
    parse_credentials,
)

FAST_N = 2**4  # scrypt's cost in tests: the format is the same, the work is not
USER = "[users.bob]\n"


def _file(password_hash: str, token_hash: str) -> str:
    return (
        f'[users.alice]\nrole = "admin"\npassword = "{password_hash}"\n\n'
        f'[tokens.dashboard]\nrole = "read"\nsha256 = "{token_hash}"\n'
    )


def test_a_password_and_a_token_are_checked_against_their_hashes() -> None:
    token, digest = new_token()
    credentials = parse_credentials(_file(hash_password("s3cret", n=FAST_N), digest))
    alice = credentials.users["alice"]
    assert alice.role == "admin"
    assert alice.password.matches("s3cret")
    assert not alice.password.matches("s3cret ")
    assert credentials.token(token) == Principal("dashboard", "read")
    assert credentials.token(token + "x") is None
    assert digest == hashlib.sha256(token.encode()).hexdigest()
    assert len(token) >= 40  # 32 random bytes


def test_each_hash_has_its_own_salt() -> None:
    assert hash_password("same", n=FAST_N) != hash_password("same", n=FAST_N)
    assert hash_password("same").startswith("scrypt$16384$8$1$")


def test_roles() -> None:
    assert Principal("r", "read").may("read") and not Principal("r", "read").may("admin")
    assert Principal("a", "admin").may("read") and Principal("a", "admin").may("admin")


@pytest.mark.parametrize(
    ("text", "names"),
    [
        ("[users", "not valid TOML"),
        ("[groups.x]\n", "unknown table(s) ['groups']"),
        (
            '[users.bob]\nrole = "root"\npassword = "x"\n',
            "users.bob.role must be one of read, admin, not 'root'",
        ),
        (
            '[users.bob]\nrole = "read"\npassword = "hunter2"\n',
            "users.bob.password must be scrypt$N$R$P$SALT$HASH",
        ),
        (
            '[users.bob]\nrole = "read"\npassword = "scrypt$3$8$1$AAAAAAAAAAA$AAAAAAAAAAAAAAAAAAAAAA"\n',
            "power of 2",
        ),
        ('[users.bob]\nrole = "read"\npasswd = "x"\n', "users.bob: unknown field(s) ['passwd']"),
        ('[tokens.t]\nrole = "read"\nsha256 = "abc"\n', "tokens.t.sha256 must be 64 hex digits"),
        ('[users."a:b"]\nrole = "read"\n', "a name is 1-128 printable characters without ':'"),
        ("users = 3\n", "users must be a table"),
    ],
)
def test_a_broken_file_is_refused_naming_the_entry(text: str, names: str) -> None:
    with pytest.raises(CredentialsError) as raised:
        parse_credentials(text)
    assert names in str(raised.value)


def test_a_token_listed_twice_is_refused() -> None:
    _, digest = new_token()
    text = (
        f'[tokens.a]\nrole = "read"\nsha256 = "{digest}"\n[tokens.b]\nrole = "admin"\nsha256 = "{digest}"\n'
    )
    with pytest.raises(CredentialsError, match=r"tokens\.b: the same token as tokens\.a"):
        parse_credentials(text)


def test_an_error_never_shows_the_hash() -> None:
    secret_hash = "scrypt$16384$8$1$c2FsdHNhbHQ$"  # cut short: invalid
    with pytest.raises(CredentialsError) as raised:
        parse_credentials(f'[users.bob]\nrole = "read"\npassword = "{secret_hash}"\n')
    assert "c2FsdHNhbHQ" not in str(raised.value)

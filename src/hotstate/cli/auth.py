"""`hotstate auth hash-password | new-token`: the values that go in the HTTP credentials file
(docs/security.md), printed as the TOML lines to paste."""

from __future__ import annotations

from typing import Annotated

import typer


def register(app: typer.Typer) -> None:
    """Add `auth hash-password` and `auth new-token` to the `hotstate` command."""
    auth_app = typer.Typer(help="Write entries of the HTTP credentials file.", no_args_is_help=True)
    app.add_typer(auth_app, name="auth")

    @auth_app.command("hash-password")
    def hash_password_command(
        user: Annotated[str, typer.Argument(help="the user's name")],
        role: Annotated[str, typer.Option("--role", help="read or admin")] = "read",
        password: Annotated[
            str | None,
            typer.Option(
                "--password",
                envvar="HOTSTATE_PASSWORD",
                help="the password; default: asked at the terminal, not echoed",
            ),
        ] = None,
    ) -> None:
        """Print a [users.USER] entry with the password's scrypt hash."""
        from hotstate.server.http.credentials import ROLES, hash_password

        if role not in ROLES:
            typer.echo(f"--role {role!r}: must be one of {', '.join(ROLES)}", err=True)
            raise typer.Exit(2)
        if password is None:
            password = typer.prompt("password", hide_input=True, confirmation_prompt=True)
        if not password:
            typer.echo("the password is empty", err=True)
            raise typer.Exit(2)
        typer.echo(f'[users.{_key(user)}]\nrole = "{role}"\npassword = "{hash_password(password)}"')

    @auth_app.command("new-token")
    def new_token_command(
        name: Annotated[str, typer.Argument(help="the token's name (shown in logs and refusals)")],
        role: Annotated[str, typer.Option("--role", help="read or admin")] = "read",
    ) -> None:
        """Make a bearer token: print it once (on stderr) and its [tokens.NAME] entry (on stdout)."""
        from hotstate.server.http.credentials import ROLES, new_token

        if role not in ROLES:
            typer.echo(f"--role {role!r}: must be one of {', '.join(ROLES)}", err=True)
            raise typer.Exit(2)
        token, digest = new_token()
        typer.echo(f"token (give it to its user; it is not stored): {token}", err=True)
        typer.echo(f'[tokens.{_key(name)}]\nrole = "{role}"\nsha256 = "{digest}"')


def _key(name: str) -> str:
    """A TOML key: bare when it can be, else quoted."""
    if name and all(c.isascii() and (c.isalnum() or c in "-_") for c in name):
        return name
    return '"' + name.replace("\\", "\\\\").replace('"', '\\"') + '"'

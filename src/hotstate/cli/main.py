"""The `hotstate` command. Sub-commands are added by the parts of the system that own them."""

from __future__ import annotations

import typer

from hotstate import __version__

app = typer.Typer(help="hotstate: highly available, queryable materialized tables for PySpark.", no_args_is_help=True)


@app.callback()
def _root() -> None:
    """hotstate: highly available, queryable materialized tables for PySpark."""


@app.command()
def version() -> None:
    """Print the hotstate version."""
    typer.echo(__version__)


def main() -> None:
    app()


if __name__ == "__main__":
    main()

"""The `hotstate` command."""

from __future__ import annotations

import asyncio
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from hotstate import __version__
from hotstate.cli import auth as auth_commands
from hotstate.cli import query as query_commands
from hotstate.cli import sql as sql_commands
from hotstate.cli import table as table_commands
from hotstate.cli import voters as voters_commands

if TYPE_CHECKING:
    from hotstate.cli.local_cluster import LocalCluster

app = typer.Typer(
    help="hotstate: highly available, queryable materialized tables for PySpark.", no_args_is_help=True
)
cluster_app = typer.Typer(
    help="A local cluster of combined-mode servers in one directory.", no_args_is_help=True
)
app.add_typer(cluster_app, name="cluster")
console = Console(width=shutil.get_terminal_size((130, 24)).columns)
DEFAULT_DIR = Path(".hotstate/cluster")
DirOption = Annotated[Path, typer.Option("--dir", help="where the cluster lives")]


@app.callback()
def _root() -> None:
    """hotstate: highly available, queryable materialized tables for PySpark."""


@app.command()
def version() -> None:
    """Print the hotstate version."""
    typer.echo(__version__)


@app.command(
    context_settings={"allow_extra_args": True, "ignore_unknown_options": True},
    help="Run one server. Settings come from --config FILE, HOTSTATE_* variables and --KEY=VALUE flags "
    "(flags win). SIGTERM shuts down in a controlled way. `hotstate server remove N --help`: remove a "
    "broker from the cluster for good.",
)
def server(
    ctx: typer.Context,
    config: Annotated[Path | None, typer.Option("--config", help="TOML configuration")] = None,
) -> None:
    if ctx.args[:1] == ["remove"]:
        from hotstate.cli.servers import remove_app

        # `server` runs a server and takes any --KEY=VALUE flag, so it cannot be a group: routed by hand.
        typer.main.get_command(remove_app(DEFAULT_DIR))(ctx.args, prog_name="hotstate server")
        return
    from hotstate.server.app import run_server
    from hotstate.server.config import ConfigError, load_config, parse_flag_overrides

    try:
        loaded = load_config(config, flags=parse_flag_overrides(ctx.args))
    except (ConfigError, OSError) as error:
        typer.echo(f"hotstate server: {error}", err=True)
        raise typer.Exit(2) from error
    run_server(loaded)


@cluster_app.command("up")
def cluster_up(
    servers: Annotated[int, typer.Option("--servers", "-n", help="how many combined-mode servers")] = 3,
    directory: DirOption = DEFAULT_DIR,
    base_port: Annotated[
        int, typer.Option("--base-port", help="first port (rpc, http alternate); 0: any")
    ] = 0,
    timeout: Annotated[float, typer.Option("--timeout", help="seconds to wait for the cluster")] = 30.0,
    tls: Annotated[
        bool,
        typer.Option(
            "--tls",
            help="make a CA and certificates in DIR/tls and use TLS for RPC and HTTP (docs/security.md)",
        ),
    ] = False,
    client_auth: Annotated[
        bool,
        typer.Option("--client-auth", help="with --tls: RPC clients must show a certificate from the CA"),
    ] = False,
    auth: Annotated[
        bool,
        typer.Option(
            "--auth",
            help="a new cluster only: turn on HTTP authentication with a user `admin` and a read-only "
            "token, both stored in DIR/cluster.json (the CLI uses the token)",
        ),
    ] = False,
) -> None:
    """Start N local servers (racks az-a, az-b, ...) and wait until every one is registered and unfenced."""
    from hotstate.cli.local_cluster import LocalCluster

    try:
        cluster = LocalCluster.load(directory)
        if len(cluster.servers) != servers:
            typer.echo(
                f"{directory} holds a cluster of {len(cluster.servers)} servers: "
                "use that number, or another --dir",
                err=True,
            )
            raise typer.Exit(2)
        if (tls or client_auth) and cluster.tls is None:
            typer.echo(f"{directory} holds a cluster without TLS: use another --dir for --tls", err=True)
            raise typer.Exit(2)
        if auth and cluster.auth is None:
            typer.echo(f"{directory} holds a cluster without --auth: use another --dir", err=True)
            raise typer.Exit(2)
    except FileNotFoundError:
        cluster = LocalCluster.create(
            directory, servers, base_port=base_port, tls=tls or client_auth, client_auth=client_auth
        )
        if auth:
            cluster.write_configs(http_auth_credentials_file=cluster.enable_auth())
        else:
            cluster.write_configs()
        cluster.save()
    cluster.start_all()
    try:
        asyncio.run(cluster.wait_ready(timeout))
    except TimeoutError as error:
        typer.echo(f"hotstate cluster up: {error}; see {directory}/server-*/server.log", err=True)
        raise typer.Exit(1) from error
    print_cluster_status(cluster)
    if cluster.auth is not None:
        console.print(
            f"HTTP authentication on: user {cluster.auth.admin_user!r} (admin) and a read-only token, "
            f"in {directory / 'cluster.json'} (HOTSTATE_USER/HOTSTATE_PASSWORD or HOTSTATE_TOKEN)",
            highlight=False,
        )


@cluster_app.command("down")
def cluster_down(
    directory: DirOption = DEFAULT_DIR,
) -> None:
    """Stop every server of the local cluster (SIGTERM: controlled shutdown)."""
    cluster = _load_cluster(directory)
    # The last voters must stay up while the others shut down, or no controller is left to move actives.
    for server in reversed(cluster.servers):
        clean = cluster.stop(server)
        console.print(f"server {server.node_id}: {'stopped' if clean else 'killed after timeout'}")
        server.pid = None
    cluster.save()


@cluster_app.command("status")
def cluster_status(
    directory: DirOption = DEFAULT_DIR,
) -> None:
    """Ask any live server of the local cluster for the cluster's state."""
    cluster = _load_cluster(directory)

    try:
        print_cluster_status(cluster)
    except Exception as error:
        typer.echo(f"hotstate cluster status: {error}", err=True)
        raise typer.Exit(1) from error


def _load_cluster(directory: Path) -> LocalCluster:
    from hotstate.cli.local_cluster import LocalCluster

    try:
        return LocalCluster.load(directory)
    except FileNotFoundError as error:
        typer.echo(str(error), err=True)
        raise typer.Exit(1) from error


def print_cluster_status(cluster: LocalCluster) -> None:
    asyncio.run(show_cluster_status(cluster))


async def show_cluster_status(cluster: LocalCluster) -> None:
    """One row per server: the cluster as the first live server sees it, plus each server's own offset."""
    from hotstate.protocol.cluster import DescribeClusterResponse

    async with cluster.admin(request_timeout_s=2.0) as admin:
        views = await admin.describe_each()
    answered = [v for v in views if isinstance(v, DescribeClusterResponse)]
    if not answered:
        raise RuntimeError(f"no server of the cluster in {cluster.root} answered: {views}")
    status = answered[0]
    offsets = {v.node_id: v.metadata_offset for v in answered}
    pids = {s.node_id: s.pid for s in cluster.servers}
    table = Table(title=f"hotstate cluster {cluster.cluster_id} (as server {status.node_id} sees it)")
    for column in (
        "id",
        "rack",
        "roles",
        "leader",
        "fenced",
        "metadata offset",
        "actives",
        "standbys",
        "rpc",
        "pid",
    ):
        table.add_column(column)
    for server in status.servers:
        table.add_row(
            str(server.node_id),
            server.rack or "",
            ",".join(server.roles),
            "yes" if server.node_id == status.leader_id else "",
            ("FENCED" if server.fenced else "no") + (", draining" if server.draining else ""),
            str(offsets[server.node_id]) if server.node_id in offsets else "down",
            str(server.actives),
            str(server.standbys),
            f"{server.rpc_host}:{server.rpc_port}",
            str(pids.get(server.node_id) or ""),
        )
    console.print(table)
    console.print(
        f"metadata: leader {status.leader_id}, epoch {status.epoch}, offset {status.metadata_offset}, "
        f"tables {len(status.tables)}"
    )
    if cluster.tls is not None:
        auth = ", client certificates required" if cluster.tls.client_auth else ""
        console.print(
            f"TLS on (RPC and HTTP{auth}); clients trust {cluster.tls.ca_file}",
            highlight=False,
            soft_wrap=True,
        )


query_commands.register(app, default_dir=DEFAULT_DIR)
sql_commands.register(app, default_dir=DEFAULT_DIR)
table_commands.register(app, default_dir=DEFAULT_DIR)
voters_commands.register(cluster_app, default_dir=DEFAULT_DIR)
auth_commands.register(app)


def main() -> None:
    if sys.argv[1:3] == ["server", "remove"]:  # here too, so that `server remove --help` is its own
        from hotstate.cli.servers import remove_app

        typer.main.get_command(remove_app(DEFAULT_DIR))(sys.argv[2:], prog_name="hotstate server")
        return
    app(args=sys.argv[1:])


if __name__ == "__main__":
    main()

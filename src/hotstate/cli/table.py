"""`hotstate table create | list | describe | drop | export | import`: table administration without Python.

The commands talk to the servers' RPC port with the admin client, so they need the cluster's id and
secret: `--cluster HOST:PORT` (repeatable or comma-separated; any subset of the servers, in any order),
`--cluster-id` and `--secret` (or HOTSTATE_CLUSTER, HOTSTATE_CLUSTER_ID, HOTSTATE_CLUSTER_SECRET, as the
Spark sink reads them), or else the local cluster in `--dir`. `describe` then reads placement, writer
racks and lags from the HTTP API of the servers the cluster names. Expected failures print one red line
and exit 1; a usage mistake exits 2; neither prints a traceback.
"""

from __future__ import annotations

import asyncio
import shutil
import ssl
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from hotstate.cli.query import AuthTokenOption, Credentials, PasswordOption, UserOption
from hotstate.controller.records import KEY_TYPE_NAMES, KeyColumn, TableTtl, key_type_named
from hotstate.protocol.ttl import parse_duration

if TYPE_CHECKING:
    from hotstate.client.admin import AdminClient
    from hotstate.client.query import Client

T = TypeVar("T")

# Module level: with postponed annotations, typer resolves these names in the module's globals.
ClusterOption = Annotated[
    list[str] | None,
    typer.Option(
        "--cluster",
        "-c",
        envvar="HOTSTATE_CLUSTER",
        help="HOST:PORT of a server's RPC port (repeat, or comma-separate; any subset of the servers); "
        "default: the local cluster in --dir",
    ),
]
ClusterIdOption = Annotated[
    str | None, typer.Option("--cluster-id", envvar="HOTSTATE_CLUSTER_ID", help="the cluster's id")
]
SecretOption = Annotated[
    str | None,
    typer.Option("--secret", envvar="HOTSTATE_CLUSTER_SECRET", help="the cluster's secret"),
]
DirOption = Annotated[Path, typer.Option("--dir", help="the local cluster to use when no --cluster")]
CaOption = Annotated[
    Path | None,
    typer.Option(
        "--ca",
        envvar="HOTSTATE_CLUSTER_CA",
        help="CA certificate (PEM) of a cluster that uses TLS (the local cluster's own without it)",
    ),
]
CertOption = Annotated[
    Path | None,
    typer.Option(
        "--cert",
        envvar="HOTSTATE_CLUSTER_CERT",
        help="client certificate (PEM), for servers with rpc.tls.client.auth=required; with --key",
    ),
]
KeyOption = Annotated[
    Path | None,
    typer.Option("--key-file", envvar="HOTSTATE_CLUSTER_KEY", help="the client certificate's key (PEM)"),
]


@dataclass(frozen=True, slots=True)
class Tls:
    """What the commands need for a cluster with TLS: the CA, and a client certificate if required."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None


@dataclass(frozen=True, slots=True)
class Target:
    servers: list[tuple[str, int]]
    cluster_id: str
    secret: str
    tls: Tls | None = None


def fail(message: str, code: int = 1) -> typer.Exit:
    Console(stderr=True, soft_wrap=True).print(f"[red]{escape(message)}[/red]")
    return typer.Exit(code)


def stdout() -> Console:
    # Made per command, not at import, so that output goes wherever sys.stdout is at the time.
    # Lines of text are not wrapped (scripts grep them); tables still fit the terminal.
    return Console(width=shutil.get_terminal_size((130, 24)).columns, soft_wrap=True)


def parse_key(specs: list[str]) -> tuple[KeyColumn, ...]:
    """`--key NAME:TYPE` (repeated for a compound key, in order) as key columns. Raises ValueError."""
    columns = []
    for spec in specs:
        name, sep, type_name = spec.rpartition(":")
        name, type_name = name.strip(), type_name.strip()
        if not sep or not name:
            raise ValueError(
                f"--key {spec!r}: expected NAME:TYPE, e.g. user:STRING (types: {KEY_TYPE_NAMES})"
            )
        # The SQL names `describe` and GET /v1/tables print, so that a key shown there can be typed back.
        key_type = key_type_named(type_name)
        if key_type is None:
            raise ValueError(f"--key {spec!r}: unknown type {type_name!r} (types: {KEY_TYPE_NAMES})")
        columns.append(KeyColumn(name, key_type))
    return tuple(columns)


def admin_target(
    cluster: list[str] | None,
    cluster_id: str | None,
    secret: str | None,
    directory: Path,
    ca: Path | None = None,
    cert: Path | None = None,
    key: Path | None = None,
) -> Target:
    if (cert is None) != (key is None):
        raise fail("--cert and --key-file go together (HOTSTATE_CLUSTER_CERT, HOTSTATE_CLUSTER_KEY)", 2)
    if cert is not None and ca is None and cluster:
        raise fail("--cert needs --ca (HOTSTATE_CLUSTER_CA): a client certificate is shown over TLS", 2)
    if cluster:
        from hotstate.spark.api import parse_cluster

        try:
            servers = list(parse_cluster(",".join(cluster)))
        except ValueError as error:
            raise fail(f"--{error}", 2) from error
        if not cluster_id or not secret:
            raise fail("--cluster needs --cluster-id and --secret (or HOTSTATE_CLUSTER_ID/_SECRET)", 2)
        return Target(servers, cluster_id, secret, Tls(ca, cert, key) if ca is not None else None)
    from hotstate.cli.local_cluster import LocalCluster

    try:
        local = LocalCluster.load(directory)
    except FileNotFoundError as error:
        raise fail(f"{error}; or name a server with --cluster HOST:PORT", 2) from error
    tls = Tls(ca, cert, key) if ca is not None else None
    if tls is None and local.tls is not None:
        own_cert, own_key = local.tls.client_files() if local.tls.client_auth else (None, None)
        tls = Tls(local.tls.ca_file, own_cert, own_key)
    return Target(local.addresses(), cluster_id or local.cluster_id, secret or local.secret, tls)


def _rpc_tls(target: Target) -> ssl.SSLContext | None:
    from hotstate.tls import TlsFilesError, client_context

    if target.tls is None:
        return None
    try:
        return client_context(ca_file=target.tls.ca, cert_file=target.tls.cert, key_file=target.tls.key)
    except TlsFilesError as error:
        raise fail(f"TLS: {error}", 2) from error


def run_admin(target: Target, work: Callable[[AdminClient], Awaitable[T]]) -> T:
    """`work` with an admin client of `target`; the client's failures as one line and exit 1."""
    from hotstate.client.admin import AdminClient, ClusterUnavailableError, OutcomeUnknownError

    tls = _rpc_tls(target)

    async def go() -> T:
        async with AdminClient(
            target.servers, cluster_id=target.cluster_id, secret=target.secret, tls=tls
        ) as admin:
            return await work(admin)

    try:
        return asyncio.run(go())
    except (ClusterUnavailableError, OutcomeUnknownError) as error:
        raise fail(str(error)) from error


def check_reply(action: str, reply: Any) -> None:
    """Exit with `action` and the reason when `reply` (a controller's or the quorum's answer, whose error
    enums both name success NONE) is a refusal."""
    if reply.error.name != "NONE":
        raise fail(f"{action}: {reply.message or reply.error.name}")


def register(app: typer.Typer, *, default_dir: Path) -> None:
    """Add `table create | list | describe | drop | export | import` to the `hotstate` command."""
    table_app = typer.Typer(help="Create, list, describe and drop tables.", no_args_is_help=True)
    app.add_typer(table_app, name="table")

    @table_app.command("create")
    def create(
        name: Annotated[str, typer.Argument(help="the table's name")],
        key: Annotated[
            list[str],
            typer.Option("--key", "-k", help="a key column NAME:TYPE, e.g. user:STRING (repeat, in order)"),
        ],
        partitions: Annotated[int, typer.Option("--partitions", "-p", help="how many partitions")] = 8,
        standby_replicas: Annotated[
            int | None,
            typer.Option(
                "--standby-replicas",
                help="standbys per partition (default: the server's num.standby.replicas)",
            ),
        ] = None,
        acceptable_lag: Annotated[
            int | None,
            typer.Option(
                "--acceptable-lag",
                "--acceptable-offset-lag",  # the anchors' name, acceptable.offset.lag
                help="most records a replica may be behind and still serve",
            ),
        ] = None,
        ttl: Annotated[
            str | None,
            typer.Option(
                "--ttl", help="rows expire this long after their --ttl-column (or last write), e.g. 7d"
            ),
        ] = None,
        ttl_column: Annotated[
            str | None,
            typer.Option(
                "--ttl-column",
                help="the TIMESTAMP column (key or value) the ttl counts from; default: each row's write",
            ),
        ] = None,
        cluster: ClusterOption = None,
        cluster_id: ClusterIdOption = None,
        secret: SecretOption = None,
        directory: DirOption = default_dir,
        ca: CaOption = None,
        cert: CertOption = None,
        key_file: KeyOption = None,
    ) -> None:
        """Create a table (the controller places its partitions at once)."""
        try:
            columns = parse_key(key)
            table_ttl = None if ttl is None else TableTtl(parse_duration(ttl), ttl_column)
        except ValueError as error:
            raise fail(str(error), 2) from error
        if ttl is None and ttl_column is not None:
            raise fail("--ttl-column needs --ttl (how long rows live), e.g. --ttl 7d", 2)
        target = admin_target(cluster, cluster_id, secret, directory, ca, cert, key_file)
        reply = run_admin(
            target,
            lambda admin: admin.create_table(
                name,
                partitions=partitions,
                standby_replicas=standby_replicas,
                key_columns=columns,
                acceptable_lag=acceptable_lag,
                ttl=table_ttl,
            ),
        )
        check_reply(f"cannot create table {name!r}", reply)
        standbys = (
            "standby replicas as the server's num.standby.replicas"
            if standby_replicas is None
            else f"{standby_replicas} standby replicas"
        )
        stdout().print(
            f"created table {escape(name)} (id {reply.table_id}): {partitions} partitions, "
            f"{standbys}, key {escape(_key_text(columns))}",
            highlight=False,
        )

    @table_app.command("list")
    def list_tables(
        cluster: ClusterOption = None,
        cluster_id: ClusterIdOption = None,
        secret: SecretOption = None,
        directory: DirOption = default_dir,
        ca: CaOption = None,
        cert: CertOption = None,
        key_file: KeyOption = None,
    ) -> None:
        """The tables' names, one a line."""
        reply = run_admin(
            admin_target(cluster, cluster_id, secret, directory, ca, cert, key_file),
            lambda admin: admin.list_tables(),
        )
        check_reply("cannot list tables", reply)
        for name in sorted(reply.tables):
            typer.echo(name)

    @table_app.command("describe")
    def describe(
        name: Annotated[str, typer.Argument(help="the table's name")],
        cluster: ClusterOption = None,
        cluster_id: ClusterIdOption = None,
        secret: SecretOption = None,
        directory: DirOption = default_dir,
        ca: CaOption = None,
        cert: CertOption = None,
        key_file: KeyOption = None,
        user: UserOption = None,
        password: PasswordOption = None,
        auth_token: AuthTokenOption = None,
    ) -> None:
        """A table's definition, writer racks and last Spark batch, then each partition's replicas and
        their lags."""
        credentials = Credentials(user, password, auth_token)
        target = admin_target(cluster, cluster_id, secret, directory, ca, cert, key_file)
        from hotstate.client.query import ClusterUnreachable, QueryFailed

        try:
            with _http_client(target, credentials, cluster, directory, 10.0) as client:
                tables = client.tables()
                lags = client.lags()
        except (QueryFailed, ClusterUnreachable) as error:
            raise fail(str(error)) from error
        found = next((t for t in tables if t.get("name") == name), None)
        if found is None:
            raise fail(f"no table {name!r} (tables: {', '.join(t['name'] for t in tables) or 'none'})")
        print_table(found, lags.get("lags", {}), stdout())

    @table_app.command("drop")
    def drop(
        name: Annotated[str, typer.Argument(help="the table's name")],
        cluster: ClusterOption = None,
        cluster_id: ClusterIdOption = None,
        secret: SecretOption = None,
        directory: DirOption = default_dir,
        ca: CaOption = None,
        cert: CertOption = None,
        key_file: KeyOption = None,
    ) -> None:
        """Delete a table and its rows on every server."""
        reply = run_admin(
            admin_target(cluster, cluster_id, secret, directory, ca, cert, key_file),
            lambda admin: admin.delete_table(name),
        )
        check_reply(f"cannot drop table {name!r}", reply)
        stdout().print(f"dropped table {escape(name)}", highlight=False)

    @table_app.command("export")
    def export(
        name: Annotated[str, typer.Argument(help="the table's name")],
        directory_out: Annotated[Path, typer.Argument(help="a directory to create: the export")],
        token: Annotated[
            str | None,
            typer.Option("--token", help="export at least at this consistency token (e.g. a writer's)"),
        ] = None,
        page_rows: Annotated[
            int,
            typer.Option(
                "--page-rows",
                min=1,
                max=100_000,
                help="rows per query; a partition read in one page is exact however fast it is written",
            ),
        ] = 100_000,
        cluster: ClusterOption = None,
        cluster_id: ClusterIdOption = None,
        secret: SecretOption = None,
        directory: DirOption = default_dir,
        ca: CaOption = None,
        cert: CertOption = None,
        key_file: KeyOption = None,
        user: UserOption = None,
        password: PasswordOption = None,
        auth_token: AuthTokenOption = None,
    ) -> None:
        """Write the table to a new directory as Parquet, every partition at one consistency token, with a
        manifest (docs/operations.md)."""
        from hotstate.client.backup import BackupError, export_table
        from hotstate.client.query import ClusterUnreachable, QueryFailed, Unavailable

        if directory_out.exists():
            raise fail(f"export directory {str(directory_out)!r} exists: name a new one")
        target = admin_target(cluster, cluster_id, secret, directory, ca, cert, key_file)
        credentials = Credentials(user, password, auth_token)
        try:
            with _http_client(target, credentials, cluster, directory, 30.0) as client:
                result = export_table(client, name, directory_out, token=token, page_rows=page_rows)
        except (BackupError, QueryFailed, ClusterUnreachable, Unavailable) as error:
            raise fail(f"cannot export table {name!r}: {error}") from error
        exactness = "exact at its token" if result.exact else "NOT exact: see positions_read in the manifest"
        stdout().print(
            f"exported table {escape(name)}: {result.rows} rows, "
            f"{result.manifest['partitions']} partitions, to {escape(str(directory_out))} ({exactness}); "
            f"token {result.token}",
            highlight=False,
        )

    @table_app.command("import")
    def import_(
        directory_in: Annotated[Path, typer.Argument(help="an export's directory")],
        table: Annotated[
            str | None, typer.Option("--table", "-t", help="load into this table (default: the export's)")
        ] = None,
        standby_replicas: Annotated[
            int | None,
            typer.Option(
                "--standby-replicas", help="standbys per partition of a table created (default: the export's)"
            ),
        ] = None,
        cluster: ClusterOption = None,
        cluster_id: ClusterIdOption = None,
        secret: SecretOption = None,
        directory: DirOption = default_dir,
        ca: CaOption = None,
        cert: CertOption = None,
        key_file: KeyOption = None,
        user: UserOption = None,
        password: PasswordOption = None,
        auth_token: AuthTokenOption = None,
    ) -> None:
        """Load an export into a table (created with the export's key, value columns and partitions when
        missing); everything is checked before anything is written."""
        from hotstate.client.backup import BackupError, plan_import, write_rows
        from hotstate.client.query import ClusterUnreachable, QueryFailed
        from hotstate.client.writer import TableWriter, WriteError

        target = admin_target(cluster, cluster_id, secret, directory, ca, cert, key_file)
        credentials = Credentials(user, password, auth_token)
        try:
            with _http_client(target, credentials, cluster, directory, 30.0) as client:
                existing = client.tables()
            plan = plan_import(directory_in, table, existing)
        except (BackupError, QueryFailed, ClusterUnreachable) as error:
            raise fail(f"cannot import {str(directory_in)!r}: {error}") from error
        exists = any(t.get("name") == plan.table for t in existing)
        standbys = standby_replicas
        if standbys is None:
            standbys = int(plan.manifest.get("standby_replicas") or 0)

        async def load(admin: AdminClient) -> str:
            if not exists:
                made = await admin.create_table(
                    plan.table,
                    partitions=plan.partitions,
                    standby_replicas=standbys,
                    key_columns=plan.key_columns,
                )
                check_reply(f"cannot create table {plan.table!r}", made)
            declared = await admin.set_value_columns(plan.table, plan.value_columns)
            check_reply(f"cannot declare the value columns of {plan.table!r}", declared)
            async with TableWriter(
                target.servers,
                plan.table,
                cluster_id=target.cluster_id,
                secret=target.secret,
                tls=_rpc_tls(target),
            ) as writer:
                try:
                    return await write_rows(writer, plan)
                except WriteError as error:
                    raise fail(f"import into {plan.table!r} failed: {error}") from error

        written = run_admin(target, load)
        stdout().print(
            f"imported {plan.rows} rows into table {escape(plan.table)} "
            f"({'existing' if exists else 'created'}); token {written}",
            highlight=False,
        )


def _http_addresses(target: Target) -> list[str]:
    status = run_admin(target, lambda admin: admin.describe())
    http = [f"{s.http_host}:{s.http_port}" for s in status.servers if s.http_host and s.http_port]
    if not http:
        raise fail("no server of the cluster has an HTTP API to read tables with")
    return http


def _http_client(
    target: Target,
    credentials: Credentials,
    cluster: list[str] | None,
    directory: Path,
    timeout_s: float,
) -> Client:
    """A client of the HTTP API of `target`'s cluster, at the addresses its servers advertise, trusting the
    CA its RPC port is reached with."""
    from hotstate.client.query import Client

    return Client(
        _http_addresses(target),
        timeout_s=timeout_s,
        tls=target.tls.ca if target.tls else None,
        **credentials.client_args(cluster, directory),
    )


def _key_text(columns: tuple[KeyColumn, ...]) -> str:
    return ", ".join(f"{c.name}:{c.type.name}" for c in columns)


def window_text(window: dict[str, Any]) -> str:
    """The window of GET /v1/tables, e.g. HOPPING size 10 min slide 5 min, of column window."""
    parts = [str(window["kind"])]
    for field in ("size", "slide", "retention"):
        micros = window.get(f"{field}_us")
        if micros is not None and (field != "slide" or window["kind"] == "HOPPING"):
            parts.append(f"{field} {_duration(int(micros))}")
    return f"{' '.join(parts)}, of column {window['column']} (key columns WINDOWSTART, WINDOWEND)"


def _duration(micros: int) -> str:
    for unit, size in (("d", 86_400_000_000), ("h", 3_600_000_000), ("min", 60_000_000)):
        if micros % size == 0:
            return f"{micros // size} {unit}"
    return f"{micros / 1_000_000:g} s"


def print_table(table: dict[str, Any], lags: dict[str, Any], console: Console) -> None:
    name = str(table["name"])
    key = ", ".join(f"{c['name']}:{c['type']}" for c in table.get("key_columns", ()))
    lag_limit = table.get("acceptable_lag")
    last_batch = table.get("last_batch")
    console.print(
        f"table {escape(name)}: key {escape(key)}; {table['partitions']} partitions, "
        f"{table['standby_replicas']} standby replicas; acceptable lag "
        f"{'unset' if lag_limit is None else lag_limit}; writer racks "
        f"{escape(', '.join(table.get('writer_racks', ())) or 'none')}; last batch "
        f"{'none' if last_batch is None else last_batch}",
        highlight=False,
    )
    values = ", ".join(f"{c['name']}:{c['type']}" for c in table.get("value_columns", ()))
    console.print(f"value columns: {escape(values) or 'not declared'}", highlight=False)
    window = table.get("window")
    if window:
        console.print(f"window: {escape(window_text(window))}", highlight=False)
    ttl = table.get("ttl")
    if ttl:
        since = f"column {ttl['column']}" if ttl.get("column") else "each row's last write"
        console.print(f"ttl: {escape(str(ttl['ttl']))} after {escape(since)}", highlight=False)
    view = Table(title=f"{name}: partitions")
    for column in ("partition", "active", "standbys", "warmups", "isr", "epoch", "lag per replica (records)"):
        view.add_column(column)
    for part in table.get("placement", ()):
        replicas = [part.get("active"), *part.get("standbys", ()), *part.get("warmups", ())]
        view.add_row(
            str(part["partition"]),
            "none" if part.get("active") is None else str(part["active"]),
            _nodes(part.get("standbys", ())),
            _nodes(part.get("warmups", ())),
            _nodes(part.get("isr", ())),
            str(part.get("leader_epoch", "")),
            "  ".join(
                f"{node}: {_lag(lags, node, name, part['partition'])}"
                for node in replicas
                if node is not None
            ),
        )
    console.print(view)


def _nodes(nodes: Any) -> str:
    return ", ".join(str(n) for n in nodes) or "-"


def _lag(lags: dict[str, Any], node: int, table: str, partition: int) -> str:
    lag = lags.get(str(node), {}).get(table, {}).get(str(partition))
    return "?" if lag is None else str(lag.get("offset_lag", "?"))

"""`hotstate query` and `hotstate status`: the query-serving view of a cluster, over its HTTP API.

Both talk to `--server HOST:PORT` (repeatable), or else to every server of the local cluster in `--dir`.
Expected failures (a refused query, no replica, no server) print one red line and exit 1; a usage
mistake exits 2; neither prints a traceback.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import signal
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from hotstate.client.query import Client, QueryResult

ServerOption = Annotated[
    list[str] | None,
    typer.Option(
        "--server",
        "-s",
        help="HOST:PORT or URL of a server's HTTP API (repeat for failover); "
        "default: every server of the local cluster in --dir",
    ),
]

# Module level: with postponed annotations, typer resolves these names in the module's globals.
DirOption = Annotated[Path, typer.Option("--dir", help="the local cluster to ask when no --server")]
CaOption = Annotated[
    Path | None,
    typer.Option(
        "--ca",
        envvar="HOTSTATE_CLUSTER_CA",
        help="CA certificate (PEM) of servers whose HTTP API uses TLS; HOST:PORT then means https "
        "(the local cluster's own CA is used without it)",
    ),
]
# HTTP authentication (docs/security.md). `--token` is the consistency token of `hotstate query`.
UserOption = Annotated[
    str | None, typer.Option("--user", envvar="HOTSTATE_USER", help="HTTP Basic user (with --password)")
]
PasswordOption = Annotated[
    str | None,
    typer.Option("--password", envvar="HOTSTATE_PASSWORD", help="HTTP Basic password (prefer the variable)"),
]
AuthTokenOption = Annotated[
    str | None,
    typer.Option(
        "--auth-token",
        envvar="HOTSTATE_TOKEN",
        help="a bearer token of the credentials file (prefer the variable); default, with no --server: the "
        "local cluster's reader token when it has one",
    ),
]


@dataclass(frozen=True)
class Credentials:
    """What the CLI authenticates with on the HTTP API, if anything."""

    user: str | None = None
    password: str | None = None
    token: str | None = None

    def client_args(self, servers: list[str] | None, directory: Path) -> dict[str, Any]:
        if self.user is not None or self.password is not None:
            if self.user is None or self.password is None:
                raise _fail("--user and --password go together (or HOTSTATE_USER and HOTSTATE_PASSWORD)", 2)
            if self.token is not None:
                raise _fail("give --user and --password, or --auth-token, not both", 2)
            return {"auth": (self.user, self.password)}
        if self.token is not None:
            return {"token": self.token}
        if not servers:  # the local cluster's own reader token, when it was started with --auth
            from hotstate.cli.local_cluster import LocalCluster

            with contextlib.suppress(FileNotFoundError):
                auth = LocalCluster.load(directory).auth
                if auth is not None:
                    return {"token": auth.reader_token}
        return {}


def _out() -> Console:
    # Made per command, not at import, so that output goes wherever sys.stdout is at the time.
    return Console(width=shutil.get_terminal_size((130, 24)).columns)


def _fail(message: str, code: int = 1) -> typer.Exit:
    Console(stderr=True, soft_wrap=True).print(f"[red]{escape(message)}[/red]")
    return typer.Exit(code)


def _servers(servers: list[str] | None, directory: Path, ca: Path | None) -> tuple[list[str], Path | None]:
    """The addresses to ask and the CA to trust (None: no TLS)."""
    if servers:
        return servers, ca
    from hotstate.cli.local_cluster import LocalCluster

    try:
        cluster = LocalCluster.load(directory)
    except FileNotFoundError as error:
        raise _fail(f"{error}; or name a server with --server HOST:PORT", 2) from error
    return cluster.http_addresses(), ca or (cluster.tls.ca_file if cluster.tls is not None else None)


@contextmanager
def _client(
    servers: list[str] | None,
    directory: Path,
    timeout_s: float,
    ca: Path | None = None,
    credentials: Credentials | None = None,
) -> Iterator[Client]:
    from hotstate.client.query import Client, ClusterUnreachable, QueryFailed
    from hotstate.tls import TlsFilesError

    try:
        addresses, trusted = _servers(servers, directory, ca)
        client = Client(
            addresses,
            timeout_s=timeout_s,
            tls=trusted,
            **(credentials or Credentials()).client_args(servers, directory),
        )
    except (ValueError, TlsFilesError) as error:
        raise _fail(f"--ca: {error}" if isinstance(error, TlsFilesError) else str(error), 2) from error
    try:
        with client:
            yield client
    except QueryFailed as error:
        raise _fail(error.message) from error
    except ClusterUnreachable as error:
        raise _fail(str(error)) from error


def register(app: typer.Typer, *, default_dir: Path) -> None:
    """Add `query` and `status` to the `hotstate` command."""

    @app.command("query")
    def query(
        sql: Annotated[str, typer.Argument(help="the pull query, e.g. \"SELECT * FROM t WHERE k = 'x'\"")],
        max_lag: Annotated[
            int | None,
            typer.Option("--max-lag", min=0, help="most records a serving replica may be behind"),
        ] = None,
        timeout_ms: Annotated[
            int | None, typer.Option("--timeout-ms", min=1, help="the server's time budget")
        ] = None,
        standby_reads: Annotated[
            bool, typer.Option("--standby-reads/--no-standby-reads", help="let standbys serve")
        ] = True,
        token: Annotated[
            str | None,
            typer.Option(
                "--token",
                help="a consistency token (from an earlier answer's, or a write's): read at least from there",
            ),
        ] = None,
        min_batch: Annotated[
            int | None,
            typer.Option(
                "--min-batch", min=0, help="see everything the table's Spark sink wrote up to this batch"
            ),
        ] = None,
        as_json: Annotated[bool, typer.Option("--json", help="print the /v1/query JSON")] = False,
        follow: Annotated[
            bool,
            typer.Option(
                "--follow",
                help="a push query: the current rows, then every change, one JSON line each, until "
                "interrupted (EMIT CHANGES is added when missing; --token resumes after a feed's token)",
            ),
        ] = False,
        server: ServerOption = None,
        directory: DirOption = default_dir,
        ca: CaOption = None,
        user: UserOption = None,
        password: PasswordOption = None,
        auth_token: AuthTokenOption = None,
    ) -> None:
        """Run a pull query: the rows, then which replica served each partition (--follow: a push query)."""
        # Long enough for the server's own timeout plus failover to each other server.
        credentials = Credentials(user, password, auth_token)
        if follow:
            with _client(server, directory, timeout_s=30.0, ca=ca, credentials=credentials) as client:
                _follow(sql, token, client)
            return
        with _client(server, directory, timeout_s=30.0, ca=ca, credentials=credentials) as client:
            result = client.query(
                sql,
                max_lag=max_lag,
                timeout_ms=timeout_ms,
                standby_reads=standby_reads,
                consistency_token=token,
                min_batch=min_batch,
            )
        if as_json:
            typer.echo(json.dumps(result.raw, indent=2))
        else:
            print_result(result, _out())

    @app.command("status")
    def status(
        server: ServerOption = None,
        directory: DirOption = default_dir,
        ca: CaOption = None,
        user: UserOption = None,
        password: PasswordOption = None,
        auth_token: AuthTokenOption = None,
    ) -> None:
        """Servers and their liveness, then each partition's active, standbys and replica lags.

        The query-serving view, as one server sees it; `hotstate cluster status` is the metadata quorum's.
        """
        credentials = Credentials(user, password, auth_token)
        with _client(server, directory, timeout_s=10.0, ca=ca, credentials=credentials) as client:
            servers = client.cluster_status()
            asked = client.last_server
            tables = client.tables()
        print_status(servers, tables, asked, _out())


def _follow(sql: str, token: str | None, client: Client) -> None:
    statement = sql.strip().rstrip(";")
    if not statement.upper().endswith("EMIT CHANGES"):
        statement += " EMIT CHANGES"
    subscription = client.subscribe(statement, from_token=token)

    def stop(signum: int, frame: FrameType | None) -> None:
        # Ctrl-C exits from here, with the token: raised inside httpx's streaming read, KeyboardInterrupt
        # could leave the stream unable to close, and the command hung (seen once in CI, 20 s after SIGINT).
        sys.stdout.flush()
        with contextlib.suppress(Exception):
            if subscription.token is not None:
                sys.stderr.write(json.dumps({"token": subscription.token}) + "\n")
        sys.stderr.flush()
        os._exit(0)

    signal.signal(signal.SIGINT, stop)
    try:
        for change in subscription:
            line: dict[str, object] = {"kind": change.kind, "partition": change.partition}
            line["key"] = list(change.key)
            if change.offset is not None:
                line["offset"] = change.offset
            line["row"] = change.row
            typer.echo(json.dumps(line, default=str))
    finally:
        subscription.close()
        if subscription.token is not None:  # where it was: --token resumes there
            typer.echo(json.dumps({"token": subscription.token}), err=True)
    if subscription.end_reason == "dropped":
        raise _fail("the table was dropped")


def print_result(result: QueryResult, console: Console) -> None:
    table = Table(title=f"{result.table} ({len(result.rows)} rows)")
    for column in result.columns:
        table.add_column(column)
    for row in result.rows:
        table.add_row(*(_cell(value) for value in row))
    console.print(table)
    for p in result.partitions:
        console.print(
            f"partition {p.partition}: served by {p.served_by} ({p.state}, lag {p.offset_lag})",
            highlight=False,
        )
    console.print(
        f"{len(result.rows)} rows in {result.took_ms:.1f} ms, answered by {escape(result.server)}",
        style="dim",
        highlight=False,
    )
    if result.consistency_token:
        console.print(f"consistency token: {result.consistency_token}", style="dim", highlight=False)


def _cell(value: Any) -> Text:
    # Text, not str: a value such as "[b]" is data, not rich markup.
    if value is None:
        return Text("null", style="dim")
    if isinstance(value, str):
        return Text(value)
    return Text(json.dumps(value))


def print_status(servers: dict[str, Any], tables: list[dict[str, Any]], asked: str, console: Console) -> None:
    by_id = {int(info["serverId"]): (address, info) for address, info in servers.items()}
    alive = {node: bool(info.get("hostAlive")) for node, (_, info) in by_id.items()}
    now_ms = time.time() * 1000
    view = Table(title=f"servers, as {asked} sees them")
    for column in ("id", "address", "rack", "alive", "last status update"):
        view.add_column(column)
    for node, (address, info) in sorted(by_id.items()):
        updated = int(info.get("lastStatusUpdateMs", now_ms))
        clock = dt.datetime.fromtimestamp(updated / 1000).strftime("%H:%M:%S.%f")[:-3]
        view.add_row(
            str(node),
            address,
            info.get("rack") or "",
            Text("yes") if alive[node] else Text("NO", style="red"),
            f"{clock} ({max(0.0, now_ms - updated) / 1000:.1f} s ago)",
        )
    console.print(view)
    if not tables:
        console.print("no tables")
        return
    placement = Table(title="partitions")
    for column in ("table", "partition", "active", "standbys", "lag per replica (records)"):
        placement.add_column(column)
    for table in tables:
        name = str(table["name"])
        for part in table.get("placement", ()):
            replicas = [part.get("active"), *part.get("standbys", ()), *part.get("warmups", ())]
            lags = "  ".join(
                f"{node}: {_lag(by_id, node, name, part['partition'])}"
                for node in replicas
                if node is not None
            )
            placement.add_row(
                name,
                str(part["partition"]),
                _node(part.get("active"), alive),
                ", ".join(_node(n, alive) for n in part.get("standbys", ())) or "-",
                lags,
            )
    console.print(placement)


def _node(node: int | None, alive: dict[int, bool]) -> str:
    if node is None:
        return "none"
    return str(node) if alive.get(node, False) else f"{node} (down)"


def _lag(by_id: dict[int, tuple[str, Any]], node: int, table: str, partition: int) -> str:
    entry = by_id.get(node)
    if entry is None:
        return "?"
    lags = entry[1].get("hostStoreLags", {}).get("stateStoreLags", {}).get(table, {})
    lag = lags.get("lagByPartition", {}).get(str(partition))
    return "?" if lag is None else str(lag.get("offsetLag", "?"))

"""`hotstate sql`: run a pipeline script (CREATE SOURCE ..., CREATE TABLE ... AS SELECT ...) on Spark.

The cluster is `--cluster HOST:PORT,...` with `--cluster-id` and `--secret` (or HOTSTATE_CLUSTER,
HOTSTATE_CLUSTER_ID, HOTSTATE_CLUSTER_SECRET), else the local cluster in `--dir`. A bad statement, a
Spark error or a failed query prints one red line naming the statement's line and exits 1; a usage
mistake exits 2; neither prints a traceback or a Java stack.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.markup import escape

if TYPE_CHECKING:
    from hotstate.spark.pipeline import Materialization
    from hotstate.spark.sqlfront import Pipeline

DirOption = Annotated[
    Path,
    typer.Option(
        "--dir", help="the local cluster to write to when no --cluster; checkpoints go in DIR/checkpoints"
    ),
]


def _out() -> Console:
    # soft_wrap: a line such as a checkpoint path is never broken.
    return Console(width=shutil.get_terminal_size((130, 24)).columns, highlight=False, soft_wrap=True)


def _fail(message: str, code: int = 1) -> typer.Exit:
    Console(stderr=True, soft_wrap=True).print(f"[red]{escape(message)}[/red]")
    return typer.Exit(code)


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def register(app: typer.Typer, *, default_dir: Path) -> None:
    """Add `sql` to the `hotstate` command."""

    @app.command("sql")
    def sql(
        file: Annotated[
            Path | None, typer.Option("--file", "-f", help="the pipeline script", dir_okay=False)
        ] = None,
        execute: Annotated[str | None, typer.Option("--execute", "-e", help="the pipeline, inline")] = None,
        directory: DirOption = default_dir,
        cluster: Annotated[
            str | None,
            typer.Option(
                "--cluster", envvar="HOTSTATE_CLUSTER", help="servers' RPC addresses: HOST:PORT,HOST:PORT"
            ),
        ] = None,
        cluster_id: Annotated[
            str | None, typer.Option("--cluster-id", envvar="HOTSTATE_CLUSTER_ID", help="with --cluster")
        ] = None,
        secret: Annotated[
            str | None, typer.Option("--secret", envvar="HOTSTATE_CLUSTER_SECRET", help="with --cluster")
        ] = None,
        master: Annotated[str, typer.Option("--master", help="Spark master")] = "local[2]",
        shuffle_partitions: Annotated[
            int,
            typer.Option(
                "--shuffle-partitions",
                min=1,
                help="spark.sql.shuffle.partitions of a new checkpoint (fixed in it afterwards)",
            ),
        ] = 4,
        checkpoints: Annotated[
            Path | None,
            typer.Option(
                "--checkpoints", help="a table's checkpoint is CHECKPOINTS/<table> unless checkpoint="
            ),
        ] = None,
        available_now: Annotated[
            bool,
            typer.Option("--available-now", help="process all the input there is now, then return"),
        ] = False,
        timeout_s: Annotated[
            float | None,
            typer.Option(
                "--timeout-s",
                min=0,
                help="with --available-now: fail if the input is not processed by then; else stop then",
            ),
        ] = None,
    ) -> None:
        """Run a pipeline script: CREATE SOURCE ... and CREATE TABLE ... AS SELECT ... statements.

        Each table's SELECT runs as Spark SQL over the sources; its rows are kept by the GROUP BY columns.

        Runs until Ctrl-C, or with --available-now until all the input there is now is processed.
        """
        from hotstate.spark.sqlfront import PipelineError, parse_script

        if (file is None) == (execute is None):
            raise _fail('give the pipeline with -f FILE or -e "SQL" (one of them)', 2)
        if file is not None:
            try:
                script = file.read_text()
            except (OSError, UnicodeDecodeError) as error:
                raise _fail(f"cannot read {file}: {error}", 2) from error
        else:
            assert execute is not None
            script = execute
        try:
            pipeline = parse_script(script)
        except PipelineError as error:
            raise _fail(_where(file, error)) from error
        servers, cluster_id, secret = _cluster(cluster, cluster_id, secret, directory)
        _run(
            pipeline,
            file=file,
            cluster=servers,
            cluster_id=cluster_id,
            secret=secret,
            master=master,
            shuffle_partitions=shuffle_partitions,
            checkpoints=checkpoints if checkpoints is not None else directory / "checkpoints",
            available_now=available_now,
            timeout_s=timeout_s,
        )


def _where(file: Path | None, error: Exception) -> str:
    return f"{file}: {error}" if file is not None else str(error)


def _cluster(
    cluster: str | None, cluster_id: str | None, secret: str | None, directory: Path
) -> tuple[str, str | None, str | None]:
    if cluster:
        from hotstate.spark.api import parse_cluster

        try:
            parse_cluster(cluster)
        except ValueError as error:
            raise _fail(f"--{error}", 2) from error
        return cluster, cluster_id, secret
    from hotstate.cli.local_cluster import LocalCluster

    try:
        local = LocalCluster.load(directory)
    except FileNotFoundError as error:
        raise _fail(
            f"{error} (start one with hotstate cluster up); or name the servers with "
            "--cluster HOST:PORT,... --cluster-id ID --secret S",
            2,
        ) from error
    if local.tls is not None and not os.environ.get("HOTSTATE_CLUSTER_CA"):
        # The sink takes the CA from the environment (materialize's default); say so rather than fail later.
        raise _fail(
            f"the cluster in {directory} uses TLS: set HOTSTATE_CLUSTER_CA={local.tls.ca_file}"
            + (
                " (its RPC port also requires client certificates, which the Spark sink cannot show yet)"
                if local.tls.client_auth
                else ""
            ),
            2,
        )
    servers = ",".join(f"{host}:{port}" for host, port in local.addresses())
    return servers, cluster_id or local.cluster_id, secret or local.secret


def _run(
    pipeline: Pipeline,
    *,
    file: Path | None,
    cluster: str,
    cluster_id: str | None,
    secret: str | None,
    master: str,
    shuffle_partitions: int,
    checkpoints: Path,
    available_now: bool,
    timeout_s: float | None,
) -> None:
    try:
        from hotstate.spark import pipeline as runner
        from hotstate.spark.sqlfront import PipelineError
    except ImportError as error:
        raise _fail(f"hotstate sql needs pyspark ({error}): pip install pyspark") from error

    out = _out()
    out.print(f"starting Spark ({escape(master)}) ...", style="dim")
    try:
        spark, owned = runner.build_session(master, shuffle_partitions)
    except Exception as error:
        raise _fail(f"cannot start Spark: {runner.spark_message(error)}") from error

    def started(item: Materialization) -> None:
        table = item.table
        lag = "" if table.acceptable_lag is None else f", acceptable_lag {table.acceptable_lag}"
        out.print(
            f"materializing {escape(table.name)} (line {table.statement.line}): key {', '.join(item.key)}; "
            f"{table.partitions} partitions, {table.standby_replicas} standby replicas{lag}; "
            f"checkpoint {escape(item.checkpoint)}"
        )

    previous = signal.getsignal(signal.SIGTERM)
    running: list[Materialization] = []
    try:
        signal.signal(signal.SIGTERM, _interrupt)
        running = runner.start_pipeline(
            spark,
            pipeline,
            cluster=cluster,
            cluster_id=cluster_id,
            secret=secret,
            checkpoints=checkpoints,
            available_now=available_now,
            on_start=started,
        )
        if not available_now:
            out.print("running; Ctrl-C stops", style="dim")
        runner.wait_pipeline(running, until_finished=available_now, timeout_s=timeout_s)
        for item in running:
            out.print(
                f"{escape(item.table.name)}: {'all input processed' if available_now else 'stopped'}, "
                f"{item.input_rows} input rows in {item.batches} batches"
            )
    except PipelineError as error:
        raise _fail(_where(file, error)) from error
    except KeyboardInterrupt:
        out.print(
            "stopping at the end of the running batches (Ctrl-C again: interrupt them) ...", style="dim"
        )
        runner.stop_all(running)
        out.print("stopped: " + ", ".join(item.table.name for item in running))
    finally:
        signal.signal(signal.SIGTERM, previous)
        runner.stop_all(running)
        if owned:
            spark.stop()

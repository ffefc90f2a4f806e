"""`hotstate table create | list | describe | drop` against real server processes (issue 16 part 3), and
its usage errors without any."""

from __future__ import annotations

import re
import time

import pytest
from typer.testing import CliRunner, Result

from hotstate.cli.main import app
from hotstate.cli.table import parse_key
from hotstate.client.writer import TableWriter
from hotstate.controller.records import KeyColumn, KeyType, ValueColumn

from .conftest import StartCluster

ROWS = [{"user": f"u{i}", "day": i % 3, "clicks": i} for i in range(20)]


def _clean_failure(result: Result, code: int, *texts: str) -> None:
    """Exit `code`, one line on stderr naming `texts`, nothing on stdout, no traceback."""
    assert result.exit_code == code, (result.exit_code, result.output)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.exception
    assert "Traceback" not in result.output and not result.stdout.strip(), result.output
    message = " ".join(result.stderr.split())  # rich may wrap a long line
    for text in texts:
        assert text in message, message


def test_table_commands_create_list_describe_and_drop(start_cluster: StartCluster) -> None:
    running = start_cluster(3)
    cluster = running.cluster
    at = ["--dir", str(cluster.root)]
    third = f"127.0.0.1:{cluster.servers[2].rpc_port}"
    # Any one server, with the id and secret from the environment (as the Spark sink reads them).
    env = {"HOTSTATE_CLUSTER_ID": cluster.cluster_id, "HOTSTATE_CLUSTER_SECRET": cluster.secret}
    runner = CliRunner()

    made = runner.invoke(
        app, ["table", "create", "clicks", "--key", "user:STRING", "--key", "day:int", "--partitions", "4",
              "--standby-replicas", "1", "--acceptable-lag", "50", *at]
    )  # fmt: skip
    assert made.exit_code == 0, made.output
    assert "created table clicks" in made.stdout and "key user:STRING, day:INT" in made.stdout
    other = runner.invoke(
        app, ["table", "create", "views", "-k", "page:STRING", "-p", "2", "--standby-replicas", "0",
              "--acceptable-offset-lag", "7", "--cluster", third], env=env
    )  # fmt: skip
    assert other.exit_code == 0, other.output
    # The anchors' name for a table's acceptable lag.
    views = runner.invoke(app, ["table", "describe", "views", "--cluster", third], env=env)
    assert "acceptable lag 7;" in " ".join(views.stdout.split()), views.output

    listed = runner.invoke(app, ["table", "list", "-c", third], env=env)
    assert listed.exit_code == 0 and listed.stdout.split() == ["clicks", "views"], listed.output

    async def write() -> None:
        async with TableWriter(
            cluster.addresses(), "clicks", cluster_id=cluster.cluster_id, secret=cluster.secret
        ) as writer:
            await writer.upsert(ROWS)
        async with cluster.admin() as admin:
            await admin.register_writer("clicks", "az-b")
            await admin.set_value_columns("clicks", (ValueColumn("clicks", "bigint"),))

    running.run(write())
    # Lags reach a server with the replicas' next reports: until every replica's is known.
    deadline = time.monotonic() + 15.0
    while True:
        shown = runner.invoke(app, ["table", "describe", "clicks", *at])
        assert shown.exit_code == 0, shown.output
        lags = re.findall(r"\b\d+: (\S+)", shown.stdout)
        if (len(lags) == 8 and "?" not in lags) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    text = " ".join(shown.stdout.split())
    for part in (
        "table clicks: key user:STRING, day:BIGINT; 4 partitions, 1 standby replicas",
        "acceptable lag 50",
        "writer racks az-b",
        "last batch none",
        "value columns: clicks:bigint",
    ):
        assert part in text, shown.stdout
    assert len(lags) == 8 and all(lag.isdigit() for lag in lags), shown.stdout  # 4 actives + 4 standbys
    assert re.search(r"│ 3 +│ [123] +│ [123] ", shown.stdout), shown.stdout  # partition 3: active, standby

    dropped = runner.invoke(app, ["table", "drop", "views", *at])
    assert dropped.exit_code == 0 and "dropped table views" in dropped.stdout, dropped.output
    listed = runner.invoke(app, ["table", "list", *at])
    assert listed.exit_code == 0 and listed.stdout.split() == ["clicks"], listed.output

    # The admin client's refusals, as one line each.
    again = runner.invoke(app, ["table", "create", "clicks", "-k", "user:STRING", *at])
    _clean_failure(again, 1, "cannot create table 'clicks'", "exists")
    _clean_failure(runner.invoke(app, ["table", "drop", "views", *at]), 1, "cannot drop table 'views'")
    _clean_failure(
        runner.invoke(app, ["table", "describe", "views", *at]), 1, "no table 'views'", "tables: clicks"
    )
    zero = runner.invoke(app, ["table", "create", "t0", "-k", "user:STRING", "--partitions", "0", *at])
    _clean_failure(zero, 1, "cannot create table 't0'", "partitions=0: must be 1..")
    bad_name = runner.invoke(app, ["table", "create", "no such", "-k", "user:STRING", *at])
    _clean_failure(bad_name, 1, "cannot create table 'no such'", "table name")


@pytest.mark.parametrize(
    ("args", "texts"),
    [
        (["create", "t", "--key", "user"], ["--key 'user': expected NAME:TYPE"]),
        (["create", "t", "--key", ":STRING"], ["expected NAME:TYPE"]),
        (["create", "t", "--key", "user:TEXT"], ["unknown type 'TEXT'", "STRING, INT"]),
        (["list", "--cluster", "nohost"], ["--cluster: 'nohost' is not host:port"]),
        (["list", "--cluster", "127.0.0.1:1"], ["--cluster needs --cluster-id and --secret"]),
        (["drop", "t", "--dir", "/nonexistent/cluster"], ["--cluster HOST:PORT"]),
    ],
)
def test_table_usage_mistakes_are_one_line_and_exit_2(args: list[str], texts: list[str]) -> None:
    result = CliRunner().invoke(
        app,
        ["table", *args],
        env=dict.fromkeys(("HOTSTATE_CLUSTER", "HOTSTATE_CLUSTER_ID", "HOTSTATE_CLUSTER_SECRET")),
    )
    _clean_failure(result, 2, *texts)


def test_parse_key_keeps_order_and_takes_any_case_and_sql_names() -> None:
    assert parse_key(["b:bytes", "a:Timestamp", "n:BIGINT", "x:double", "ok:BOOL"]) == (
        KeyColumn("b", KeyType.BYTES),
        KeyColumn("a", KeyType.TIMESTAMP),
        KeyColumn("n", KeyType.INT),  # the SQL names `describe` prints are taken back too
        KeyColumn("x", KeyType.FLOAT),
        KeyColumn("ok", KeyType.BOOL),
    )


def test_a_create_without_a_standby_count_takes_the_servers_num_standby_replicas(
    start_cluster: StartCluster,
) -> None:
    # 2, not the CLI's old default of 1: an explicit count sent by the CLI would show as 1.
    running = start_cluster(3, default_standby_replicas=2)
    cluster = running.cluster
    at = ["--dir", str(cluster.root)]
    runner = CliRunner()
    made = runner.invoke(app, ["table", "create", "clicks", "--key", "user:STRING", "-p", "2", *at])
    assert made.exit_code == 0, made.output
    assert "standby replicas as the server's num.standby.replicas" in " ".join(made.stdout.split())

    async def by_admin() -> None:
        async with cluster.admin() as admin:
            created = await admin.create_table(
                "views", partitions=2, key_columns=(KeyColumn("page", KeyType.STRING),)
            )
            assert created.table_id > 0, created
            explicit = await admin.create_table(
                "pages", partitions=2, standby_replicas=0, key_columns=(KeyColumn("page", KeyType.STRING),)
            )
            assert explicit.table_id > 0, explicit

    running.run(by_admin())
    for table, standbys in (("clicks", 2), ("views", 2), ("pages", 0)):
        shown = runner.invoke(app, ["table", "describe", table, *at])
        assert shown.exit_code == 0, shown.output
        assert f"2 partitions, {standbys} standby replicas" in " ".join(shown.stdout.split()), shown.output

"""A local cluster with TLS everywhere and HTTP authentication on (`hotstate cluster up --tls --client-auth
--auth`; clients query with a reader's token): writes, queries, table administration and the console's
server-to-server HTTPS calls work; a SIGKILLed server costs no query;
clients with the wrong CA, plain HTTP, plain RPC and an expired client certificate are refused, and so is
a server restarted with an expired certificate or one for another name, each with a message naming the
peer and what was wrong, while the other servers keep serving."""

from __future__ import annotations

import collections
import datetime as dt
import json
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from typer.testing import CliRunner

import hotstate
from hotstate.cli.certificates import CertificateAuthority
from hotstate.cli.local_cluster import LocalCluster
from hotstate.cli.main import app
from hotstate.client.admin import AdminClient, ClusterUnavailableError
from hotstate.client.query import ClusterUnreachable
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.tls import client_context

from .conftest import RunningCluster

HOTSTATE = [sys.executable, "-m", "hotstate.cli.main"]

KEY = (KeyColumn("user", KeyType.STRING),)
ROWS = [{"user": f"u{i}", "clicks": i} for i in range(20)]
EXPIRED = (dt.datetime(2020, 1, 1, tzinfo=dt.UTC), dt.datetime(2021, 1, 1, tzinfo=dt.UTC))


@pytest.fixture
def tls_cluster(tmp_path: Path) -> Iterator[RunningCluster]:
    """Three servers from `hotstate cluster up --tls --client-auth --auth` (HTTP authentication on too),
    killed however the test ends."""
    directory = tmp_path / "cluster"
    up = subprocess.run(
        [
            *HOTSTATE,
            "cluster",
            "up",
            "--tls",
            "--client-auth",
            "--auth",
            "--servers",
            "3",
            "--dir",
            str(directory),
        ],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    cluster = LocalCluster.load(directory) if (directory / "cluster.json").exists() else None
    try:
        assert up.returncode == 0, up.stderr
        assert cluster is not None and cluster.tls is not None and cluster.tls.client_auth
        assert cluster.auth is not None
        line = f"TLS on (RPC and HTTP, client certificates required); clients trust {cluster.tls.ca_file}"
        assert line in up.stdout.splitlines(), up.stdout
        yield RunningCluster(cluster)
    finally:
        if cluster is not None:
            for server in cluster.servers:
                cluster.signal(server, signal.SIGKILL)


def test_a_missing_certificate_stops_the_server_naming_it(tmp_path: Path) -> None:
    cluster = LocalCluster.create(tmp_path, 1, tls=True)
    cluster.write_configs()
    assert cluster.tls is not None
    cert, _ = cluster.tls.server_files(1)
    cert.unlink()
    config = cluster.servers[0].directory(tmp_path) / "server.toml"
    done = subprocess.run(
        [*HOTSTATE, "server", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip() == f"hotstate server: rpc.tls.*: certificate file '{cert}': no such file"


def test_tls_cluster_serves_everything_and_survives_a_kill_9_without_a_failed_query(
    tls_cluster: RunningCluster, tmp_path: Path
) -> None:
    running = tls_cluster
    cluster = running.cluster
    assert cluster.tls is not None and cluster.auth is not None
    ca = cluster.tls.ca_file
    token = cluster.auth.reader_token  # HTTP authentication is on as well: a reader's bearer token

    async def create_and_write() -> None:
        async with cluster.admin() as admin:
            created = await admin.create_table("clicks", partitions=6, standby_replicas=1, key_columns=KEY)
            assert created.table_id > 0, created
        async with cluster.writer("clicks") as writer:
            await writer.upsert(ROWS)

    running.run(create_and_write())
    urls = cluster.http_addresses()
    assert all(url.startswith("https://127.0.0.1:") for url in urls)
    with hotstate.Client(urls, tls=ca, token=token) as client:
        assert sorted(client.query("SELECT * FROM clicks").dicts(), key=lambda r: r["clicks"]) == ROWS
        placement = client.tables()[0]["placement"]

    # ksqlDB's streaming endpoint over HTTP/2 on TLS (ALPN h2), as ksqlDB's clients connect to a TLS server.
    with httpx.Client(http1=False, http2=True, verify=client_context(ca_file=ca), timeout=10) as h2:
        streamed = h2.post(
            f"{urls[0]}/query-stream",
            json={"sql": "SELECT * FROM clicks WHERE user = 'u3';"},
            headers={"Authorization": f"Bearer {token}"},
        )
    assert streamed.status_code == 200 and streamed.http_version == "HTTP/2", streamed.text
    assert [json.loads(line) for line in streamed.text.splitlines()][1:] == [["u3", 3]]

    # The CLI finds the CA (and the client certificate) in the local cluster's directory.
    runner = CliRunner()
    listed = runner.invoke(app, ["table", "list", "--dir", str(cluster.root)])
    assert listed.exit_code == 0 and listed.output.split() == ["clicks"], listed.output
    queried = runner.invoke(
        app, ["query", "SELECT clicks FROM clicks WHERE user = 'u3'", "--json", "--dir", str(cluster.root)]
    )
    assert queried.exit_code == 0 and '"rows"' in queried.output, queried.output

    # Server to server over HTTPS: every server's rates, gathered by one.
    verify = client_context(ca_file=ca)
    deadline = time.monotonic() + 10
    while True:
        rates = httpx.get(
            f"{urls[0]}/v1/cluster/rates", verify=verify, headers={"Authorization": f"Bearer {token}"}
        ).json()["rates"]
        if all(r["error"] is None for r in rates) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    assert [r["server"] for r in rates] == [1, 2, 3] and all(r["error"] is None for r in rates), rates

    # SIGKILL the server holding the most actives while a client queries without a pause.
    actives = collections.Counter(p["active"] for p in placement)
    victim = actives.most_common(1)[0][0]
    failures: list[str] = []
    answered = 0
    stop = threading.Event()

    def query_loop() -> None:
        nonlocal answered
        with hotstate.Client(urls, tls=ca, token=token, timeout_s=10.0) as client:
            while not stop.is_set():
                try:
                    result = client.query("SELECT * FROM clicks")
                    if len(result.rows) != len(ROWS):
                        failures.append(f"{len(result.rows)} rows")
                    answered += 1
                except Exception as error:
                    failures.append(f"{type(error).__name__}: {error}")

    def until(done: Callable[[], bool], what: str) -> None:
        deadline = time.monotonic() + 20
        while not done():
            assert time.monotonic() < deadline and not failures, (what, failures[:3])
            time.sleep(0.05)

    def moved() -> bool:
        tables = httpx.get(
            f"{survivor}/v1/tables", verify=verify, headers={"Authorization": f"Bearer {token}"}
        ).json()["tables"]
        return all(p["active"] not in (None, victim) for p in tables[0]["placement"])

    survivor = next(u for u, s in zip(urls, cluster.servers, strict=True) if s.node_id != victim)
    thread = threading.Thread(target=query_loop, daemon=True)
    thread.start()
    until(lambda: answered > 5, "queries before the kill")
    before = answered
    running.kill(victim)
    until(moved, f"the actives of server {victim} to move")
    after = answered
    until(lambda: answered > after + 10, "queries after the actives moved")
    stop.set()
    thread.join(15)
    assert failures == [] and before > 5 and answered > before + 10, (failures, before, answered)

    # Writes are routed to the new actives, over TLS.
    async def write_again() -> None:
        async with cluster.writer("clicks") as writer:
            await writer.upsert([{"user": "u0", "clicks": 100}], deadline_s=20)

    running.run(write_again())
    alive = [url for url, s in zip(urls, cluster.servers, strict=True) if s.node_id != victim]
    with hotstate.Client(alive, tls=ca, token=token) as client:
        assert client.query("SELECT clicks FROM clicks WHERE user = 'u0'").rows == [[100]]

    # -- refusals, each naming the server, with the servers serving throughout
    port = urls[0].rpartition(":")[2] if cluster.servers[0].node_id != victim else urls[1].rpartition(":")[2]
    target = f"https://127.0.0.1:{port}"
    other = CertificateAuthority.create(tmp_path / "other-ca")
    with (
        hotstate.Client([target], tls=other.files.cert_file, timeout_s=3) as stranger,
        pytest.raises(ClusterUnreachable) as untrusted,
    ):
        stranger.query("SELECT * FROM clicks")
    message = str(untrusted.value)
    assert f"TLS: certificate of 127.0.0.1:{port} refused: unable to get local issuer certificate" in message
    assert "unknown CA" in message and "certificate verify failed" in message

    with pytest.raises(httpx.TransportError):
        httpx.get(f"http://127.0.0.1:{port}/info", timeout=3)
    with (
        hotstate.Client([f"http://127.0.0.1:{port}"], timeout_s=3) as plain,
        pytest.raises(ClusterUnreachable, match="use https:// addresses and give the CA"),
    ):
        plain.query("SELECT * FROM clicks")
    with hotstate.Client([target], tls=ca, token=token) as client:
        assert len(client.query("SELECT * FROM clicks").rows) == len(ROWS)

    server = next(s for s in cluster.servers if s.node_id != victim)
    expired = CertificateAuthority.load(Path(cluster.tls.directory)).issue(
        tmp_path, "expired", ["client"], not_before=EXPIRED[0], not_after=EXPIRED[1]
    )

    async def refused_rpc() -> tuple[str, str]:
        rpc = [("127.0.0.1", server.rpc_port)]
        async with AdminClient(rpc, cluster_id=cluster.cluster_id, secret=cluster.secret) as plain_admin:
            with pytest.raises(ClusterUnavailableError) as plain_error:
                await plain_admin.list_tables(deadline_s=1.0)
        old = client_context(ca_file=ca, cert_file=expired.cert_file, key_file=expired.key_file)
        async with AdminClient(
            rpc, cluster_id=cluster.cluster_id, secret=cluster.secret, tls=old
        ) as old_admin:
            with pytest.raises(ClusterUnavailableError) as expired_error:
                await old_admin.list_tables(deadline_s=1.0)
        async with cluster.admin() as admin:
            assert "clicks" in (await admin.list_tables()).tables
        return str(plain_error.value), str(expired_error.value)

    plain_message, expired_message = running.run(refused_rpc())
    assert "if its rpc listener uses TLS, connect with TLS" in plain_message, plain_message
    assert "a client certificate from the cluster's CA may be required" in expired_message, expired_message
    log = (server.directory(cluster.root) / "server.log").read_text()
    assert "refused RPC connection from 127.0.0.1:" in log
    assert "the other end does not speak TLS (plain TCP?)" in log
    assert "certificate has expired (certificate verify failed)" in log

    # The victim comes back with a bad certificate of its own: clients and the other servers refuse it,
    # naming it and the reason, and the others keep serving.
    dead = running.server(victim)
    cert, key = cluster.tls.server_files(victim)
    authority = CertificateAuthority.load(Path(cluster.tls.directory))
    for hosts, bounds, expected in (
        (["127.0.0.1"], EXPIRED, "certificate has expired"),
        (["other.example"], (None, None), "IP address mismatch, certificate is not valid for '127.0.0.1'"),
    ):
        running.kill(victim)
        bad = authority.issue(
            tmp_path, f"bad-{len(hosts[0])}", hosts, not_before=bounds[0], not_after=bounds[1]
        )
        cert.write_bytes(bad.cert_file.read_bytes())
        key.write_bytes(bad.key_file.read_bytes())
        running.restart(victim)
        address = f"127.0.0.1:{dead.http_port}"
        message = ""
        deadline = time.monotonic() + 15
        while expected not in message and time.monotonic() < deadline:
            with hotstate.Client([f"https://{address}"], tls=ca, token=token, timeout_s=2) as client:
                try:
                    client.query("SELECT * FROM clicks")
                except ClusterUnreachable as error:
                    message = str(error)
            time.sleep(0.2)
        assert f"TLS: certificate of {address} refused: {expected} (certificate verify failed)" in message
        peer_log = server.directory(cluster.root) / "server.log"
        line = f"TLS: certificate of 127.0.0.1:{dead.rpc_port} refused: {expected}"
        while line not in peer_log.read_text() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert line in peer_log.read_text()
        with hotstate.Client(alive, tls=ca, token=token) as client:
            assert len(client.query("SELECT * FROM clicks").rows) == len(ROWS)

"""The cluster of docs/deploy.md, from its own files: 3 dedicated controllers and 2 brokers, each
`hotstate server --config deploy/config/<name>.toml` in a network namespace of its own with its own
address (hotstate.chaos's fabric), TLS with client certificates and HTTP authentication on, the secret
from HOTSTATE_CLUSTER_SECRET as the systemd unit and the compose file give it. Tables are created,
written and queried, and a broker is restarted (SIGTERM, start again: one step of a rolling restart)
while a writer keeps writing: no acknowledged write is lost and queries keep being answered.

What the test changes in each file, and nothing else (checked): the host names in `listeners` and
`controller.quorum.voters` become the namespace's address (the servers and the client resolve no
names here), and the paths under /etc/hotstate and /var/lib/hotstate move into the test's directory.
"""

from __future__ import annotations

import asyncio
import difflib
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import hotstate
from hotstate.chaos.netns import Fabric, in_namespace
from hotstate.cli.local_cluster import LocalAuth, LocalCluster, LocalServer, LocalTls
from hotstate.client.query import QueryFailed
from hotstate.controller.records import KeyColumn, KeyType
from hotstate.query import tokens as tokens_
from hotstate.server.http.credentials import hash_password, new_token

pytestmark = [pytest.mark.usefixtures("netns_available"), pytest.mark.xdist_group("deploy")]

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
SERVERS = {  # file name -> (node.id, rack) as the files say
    "controller-1": 1,
    "controller-2": 2,
    "controller-3": 3,
    "broker-1": 101,
    "broker-2": 102,
}
RACKS = {1: "az-a", 2: "az-b", 3: "az-c", 101: "az-a", 102: "az-b"}
KEY = (KeyColumn("user", KeyType.STRING),)
SECRET = "deploy-test-secret-0123456789abcdef"


def localize(text: str, addresses: dict[str, str], etc: Path, data: Path) -> str:
    """The shipped file as this test runs it: host names in listeners and voters -> addresses, and the
    /etc/hotstate and /var/lib/hotstate paths -> the test's directories."""
    out = text.replace('"/etc/hotstate/', f'"{etc}/').replace('"/var/lib/hotstate"', f'"{data}"')
    for name, address in addresses.items():
        out = re.sub(rf"(//|@){re.escape(name)}:", rf"\g<1>{address}:", out)
    return out


def changed_lines(before: str, after: str) -> list[str]:
    return [
        line[2:] for line in difflib.ndiff(before.splitlines(), after.splitlines()) if line.startswith("- ")
    ]


@pytest.fixture
def deployed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Fabric, LocalCluster]]:
    fabric = Fabric.build(RACKS)
    cluster: LocalCluster | None = None
    try:
        addresses = {name: fabric.address(node) for name, node in SERVERS.items()}
        etc = tmp_path / "etc"
        tls = etc / "tls"
        # The certificates as docs/deploy.md makes them, with the addresses as extra names.
        subprocess.run(
            [sys.executable, str(DEPLOY / "make-certs.py"), str(tls)]
            + [f"{name}={address}" for name, address in addresses.items()],
            check=True,
            capture_output=True,
            timeout=60,
        )
        password = "deploy-admin-password"
        token, digest = new_token()
        (etc / "credentials.toml").write_text(
            f'[users.admin]\nrole = "admin"\npassword = "{hash_password(password)}"\n\n'
            f'[tokens.reader]\nrole = "read"\nsha256 = "{digest}"\n'
        )
        servers = []
        for name, node in SERVERS.items():
            host = fabric.hosts[node]
            server = LocalServer(node, host.rack, 9092, 8080, host=host.address, netns=host.netns)
            directory = server.directory(tmp_path)
            directory.mkdir(parents=True)
            shipped = (DEPLOY / "config" / f"{name}.toml").read_text()
            local = localize(shipped, addresses, etc, directory / "data")
            changed = changed_lines(shipped, local)
            assert all(
                re.match(r'(listeners|"controller.quorum.voters"|"data.dir"|"(rpc|http)\.\S+\.file") =', line)
                for line in changed
            ), changed
            (directory / "server.toml").write_text(local)
            servers.append(server)
        cluster = LocalCluster(
            tmp_path,
            "hotstate-prod",
            SECRET,
            servers,
            LocalTls(str(tls), client_auth=True),
            LocalAuth(password, token),
        )
        # As the unit's EnvironmentFile and the compose file's environment give it.
        monkeypatch.setenv("HOTSTATE_CLUSTER_SECRET", SECRET)
        cluster.start_all()
        yield fabric, cluster
    finally:
        if cluster is not None:
            for server in cluster.servers:
                cluster.signal(server, signal.SIGKILL)
        fabric.close()


def _logs(cluster: LocalCluster) -> str:
    return "\n".join(
        f"--- {s.node_id}\n"
        + "\n".join((s.directory(cluster.root) / "server.log").read_text().splitlines()[-15:])
        for s in cluster.servers
        if (s.directory(cluster.root) / "server.log").exists()
    )


def test_the_documented_cluster_writes_queries_and_survives_a_rolling_restart(
    deployed: tuple[Fabric, LocalCluster],
) -> None:
    fabric, cluster = deployed
    assert cluster.tls is not None and cluster.auth is not None
    brokers = [s for s in cluster.servers if s.node_id > 100]
    urls = [f"https://{s.host}:{s.http_port}" for s in brokers]
    ca = str(cluster.tls.ca_file)
    token = cluster.auth.reader_token
    acked: dict[str, int] = {}
    restarted = brokers[0]

    async def main() -> None:
        try:
            view = await cluster.wait_ready(30.0)
        except TimeoutError:
            raise AssertionError(_logs(cluster)) from None
        assert {s.node_id for s in view.servers} == set(SERVERS.values())
        async with cluster.admin() as admin:
            await admin.create_table("clicks", partitions=4, standby_replicas=1, key_columns=KEY)
        async with cluster.writer("clicks") as writer:
            await writer.upsert([{"user": f"u{i}", "n": 0} for i in range(20)])
            acked.update({f"u{i}": 0 for i in range(20)})
            async with hotstate.AsyncClient(urls, tls=ca) as anonymous:
                with pytest.raises(QueryFailed, match="HTTP 401"):
                    await anonymous.query("SELECT * FROM clicks")
            async with hotstate.AsyncClient(urls, tls=ca, token=token) as client:
                rows = (await client.query("SELECT * FROM clicks")).dicts()
                assert {r["user"]: r["n"] for r in rows} == acked

                stop = asyncio.Event()
                queried = 0
                tokens: list[str] = []

                async def write() -> None:
                    n = 0
                    while not stop.is_set():
                        n += 1
                        batch = {f"u{i}": n for i in range(n % 4, 20, 4)}
                        result = await writer.upsert([{"user": u, "n": v} for u, v in batch.items()])
                        acked.update(batch)
                        tokens.append(result.consistency_token)

                async def query() -> None:
                    nonlocal queried
                    while not stop.is_set():
                        await client.query("SELECT * FROM clicks WHERE user = 'u1'")
                        queried += 1
                        await asyncio.sleep(0.05)

                load = asyncio.gather(write(), query())
                try:
                    # One step of a rolling restart: stop (controlled), start the same host again, wait
                    # until every server is back and unfenced before the next one would go.
                    assert await asyncio.to_thread(cluster.stop, restarted), _logs(cluster)
                    cluster.start(restarted)
                    await cluster.wait_ready(30.0)
                finally:
                    stop.set()
                    await load
                assert queried > 0 and tokens
                # Every acknowledged write's token together: the final read sees all of them.
                every = tokens_.encode(
                    tokens_.merge(*(tokens_.decode(t, None) for t in tokens)), tokens_.tag_of(tokens[0])
                )
                final = await client.query("SELECT * FROM clicks", consistency_token=every)
                assert {r["user"]: r["n"] for r in final.dicts()} == acked

    in_namespace(fabric.client_netns, main)

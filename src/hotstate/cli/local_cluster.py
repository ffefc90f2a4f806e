"""A cluster of local combined-mode servers in one directory: what `hotstate cluster up|down|status` run.

Layout of the directory:
    cluster.json            cluster id, secret, TLS (if on), and per server: id, rack, ports, pid; with
                            `--auth`, the admin's password and the reader's token (the operator's only)
    credentials.toml        with `--auth`: the servers' HTTP credentials file (hashes only)
    server-<id>/server.toml the server's configuration (written with render_toml)
    server-<id>/server.log  its output
    server-<id>/data/       its data directory
    tls/                    with --tls: ca.crt (what clients trust), server-<id>.crt/.key, client.crt/.key
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from hotstate.client.admin import AdminClient
from hotstate.client.writer import TableWriter
from hotstate.protocol.cluster import DescribeClusterResponse
from hotstate.server.config import Listener, ServerConfig, Voter, render_toml
from hotstate.tls import TlsFiles, client_context

RACKS = ("az-a", "az-b", "az-c", "az-d", "az-e")
STATE_FILE = "cluster.json"
CREDENTIALS_FILE = "credentials.toml"


@dataclass
class LocalServer:
    node_id: int
    rack: str
    rpc_port: int
    http_port: int
    pid: int | None = None
    # Where it listens, and the network namespace it runs in (`ip netns exec NETNS`): loopback and the
    # machine's own namespace by default; hotstate.chaos gives each server a namespace and an address.
    host: str = "127.0.0.1"
    netns: str | None = None

    def directory(self, root: Path) -> Path:
        return root / f"server-{self.node_id}"


@dataclass(frozen=True)
class LocalTls:
    """TLS of a local cluster: every listener uses it; `client_auth` makes RPC clients show a certificate."""

    directory: str  # absolute; holds the files named in the module docstring
    client_auth: bool = False

    @property
    def ca_file(self) -> Path:
        return Path(self.directory) / "ca.crt"

    def server_files(self, node_id: int) -> tuple[Path, Path]:
        return Path(self.directory) / f"server-{node_id}.crt", Path(self.directory) / f"server-{node_id}.key"

    def client_files(self) -> tuple[Path, Path]:
        return Path(self.directory) / "client.crt", Path(self.directory) / "client.key"

    def rpc_client(self) -> ssl.SSLContext:
        """What clients of the RPC port use: the CA, and the client certificate when it is required."""
        if not self.client_auth:
            return client_context(ca_file=self.ca_file)
        cert, key = self.client_files()
        return client_context(ca_file=self.ca_file, cert_file=cert, key_file=key)


@dataclass
class LocalAuth:
    """HTTP authentication of a local cluster (`hotstate cluster up --auth`): a user `admin` and a
    read-only token, in `credentials.toml` as hashes and here in the clear for the CLI and tests."""

    admin_password: str
    reader_token: str
    admin_user: str = "admin"
    credentials_file: str = CREDENTIALS_FILE


@dataclass
class LocalCluster:
    root: Path
    cluster_id: str
    secret: str
    servers: list[LocalServer]
    tls: LocalTls | None = None
    auth: LocalAuth | None = None

    def enable_auth(self) -> Path:
        """Writes the credentials file of a new admin password and reader token; returns its path (the
        `http_auth_credentials_file` of the servers' configs)."""
        from hotstate.server.http.credentials import hash_password, new_token

        password = secrets.token_urlsafe(18)
        token, token_hash = new_token()
        self.auth = LocalAuth(password, token)
        path = (self.root / CREDENTIALS_FILE).resolve()
        self.root.mkdir(parents=True, exist_ok=True)
        path.write_text(
            "# HTTP credentials of the local cluster (docs/security.md); the secrets are in cluster.json\n"
            f'[users.admin]\nrole = "admin"\npassword = "{hash_password(password)}"\n\n'
            f'[tokens.reader]\nrole = "read"\nsha256 = "{token_hash}"\n'
        )
        return path

    # ------------------------------------------------------------------ persistence
    def save(self) -> None:
        state: dict[str, object] = {
            "cluster_id": self.cluster_id,
            "secret": self.secret,
            "tls": None if self.tls is None else asdict(self.tls),
            "servers": [asdict(server) for server in self.servers],
        }
        if self.auth is not None:
            state["auth"] = asdict(self.auth)
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.root / (STATE_FILE + ".tmp")
        tmp.touch(mode=0o600)  # it holds the cluster's secret (and the admin's password)
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.root / STATE_FILE)

    @staticmethod
    def load(root: Path) -> LocalCluster:
        path = root / STATE_FILE
        if not path.exists():
            raise FileNotFoundError(
                f"no local cluster in {root} (no {STATE_FILE}); start one with `hotstate cluster up`"
            )
        state = json.loads(path.read_text())
        tls = state.get("tls")
        auth = state.get("auth")
        return LocalCluster(
            root,
            state["cluster_id"],
            state["secret"],
            [LocalServer(**server) for server in state["servers"]],
            LocalTls(**tls) if tls else None,
            LocalAuth(**auth) if auth else None,
        )

    @staticmethod
    def create(
        root: Path, count: int, *, base_port: int = 0, tls: bool = False, client_auth: bool = False
    ) -> LocalCluster:
        """`tls`: make a CA and certificates in root/tls and turn TLS on for every listener;
        `client_auth`: RPC clients must present a certificate too (rpc.tls.client.auth=required)."""
        if count < 1:
            raise ValueError(f"--servers {count}: a cluster needs at least one server")
        ports = free_ports(2 * count) if base_port == 0 else list(range(base_port, base_port + 2 * count))
        servers = [
            LocalServer(i + 1, RACKS[i % len(RACKS)], rpc_port=ports[2 * i], http_port=ports[2 * i + 1])
            for i in range(count)
        ]
        cluster = LocalCluster(root, f"local-{secrets.token_hex(4)}", secrets.token_hex(24), servers)
        if tls or client_auth:
            cluster.make_certificates(client_auth=client_auth)
        return cluster

    def make_certificates(self, *, client_auth: bool = False) -> None:
        """A new CA, one certificate per server (for the hosts its configuration names, and localhost)
        and one for clients; TLS is on for the configurations written from now on."""
        from hotstate.cli.certificates import CertificateAuthority  # cryptography: only when asked

        directory = (self.root / "tls").resolve()
        self.tls = LocalTls(str(directory), client_auth)
        ca = CertificateAuthority.create(directory, f"hotstate {self.cluster_id} CA")
        for server in self.servers:
            config = self.config_for(server)
            hosts = [config.rpc.host, *([config.http.host] if config.http else []), "localhost", "127.0.0.1"]
            usable = [host for host in hosts if host not in ("0.0.0.0", "::")]
            ca.issue(directory, f"server-{server.node_id}", usable)
        ca.issue(directory, "client", ["hotstate-client"])

    # ------------------------------------------------------------------ configuration
    def config_for(self, server: LocalServer, **overrides: object) -> ServerConfig:
        voters = tuple(Voter(s.node_id, s.host, s.rpc_port) for s in self.servers)
        fields: dict[str, object] = {
            "node_id": server.node_id,
            "process_roles": frozenset({"controller", "broker"}),
            "rpc": Listener("rpc", server.host, server.rpc_port),
            "http": Listener("http", server.host, server.http_port),
            "voters": voters,
            "data_dir": server.directory(self.root).resolve() / "data",
            "rack": server.rack,
            "cluster_id": self.cluster_id,
            "cluster_secret": self.secret,
        }
        if self.tls is not None:
            cert, key = self.tls.server_files(server.node_id)
            ca = self.tls.ca_file
            fields["rpc_tls"] = TlsFiles(cert, key, ca, "required" if self.tls.client_auth else "none")
            fields["http_tls"] = TlsFiles(cert, key, ca)
        fields.update(overrides)
        return ServerConfig(**fields)  # type: ignore[arg-type]

    def write_configs(self, **overrides: object) -> None:
        for server in self.servers:
            directory = server.directory(self.root)
            directory.mkdir(parents=True, exist_ok=True)
            (directory / "server.toml").write_text(render_toml(self.config_for(server, **overrides)))

    # ------------------------------------------------------------------ processes
    def start(self, server: LocalServer) -> None:
        directory = server.directory(self.root)
        prefix = ["ip", "netns", "exec", server.netns] if server.netns is not None else []
        with open(directory / "server.log", "ab") as out:
            process = subprocess.Popen(
                [
                    *prefix,  # `ip netns exec` execs the command: the pid is still the server's
                    sys.executable,
                    "-m",
                    "hotstate.cli.main",
                    "server",
                    "--config",
                    str(directory / "server.toml"),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,  # Ctrl-C in the terminal that ran `cluster up` does not reach them
            )
        server.pid = process.pid
        self.save()

    def start_all(self) -> None:
        for server in self.servers:
            if not self.alive(server):
                self.start(server)

    def alive(self, server: LocalServer) -> bool:
        if server.pid is None:
            return False
        try:
            pid, _ = os.waitpid(server.pid, os.WNOHANG)
            if pid == server.pid:
                return False
        except ChildProcessError:
            pass  # not our child (started by another `hotstate` process): ask the kernel
        try:
            os.kill(server.pid, 0)
        except ProcessLookupError:
            return False
        return _running(server.pid)

    def signal(self, server: LocalServer, signum: int) -> None:
        if server.pid is not None and self.alive(server):
            with contextlib.suppress(ProcessLookupError):
                os.kill(server.pid, signum)

    def stop(self, server: LocalServer, *, timeout_s: float = 20.0) -> bool:
        """SIGTERM (controlled shutdown), then SIGKILL after `timeout_s`. True when it stopped by itself."""
        self.signal(server, signal.SIGTERM)
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if not self.alive(server):
                return True
            time.sleep(0.05)
        self.signal(server, signal.SIGKILL)
        return False

    def addresses(self) -> list[tuple[str, int]]:
        return [(server.host, server.rpc_port) for server in self.servers]

    def http_addresses(self) -> list[str]:
        """The servers' HTTP API, as `hotstate.Client` takes them (https:// with TLS)."""
        scheme = "https" if self.tls is not None else "http"
        return [f"{scheme}://{server.host}:{server.http_port}" for server in self.servers]

    def rpc_tls(self) -> ssl.SSLContext | None:
        """What a client of the RPC port needs (AdminClient, TableWriter): None without TLS."""
        return None if self.tls is None else self.tls.rpc_client()

    def admin(self, **kwargs: float) -> AdminClient:
        return AdminClient(
            self.addresses(), cluster_id=self.cluster_id, secret=self.secret, tls=self.rpc_tls(), **kwargs
        )

    def writer(self, table: str, request_timeout_s: float = 10.0) -> TableWriter:
        """A TableWriter for `table` on this cluster (its servers, secret and TLS)."""
        return TableWriter(
            self.addresses(),
            table,
            cluster_id=self.cluster_id,
            secret=self.secret,
            request_timeout_s=request_timeout_s,
            tls=self.rpc_tls(),
        )

    async def wait_ready(
        self, timeout_s: float = 30.0, *, expect: int | None = None
    ) -> DescribeClusterResponse:
        """Until `expect` servers (default: all) answer for themselves, agree on one leader, and are
        registered and unfenced in the leader's view. (A server just restarted still looks unfenced in
        the others' images for a session timeout, so asking one server is not enough.)"""
        expect = len(self.servers) if expect is None else expect
        end = time.monotonic() + timeout_s
        last: object = None
        async with self.admin(request_timeout_s=1.0) as admin:
            while time.monotonic() < end:
                views = await admin.describe_each()
                last = views
                answered = [v for v in views if isinstance(v, DescribeClusterResponse)]
                leaders = {v.leader_id for v in answered}
                leader_view = next((v for v in answered if v.node_id == v.leader_id), None)
                if (
                    len(answered) >= expect
                    and len(leaders) == 1
                    and leader_view is not None
                    and sum(not s.fenced for s in leader_view.servers) >= expect
                ):
                    return leader_view
                await asyncio.sleep(0.1)
        raise TimeoutError(f"cluster in {self.root} not ready after {timeout_s:.0f} s (last status: {last})")


# Below Linux's default ephemeral range (32768-60999). A port the kernel hands out for bind(("", 0)) comes
# from that range, and so does the local port of every outgoing connection: between picking such a port
# and the server binding it, any connection on the machine could take it (seen in the test suite as a
# server dying with "address already in use").
PORT_RANGE = (20_000, 32_000)
# Ports handed out lately, by any process: two clusters created at the same moment (the test suite runs
# several at once) could both pick a port nothing listens on yet, and the second server to bind it died with
# "address already in use". A port handed out is held here until its server has surely bound it; after
# that the bind check alone tells.
RESERVATIONS = Path(tempfile.gettempdir()) / "hotstate-ports"
RESERVED_S = 60.0


def free_ports(count: int) -> list[int]:
    """`count` distinct ports that nothing listens on now and no other process was handed in the last
    RESERVED_S, drawn at random outside the ephemeral range."""
    rng = random.SystemRandom()
    ports: list[int] = []
    while len(ports) < count:
        port = rng.randrange(*PORT_RANGE)
        if port in ports:
            continue
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
        if _reserve(port):
            ports.append(port)
    return ports


def _reserve(port: int) -> bool:
    """Claim `port` for RESERVED_S against every process's `free_ports`; False if another holds it."""
    path = RESERVATIONS / str(port)
    try:
        RESERVATIONS.mkdir(exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            if time.time() - path.stat().st_mtime < RESERVED_S:
                return False
            path.unlink()  # an old claim: its server bound the port long ago, or never will
        os.close(os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644))
    except FileExistsError:
        return False  # claimed by another process a moment ago
    except OSError:
        return True  # no shared directory to claim it in (read-only /tmp): the bind check alone decides
    return True


def _running(pid: int) -> bool:
    """Whether any thread of process `pid` is still running. Not just its main thread: killed (or once its
    main thread has exited), the main thread turns zombie at once while other threads may still be
    finishing, e.g. a RocksDB flush, with the stores' lock files held; a server started again on the same
    data directory meanwhile cannot open its replicas (found by the chaos runs: a store of a killed
    server still locked)."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return True  # no /proc to ask: the kernel said it exists
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/stat") as stat:
                if stat.read().rsplit(")", 1)[-1].split()[0] not in ("Z", "X"):
                    return True
        except OSError:
            continue  # that thread is gone
    return False

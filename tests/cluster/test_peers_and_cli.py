"""Strangers on the RPC port, and the `hotstate cluster` commands end to end."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hotstate.cli.local_cluster import LocalCluster
from hotstate.protocol.cluster import DescribeClusterRequest
from hotstate.protocol.wire import MESSAGES
from hotstate.rpc import HandshakeError, PeerPool

from .conftest import RunningCluster, StartCluster


def _server_log(running: RunningCluster, node_id: int) -> str:
    return (running.server(node_id).directory(running.cluster.root) / "server.log").read_text()


@pytest.mark.parametrize(
    ("cluster_id", "secret", "reason"),
    [
        ("other-cluster", None, "cluster id 'other-cluster'"),
        (None, "a-wrong-secret-of-enough-length", "HMAC mismatch"),
    ],
)
def test_a_peer_of_another_cluster_or_with_a_wrong_secret_is_refused_and_logged(
    start_cluster: StartCluster, cluster_id: str | None, secret: str | None, reason: str
) -> None:
    running = start_cluster(1)
    cluster = running.cluster

    async def intrude() -> None:
        pool = PeerPool(99, cluster_id or cluster.cluster_id, secret or cluster.secret, MESSAGES)
        pool.update({1: ("127.0.0.1", cluster.servers[0].rpc_port)})
        try:
            with pytest.raises(HandshakeError):
                await pool.request(1, DescribeClusterRequest(), 2.0)
        finally:
            await pool.close()

    running.run(intrude())
    # The refusal reaches the intruder before the server has necessarily written its log line.
    deadline = time.monotonic() + 5.0
    while reason not in _server_log(running, 1) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert reason in _server_log(running, 1)
    running.status(5.0)  # still serving


def test_garbage_bytes_on_the_rpc_port_close_only_that_connection(start_cluster: StartCluster) -> None:
    running = start_cluster(1)
    port = running.cluster.servers[0].rpc_port
    for garbage in (
        b"\xff" * 64,
        b"\x00\x00\x00\x05hello",
        b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        b"\x7f\xff\xff\xff",
    ):
        with socket.create_connection(("127.0.0.1", port), timeout=2) as sock:
            sock.sendall(garbage)
            sock.settimeout(3)
            try:
                while sock.recv(4096):
                    pass  # the server may answer with an error frame, then it must close
            except TimeoutError:
                pytest.fail(f"the server kept a connection open after {garbage!r}")
            except ConnectionResetError:
                pass
    status = running.status(5.0)
    assert status.servers


def test_cluster_up_status_down(tmp_path: Path) -> None:
    directory = tmp_path / "cluster"
    command = [sys.executable, "-m", "hotstate.cli.main", "cluster"]
    try:
        up = subprocess.run(
            [*command, "up", "--dir", str(directory), "--servers", "3"],
            capture_output=True,
            text=True,
            timeout=90,
            check=False,
        )
        assert up.returncode == 0, up.stderr
        for text in ("az-a", "az-b", "az-c", "yes"):
            assert text in up.stdout
        status = subprocess.run(
            [*command, "status", "--dir", str(directory)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert status.returncode == 0, status.stderr
        assert "FENCED" not in status.stdout and "metadata: leader" in status.stdout
    finally:
        down = subprocess.run(
            [*command, "down", "--dir", str(directory)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert down.returncode == 0, down.stderr
    assert down.stdout.count("stopped") == 3, down.stdout
    cluster = LocalCluster.load(directory)
    assert not any(cluster.alive(server) for server in cluster.servers)


def test_cluster_status_without_a_cluster_says_so(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hotstate.cli.main", "cluster", "status", "--dir", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1 and "no local cluster" in done.stderr


def test_a_bad_server_config_exits_non_zero_naming_the_key(tmp_path: Path) -> None:
    config = tmp_path / "server.toml"
    config.write_text('"node.id" = "abc"\n')
    done = subprocess.run(
        [sys.executable, "-m", "hotstate.cli.main", "server", "--config", str(config)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "node.id='abc'" in done.stderr


def test_cluster_up_with_another_server_count_than_the_directory_holds_is_refused(tmp_path: Path) -> None:
    existing = LocalCluster.create(tmp_path, 3)
    existing.save()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "hotstate.cli.main",
            "cluster",
            "up",
            "--dir",
            str(tmp_path),
            "--servers",
            "5",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert "holds a cluster of 3 servers" in done.stderr

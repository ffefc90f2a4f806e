"""The local cluster (cli/local_cluster.py): its port choice, and when it counts a server process gone."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from hotstate.cli import local_cluster
from hotstate.cli.local_cluster import PORT_RANGE, LocalCluster, free_ports

# The main thread exits (pthread_exit) while another thread runs on until stdin closes: the process's main
# thread is a zombie, the process is not gone (its files, and their locks, are still held).
MAIN_THREAD_EXITS_FIRST = """
import ctypes, sys, threading
threading.Thread(target=sys.stdin.read).start()
ctypes.CDLL(None).pthread_exit(None)
"""


def _until(condition: Callable[[], bool], what: str, timeout_s: float = 10.0) -> None:
    """Poll a condition the kernel gives no event for (a thread's state in /proc), within a deadline."""
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_ports_are_distinct_free_and_outside_the_ephemeral_range() -> None:
    low, high = (int(n) for n in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    for _ in range(20):
        ports = free_ports(12)
        assert len(set(ports)) == 12
        for port in ports:
            assert PORT_RANGE[0] <= port < PORT_RANGE[1]
            assert not low <= port <= high  # never a port an outgoing connection could take meanwhile
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", port))


def test_a_port_handed_out_is_not_handed_out_again_until_its_claim_is_old(tmp_path: Path) -> None:
    """Two clusters created at once (the suite runs several) could pick the same free port, and the second
    server to bind it died: a claim in a directory every process shares keeps them apart."""
    first, second = free_ports(300), free_ports(300)
    assert not set(first) & set(second)
    port = first[0]
    assert not local_cluster._reserve(port)  # held
    claim = local_cluster.RESERVATIONS / str(port)
    old = time.time() - local_cluster.RESERVED_S - 1
    os.utime(claim, (old, old))
    assert local_cluster._reserve(port)  # an old claim is taken over
    assert not local_cluster._reserve(port)


def test_a_process_whose_main_thread_exited_is_alive_until_its_last_thread_is_gone(tmp_path: Path) -> None:
    cluster = LocalCluster.create(tmp_path, 1)
    server = cluster.servers[0]
    process = subprocess.Popen([sys.executable, "-c", MAIN_THREAD_EXITS_FIRST], stdin=subprocess.PIPE)
    server.pid = process.pid

    def main_thread_state() -> str:
        return Path(f"/proc/{process.pid}/stat").read_text().rsplit(")", 1)[-1].split()[0]

    try:
        _until(lambda: main_thread_state() == "Z", "the main thread to exit")
        assert cluster.alive(server)  # but a thread still runs
    finally:
        assert process.stdin is not None
        process.stdin.close()  # the last thread's read ends, and the process with it
    _until(lambda: not cluster.alive(server), "the process to be gone")
    process.wait(10)

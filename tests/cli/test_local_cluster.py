"""The local cluster's port choice (cli/local_cluster.py)."""

from __future__ import annotations

import socket
from pathlib import Path

from hotstate.cli.local_cluster import PORT_RANGE, free_ports


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

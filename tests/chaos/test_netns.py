"""The fabric for real: namespaces per server and rack, faults that cut, drop and slow real traffic,
rack uplink counters, and cleanup that leaves nothing behind (also after a failure, and after a run that
died without cleaning up)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hotstate.chaos import netns
from hotstate.chaos.netns import Fabric, in_namespace

pytestmark = pytest.mark.usefixtures("netns_available")

PORT = 7700
# Listens on PORT until killed: TCP echoes "ok" and drains; UDP counts datagrams into a file.
LISTENER = """
import os, socket, sys, threading
addr, count_file = sys.argv[1], sys.argv[2]
udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); udp.bind((addr, 7700))
tcp = socket.socket(); tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
tcp.bind((addr, 7700)); tcp.listen()
def serve():
    while True:
        conn, _ = tcp.accept()
        conn.sendall(b"ok")
        while conn.recv(65536):
            pass
        conn.close()
threading.Thread(target=serve, daemon=True).start()
# A loaded machine can leave this process behind the senders: a big buffer keeps the kernel from dropping
# datagrams the fault let through, and the count is written once per burst, not per datagram.
udp.setsockopt(socket.SOL_SOCKET, 33, 16 << 20)  # SO_RCVBUFFORCE (root): past rmem_max
received = 0
while True:
    udp.setblocking(True)
    udp.recv(100)
    received += 1
    udp.setblocking(False)
    try:
        while True:
            udp.recv(100)
            received += 1
    except BlockingIOError:
        pass
    open(count_file + ".new", "w").write(str(received))
    os.replace(count_file + ".new", count_file)  # a reader never sees the file empty
"""
CONNECT = """
import socket, sys, time
try:
    s = socket.create_connection((sys.argv[1], 7700), timeout=1.0)
    assert s.recv(2) == b"ok"
    s.settimeout(10.0)
    start = time.monotonic(); s.sendall(b"x" * int(sys.argv[2])); s.shutdown(socket.SHUT_WR); s.recv(1)
    print("ok %.3f" % (time.monotonic() - start))
except OSError as error:
    print("fail", error)
"""
SEND_UDP = """
import socket, sys, time
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for _ in range(int(sys.argv[2])):
    s.sendto(b"x", (sys.argv[1], 7700)); time.sleep(0.0005)
"""


@pytest.fixture
def fabric(tmp_path: Path) -> Iterator[Fabric]:
    built = Fabric.build({1: "az-a", 2: "az-b", 3: "az-c", 4: "az-a"})
    listeners = []
    for node, host in built.hosts.items():
        count = tmp_path / f"udp-{node}"
        listeners.append(
            subprocess.Popen(
                ["ip", "netns", "exec", host.netns, sys.executable, "-c", LISTENER, host.address, str(count)]
            )
        )
    time.sleep(0.5)
    built.counts = {node: tmp_path / f"udp-{node}" for node in built.hosts}  # type: ignore[attr-defined]
    yield built
    built.close()
    for listener in listeners:
        listener.wait(5)  # killed with its namespace


def connect(fabric: Fabric, src: int, dst: int, nbytes: int = 0) -> str:
    return fabric.sh(
        fabric.hosts[src].netns, sys.executable, "-c", CONNECT, fabric.address(dst), str(nbytes)
    ).strip()


def settled_count(path: Path, quiet_s: float = 0.3, timeout_s: float = 10.0) -> int:
    """A listener's datagram count once it has stopped growing (a loaded machine delivers late)."""
    end = time.monotonic() + timeout_s
    last, since = -1, time.monotonic()
    while time.monotonic() < end:
        now = int(path.read_text()) if path.exists() else 0
        if now != last:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= quiet_s:
            break
        time.sleep(0.05)
    return last


def ours() -> list[str]:
    return [n for n in netns.namespaces() if n.startswith(f"{netns.PREFIX}{os.getpid()}-")]


def test_every_server_reaches_every_other_and_the_client_reaches_all(fabric: Fabric) -> None:
    for a in fabric.hosts:
        for b in fabric.hosts:
            if a != b:
                assert connect(fabric, a, b).startswith("ok"), (a, b)

    async def from_client() -> list[str]:
        import asyncio

        out = []
        for node in sorted(fabric.hosts):
            _, writer = await asyncio.wait_for(asyncio.open_connection(fabric.address(node), PORT), 2.0)
            writer.close()
            out.append(fabric.address(node))
        return out

    assert in_namespace(fabric.client_netns, from_client) == [fabric.address(n) for n in sorted(fabric.hosts)]
    # The machine's own namespace has no route to the fabric's addresses.
    assert "10.213." not in subprocess.run(["ip", "route"], capture_output=True, text=True).stdout


def test_a_partition_cuts_both_ways_and_heals(fabric: Fabric) -> None:
    fabric.partition([1])
    assert connect(fabric, 1, 2).startswith("fail") and connect(fabric, 3, 1).startswith("fail")
    assert connect(fabric, 2, 3).startswith("ok") and connect(fabric, 4, 2).startswith("ok")
    fabric.heal()
    assert fabric.faults() == {}
    assert connect(fabric, 1, 2).startswith("ok") and connect(fabric, 3, 1).startswith("ok")


def test_a_one_way_block_drops_only_one_direction(fabric: Fabric) -> None:
    fabric.block([1], [2])
    sends = 200
    fabric.sh(fabric.hosts[1].netns, sys.executable, "-c", SEND_UDP, fabric.address(2), str(sends))
    fabric.sh(fabric.hosts[2].netns, sys.executable, "-c", SEND_UDP, fabric.address(1), str(sends))
    counts = fabric.counts  # type: ignore[attr-defined]
    assert settled_count(counts[1]) == sends  # everything from 2 arrived at 1
    assert not counts[2].exists()  # nothing from 1 arrived at 2


def test_a_lossy_link_drops_about_the_fraction_asked(fabric: Fabric) -> None:
    fabric.drop(1, 3, 50)
    sends = 1000
    fabric.sh(fabric.hosts[1].netns, sys.executable, "-c", SEND_UDP, fabric.address(3), str(sends))
    fabric.sh(fabric.hosts[2].netns, sys.executable, "-c", SEND_UDP, fabric.address(3), str(sends))
    received = settled_count(fabric.counts[3])  # type: ignore[attr-defined]
    # 1000 from server 2 (not on the lossy link) plus about half of server 1's (binomial: +-5 sigma ~ 80).
    assert sends + 400 < received < sends + 600, received


def test_a_slow_link_is_slow_and_rack_uplinks_count_bytes(fabric: Fabric) -> None:
    before = fabric.rack_bytes()
    fast = float(connect(fabric, 1, 2, 200_000).split()[1])
    after = fabric.rack_bytes()
    # 200 kB from az-a (server 1) to az-b (server 2) crossed az-a's uplink out and az-b's in.
    assert after["az-a"]["out"] - before["az-a"]["out"] >= 200_000
    assert after["az-b"]["in"] - before["az-b"]["in"] >= 200_000
    assert after["az-c"]["in"] - before["az-c"]["in"] < 10_000
    fabric.slow(1, "1mbit")
    slow = float(connect(fabric, 1, 2, 200_000).split()[1])
    assert slow > 1.2 > fast, (fast, slow)  # 200 kB at 125 kB/s takes 1.6 s
    fabric.heal()
    assert float(connect(fabric, 1, 2, 200_000).split()[1]) < 1.0


def test_a_rack_rate_limits_traffic_between_racks_only() -> None:
    with Fabric.build({1: "az-a", 2: "az-b", 3: "az-a"}, rack_rate="1mbit") as fabric:
        listeners = [
            subprocess.Popen(
                ["ip", "netns", "exec", h.netns, sys.executable, "-c", LISTENER, h.address, "/dev/null"]
            )
            for h in fabric.hosts.values()
        ]
        time.sleep(0.5)
        across = float(connect(fabric, 1, 2, 200_000).split()[1])
        within = float(connect(fabric, 1, 3, 200_000).split()[1])
        assert across > 1.2 > 0.5 > within, (across, within)
    for listener in listeners:
        listener.wait(5)
    assert ours() == []


def test_cleanup_removes_every_namespace_also_when_the_build_or_the_test_fails() -> None:
    with pytest.raises(RuntimeError, match="boom"), Fabric.build({1: "az-a", 2: "az-b"}) as fabric:
        assert len(ours()) == 1 + 2 + 2 + 1  # core, racks, servers, client
        subprocess.Popen(["ip", "netns", "exec", fabric.hosts[1].netns, "sleep", "600"])
        raise RuntimeError("boom")
    assert ours() == []
    with pytest.raises(ValueError, match="node ids must be 1-200"):
        Fabric.build({0: "az-a"})
    assert ours() == []


def test_leftovers_of_a_run_that_died_are_swept_and_a_live_runs_are_not() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    stale = f"{netns.PREFIX}{dead.pid}-s1"
    live = f"{netns.PREFIX}{os.getppid()}-s1"  # our parent is alive
    for name in (stale, live):
        netns.run(["ip", "netns", "add", name])
    sleeper = subprocess.Popen(["ip", "netns", "exec", stale, "sleep", "600"])
    try:
        # Swept only once it runs in the namespace: before, `ip netns exec` may not have entered it yet (a
        # CI run's loaded machine swept first, and the sleeper slept on outside any sweep's reach).
        end = time.monotonic() + 30.0
        while str(sleeper.pid) not in netns.run(["ip", "netns", "pids", stale]).split():
            assert time.monotonic() < end, "the sleeper never ran in the namespace"
            assert sleeper.poll() is None, f"the sleeper ended ({sleeper.returncode})"
            time.sleep(0.01)
        assert stale in netns.sweep_leftovers()
        assert sleeper.wait(5) == -9
        names = netns.namespaces()
        assert stale not in names and live in names
    finally:
        netns.run(["ip", "netns", "del", live], check=False)
        netns.run(["ip", "netns", "del", stale], check=False)


def test_a_rack_client_sends_within_its_rack_and_across_its_uplink(fabric: Fabric) -> None:
    client = fabric.rack_client("az-a")
    assert fabric.rack_client("az-a") == client  # made once
    with pytest.raises(ValueError, match="no rack 'az-z'"):
        fabric.rack_client("az-z")

    async def send(node: int) -> None:
        import asyncio

        reader, writer = await asyncio.wait_for(asyncio.open_connection(fabric.address(node), PORT), 2.0)
        assert await reader.readexactly(2) == b"ok"
        writer.write(b"x" * 200_000)
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    before = fabric.rack_bytes()
    in_namespace(client, lambda: send(4))  # server 4 is in az-a: nothing crosses an uplink
    within = fabric.rack_bytes()
    in_namespace(client, lambda: send(2))  # server 2 is in az-b: out of az-a, into az-b
    across = fabric.rack_bytes()
    assert within["az-a"]["out"] - before["az-a"]["out"] < 10_000
    assert across["az-a"]["out"] - within["az-a"]["out"] >= 200_000
    assert across["az-b"]["in"] - within["az-b"]["in"] >= 200_000
    assert across["az-c"]["in"] - within["az-c"]["in"] < 10_000

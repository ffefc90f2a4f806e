"""A cluster of hosts on one machine: Linux network namespaces, veth pairs, bridges, nftables and tc.

Topology (every name starts with `hs-<pid>-`, the pid of the process that built it, so a later run can tell
its own leftovers from another live run's and sweep them):

    hs-P-core         routes between racks; one uplink veth `r<i>` per rack, `cl` to the client namespace
    hs-P-r<i>         a rack: bridge `br0` (gateway 10.B.i.1) holding its servers' veths, uplink `uplink`
    hs-P-s<n>         server n: `eth0` with 10.B.i.(10+n), default route via its rack's gateway
    hs-P-cl           the client (workload, nemesis, checker): `eth0` 10.B.250.2, routed through the core
    hs-P-c<i>         a client inside rack i (`rack_client`, made on demand): `eth0` 10.B.i.250 on the rack's
                      bridge, so what it sends to another rack crosses that rack's uplink (a writer placed in
                      the rack)

Traffic between racks crosses two uplinks, so a rack's bytes in and out are the counters of its uplink
(`rack_bytes`), and a bandwidth limit between racks is an `htb` class on each end of an uplink. Faults are
nftables rules in the servers' own namespaces (an `inet hschaos` table with an input chain): dropping a
peer's packets on arrival at both ends cuts a link both ways, at one end one way; `numgen random` drops a
fraction. A slow link is a `tbf` on both ends of a server's veth. The kernel here has no `netem`, so no
added latency: a slow link is a low rate with a deep queue (its delay grows with the traffic).

Nothing is routed to or from the machine's own namespace: the client side runs in `hs-P-cl` (a thread
enters it with setns(2), `in_namespace`), and the servers under `ip netns exec`. Deleting a namespace
deletes its links, rules and queues, so cleanup is: kill what runs in each namespace made, delete it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

PREFIX = "hs-"
CLONE_NEWNET = 0x40000000
NETNS_DIR = "/run/netns"
# Second octet of every address: 10.B.0.0/16 exists only inside the namespaces made here.
SUBNET_OCTET = 213
CLIENT_LINK = 250
UPLINK_NET = 200
RACK_CLIENT_HOST = 250  # a rack client's last octet: servers use 11-210, the gateway 1
NFT_TABLE = "hschaos"
_T = TypeVar("_T")


class NetnsUnavailable(Exception):
    """Namespaces cannot be made here (not root, no CAP_NET_ADMIN, or a tool is missing)."""


class CommandFailed(Exception):
    def __init__(self, argv: Sequence[str], code: int, output: str) -> None:
        super().__init__(f"`{' '.join(argv)}` exited {code}: {output.strip()[:500]}")
        self.argv = list(argv)
        self.code = code


def run(argv: Sequence[str], *, check: bool = True, input: str | None = None) -> str:
    result = subprocess.run(list(argv), capture_output=True, text=True, input=input, check=False)
    if check and result.returncode != 0:
        raise CommandFailed(argv, result.returncode, result.stderr + result.stdout)
    return result.stdout


def unavailable_reason() -> str | None:
    """Why namespaces cannot be made here, or None when they can (tried for real: add one, delete it)."""
    if os.geteuid() != 0:
        return "network namespaces need root (CAP_NET_ADMIN); run as root to run the chaos tests"
    for tool, package in (("ip", "iproute2"), ("nft", "nftables"), ("tc", "iproute2")):
        if not any(os.access(os.path.join(d, tool), os.X_OK) for d in os.environ.get("PATH", "").split(":")):
            return f"`{tool}` is not installed (Debian package {package}; `make pytest` installs it)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        run(["ip", "netns", "add", probe])
    except CommandFailed as error:
        return f"cannot create a network namespace: {error}"
    run(["ip", "netns", "del", probe], check=False)
    return None


def namespaces() -> list[str]:
    out = run(["ip", "-j", "netns", "list"], check=False).strip()
    return [entry["name"] for entry in json.loads(out)] if out else []


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def processes(name: str) -> list[int]:
    """The processes running in namespace `name` (zombies left out: they hold nothing any more)."""
    pids = [int(p) for p in run(["ip", "netns", "pids", name], check=False).split()]
    return [pid for pid in pids if not _zombie(pid)]


def _zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[-1].split()[0] in ("Z", "X")
    except OSError:
        return True  # gone already


def kill_processes(name: str, timeout_s: float = 10.0) -> list[int]:
    """SIGKILL everything running in namespace `name` and wait until it is gone; the pids found."""
    seen: list[int] = []
    end = time.monotonic() + timeout_s
    while (pids := processes(name)) and time.monotonic() < end:
        for pid in pids:
            if pid not in seen:
                seen.append(pid)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.02)
    return seen


def kill_namespace(name: str) -> None:
    """SIGKILL everything running in namespace `name`, wait for it to go, delete the namespace."""
    kill_processes(name)
    run(["ip", "netns", "del", name], check=False)


def sweep_leftovers() -> list[str]:
    """Delete the namespaces of earlier runs that died before cleaning up (their pid is gone)."""
    swept = []
    for name in namespaces():
        match = re.fullmatch(rf"{PREFIX}(\d+)-.+", name)
        if match and not _pid_alive(int(match.group(1))):
            kill_namespace(name)
            swept.append(name)
    return swept


@dataclass(frozen=True, slots=True)
class Host:
    node_id: int
    rack: str
    rack_index: int
    address: str
    netns: str


@dataclass
class Fabric:
    """The namespaces, links and rules of one run; `close()` removes exactly them."""

    tag: str
    racks: dict[str, int]  # rack name -> index (1-based)
    hosts: dict[int, Host]
    client_netns: str
    rack_rate: str | None = None
    made: list[str] = field(default_factory=list)  # namespaces, in creation order
    rack_clients: dict[str, str] = field(default_factory=dict)  # rack name -> its client namespace
    _faults: dict[int, list[str]] = field(default_factory=dict)  # node -> nft rules in force
    _slowed: set[int] = field(default_factory=set)

    # ------------------------------------------------------------------ building
    @staticmethod
    def build(placement: Mapping[int, str], *, rack_rate: str | None = None) -> Fabric:
        """Namespaces for servers `placement` (node id -> rack name). `rack_rate` (a tc rate, "100mbit")
        limits each rack's uplink both ways. On any error, what was made is removed again."""
        if not placement:
            raise ValueError("a fabric needs at least one server")
        if any(not 1 <= n <= 200 for n in placement):
            raise ValueError(f"node ids must be 1-200 to get an address: {sorted(placement)}")
        sweep_leftovers()
        tag = f"{PREFIX}{os.getpid()}"
        if any(name.startswith(tag + "-") for name in namespaces()):
            raise RuntimeError(f"this process already holds a fabric ({tag}-*); close it first")
        racks = {rack: i + 1 for i, rack in enumerate(sorted(set(placement.values())))}
        if len(racks) > 60:
            raise ValueError("at most 60 racks")
        hosts = {
            n: Host(n, rack, racks[rack], f"10.{SUBNET_OCTET}.{racks[rack]}.{10 + n}", f"{tag}-s{n}")
            for n, rack in sorted(placement.items())
        }
        fabric = Fabric(tag, racks, hosts, f"{tag}-cl", rack_rate)
        try:
            fabric._build()
        except BaseException:
            fabric.close()
            raise
        return fabric

    def _netns(self, name: str) -> str:
        run(["ip", "netns", "add", name])
        self.made.append(name)
        self.ip(name, "link", "set", "lo", "up")
        return name

    def ip(self, netns: str, *args: str) -> str:
        return run(["ip", "-n", netns, *args])

    def sh(self, netns: str, *argv: str, check: bool = True, input: str | None = None) -> str:
        return run(["ip", "netns", "exec", netns, *argv], check=check, input=input)

    def _forwarding(self, netns: str) -> None:
        self.sh(netns, "sysctl", "-qw", "net.ipv4.ip_forward=1")

    def _build(self) -> None:
        b = SUBNET_OCTET
        core = self._netns(f"{self.tag}-core")
        self._forwarding(core)
        for i in self.racks.values():
            ns = self._netns(f"{self.tag}-r{i}")
            self._forwarding(ns)
            self.ip(ns, "link", "add", "br0", "type", "bridge")
            self.ip(ns, "addr", "add", f"10.{b}.{i}.1/24", "dev", "br0")
            self.ip(ns, "link", "set", "br0", "up")
            self.ip(core, "link", "add", f"r{i}", "type", "veth", "peer", "name", "uplink", "netns", ns)
            self.ip(core, "addr", "add", f"10.{b}.{UPLINK_NET}.{4 * i + 1}/30", "dev", f"r{i}")
            self.ip(ns, "addr", "add", f"10.{b}.{UPLINK_NET}.{4 * i + 2}/30", "dev", "uplink")
            self.ip(core, "link", "set", f"r{i}", "up")
            self.ip(ns, "link", "set", "uplink", "up")
            self.ip(ns, "route", "add", "default", "via", f"10.{b}.{UPLINK_NET}.{4 * i + 1}")
            self.ip(core, "route", "add", f"10.{b}.{i}.0/24", "via", f"10.{b}.{UPLINK_NET}.{4 * i + 2}")
            if self.rack_rate is not None:
                for where, dev in ((core, f"r{i}"), (ns, "uplink")):
                    self.sh(
                        where, "tc", "qdisc", "add", "dev", dev, "root", "handle", "1:", "htb", "default", "1"
                    )
                    self.sh(where, "tc", "class", "add", "dev", dev, "parent", "1:", "classid", "1:1", "htb",
                            "rate", self.rack_rate)  # fmt: skip
        for host in self.hosts.values():
            ns = self._netns(host.netns)
            rack_ns = f"{self.tag}-r{host.rack_index}"
            self.ip(
                ns,
                "link",
                "add",
                "eth0",
                "type",
                "veth",
                "peer",
                "name",
                f"s{host.node_id}",
                "netns",
                rack_ns,
            )
            self.ip(rack_ns, "link", "set", f"s{host.node_id}", "master", "br0")
            self.ip(rack_ns, "link", "set", f"s{host.node_id}", "up")
            self.ip(ns, "addr", "add", f"{host.address}/24", "dev", "eth0")
            self.ip(ns, "link", "set", "eth0", "up")
            self.ip(ns, "route", "add", "default", "via", f"10.{b}.{host.rack_index}.1")
            self.sh(ns, "nft", "-f", "-", input=_NFT_BASE)
        client = self._netns(self.client_netns)
        self.ip(core, "link", "add", "cl", "type", "veth", "peer", "name", "eth0", "netns", client)
        self.ip(core, "addr", "add", f"10.{b}.{CLIENT_LINK}.1/30", "dev", "cl")
        self.ip(client, "addr", "add", f"10.{b}.{CLIENT_LINK}.2/30", "dev", "eth0")
        self.ip(core, "link", "set", "cl", "up")
        self.ip(client, "link", "set", "eth0", "up")
        self.ip(client, "route", "add", "default", "via", f"10.{b}.{CLIENT_LINK}.1")

    def rack_client(self, rack: str) -> str:
        """The namespace of a client placed in `rack` (made on first use): its veth is on the rack's bridge
        beside the servers', so its traffic to the rack's servers stays in the rack and its traffic to
        other racks crosses the rack's uplink (`rack_bytes` counts it). Run a writer there with
        `in_namespace(fabric.rack_client(rack), ...)`."""
        if rack not in self.racks:
            raise ValueError(f"no rack {rack!r} in this fabric (racks: {', '.join(sorted(self.racks))})")
        if rack in self.rack_clients:
            return self.rack_clients[rack]
        i = self.racks[rack]
        rack_ns = f"{self.tag}-r{i}"
        ns = self._netns(f"{self.tag}-c{i}")
        self.ip(ns, "link", "add", "eth0", "type", "veth", "peer", "name", "client", "netns", rack_ns)
        self.ip(rack_ns, "link", "set", "client", "master", "br0")
        self.ip(rack_ns, "link", "set", "client", "up")
        self.ip(ns, "addr", "add", f"10.{SUBNET_OCTET}.{i}.{RACK_CLIENT_HOST}/24", "dev", "eth0")
        self.ip(ns, "link", "set", "eth0", "up")
        self.ip(ns, "route", "add", "default", "via", f"10.{SUBNET_OCTET}.{i}.1")
        self.rack_clients[rack] = ns
        return ns

    def close(self) -> None:
        """Kill every process in the namespaces made and delete them (their links, rules and queues go
        with them). Safe to call twice, and after a partial build."""
        for name in reversed(self.made):
            kill_namespace(name)
        self.made.clear()
        self.rack_clients.clear()
        self._faults.clear()
        self._slowed.clear()

    def __enter__(self) -> Fabric:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ faults
    def address(self, node: int) -> str:
        return self.hosts[node].address

    def _rule(self, node: int, rule: str) -> None:
        self.sh(self.hosts[node].netns, "nft", "add", "rule", "inet", NFT_TABLE, "input", *rule.split())
        self._faults.setdefault(node, []).append(rule)

    def block(self, senders: Iterable[int], receivers: Iterable[int]) -> None:
        """Packets from `senders` no longer reach `receivers` (one way)."""
        senders = sorted(set(senders))
        for receiver in sorted(set(receivers)):
            sources = [self.address(s) for s in senders if s != receiver]
            if sources:
                self._rule(receiver, f"ip saddr {{ {', '.join(sources)} }} drop")

    def partition(self, side: Iterable[int], other: Iterable[int] | None = None) -> None:
        """Cut `side` off from `other` (default: every other server) both ways. Clients still reach all."""
        side = set(side)
        rest = set(self.hosts) - side if other is None else set(other)
        self.block(side, rest)
        self.block(rest, side)

    def drop(self, a: int, b: int, percent: int) -> None:
        """Drop `percent`% of the packets on the link between servers a and b, each way."""
        if not 0 < percent <= 100:
            raise ValueError(f"percent must be 1-100, got {percent}")
        for src, dst in ((a, b), (b, a)):
            self._rule(dst, f"ip saddr {self.address(src)} numgen random mod 100 < {percent} drop")

    def slow(self, node: int, rate: str = "256kbit", latency_ms: int = 400) -> None:
        """Limit server `node`'s link (both ways) to `rate`, queueing up to `latency_ms` before dropping."""
        host = self.hosts[node]
        rack_ns = f"{self.tag}-r{host.rack_index}"
        for ns, dev in ((host.netns, "eth0"), (rack_ns, f"s{node}")):
            self.sh(ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", rate, "burst", "16kb",
                    "latency", f"{latency_ms}ms")  # fmt: skip
        self._slowed.add(node)

    def heal(self) -> None:
        """Remove every fault: the nft rules and the slow links (the rack limits stay)."""
        for node in list(self._faults):
            self.sh(self.hosts[node].netns, "nft", "flush", "chain", "inet", NFT_TABLE, "input")
        self._faults.clear()
        for node in sorted(self._slowed):
            host = self.hosts[node]
            rack_ns = f"{self.tag}-r{host.rack_index}"
            for ns, dev in ((host.netns, "eth0"), (rack_ns, f"s{node}")):
                self.sh(ns, "tc", "qdisc", "del", "dev", dev, "root", check=False)
        self._slowed.clear()

    def faults(self) -> dict[int, list[str]]:
        """The nft rules in force, per server (what `heal` removes)."""
        return {node: list(rules) for node, rules in self._faults.items()}

    # ------------------------------------------------------------------ measuring
    def rack_bytes(self) -> dict[str, dict[str, int]]:
        """Per rack, bytes that left it (`out`) and entered it (`in`) over its uplink since it was made."""
        core = f"{self.tag}-core"
        links = {entry["ifname"]: entry for entry in json.loads(self.ip(core, "-s", "-j", "link", "show"))}
        out: dict[str, dict[str, int]] = {}
        for rack, i in self.racks.items():
            stats = links[f"r{i}"]["stats64"]
            # The core's end receives what leaves the rack and transmits what enters it.
            out[rack] = {"out": int(stats["rx"]["bytes"]), "in": int(stats["tx"]["bytes"])}
        return out


_NFT_BASE = f"""
table inet {NFT_TABLE} {{
    chain input {{
        type filter hook input priority 0; policy accept;
    }}
}}
"""


# ---------------------------------------------------------------------- entering a namespace
_libc = ctypes.CDLL(None, use_errno=True)


@contextlib.contextmanager
def _entered(netns: str) -> Iterator[None]:
    """The calling thread (only it: setns(2) with CLONE_NEWNET is per thread) in namespace `netns`."""
    original = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
    target = os.open(os.path.join(NETNS_DIR, netns), os.O_RDONLY)
    try:
        if _libc.setns(target, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns into {netns}: {os.strerror(err)}")
        try:
            yield
        finally:
            if _libc.setns(original, CLONE_NEWNET) != 0:
                err = ctypes.get_errno()
                raise OSError(err, f"setns back: {os.strerror(err)}")
    finally:
        os.close(target)
        os.close(original)


def in_namespace(netns: str, main: Callable[[], Awaitable[_T]]) -> _T:
    """Run the coroutine `main()` on a fresh event loop in a thread inside `netns`, and return its result.
    Sockets are bound to the namespace of the thread that creates them, so everything the coroutine
    connects to is reached from `netns`."""
    import asyncio

    box: dict[str, object] = {}

    def body() -> None:
        try:
            with _entered(netns):
                box["result"] = asyncio.run(_as_coroutine(main))
        except BaseException as error:  # handed to the caller's thread
            box["error"] = error

    # A daemon: after Ctrl-C the caller cleans up (servers killed, namespaces deleted) and exits without
    # waiting for the loop to notice.
    thread = threading.Thread(target=body, name=f"in-{netns}", daemon=True)
    thread.start()
    try:
        thread.join()
    except KeyboardInterrupt:
        thread.join(5.0)
        raise
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["result"]  # type: ignore[return-value]


async def _as_coroutine(main: Callable[[], Awaitable[_T]]) -> _T:
    return await main()

"""Listener and Voter, the addresses in a configuration, and the rules on a single host or port.

The kinds `listeners` and `voters` (kinds.py) parse and check whole lists of them with these.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Final, Literal

from hotstate.server.config.errors import ConfigError

ListenerName = Literal["rpc", "http"]


@dataclass(frozen=True, slots=True)
class Listener:
    """Where the server listens: `rpc` for servers and Spark executors, `http` for queries and status."""

    name: ListenerName
    host: str  # an IPv6 address without brackets
    port: int  # 0: any free port

    def __str__(self) -> str:
        return f"{self.name}://{host_port(self.host, self.port)}"


@dataclass(frozen=True, slots=True)
class Voter:
    """A member of the metadata quorum, as listed in `controller.quorum.voters`."""

    node_id: int
    host: str
    port: int

    def __str__(self) -> str:
        return f"{self.node_id}@{host_port(self.host, self.port)}"


def host_port(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


_LABEL = r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
_HOSTNAME_RE: Final = re.compile(rf"{_LABEL}(?:\.{_LABEL})*")
HOST_ALLOWED: Final = "a host name, an IPv4 address or an IPv6 address in brackets, e.g. [::1]"
PORT_ALLOWED: Final = "a port from 0 to 65535 (0: any free port)"


def host_problem(host: object) -> str | None:
    if not isinstance(host, str) or not host:
        return f"must name {HOST_ALLOWED}"
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return f"{host!r} is not an IPv6 address; must name {HOST_ALLOWED}"
        return None
    if re.fullmatch(r"[0-9.]+", host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return f"{host!r} is not an IPv4 address; must name {HOST_ALLOWED}"
        return None
    if len(host) > 253 or not _HOSTNAME_RE.fullmatch(host):
        return f"{host!r} is not a valid host name; must name {HOST_ALLOWED}"
    return None


def is_unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.split("%", 1)[0]).is_unspecified
    except ValueError:
        return False


def is_port(port: object, minimum: int) -> bool:
    return isinstance(port, int) and not isinstance(port, bool) and minimum <= port <= 65535


def parse_host_port(key: str, text: str, allowed: str) -> tuple[str, int]:
    if text.startswith("["):
        end = text.find("]")
        if end < 0 or text[end + 1 : end + 2] != ":":
            raise ConfigError(key, text, allowed)
        host, port_text = text[1:end], text[end + 2 :]
        if ":" not in host:
            raise ConfigError(key, text, f"{allowed}; brackets are only for IPv6 addresses")
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep:
            raise ConfigError(key, text, f"{allowed}; the port is missing")
        if ":" in host:
            raise ConfigError(key, text, f"{allowed}; put an IPv6 address in brackets, e.g. [::1]:9092")
    if not re.fullmatch(r"[0-9]{1,5}", port_text):
        raise ConfigError(key, text, f"{allowed}; {port_text!r} is not a port number")
    return host, int(port_text)

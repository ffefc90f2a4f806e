"""What any server says about the cluster when asked (DescribeCluster): the messages, for clients and
servers alike. Answered locally by every server, without the controller (server/http/status.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class DescribeClusterRequest:
    pass


@dataclass(frozen=True, slots=True)
class ServerStatus:
    node_id: int
    rack: str | None
    roles: tuple[str, ...]
    fenced: bool
    rpc_host: str
    rpc_port: int
    http_host: str | None
    http_port: int | None
    actives: int  # partitions whose active replica is on this server
    standbys: int
    # Being removed (`hotstate server remove`): its replicas are moving away. Version 2.
    draining: bool = False


@dataclass(frozen=True, slots=True)
class DescribeClusterResponse:
    node_id: int  # the server that answered
    quorum_role: str
    epoch: int
    leader_id: int | None
    high_watermark: int
    metadata_offset: int
    servers: tuple[ServerStatus, ...]
    tables: tuple[str, ...]

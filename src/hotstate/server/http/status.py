"""What any server says about the cluster: its own view, answered locally without the controller."""

from __future__ import annotations

from hotstate.controller.image import MetadataImage
from hotstate.protocol.cluster import DescribeClusterResponse, ServerStatus
from hotstate.raft.node import RaftNode
from hotstate.server.copy_counts import CountsCache


async def describe(node: RaftNode, image: MetadataImage, counts: CountsCache) -> DescribeClusterResponse:
    copies = await counts.stepped(image)
    servers = tuple(
        ServerStatus(
            s.node_id,
            s.rack,
            s.roles,
            s.fenced,
            s.rpc.host,
            s.rpc.port,
            s.http.host if s.http else None,
            s.http.port if s.http else None,
            copies.actives[s.node_id],
            copies.standbys[s.node_id],
            s.draining,
        )
        for _, s in sorted(image.servers.items())
    )
    return DescribeClusterResponse(
        node.id,
        node.role.value,
        node.epoch,
        node.leader_id,
        node.high_watermark,
        image.offset,
        servers,
        tuple(image.tables_listed()),
    )

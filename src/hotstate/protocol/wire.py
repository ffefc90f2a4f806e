"""The one codec for server-to-server messages: every type that travels over hotstate.rpc, with its id.

Type ids are part of the wire protocol: never reuse or renumber one.
"""

from __future__ import annotations

from dataclasses import dataclass

from hotstate.controller.records import Endpoint, KeyColumn, TableTtl, TableWindow, ValueColumn
from hotstate.controller.requests import (
    AlterPartitionRequest,
    AlterPartitionResponse,
    CommitBatchRequest,
    CommitBatchResponse,
    ControllerRequest,
    CreateTableRequest,
    CreateTableResponse,
    DeleteTableRequest,
    DeleteTableResponse,
    ListTablesRequest,
    ListTablesResponse,
    RegisterServerRequest,
    RegisterServerResponse,
    RegisterWriterRequest,
    RegisterWriterResponse,
    RemoveServerRequest,
    RemoveServerResponse,
    ReplaceTableRequest,
    ReplaceTableResponse,
    ServerHeartbeatRequest,
    ServerHeartbeatResponse,
    SetValueColumnsRequest,
    SetValueColumnsResponse,
    StageTableRequest,
    StageTableResponse,
)
from hotstate.log.batch import RecordBatch
from hotstate.log.divergence import DivergingEpoch
from hotstate.protocol.cluster import DescribeClusterRequest, DescribeClusterResponse, ServerStatus
from hotstate.protocol.voters import ObserverProgress, VotersRequest, VotersResponse
from hotstate.raft.messages import (
    BeginQuorumEpoch,
    BeginQuorumEpochResponse,
    Fetch,
    FetchResponse,
    FetchSnapshot,
    FetchSnapshotResponse,
    Vote,
    VoteResponse,
)
from hotstate.raft.records import Entry, SnapshotId
from hotstate.replica import messages as replica
from hotstate.rpc.schema import TypeRegistry


@dataclass(frozen=True, slots=True)
class ForwardedControllerRequest:
    """A controller request one server passes to the leader; the leader answers it or refuses, never
    forwards it again (no loops while leadership moves)."""

    request: ControllerRequest


MESSAGES = TypeRegistry()
for type_id, cls in (
    # Raft (1-49)
    (1, Entry),
    (2, SnapshotId),
    (3, DivergingEpoch),
    (10, Vote),
    (11, VoteResponse),
    (12, BeginQuorumEpoch),
    (13, BeginQuorumEpochResponse),
    (14, Fetch),
    (15, FetchResponse),
    (16, FetchSnapshot),
    # Quorum membership (KIP-853)
    (20, VotersRequest),
    (21, ObserverProgress),
    (22, VotersResponse),
    # Controller (50-99)
    (50, Endpoint),
    (51, KeyColumn),
    (60, RegisterServerRequest),
    (61, RegisterServerResponse),
    (62, ServerHeartbeatRequest),
    (63, ServerHeartbeatResponse),
    (65, CreateTableResponse),
    (66, DeleteTableRequest),
    (67, DeleteTableResponse),
    (68, ListTablesRequest),
    (69, ListTablesResponse),
    (70, ForwardedControllerRequest),
    (71, AlterPartitionRequest),
    (72, AlterPartitionResponse),
    (73, RegisterWriterRequest),
    (74, RegisterWriterResponse),
    (75, CommitBatchRequest),
    (76, CommitBatchResponse),
    (77, SetValueColumnsRequest),
    (78, SetValueColumnsResponse),
    (79, ValueColumn),
    (81, StageTableResponse),
    (82, ReplaceTableRequest),
    (83, ReplaceTableResponse),
    (84, RemoveServerRequest),
    (85, RemoveServerResponse),
    (86, TableWindow),
    (87, TableTtl),
    # Cluster status (100-)
    (100, DescribeClusterRequest),
    (102, DescribeClusterResponse),
    # Partition replicas (150-199)
    (150, RecordBatch),
    (151, replica.FetchRequest),
    (152, replica.FetchResponse),
    (153, replica.ProduceRequest),
    (154, replica.ProduceResponse),
    (155, replica.FetchStoreSnapshotRequest),
    (156, replica.FetchStoreSnapshotResponse),
    (157, replica.LagInfo),
    (158, replica.LagInfoRequest),
    (159, replica.LagInfoResponse),
    (160, replica.MetadataForKeyRequest),
    (161, replica.MetadataForKeyResponse),
    (163, replica.PartitionMetadata),
    (164, replica.ServerAddress),
    (166, replica.ReadPartitionRequest),
    (167, replica.ReadPartitionResponse),
    (170, replica.Heartbeat),
    (171, replica.LagReport),
    (173, replica.QueryPartitionsResponse),
    (174, replica.PartitionRows),
    (175, replica.ProducePartitionsRequest),
    (176, replica.ProducePartitionsResponse),
    (177, replica.FeedReadRequest),
    (178, replica.FeedReadResponse),
    (181, replica.FeedPageRequest),
    (182, replica.FeedPageResponse),
):
    MESSAGES.register(type_id, cls)
# Version 2 appended voters (KIP-853: a snapshot carries the voter set).
MESSAGES.register(17, FetchSnapshotResponse, version=2)
# Version 2 appended writer_rack, version 3 window; version 4 appended ttl and lets standby_replicas be None
# (the server that takes the request applies its num.standby.replicas). A version 3 reader refuses version 4.
MESSAGES.register(64, CreateTableRequest, version=4)
# Version 2 appended ttl.
MESSAGES.register(80, StageTableRequest, version=2)
# Version 2 appended draining.
MESSAGES.register(101, ServerStatus, version=2)
# Version 2 appended known_offset and max_wait_ms (the metadata watch).
MESSAGES.register(162, replica.TableMetadataRequest, version=2)
# Version 2 appended produce_max_bytes.
MESSAGES.register(165, replica.TableMetadataResponse, version=2)
# Version 2 appended min_position (consistency tokens), version 3 table_id (table generations), version 4
# program (scans, query/scan.py).
MESSAGES.register(168, replica.PartitionQueryRequest, version=4)
# Version 2 appended user (who asked the coordinator, for the serving server's log).
MESSAGES.register(172, replica.QueryPartitionsRequest, version=2)
# Version 2 appended partial (a scan's counts and partial aggregates).
MESSAGES.register(169, replica.PartitionQueryResponse, version=2)

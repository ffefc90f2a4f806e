"""One hotstate server process: wiring of the quorum member, the controller host and the server lifecycle.

SIGTERM runs a controlled shutdown (the controller moves this server's actives away, committed, before
the process exits); SIGKILL loses nothing committed, since every Ready is fsynced before it is answered.
A data directory that cannot be written or trusted stops the server the same way, with the exit code
`data_dir.DISK_FAILURE_EXIT_CODE` (at start: before anything is opened).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import ssl
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import cast

from hotstate.controller.controller import ControllerConfig
from hotstate.controller.evidence import ProbeResult
from hotstate.controller.image import MetadataImage
from hotstate.controller.records import Endpoint
from hotstate.controller.requests import (
    AlterPartitionRequest,
    CommitBatchRequest,
    ControllerError,
    ControllerRequest,
    ControllerResponse,
    CreateTableRequest,
    DeleteTableRequest,
    ListTablesRequest,
    RegisterServerRequest,
    RegisterWriterRequest,
    RemoveServerRequest,
    ReplaceTableRequest,
    ServerHeartbeatRequest,
    SetValueColumnsRequest,
    StageTableRequest,
    error_response,
)
from hotstate.controller.snapshot import encode_snapshot
from hotstate.protocol.cluster import DescribeClusterRequest
from hotstate.protocol.voters import VotersError, VotersRequest, VotersResponse
from hotstate.protocol.wire import MESSAGES, ForwardedControllerRequest
from hotstate.query.tokens import cluster_tag
from hotstate.raft.messages import (
    BeginQuorumEpoch,
    BeginQuorumEpochResponse,
    Fetch,
    FetchResponse,
    FetchSnapshot,
    FetchSnapshotResponse,
    Message,
    Vote,
    VoteResponse,
)
from hotstate.raft.node import RaftRole
from hotstate.raft.records import Entry, Snapshot
from hotstate.raft.storage import RaftStorage, StorageError
from hotstate.replica import messages as replica_messages
from hotstate.routing.hedging import HedgePolicy
from hotstate.rpc import NOT_SENT, Connection, PeerInfo, PeerPool, RpcError, RpcServer
from hotstate.server import runtime
from hotstate.server.config import ServerConfig, config_warnings
from hotstate.server.console.feed import ConsoleFeed
from hotstate.server.console.http import ConsoleContext
from hotstate.server.controller_host import ControllerHost
from hotstate.server.coordinator import ClusterView, Coordinator
from hotstate.server.copy_counts import CountsCache
from hotstate.server.data_dir import DISK_FAILURE_EXIT_CODE, DataDirError, check_writable
from hotstate.server.feeds import FeedHub
from hotstate.server.http.api import HttpContext, build_app, http_server
from hotstate.server.http.auth import HttpAuth, server_token
from hotstate.server.http.control_metrics import ControlPlaneMetrics, ControlPlaneView, RaftView
from hotstate.server.http.credentials import CredentialsError
from hotstate.server.http.limits import HttpLimits
from hotstate.server.http.metrics import LOOP_PROBE_S, Metrics
from hotstate.server.http.status import describe
from hotstate.server.lifecycle import ServerLifecycle
from hotstate.server.liveness import Liveness
from hotstate.server.metadata import MetadataPublisher
from hotstate.server.raft_driver import RaftDriver, monotonic_ms
from hotstate.server.replicas import ReplicaManager
from hotstate.server.serving import LocalReads
from hotstate.server.suspects import Suspects, probe_after_hint
from hotstate.server.voters import VOTERS_FORWARD_TIMEOUT_S, VoterAdmin
from hotstate.server.writer_metadata import (
    NOT_READY_REFUSES,
    answer_table_metadata,
    metadata_for_key,
    not_ready_answer,
)
from hotstate.tls import TlsFiles, TlsFilesError, client_context, server_context

log = logging.getLogger(__name__)


def _ignored(replica: object, error: object) -> None:
    """A store failure on a server that holds no replicas: cannot happen."""


# What arrives one-way is the Raft traffic; what arrives as a request is for the controller or local.
RAFT_MESSAGES = (
    Vote,
    VoteResponse,
    BeginQuorumEpoch,
    BeginQuorumEpochResponse,
    Fetch,
    FetchResponse,
    FetchSnapshot,
    FetchSnapshotResponse,
)
CONTROLLER_REQUESTS = (
    RegisterServerRequest,
    ServerHeartbeatRequest,
    CreateTableRequest,
    DeleteTableRequest,
    ListTablesRequest,
    AlterPartitionRequest,
    RegisterWriterRequest,
    CommitBatchRequest,
    SetValueColumnsRequest,
    StageTableRequest,
    ReplaceTableRequest,
    RemoveServerRequest,
)
REPLICA_MESSAGES = (replica_messages.FetchRequest, replica_messages.FetchResponse)
HTTP_STOP_TIMEOUT_S = 5.0
FORWARD_TIMEOUT_S = 5.0
CREATE_FORWARD_TIMEOUT_S = 120.0
PEER_BACKOFF_MAX_S = 0.25
SHUTDOWN_TIMEOUT_S = 10.0
# After a disk failure the controlled shutdown may have no quorum to commit it (this server may be the
# metadata leader that can no longer write): bounded, since the others fence it on its exit anyway.
DISK_FAILURE_SHUTDOWN_TIMEOUT_S = 3.0
# sysexits.h EX_CONFIG: this node id was removed from the cluster (`hotstate server remove`); restarting the
# server under it is refused again, so a supervisor must not (docs/operations.md).
REMOVED_EXIT_CODE = 78
# sysexits.h EX_SOFTWARE: a committed metadata record could not be applied to the image (a bug); a restart
# rebuilds the image from the snapshot and the log.
APPLY_FAILURE_EXIT_CODE = 70


@dataclass(frozen=True, slots=True)
class ServerTls:
    """The server's TLS contexts from rpc.tls.* and http.tls.* (None where TLS is off)."""

    rpc_server: ssl.SSLContext | None = None
    # Our side of connections to other servers: checks their certificates and presents ours.
    rpc_client: ssl.SSLContext | None = None
    http_server: ssl.SSLContext | None = None
    # For the console's calls to other servers' HTTP API.
    http_client: ssl.SSLContext | None = None

    @staticmethod
    def from_config(config: ServerConfig) -> ServerTls:
        """Reads the files; raises TlsFilesError naming the settings and the file that cannot be used."""
        rpc, http = config.rpc_tls, config.http_tls
        return ServerTls(
            rpc_server=_listener_context("rpc", rpc, client_auth=rpc.client_auth == "required"),
            rpc_client=_peer_context("rpc", rpc, present_certificate=True),
            # HTTP/2 over TLS is chosen by ALPN; the client then opens with HTTP/2's preface, which the
            # HTTP/1.1 protocol hands over to http/http2.py as it does in clear (h2 prior knowledge).
            http_server=_listener_context("http", http, client_auth=False, alpn=("h2", "http/1.1")),
            http_client=_peer_context("http", http, present_certificate=False),
        )


def _listener_context(
    name: str, files: TlsFiles, *, client_auth: bool, alpn: tuple[str, ...] = ()
) -> ssl.SSLContext | None:
    if files.cert_file is None or files.key_file is None:
        return None
    try:
        return server_context(
            files.cert_file, files.key_file, ca_file=files.ca_file, client_auth=client_auth, alpn=alpn
        )
    except TlsFilesError as error:
        raise TlsFilesError(f"{name}.tls.*: {error}") from None


def _peer_context(name: str, files: TlsFiles, *, present_certificate: bool) -> ssl.SSLContext | None:
    if files.cert_file is None or files.key_file is None:
        return None
    try:
        if present_certificate:
            return client_context(ca_file=files.ca_file, cert_file=files.cert_file, key_file=files.key_file)
        return client_context(ca_file=files.ca_file)
    except TlsFilesError as error:
        raise TlsFilesError(f"{name}.tls.*: {error}") from None


class Server:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.tls = ServerTls.from_config(config)
        self.incarnation_id = uuid.uuid4().hex
        self._stopped = asyncio.Event()
        self._stop_requested = asyncio.Event()
        # Set when the server stops for a disk fault: run_server exits with it.
        self.exit_code = 0
        self.driver: RaftDriver | None = None
        self.rpc: RpcServer | None = None
        self.pool: PeerPool | None = None
        self.metadata: MetadataPublisher | None = None
        self._snapshotting: asyncio.Task[None] | None = None
        self.controller: ControllerHost | None = None
        self.voter_admin: VoterAdmin | None = None
        self.lifecycle: ServerLifecycle | None = None
        self.replicas: ReplicaManager | None = None
        self.liveness: Liveness | None = None
        self.queries: Coordinator | None = None
        self.reads: LocalReads | None = None
        self.metrics = Metrics()
        self.control_metrics = ControlPlaneMetrics(self._control_plane, self.metrics.registry)
        self._counts = CountsCache()
        self._http: object | None = None
        self._http_task: asyncio.Task[None] | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._voter_addresses = {v.node_id: (v.host, v.port) for v in config.voters}
        self._suspects: Suspects | None = None
        self.console: ConsoleFeed | None = None
        self.feeds: FeedHub | None = None  # push queries (server/feeds.py), brokers only

    # ------------------------------------------------------------------ start and stop
    async def _probe_loop(self) -> None:
        """Measure the event loop's stalls: how late a timer due every LOOP_PROBE_S fires (the metrics
        hotstate_event_loop_stall_seconds and its max)."""
        longest = 0.0
        while True:
            due = time.perf_counter() + LOOP_PROBE_S
            await asyncio.sleep(LOOP_PROBE_S)
            late = max(0.0, time.perf_counter() - due)
            self.metrics.loop_stall.observe(late)
            if late > longest:
                longest = late
                self.metrics.loop_stall_max.set(late)

    async def start(self) -> None:
        config = self.config
        data_dir = Path(config.data_dir)
        check_writable(data_dir)
        storage = RaftStorage(data_dir / "metadata")
        self.pool = PeerPool(
            config.node_id,
            config.cluster_id,
            config.cluster_secret,
            MESSAGES,
            max_frame_bytes=config.max_frame_bytes,
            # A restarted peer must hear our Votes at once; reconnecting on a LAN is cheap, so never back
            # off for long (the default 5 s cap delayed elections after a restart by a whole round).
            backoff_max=PEER_BACKOFF_MAX_S,
            tls=self.tls.rpc_client,
        )
        self.pool.update(self._voter_addresses)
        self.driver = RaftDriver(
            config.node_id,
            [v.node_id for v in config.voters],
            config.raft,
            storage,
            send=self._send_raft,
            on_committed=self._on_committed,
            prepare_commit=self._prepare_commit,
            on_role_change=self._on_role_change,
            on_disk_failure=self.disk_failed,
            on_apply_failure=self._apply_failed,
        )
        self.metadata = MetadataPublisher(
            snapshot=self.driver.initial_snapshot,
            snapshot_max_records=config.snapshot_max_records,
            snapshot_interval_ms=config.snapshot_interval_ms,
            clock=monotonic_ms,
            # Ready (queries, writes, table metadata) once the image holds this process's registration.
            incarnation=(config.node_id, self.incarnation_id),
        )
        if config.is_broker:
            pool = self.pool
            metadata = self.metadata
            self.replicas = ReplicaManager(
                config.node_id,
                data_dir,
                config.replica,
                fsync="always" if config.replica_log_fsync == "always" else "never",
                produce_max_bytes=config.produce_max_bytes,
                send=pool.send_oneway,
                request=pool.request,
                to_controller=self._to_controller,
                ready=lambda: metadata.not_ready() is None,
                on_disk_failure=self.disk_failed,
                move_throttle_bytes_per_s=config.move_throttle_bytes_per_sec,
            )
        if config.is_broker:
            replicas = self.replicas
            self.liveness = Liveness(
                config.node_id,
                config.liveness,
                send=self.pool.send_oneway,
                local_lags=replicas.lag_info if replicas is not None else list,
                lags=replicas.lags if replicas is not None else None,
            )
            liveness = self.liveness
            metadata = self.metadata
            self.reads = LocalReads(
                config.node_id,
                image=lambda: metadata.image,
                replicas=(lambda: replicas.replicas) if replicas is not None else dict,
                lags=liveness.lags,
                on_store_failure=replicas.read_failed if replicas is not None else _ignored,
                scan_max_rows=config.scan_max_rows,
                scan_max_concurrent=config.scan_max_concurrent,
                scan_step_rows=config.scan_step_rows,
                scan_step_ms=config.scan_step_ms,
                scan_cache_bytes=config.scan_cache_bytes,
                on_scan_cancelled=self.metrics.scans_cancelled.labels("client_gone").inc,
            )
            self.queries = Coordinator(
                config.node_id,
                ClusterView(
                    image=lambda: metadata.image,
                    lags=liveness.lags,
                    alive=liveness.alive,
                    alive_version=lambda: liveness.status.version,
                    connected=self.pool.is_connected,
                    not_ready=metadata.not_ready,
                ),
                self.reads,
                self.pool.request_soon,
                hedging=HedgePolicy(config.hedging),
                default_timeout_ms=config.query_timeout_ms,
                cluster_id=config.cluster_id,
                on_forward=lambda outcome: self.metrics.forwards.labels(outcome).inc(),
            )
        if self.replicas is not None:
            manager = self.replicas
            metadata = self.metadata
            self.feeds = FeedHub(
                config.node_id,
                cluster_tag(config.cluster_id),
                lambda: metadata.image,
                lambda: manager.replicas,
                max_subscriptions=config.push_max_subscriptions,
                buffer_changes=config.push_buffer_max_changes,
                step_rows=config.scan_step_rows,
                step_ms=config.scan_step_ms,
                send_timeout_s=config.push_send_timeout_ms / 1000,
                on_end=lambda reason: self.metrics.push_ended.labels(str(reason)).inc(),
                on_drop=self.metrics.push_dropped.inc,
                request=self.pool.request,
                alive=self.liveness.alive if self.liveness is not None else (lambda node_id: True),
            )
            manager.feeds = self.feeds
        self.metadata.add_listener(self._on_image)
        metadata = self.metadata
        self.console = ConsoleFeed(
            config.node_id,
            image=lambda: metadata.image,
            caught_up=lambda: metadata.caught_up,
            liveness=self.liveness,
            replica_ends=self.replicas.replica_ends if self.replicas is not None else tuple,
            metrics=self.metrics,
        )
        self.metadata.add_listener(self.console.on_image)
        self.controller = ControllerHost(
            self.driver,
            self.metadata,
            ControllerConfig(
                session_timeout_ms=config.session_timeout_ms,
                assignor=config.assignor,
                reassign_interval_ms=config.reassign_interval_ms,
                broker_removal_delay_ms=config.broker_removal_delay_ms,
                stall_grace_ms=config.session_timeout_ms // 4,  # ticks run every 50 ms
            ),
            forward=self._forward,
            clock=monotonic_ms,
        )
        self.voter_admin = VoterAdmin(
            self.driver, lambda: metadata.image, forward=self._forward_voters, clock=monotonic_ms
        )
        if config.is_controller and config.find_voter(config.node_id) is None:
            log.info(
                "server %d is a controller but not among the bootstrap voters (controller.quorum.voters): "
                "it is %s (add it with `hotstate cluster voters add %d`)",
                config.node_id,
                "a voter" if self.driver.node.is_voter else "an observer of the metadata log until added",
                config.node_id,
            )
        self.rpc = RpcServer(
            config.rpc.host,
            config.rpc.port,
            cluster_id=config.cluster_id,
            secret=config.cluster_secret,
            node_id=config.node_id,
            registry=MESSAGES,
            handler=self._handle_request,
            on_oneway=self._handle_oneway,
            max_frame_bytes=config.max_frame_bytes,
            tls=self.tls.rpc_server,
        )
        # A peer's connection closed or reset is a hint that it died: probe it (server/suspects.py).
        suspects = self._suspects = Suspects(self._check_suspect)
        self.controller.on_activated = self._suspect_all
        self.pool.on_lost = suspects.hint
        self.rpc.on_peer_lost = lambda peer: suspects.hint(peer.node_id)
        await self.rpc.start()
        rpc_endpoint = Endpoint(config.rpc.host, self.rpc.port)
        http_endpoint = Endpoint(config.http.host, config.http.port) if config.http else None
        self.lifecycle = ServerLifecycle(
            node_id=config.node_id,
            incarnation_id=self.incarnation_id,
            rpc=rpc_endpoint,
            http=http_endpoint,
            rack=config.rack,
            tags=config.tags,
            roles=tuple(sorted(config.process_roles)),
            metadata=self.metadata,
            send=self._to_controller,
            heartbeat_interval_ms=config.heartbeat_interval_ms,
            replica_ends=self.replicas.replica_ends if self.replicas is not None else tuple,
            on_removed=self._removed,
        )
        self._connect_eagerly(self._voter_addresses)
        if self.replicas is not None:
            self.replicas.start()
        if self.liveness is not None:
            self.liveness.start()
        await self._start_http()
        self.driver.start()
        self.controller.start()
        self._tasks.append(asyncio.create_task(self.lifecycle.run(), name="lifecycle"))
        self._tasks.append(asyncio.create_task(self._probe_loop(), name="loop-probe"))
        self._tasks.append(asyncio.create_task(self.console.run(), name="console"))
        log.info(
            "server %d up: rpc %s:%d, roles %s, rack %s, incarnation %s",
            config.node_id,
            rpc_endpoint.host,
            rpc_endpoint.port,
            ",".join(sorted(config.process_roles)),
            config.rack,
            self.incarnation_id,
        )

    def disk_failed(self, reason: str) -> None:
        """A write on the data directory failed: shut down (controlled, bounded) and exit with
        DISK_FAILURE_EXIT_CODE. The caller has logged the failure."""
        if self.exit_code == 0:
            self.exit_code = DISK_FAILURE_EXIT_CODE
            self._stop_requested.set()

    def _apply_failed(self, reason: str) -> None:
        """A metadata commit could not be applied (the driver logged it): exit APPLY_FAILURE_EXIT_CODE."""
        if self.exit_code == 0:
            self.exit_code = APPLY_FAILURE_EXIT_CODE
            self._stop_requested.set()

    def _removed(self, message: str) -> None:
        """The controller says this node id was removed from the cluster: stop, with REMOVED_EXIT_CODE."""
        if self.exit_code == 0:
            self.exit_code = REMOVED_EXIT_CODE
            self._stop_requested.set()

    async def stop(self, *, controlled: bool) -> None:
        if controlled and self.lifecycle is not None:
            log.info("controlled shutdown: asking the controller to move this server's actives away")
            driver = self.driver
            await self.lifecycle.controlled_shutdown(
                DISK_FAILURE_SHUTDOWN_TIMEOUT_S if self.exit_code else SHUTDOWN_TIMEOUT_S,
                leader_known=lambda: driver is not None and driver.node.leader_id is not None,
            )
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self.feeds is not None:  # every feed ends with its positions, so that its client resumes
            self.feeds.close_all()
        if self._http_task is not None and self._http is not None:
            self._http.should_exit = True  # type: ignore[attr-defined]
            with contextlib.suppress(asyncio.CancelledError, asyncio.TimeoutError):
                await asyncio.wait_for(self._http_task, HTTP_STOP_TIMEOUT_S)
        if self.reads is not None:
            self.reads.close()
        if self.liveness is not None:
            await self.liveness.stop()
        if self.replicas is not None:
            await self.replicas.stop()
        if self._suspects is not None:
            await self._suspects.close()
        if self.controller is not None:
            await self.controller.stop()
        if self.driver is not None:
            await self.driver.stop()
        if self.rpc is not None:
            await self.rpc.close()
        if self.pool is not None:
            await self.pool.close()
        self._stopped.set()

    async def run_until_signalled(self) -> None:
        await self.start()
        runtime.settle_gc()
        loop = asyncio.get_running_loop()
        for signum in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(signum, self._stop_requested.set)
        await self._stop_requested.wait()
        await self.stop(controlled=True)
        if self.exit_code == REMOVED_EXIT_CODE:
            log.critical(
                "server %d stopped: it was removed from the cluster (exit code %d; do not restart it)",
                self.config.node_id,
                self.exit_code,
            )
        elif self.exit_code:
            log.critical(
                "server %d stopped after a disk failure (exit code %d)", self.config.node_id, self.exit_code
            )
        else:
            log.info("server %d stopped", self.config.node_id)

    # ------------------------------------------------------------------ quorum plumbing
    def _send_raft(self, message: Message) -> None:
        assert self.pool is not None
        self.pool.send_oneway(message.dst, message)

    def _suspect_all(self, node_ids: Sequence[int]) -> None:
        assert self._suspects is not None
        for node_id in node_ids:
            self._suspects.hint(node_id)

    async def _check_suspect(self, node_id: int) -> None:
        """A connection of `node_id`'s closed: if its process is provably gone, act now (suspects.py)."""
        assert self.driver is not None and self.controller is not None and self.pool is not None
        pool = self.pool

        def back() -> bool:
            return pool.is_connected(node_id)

        node = self.driver.node
        address = self._voter_addresses.get(node_id)
        registered = self.metadata.image.servers.get(node_id) if self.metadata is not None else None
        if address is None and registered is not None:  # a voter added since the bootstrap (KIP-853)
            address = (registered.rpc.host, registered.rpc.port)
        if node.role is RaftRole.FOLLOWER and node.leader_id == node_id and address is not None:
            result = await probe_after_hint(*address, back)
            if result is ProbeResult.REFUSED:
                log.info("the metadata leader %d refuses connections: standing for election now", node_id)
                self.driver.leader_gone(node_id)
            else:
                log.info(
                    "the metadata leader %d lost a connection but is %s: no early election",
                    node_id,
                    result.value,
                )
        await self.controller.suspect(node_id, back)

    async def _prepare_commit(self, entries: Sequence[Entry], snapshot: Snapshot | None) -> None:
        if self.metadata is not None:
            await self.metadata.prepare(entries, snapshot)

    def _on_committed(self, entries: Sequence[Entry], snapshot: Snapshot | None) -> None:
        assert self.metadata is not None and self.driver is not None
        self.metadata.on_committed(entries, snapshot)
        if self.metadata.snapshot_due() and self._snapshotting is None:
            # Encoded off the event loop (a million partitions take seconds); the image is immutable.
            image = self.metadata.snapshot_started()
            self._snapshotting = asyncio.create_task(self._take_snapshot(image), name="metadata-snapshot")

    async def _take_snapshot(self, image: MetadataImage) -> None:
        try:
            data = await asyncio.to_thread(encode_snapshot, image)
            driver = self.driver
            if driver is not None and image.offset > driver.node.log.start_offset:
                driver.take_snapshot(image.offset, data)
        except Exception:
            log.exception("metadata snapshot at offset %d failed; the next one is due later", image.offset)
        finally:
            self._snapshotting = None

    def _on_role_change(self, node: object) -> None:
        if self.driver is not None and self.driver.node.leader_id is not None:
            self.control_metrics.on_epoch(self.driver.node.epoch)
        if self.controller is not None:
            self.controller.on_role_change(node)  # type: ignore[arg-type]
        if self.console is not None and self.driver is not None:
            self.console.on_leader(self.driver.node.leader_id, self.driver.node.epoch)

    def _control_plane(self) -> ControlPlaneView:
        node = self.driver.node if self.driver is not None else None
        raft = (
            None
            if node is None
            else RaftView(
                node.leader_id, node.epoch, node.high_watermark, node.log.end_offset, node.role.value
            )
        )
        image = self.metadata.image if self.metadata is not None else MetadataImage.empty()
        active = self.controller is not None and self.controller.active
        return ControlPlaneView(self.config.node_id, image, active, raft, self._counts.now(image))

    def _connect_eagerly(self, peers: dict[int, tuple[str, int]]) -> None:
        """Open (and from then on keep reopening) connections to peers before there is anything to send:
        one-way Raft messages to a peer not yet connected are dropped, and a restarted voter's first
        message is often the VoteResponse a candidate is waiting for."""
        assert self.pool is not None
        for peer_id in peers:
            if peer_id != self.config.node_id and not self.pool.is_connected(peer_id):
                connection = self.pool.connection(peer_id)
                self._tasks.append(
                    asyncio.create_task(_start_connecting(connection), name=f"connect-{peer_id}")
                )

    def _on_image(self, image: MetadataImage, entries: object) -> None:
        # Observers (broker-only servers) are reached at the endpoint they registered with.
        assert self.pool is not None
        peers = dict(self._voter_addresses)
        for node_id, server in image.servers.items():
            peers.setdefault(node_id, (server.rpc.host, server.rpc.port))
        self.pool.update(peers)
        if self.replicas is not None:
            self.replicas.on_image(image)
        if self.liveness is not None:
            self.liveness.on_image(image)
        self.control_metrics.on_image(image)

    # ------------------------------------------------------------------ requests
    async def _handle_request(self, peer: PeerInfo, message: object) -> object:
        assert self.controller is not None and self.driver is not None and self.metadata is not None
        if isinstance(message, ForwardedControllerRequest):
            return await self.controller.handle(message.request, forwarded=True)
        if isinstance(message, DescribeClusterRequest):
            return await describe(self.driver.node, self.metadata.image, self._counts)
        if isinstance(message, VotersRequest) and self.voter_admin is not None:
            return await self.voter_admin.handle(message)
        if isinstance(message, CONTROLLER_REQUESTS):
            if isinstance(message, CreateTableRequest) and message.standby_replicas is None:
                # As for an HTTP create: the server that takes the request applies its own default.
                message = replace(message, standby_replicas=self.config.default_standby_replicas)
            return await self.controller.handle(message)
        if isinstance(message, replica_messages.TableMetadataRequest):
            return await answer_table_metadata(self.metadata, message, self.config.produce_max_bytes)
        if isinstance(message, NOT_READY_REFUSES) and (reason := self.metadata.not_ready()) is not None:
            return not_ready_answer(message, reason)
        if isinstance(message, replica_messages.QueryPartitionsRequest) and self.reads is not None:
            # Forwarded lookups, the most frequent request here after replication's: tested first among
            # the requests of brokers (`reads` is None on a server that is not one).
            for part in message.parts:  # a loop, not any(): this runs on every forwarded lookup
                if part.program:
                    return await self.reads.serve_partitions_stepped(message)
            return self.reads.serve_partitions(message)
        if isinstance(message, replica_messages.MetadataForKeyRequest):
            return metadata_for_key(self.metadata.image, message.table, message.key_row)
        replicas = self.replicas
        if replicas is None:
            raise ValueError(f"server {self.config.node_id} is not a broker: {type(message).__name__}")
        if isinstance(message, replica_messages.ProduceRequest):
            return await replicas.produce(message)
        if isinstance(message, replica_messages.ProducePartitionsRequest):
            return await replicas.produce_partitions(message)
        if isinstance(message, replica_messages.FetchStoreSnapshotRequest):
            return await replicas.serve_snapshot(message)
        if isinstance(message, replica_messages.ReadPartitionRequest):
            return replicas.read_partition(message)
        if isinstance(message, replica_messages.FeedReadRequest) and self.feeds is not None:
            return await self.feeds.serve_read(message)
        if isinstance(message, replica_messages.FeedPageRequest) and self.feeds is not None:
            return await self.feeds.serve_page(message)
        if isinstance(message, replica_messages.LagInfoRequest):
            return replica_messages.LagInfoResponse(self.config.node_id, tuple(replicas.lag_info()))
        raise ValueError(f"unexpected request {type(message).__name__}")

    def _handle_oneway(self, peer: PeerInfo, message: object) -> None:
        if isinstance(message, RAFT_MESSAGES) and self.driver is not None:
            self.driver.deliver(message)
        elif isinstance(message, REPLICA_MESSAGES) and self.replicas is not None:
            self.replicas.deliver(message)
        elif isinstance(message, replica_messages.Heartbeat) and self.liveness is not None:
            self.liveness.on_heartbeat(message)
        elif isinstance(message, replica_messages.LagReport) and self.liveness is not None:
            self.liveness.on_lag_report(message)

    async def _start_http(self) -> None:
        config = self.config
        if config.http is None or self.queries is None or self.liveness is None:
            return
        assert self.metadata is not None and self.driver is not None and self.controller is not None
        assert self.console is not None
        metadata, driver = self.metadata, self.driver
        auth, peer_headers = None, {}
        if config.http_auth_credentials_file is not None:
            auth = HttpAuth(config.http_auth_credentials_file, self.metrics, config.cluster_secret)
            peer_headers = {"authorization": f"Bearer {server_token(config.cluster_secret)}"}
        context = HttpContext(
            config.node_id,
            config.cluster_id,
            lambda: metadata.image,
            self.queries,
            self.liveness,
            self.replicas,
            self.metrics,
            lambda: driver.node.leader_id,
            metadata.not_ready,
            self.controller.handle,
            voters=self.voter_admin.handle if self.voter_admin is not None else None,
            console=ConsoleContext(
                config.node_id,
                config.cluster_id,
                self.console,
                lambda: metadata.image,
                self.liveness,
                lambda: (driver.node.leader_id, driver.node.epoch),
                metadata.not_ready,
                peer_tls=self.tls.http_client,
                peer_headers=peer_headers,
            ),
            auth=auth,
            default_standby_replicas=config.default_standby_replicas,
            feeds=self.feeds,
        )
        limits = HttpLimits(
            max_head_bytes=config.http_header_max_bytes,
            read_timeout_s=config.http_request_timeout_ms / 1000,
            idle_timeout_s=config.http_idle_timeout_ms / 1000,
            max_connections=config.http_max_connections,
        )
        server = http_server(
            build_app(context), config.http.host, config.http.port, self.tls.http_server, limits, self.metrics
        )
        self._http = server
        self._http_task = asyncio.create_task(server.serve(), name="http")
        for _ in range(200):  # bound before the server registers its endpoint
            if server.started or self._http_task.done():
                break
            await asyncio.sleep(0.01)
        if self._http_task.done():
            self._http_task.result()  # raises: e.g. the port is taken
        log.info(
            "http api on %s://%s:%d",
            "https" if self.tls.http_server is not None else "http",
            config.http.host,
            config.http.port,
        )

    async def _forward(self, leader_id: int, request: ControllerRequest) -> ControllerResponse:
        assert self.pool is not None
        timeout = FORWARD_TIMEOUT_S
        if isinstance(request, ServerHeartbeatRequest | AlterPartitionRequest):
            # A heartbeat stuck on a leader that just died must not outlive the session it keeps alive:
            # the new controller would fence this server (and, with every server stuck the same way,
            # all of them: seen when the stopped leader was SIGSTOPped).
            timeout = min(FORWARD_TIMEOUT_S, self.config.session_timeout_ms / 4000)
        elif isinstance(request, CreateTableRequest):
            # The leader places the table before it proposes it: seconds for 100,000 partitions on 2 cores.
            # Cut short, a create that succeeds would read as "outcome unknown" to the caller.
            timeout = CREATE_FORWARD_TIMEOUT_S
        try:
            reply = await self.pool.request(leader_id, ForwardedControllerRequest(request), timeout)
        except NOT_SENT as error:  # never sent: certainly not applied, the caller may retry elsewhere
            return error_response(
                request, ControllerError.NOT_CONTROLLER, f"leader {leader_id} unreachable: {error}"
            )
        except RpcError as error:
            # Sent, answer lost: the leader may have applied it. NOT_CONTROLLER here would invite a retry
            # that reports the caller's own change back to it as "exists" (the linearizability test saw it).
            return error_response(
                request, ControllerError.TIMEOUT, f"forwarded to leader {leader_id}, answer lost: {error}"
            )
        return cast(ControllerResponse, reply)

    async def _forward_voters(self, leader_id: int, request: VotersRequest) -> VotersResponse:
        assert self.pool is not None
        try:
            reply = await self.pool.request(leader_id, request, VOTERS_FORWARD_TIMEOUT_S)
        except NOT_SENT as error:  # never sent: certainly not applied
            return VotersResponse(
                VotersError.NOT_LEADER, f"leader {leader_id} unreachable: {error}", leader_id
            )
        except RpcError as error:
            return VotersResponse(
                VotersError.TIMEOUT, f"forwarded to leader {leader_id}, answer lost: {error}", leader_id
            )
        return cast(VotersResponse, reply)

    async def _to_controller(self, request: ControllerRequest) -> ControllerResponse:
        assert self.controller is not None and self.driver is not None
        reply = await self.controller.handle(request)
        node = self.driver.node
        if (
            getattr(reply, "error", None) is ControllerError.NOT_CONTROLLER
            and node.leader_id is None
            and not node.is_voter
        ):
            # An observer the voters cannot reach yet (not a bootstrap voter, not registered: no address
            # for it, so their Raft answers are dropped) never learns the leader by itself. Its
            # registration, answered on its own connection, gives the cluster its address: ask each
            # bootstrap voter in turn; the leader takes it.
            for voter in sorted(self._voter_addresses):
                if voter != self.config.node_id:
                    reply = await self._forward(voter, request)
                    if getattr(reply, "error", None) is not ControllerError.NOT_CONTROLLER:
                        break
        return reply


async def _start_connecting(connection: Connection) -> None:
    with contextlib.suppress(RpcError):
        # Only starts the connection's own reconnect loop; failing to connect now is fine.
        await connection.connect(0.001)


def run_server(config: ServerConfig) -> None:
    logging.basicConfig(
        level=config.log_level,
        format=f"%(asctime)s server-{config.node_id} %(levelname)s %(name)s: %(message)s",
    )
    for warning in config_warnings(config):
        log.warning("configuration: %s", warning)

    try:
        server = Server(config)
    except TlsFilesError as error:
        # A configuration mistake found when the files are read: one line, as for a bad setting.
        print(f"hotstate server: {error}", file=sys.stderr)
        raise SystemExit(2) from None
    try:
        runtime.run(server.run_until_signalled())
    except (DataDirError, StorageError) as error:
        log.critical("server %d refuses to start: %s", config.node_id, error)
        sys.exit(DISK_FAILURE_EXIT_CODE)
    except CredentialsError as error:
        log.critical("server %d refuses to start: %s", config.node_id, error)
        sys.exit(2)
    if server.exit_code:
        sys.exit(server.exit_code)

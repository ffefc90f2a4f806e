"""Real server processes on loopback, one local cluster per test, torn down however the test ends."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Callable, Coroutine, Generator, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pluggy
import pytest

from hotstate.cli.local_cluster import LocalCluster, LocalServer
from hotstate.client.admin import ClusterUnavailableError
from hotstate.protocol.cluster import DescribeClusterResponse
from hotstate.server.config import Voter

T = TypeVar("T")


def present(node_id: int | None) -> int:
    """A node id the test needs to be there (a partition's active, the quorum's leader)."""
    assert node_id is not None, "expected a node, found none"
    return node_id


class RunningCluster:
    def __init__(self, cluster: LocalCluster) -> None:
        self.cluster = cluster

    def run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run(coroutine)

    def status(self, timeout_s: float = 10.0) -> DescribeClusterResponse:
        return self.run(self.cluster.wait_ready(timeout_s))

    def leader(self, timeout_s: float = 30.0) -> int:
        async def ask() -> int:
            loop = asyncio.get_running_loop()
            end = loop.time() + timeout_s
            last: object = None
            async with self.cluster.admin(request_timeout_s=1.0) as admin:
                while loop.time() < end:
                    try:
                        status = await admin.describe(deadline_s=2.0)
                    except ClusterUnavailableError as error:  # servers just started on a loaded machine
                        last = error
                        continue
                    if status.leader_id is not None:
                        return status.leader_id
                    last = status
                    await asyncio.sleep(0.05)
            raise AssertionError(f"no leader within {timeout_s} s (last answer: {last})")

        return self.run(ask())

    def server(self, node_id: int) -> LocalServer:
        return next(s for s in self.cluster.servers if s.node_id == node_id)

    def kill(self, node_id: int, signum: int = signal.SIGKILL) -> None:
        self.cluster.signal(self.server(node_id), signum)

    def restart(self, node_id: int) -> None:
        """Start the server again once its old process has exited: a second process on the same data
        directory fails at once ("log directory ... is open elsewhere"). A SIGTERM'd metadata leader on a
        loaded machine took more than 2 s to stop (a CI run), so the wait is for the exit, up to 30 s."""
        import time

        server = self.server(node_id)
        end = time.monotonic() + 30.0
        while self.cluster.alive(server):
            if time.monotonic() > end:
                raise AssertionError(f"server {node_id} (pid {server.pid}) did not exit within 30 s")
            time.sleep(0.02)
        self.cluster.start(server)

    def logs(self) -> str:
        out = []
        for server in self.cluster.servers:
            path = server.directory(self.cluster.root) / "server.log"
            if path.exists():
                lines = path.read_text(errors="replace").splitlines()[-40:]
                out.append(f"--- server {server.node_id} (last {len(lines)} lines)\n" + "\n".join(lines))
        return "\n".join(out)


# The `start_cluster` fixture: start(count=3, *, hold=(), tls=False, client_auth=False, **config) -> cluster.
StartCluster = Callable[..., RunningCluster]


@pytest.fixture
def start_cluster(tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[StartCluster]:
    started: list[RunningCluster] = []

    def start(
        count: int = 3,
        *,
        hold: tuple[int, ...] = (),
        tls: bool = False,
        client_auth: bool = False,
        voters: int | None = None,
        **overrides: object,
    ) -> RunningCluster:
        """`hold`: node ids not started (yet): `running.restart(node_id)` starts one. `tls`, `client_auth`:
        as `hotstate cluster up --tls --client-auth`. `voters`: only the first N servers are bootstrap
        voters (`controller.quorum.voters`); the others are controllers that join as observers."""
        cluster = LocalCluster.create(
            tmp_path / f"cluster-{len(started)}", count, tls=tls, client_auth=client_auth
        )
        if voters is not None:
            overrides["voters"] = tuple(
                Voter(s.node_id, s.host, s.rpc_port) for s in cluster.servers[:voters]
            )
        cluster.write_configs(**overrides)
        cluster.save()
        for server in cluster.servers:
            if server.node_id not in hold:
                cluster.start(server)
        running = RunningCluster(cluster)
        started.append(running)
        running.run(cluster.wait_ready(30.0, expect=count - len(hold)))
        return running

    yield start
    failed = getattr(request.node, "rep_call", None)
    for running in started:
        if failed is not None and failed.failed:
            print(running.logs())
        for server in running.cluster.servers:
            running.cluster.signal(server, signal.SIGKILL)


@pytest.hookimpl(tryfirst=True, hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pluggy.Result[pytest.TestReport], None]:
    outcome = yield
    report = outcome.get_result()
    setattr(item, "rep_" + report.when, report)

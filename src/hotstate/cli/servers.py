"""`hotstate server remove N`: remove a broker from the cluster for good (docs/operations.md).

`hotstate server` itself runs a server; `hotstate server remove ...` is routed here by cli/main.py. The
command talks to the servers' RPC port with the admin client, found as `hotstate table` finds it
(`--cluster`, `--cluster-id`, `--secret`, or the local cluster in `--dir`). It asks the controller to
remove the server, then (unless `--no-wait`) waits until the server is unregistered, saying how many
replicas it still holds. Expected failures print one red line and exit 1; a usage mistake exits 2.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from hotstate.cli.table import (
    CaOption,
    CertOption,
    ClusterIdOption,
    ClusterOption,
    DirOption,
    KeyOption,
    SecretOption,
    admin_target,
    check_reply,
    fail,
    run_admin,
    stdout,
)

if TYPE_CHECKING:
    from hotstate.client.admin import AdminClient
    from hotstate.controller.requests import RemoveServerResponse

POLL_S = 0.5


def remove_app(default_dir: Path) -> typer.Typer:
    app = typer.Typer(help="Administer the cluster's servers.", no_args_is_help=True)

    @app.callback()
    def _group() -> None:
        """Administer the cluster's servers."""

    @app.command("remove")
    def remove(
        node_id: Annotated[int, typer.Argument(help="the node.id of the broker to remove")],
        wait: Annotated[bool, typer.Option("--wait/--no-wait", help="wait until it is unregistered")] = True,
        timeout: Annotated[float, typer.Option("--timeout", help="seconds to wait with --wait")] = 600.0,
        cluster: ClusterOption = None,
        cluster_id: ClusterIdOption = None,
        secret: SecretOption = None,
        directory: DirOption = default_dir,
        ca: CaOption = None,
        cert: CertOption = None,
        key_file: KeyOption = None,
    ) -> None:
        """Remove a broker for good: its replicas move to the other servers (keeping every partition's
        standbys), then it is unregistered; its node id is never used again."""
        target = admin_target(cluster, cluster_id, secret, directory, ca, cert, key_file)

        async def work(admin: AdminClient) -> tuple[RemoveServerResponse, bool]:
            reply = await admin.remove_server(node_id)
            if reply.error.name != "NONE" or reply.state == "removed" or not wait:
                return reply, reply.state == "removed"
            return reply, await _wait_removed(admin, node_id, timeout)

        reply, removed = run_admin(target, work)
        check_reply(f"cannot remove server {node_id}", reply)
        if removed:
            stdout().print(f"server {node_id} removed: it is unregistered, and its node id is not used again")
        elif not wait:
            stdout().print(f"server {node_id} draining: its replicas are moving to the other servers")
        else:
            raise fail(
                f"server {node_id} still draining after {timeout:.0f} s (it goes on; run again to wait)"
            )

    return app


async def _wait_removed(admin: AdminClient, node_id: int, timeout_s: float) -> bool:
    console = stdout()
    end = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < end:
        status = await admin.describe()
        server = next((s for s in status.servers if s.node_id == node_id), None)
        if server is None:
            return True
        held = (server.actives, server.standbys)
        if held != last:
            left = f"{server.actives} active(s), {server.standbys} standby(s) left"
            console.print(f"server {node_id} draining: {left}")
            last = held
        await asyncio.sleep(POLL_S)
    return False

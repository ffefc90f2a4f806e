"""`hotstate cluster voters list | add | remove`: the metadata quorum's membership (KIP-853).

Replacing a controller, one voter at a time: start the new server with `process.roles` including
`controller` (it need not be in `controller.quorum.voters`: it follows the metadata log as an observer),
`add` it once `list` shows it caught up, then `remove` the old one and stop it. The commands reach the
servers as `hotstate table` does (`--cluster HOST:PORT`, `--cluster-id`, `--secret`, or the local cluster in
`--dir`); a refusal prints the leader's reason and exits 1.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

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
    run_admin,
    stdout,
)

if TYPE_CHECKING:
    from hotstate.protocol.voters import VotersResponse

NodeArgument = Annotated[int, typer.Argument(help="the server's node.id")]


def _print(reply: VotersResponse) -> None:
    console = stdout()
    pending = " (a change is not committed yet)" if reply.change_pending else ""
    console.print(
        f"leader {reply.leader_id}, epoch {reply.epoch}, high watermark {reply.high_watermark}{pending}",
        highlight=False,
    )
    table = Table()
    for column in ("node", "role", "fetch offset", "caught up", "last fetch (ms ago)"):
        table.add_column(column)
    for node_id in reply.voters:
        role = "voter (leader)" if node_id == reply.leader_id else "voter"
        table.add_row(str(node_id), role, "", "", "")
    for observer in reply.observers:
        table.add_row(
            str(observer.node_id),
            "observer",
            str(observer.fetch_offset),
            "yes" if observer.caught_up else "no",
            str(observer.last_fetch_ms_ago),
        )
    console.print(table)


def register(app: typer.Typer, *, default_dir: Path) -> None:
    """Add `voters list | add | remove` to `app` (`hotstate cluster`)."""
    voters_app = typer.Typer(
        help="The metadata quorum's voters: list them, add or remove one at a time (KIP-853).",
        no_args_is_help=True,
    )
    app.add_typer(voters_app, name="voters")

    @voters_app.command("list")
    def list_voters(
        cluster: ClusterOption = None,
        cluster_id: ClusterIdOption = None,
        secret: SecretOption = None,
        directory: DirOption = default_dir,
        ca: CaOption = None,
        cert: CertOption = None,
        key_file: KeyOption = None,
    ) -> None:
        """The voters, and the observers the leader sees fetching (with whether they have caught up)."""
        target = admin_target(cluster, cluster_id, secret, directory, ca, cert, key_file)
        reply = run_admin(target, lambda admin: admin.list_voters())
        check_reply("cannot list the voters", reply)
        _print(reply)

    @voters_app.command("add")
    def add(
        node_id: NodeArgument,
        cluster: ClusterOption = None,
        cluster_id: ClusterIdOption = None,
        secret: SecretOption = None,
        directory: DirOption = default_dir,
        ca: CaOption = None,
        cert: CertOption = None,
        key_file: KeyOption = None,
    ) -> None:
        """Make a caught-up observer with the controller role a voter (answered once committed)."""
        target = admin_target(cluster, cluster_id, secret, directory, ca, cert, key_file)
        reply = run_admin(target, lambda admin: admin.add_voter(node_id))
        check_reply(f"cannot add voter {node_id}", reply)
        stdout().print(f"voter {node_id} added: voters {list(reply.voters)}", highlight=False)

    @voters_app.command("remove")
    def remove(
        node_id: NodeArgument,
        cluster: ClusterOption = None,
        cluster_id: ClusterIdOption = None,
        secret: SecretOption = None,
        directory: DirOption = default_dir,
        ca: CaOption = None,
        cert: CertOption = None,
        key_file: KeyOption = None,
    ) -> None:
        """Take a voter out of the quorum (a leader that removes itself steps down once committed)."""
        target = admin_target(cluster, cluster_id, secret, directory, ca, cert, key_file)
        reply = run_admin(target, lambda admin: admin.remove_voter(node_id))
        check_reply(f"cannot remove voter {node_id}", reply)
        stdout().print(f"voter {node_id} removed: voters {list(reply.voters)}", highlight=False)

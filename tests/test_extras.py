"""`pip install hotstate` (no extras) is a server, the clients and the CLI: none of them imports the Spark
sink's dependencies, which come with `hotstate[spark]` (pyproject.toml), nor pyarrow, which a server loads
only when a scan can use a column copy (server/serving.py)."""

from __future__ import annotations

import subprocess
import sys

SPARK_ONLY = ("pyspark", "pyarrow")


def test_servers_clients_and_the_cli_run_without_the_spark_extra() -> None:
    # A finder that refuses the Spark extra's packages, as an install without them would.
    code = f"""
import sys
class NoSpark:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {SPARK_ONLY!r}:
            raise ImportError(f"{{name}} is not installed (hotstate[spark] brings it)")
        return None
sys.meta_path.insert(0, NoSpark())
import hotstate.server.app, hotstate.client.writer, hotstate.client.admin, hotstate.cli.main
import hotstate.sim.replication, hotstate.sim.world
from hotstate.client.query import Client
loaded = sorted(m for m in sys.modules if m.split(".")[0] in {SPARK_ONLY!r})
assert not loaded, loaded
print("ok")
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]

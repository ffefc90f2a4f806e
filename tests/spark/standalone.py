"""A Spark standalone cluster on loopback for the tests: a master and workers started from the installed
pyspark (`spark-class ...deploy.master.Master` / `...deploy.worker.Worker`), each worker with its own
rack (env HOTSTATE_RACK, which the executors it launches inherit), so executors are separate JVMs with
their own Python workers, as on a real cluster.

Every daemon runs in its own process group (its executors and their Python workers join it): `stop()`
kills the groups, whatever state the test left them in."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pyspark

SPARK_HOME = Path(pyspark.__file__).parent
SPARK_CLASS = SPARK_HOME / "bin" / "spark-class"
EXECUTOR_MAIN = "org.apache.spark.executor.CoarseGrainedExecutorBackend"
# Test-only JVM flags (as the local session's): C1 only, serial GC, small heaps; the machine is shared.
DAEMON_JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"

_MASTER_URL = re.compile(r"Starting Spark master at (spark://[\w.]+:\d+)")
_REGISTERED = re.compile(r"Registering worker (\S+) with")


@dataclass(eq=False)
class Daemon:
    name: str
    process: subprocess.Popen[bytes]
    log: Path
    rack: str | None = None

    def text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


@dataclass
class StandaloneSpark:
    root: Path
    master_url: str = ""
    daemons: list[Daemon] = field(default_factory=list)

    def env(self, rack: str | None = None) -> dict[str, str]:
        """The daemons' environment: loopback, the venv's python and this tree's sources for the executors'
        Python workers, and the worker's rack."""
        env = dict(os.environ)
        env.pop("HOTSTATE_RACK", None)
        env.update(
            SPARK_HOME=str(SPARK_HOME),
            SPARK_LOCAL_IP="127.0.0.1",
            SPARK_LOCAL_HOSTNAME="127.0.0.1",
            PYSPARK_PYTHON=sys.executable,
            SPARK_DAEMON_MEMORY="256m",
            SPARK_DAEMON_JAVA_OPTS=DAEMON_JAVA_OPTS,
            # The master's REST submission server listens on fixed port 6066: off (tests run in parallel).
            SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
            SPARK_LOG_DIR=str(self.root / "logs"),
            SPARK_CONF_DIR=str(self.root / "conf"),
        )
        if rack is not None:
            env["HOTSTATE_RACK"] = rack
        return env

    def _spawn(self, name: str, args: list[str], rack: str | None = None) -> Daemon:
        log = self.root / f"{name}.log"
        with log.open("wb") as out:
            process = subprocess.Popen(
                [str(SPARK_CLASS), *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env=self.env(rack),
                start_new_session=True,  # its own process group: executors and Python workers join it
            )
        daemon = Daemon(name, process, log, rack)
        self.daemons.append(daemon)
        return daemon

    def start(self, racks: list[str], *, timeout_s: float = 60.0) -> None:
        """A master, then one worker per rack (1 core, 1 GB each); returns once every worker registered."""
        (self.root / "conf").mkdir(parents=True, exist_ok=True)
        (self.root / "logs").mkdir(exist_ok=True)
        master = self._spawn(
            "master",
            [
                "org.apache.spark.deploy.master.Master",
                *("--host", "127.0.0.1", "--port", "0", "--webui-port", "0"),
            ],
        )
        end = time.monotonic() + timeout_s
        while not (found := _MASTER_URL.search(master.text())):
            self._check(end)
        self.master_url = found.group(1)
        for n, rack in enumerate(racks, 1):
            work = self.root / f"work-{n}"
            work.mkdir()
            self._spawn(
                f"worker-{n}",
                [
                    "org.apache.spark.deploy.worker.Worker",
                    *("--host", "127.0.0.1", "--port", "0", "--webui-port", "0"),
                    *("--cores", "1", "--memory", "1g", "--work-dir", str(work)),
                    self.master_url,
                ],
                rack,
            )
        while len(_REGISTERED.findall(master.text())) < len(racks):
            self._check(end)

    def _check(self, end: float) -> None:
        for daemon in self.daemons:
            if daemon.process.poll() is not None:
                raise RuntimeError(f"spark {daemon.name} exited:\n{daemon.text()[-3000:]}")
        if time.monotonic() > end:
            raise RuntimeError("spark standalone cluster not up in time:\n" + self.logs())
        time.sleep(0.2)

    def workers(self) -> list[Daemon]:
        return [d for d in self.daemons if d.name.startswith("worker-")]

    def executors(self) -> dict[int, Daemon]:
        """The executor JVMs running now: pid -> the worker that launched it."""
        by_pid = {d.process.pid: d for d in self.workers()}
        found = {}
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                cmdline = (entry / "cmdline").read_bytes()
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if EXECUTOR_MAIN.encode() not in cmdline:
                continue
            parent = int(stat.rsplit(")", 1)[1].split()[1])
            if parent in by_pid:
                found[int(entry.name)] = by_pid[parent]
        return found

    def logs(self) -> str:
        out = []
        for daemon in self.daemons:
            lines = daemon.text().splitlines()[-30:]
            out.append(f"--- spark {daemon.name} (last {len(lines)} lines)\n" + "\n".join(lines))
        for stderr in sorted(self.root.glob("work-*/*/*/stderr")):
            lines = stderr.read_text(errors="replace").splitlines()[-30:]
            out.append(f"--- executor {stderr.relative_to(self.root)}\n" + "\n".join(lines))
        return "\n".join(out)

    def stop(self) -> None:
        """Kill every daemon's process group (workers' groups hold their executors), then reap."""
        for daemon in reversed(self.daemons):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(daemon.process.pid, signal.SIGKILL)
        for daemon in self.daemons:
            daemon.process.wait(timeout=30)

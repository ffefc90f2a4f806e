"""Test-suite wide settings, and the markers that split the fast loop from the rest."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# CI runs each property test on the same examples every time (a failure there must reproduce, and a
# rare counterexample found by chance must not fail an unrelated change); HYPOTHESIS_PROFILE=explore
# searches fresh examples, as the sim soaks search fresh seeds.
# too_slow: a draw stalled by a busy 2-core machine (CI runs servers beside) is not a slow strategy.
settings.register_profile("ci", derandomize=True, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("explore", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

TESTS = Path(__file__).parent
# Every test here runs real `hotstate server` processes (or the whole demo) on loopback.
CLUSTER_DIRS = (TESTS / "cluster",)
# Real server processes in network namespaces (hotstate.chaos): cluster tests outside tests/cluster.
CLUSTER_FILES = {TESTS / "chaos" / "test_schedules.py"}
# Tests that take seconds each without servers or Spark (seed soaks, subprocess replays): not in
# `make quick`, still in `make test`.
SLOW_FILES = {
    TESTS / "sim" / "test_broken_rules.py",
    TESTS / "sim" / "test_determinism.py",
    TESTS / "sim" / "test_seeds.py",
    TESTS / "sim" / "test_replication_sim.py",
    TESTS / "assignor" / "test_determinism.py",
    TESTS / "chaos" / "test_netns.py",  # builds network namespaces and sends real traffic through them
}


# trylast: after xdist's own hook, whose group suffix `_xdist_groups` checks for.
@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks tests by what they start, so nobody has to remember a decorator: `cluster` (server
    processes: under tests/cluster, using the `start_cluster` fixture, or importing LocalCluster),
    `spark` (a SparkSession: the `spark` fixture or the "spark" xdist group), and `slow` for both and for
    SLOW_FILES. `make quick` runs `-m "not slow"`; `make test` runs everything."""
    for item in items:
        path = Path(str(item.path))
        fixtures = set(getattr(item, "fixturenames", ()))
        groups = {m.args[0] for m in item.iter_markers("xdist_group") if m.args}
        # A module holding LocalCluster starts servers itself, without the fixture.
        module = getattr(item, "module", None)
        cluster = (
            "start_cluster" in fixtures
            or any(path.is_relative_to(d) for d in CLUSTER_DIRS)
            or path in CLUSTER_FILES
            or hasattr(module, "LocalCluster")
        )
        spark = "spark" in fixtures or any(group.startswith("spark") for group in groups)
        if cluster:
            item.add_marker(pytest.mark.cluster)
        if spark:
            item.add_marker(pytest.mark.spark)
        if cluster or spark or path in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
    _xdist_groups(config, items)
    _slow_modules_first(items)


def _xdist_groups(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Gives each test of an `xdist_group` the "@group" node id suffix by which `--dist loadgroup` sends the
    group whole to one worker.

    xdist's worker hook appends it by assigning `item._nodeid`, which pytest 9.2's structured node ids no
    longer read (pytest-xdist issue #1386): every group was split across the workers, each setting up the
    module-scoped fixtures (a rack_traffic measurement of some 45 s ran twice in CI). Does nothing where
    xdist's suffix took effect, and outside loadgroup runs."""
    if not getattr(config.option, "loadgroup", False):
        return
    for item in items:
        names = {
            str(mark.args[0] if mark.args else mark.kwargs.get("name", "default"))
            for mark in item.iter_markers("xdist_group")
        }
        suffix = "@" + "_".join(sorted(names))
        if not names or item.nodeid.endswith(suffix) or not hasattr(item, "_id"):
            continue
        from _pytest.nodeid import NodeId  # pytest >= 9.2, which has `_id`

        item._id = NodeId.parse(item.nodeid + suffix)


def _slow_modules_first(items: list[pytest.Item]) -> None:
    """Runs the modules holding a slow test before the others, each module's tests in their order.

    `--dist loadgroup` hands out the groups first (most tests first), then single tests in this order,
    each to the worker that runs out of work. Tests of tens of seconds (the demo, standalone Spark, the
    sim soaks) handed out last keep one worker busy while the other has nothing left; handed out first,
    the fast tests at the end even the two workers out. Whole modules move, so a module-scoped fixture
    still starts once per worker."""
    slow_paths = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow_paths)


# Per xdist worker (on the controller: each report names its worker): the time its tests took and when
# its last one ended, printed at the end of the run, so a run's output shows whether a worker sat idle.
_STARTED = time.monotonic()
_busy_s: dict[str, float] = {}
_done_at_s: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    node = getattr(report, "node", None)
    gateway = getattr(node, "gateway", None)
    if gateway is None:
        return
    worker = str(gateway.id)
    _busy_s[worker] = _busy_s.get(worker, 0.0) + report.duration
    _done_at_s[worker] = time.monotonic() - _STARTED


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if _busy_s:
        terminalreporter.write_line(
            "xdist workers: "
            + "; ".join(
                f"{worker} ran tests for {_busy_s[worker]:.0f} s, done at {_done_at_s[worker]:.0f} s"
                for worker in sorted(_busy_s)
            )
        )

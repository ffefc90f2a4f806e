"""Test-suite wide settings, and the markers that split the fast loop from the rest."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import settings

# CI runs each property test on the same examples every time (a failure there must reproduce, and a
# rare counterexample found by chance must not fail an unrelated change); HYPOTHESIS_PROFILE=explore
# searches fresh examples, as the sim soaks search fresh seeds.
settings.register_profile("ci", derandomize=True)
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
        spark = "spark" in fixtures or "spark" in groups
        if cluster:
            item.add_marker(pytest.mark.cluster)
        if spark:
            item.add_marker(pytest.mark.spark)
        if cluster or spark or path in SLOW_FILES:
            item.add_marker(pytest.mark.slow)

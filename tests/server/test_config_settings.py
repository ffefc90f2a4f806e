"""The table of settings: every typed config field has its setting, and docs/configuration.md is generated
from the table."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from hotstate.assignor import AssignorConfig
from hotstate.raft.config import RaftConfig
from hotstate.replica.core import ReplicaConfig
from hotstate.routing.heartbeat import HeartbeatConfig, LivenessConfig
from hotstate.routing.hedging import HedgeConfig
from hotstate.server.config import DEFAULTS, SETTING, ServerConfig
from hotstate.server.settings import SECTIONS, SETTINGS, doc_table, update_doc
from hotstate.tls import TlsFiles

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"

# Typed configs inside ServerConfig, by attribute path, and their fields that are no server setting.
GROUPS: dict[str, tuple[type[object], set[str]]] = {
    "": (ServerConfig, {"raft", "replica", "liveness", "assignor", "hedging", "rpc_tls", "http_tls"}),
    "raft": (RaftConfig, {"max_pending_proposals"}),  # back-pressure inside the Raft driver
    "replica": (ReplicaConfig, set()),
    "liveness": (LivenessConfig, {"heartbeat"}),
    "liveness.heartbeat": (HeartbeatConfig, set()),
    "assignor": (AssignorConfig, {"num_standby_replicas"}),  # every table sets its own
    "hedging": (HedgeConfig, {"burst", "window", "min_samples"}),  # fixed by the code
    "rpc_tls": (TlsFiles, set()),
    "http_tls": (TlsFiles, {"client_auth"}),  # client certificates over HTTP: not yet
}


def test_the_doc_tables_are_generated_from_the_settings() -> None:
    text = DOCS.read_text(encoding="utf-8")
    assert update_doc(text, DEFAULTS) == text, (
        "docs/configuration.md differs from SETTINGS: run python scripts/update_config_docs.py"
    )


def test_a_stale_table_is_regenerated() -> None:
    text = DOCS.read_text(encoding="utf-8")
    stale = text.replace("| `broker.session.timeout.ms` | integer >= 1 | 2000 |", "| x | y | z |")
    assert stale != text
    assert update_doc(stale, DEFAULTS) == text


def test_a_missing_table_is_an_error() -> None:
    text = DOCS.read_text(encoding="utf-8").replace("<!-- settings: quorum -->\n", "")
    with pytest.raises(ValueError, match="one table of settings per section"):
        update_doc(text, DEFAULTS)


def test_each_section_has_settings_and_a_table() -> None:
    assert all(section.settings for section in SECTIONS)
    table = doc_table(SECTIONS[1], DEFAULTS)
    assert "| `controller.quorum.fetch.max.bytes` | integer >= 1 | 1048576 (1 MiB) |" in table
    assert "| `controller.quorum.append.linger.ms` | integer >= 0 | 5 |" in table


def test_every_field_of_the_typed_configs_is_a_setting() -> None:
    targets = {target for setting in SETTINGS for target in setting.targets}
    for path, (config_type, not_settings) in GROUPS.items():
        assert dataclasses.is_dataclass(config_type)
        names = {f.name for f in dataclasses.fields(config_type)}
        assert not_settings <= names
        expected = {f"{path}.{name}".lstrip(".") for name in names - not_settings}
        held = {target for target in targets if target.rpartition(".")[0] == path}
        assert held == expected, path


def test_defaults_come_from_the_typed_configs() -> None:
    assert DEFAULTS["controller.quorum.fetch.timeout.ms"] == RaftConfig().fetch_timeout_ms
    assert DEFAULTS["replica.fetch.max.bytes"] == ReplicaConfig().fetch_max_bytes
    assert DEFAULTS["lag.reporting.send.interval.ms"] == LivenessConfig().lag_report_interval_ms
    assert DEFAULTS["rack.aware.assignment.tags"] == ",".join(AssignorConfig().rack_aware_assignment_tags)
    assert DEFAULTS["broker.session.timeout.ms"] == 2000
    assert not any(SETTING[key].required for key in DEFAULTS)


def test_bounds_and_units_live_in_the_table() -> None:
    assert SETTING["rpc.max.frame.bytes"].minimum == 1024
    assert SETTING["replica.fetch.backoff.ms"].minimum == 0
    assert SETTING["heartbeat.missed.threshold"].unit == "send intervals"
    assert all(setting.unit == "" for setting in SETTINGS if setting.kind != "int")
    assert all(setting.shape for setting in SETTINGS if setting.kind != "int")

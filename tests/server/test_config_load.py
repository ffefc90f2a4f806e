"""Loading: TOML styles, sources and their precedence, unknown keys, defaults."""

from __future__ import annotations

import dataclasses
import logging
import re
from collections.abc import Callable
from pathlib import Path

import pytest

from hotstate.assignor import AssignorConfig
from hotstate.raft.config import RaftConfig
from hotstate.replica.core import ReplicaConfig
from hotstate.routing.heartbeat import HeartbeatConfig, LivenessConfig
from hotstate.server.config import (
    DEFAULTS,
    HEARTBEAT_KEYS,
    KNOWN_KEYS,
    LAG_REPORTING_KEYS,
    LIVENESS_KEYS,
    RAFT_KEYS,
    REPLICA_KEYS,
    ConfigError,
    Listener,
    ServerConfig,
    Voter,
    env_var_name,
    load_config,
)
from hotstate.server.settings import ALIASES, CLIENT_TAG_PREFIX

from .helpers import BASE, BASE_TOML, assert_reports, built_in_code, load, load_toml

DOCS = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"


def test_base_file_loads_with_defaults(tmp_path: Path) -> None:
    config = load_toml(tmp_path, BASE_TOML)
    assert config.node_id == 1
    assert config.process_roles == frozenset({"controller", "broker"})
    assert config.is_controller and config.is_broker
    assert config.rpc == Listener("rpc", "127.0.0.1", 9092)
    assert config.http == Listener("http", "127.0.0.1", 8080)
    assert config.voters == (
        Voter(1, "127.0.0.1", 9092),
        Voter(2, "127.0.0.1", 9093),
        Voter(3, "127.0.0.1", 9094),
    )
    assert config.data_dir == Path("/var/lib/hotstate/1")
    assert config.rack is None and config.tags == ()
    assert (config.cluster_id, config.cluster_secret) == ("hs-test", "0123456789abcdef")
    assert config.raft == RaftConfig()
    assert config.heartbeat_interval_ms == 250
    assert config.session_timeout_ms == 2000
    assert config.snapshot_max_records == 10_000
    assert config.snapshot_interval_ms == 60_000
    assert config.max_frame_bytes == 16 * 1024 * 1024
    assert config.replica == ReplicaConfig()
    assert config.replica_log_fsync == "never"
    assert config.produce_max_bytes == 8 * 1024 * 1024
    assert config.liveness == LivenessConfig()
    assert config.log_level == "INFO"


def test_nested_tables_equal_flat_dotted_keys(tmp_path: Path) -> None:
    nested = """\
listeners = "rpc://127.0.0.1:9092,http://127.0.0.1:8080"
rack = "az-a"

[node]
id = 1

[process]
roles = "controller,broker"

[controller.quorum]
voters = "1@127.0.0.1:9092,2@127.0.0.1:9093,3@127.0.0.1:9094"
election.timeout.ms = 300
fetch = { timeout.ms = 900 }

[data]
dir = "/var/lib/hotstate/1"

[cluster]
id = "hs-test"
secret = "0123456789abcdef"

[tags]
zone = "eu1"
cluster = "k8s-1"

[broker.heartbeat]
interval.ms = 100
"""
    flat = BASE_TOML + (
        '"rack" = "az-a"\n'
        '"controller.quorum.election.timeout.ms" = 300\n'
        '"controller.quorum.fetch.timeout.ms" = 900\n'
        '"tags" = "zone=eu1,cluster=k8s-1"\n'
        '"broker.heartbeat.interval.ms" = 100\n'
    )
    from_nested = load_toml(tmp_path, nested)
    assert from_nested == load_toml(tmp_path, flat)
    assert from_nested.raft.election_timeout_ms == 300
    assert from_nested.raft.fetch_timeout_ms == 900
    assert from_nested.tags == (("cluster", "k8s-1"), ("zone", "eu1"))
    assert from_nested.heartbeat_interval_ms == 100


def test_replica_keys_as_nested_tables_equal_flat_dotted_keys(tmp_path: Path) -> None:
    nested = (
        BASE_TOML
        + """[replica]
fetch = { max.wait.ms = 100, timeout.ms = 900 }
lag.time.max.ms = 5000
log.fsync = "always"

[min.insync]
replicas = 2

[produce.max]
bytes = 1048576
"""
    )
    flat = BASE_TOML + (
        '"replica.fetch.max.wait.ms" = 100\n'
        '"replica.fetch.timeout.ms" = 900\n'
        '"replica.lag.time.max.ms" = 5000\n'
        '"replica.log.fsync" = "always"\n'
        '"min.insync.replicas" = 2\n'
        '"produce.max.bytes" = 1048576\n'
    )
    from_nested = load_toml(tmp_path, nested)
    assert from_nested == load_toml(tmp_path, flat)
    assert from_nested.replica == ReplicaConfig(
        fetch_max_wait_ms=100, fetch_timeout_ms=900, replica_lag_time_max_ms=5000, min_insync_replicas=2
    )
    assert from_nested.replica_log_fsync == "always"
    assert from_nested.produce_max_bytes == 1024 * 1024


def test_liveness_keys_as_nested_tables_equal_flat_dotted_keys(tmp_path: Path) -> None:
    nested = (
        BASE_TOML
        + """[heartbeat]
send.interval.ms = 50
check = { interval.ms = 100 }
window.ms = 1000
missed.threshold = 4
received.threshold = 3

[lag.reporting.send]
interval.ms = 250
"""
    )
    flat = BASE_TOML + (
        '"heartbeat.send.interval.ms" = 50\n'
        '"heartbeat.check.interval.ms" = 100\n'
        '"heartbeat.window.ms" = 1000\n'
        '"heartbeat.missed.threshold" = 4\n'
        '"heartbeat.received.threshold" = 3\n'
        '"lag.reporting.send.interval.ms" = 250\n'
    )
    from_nested = load_toml(tmp_path, nested)
    assert from_nested == load_toml(tmp_path, flat)
    assert from_nested.liveness == LivenessConfig(
        heartbeat=HeartbeatConfig(
            send_interval_ms=50,
            check_interval_ms=100,
            window_ms=1000,
            missed_threshold=4,
            received_threshold=3,
        ),
        lag_report_interval_ms=250,
    )
    # broker.heartbeat.* is the heartbeat to the controller, a separate setting.
    assert from_nested.heartbeat_interval_ms == 250


def test_toml_arrays_for_lists(tmp_path: Path) -> None:
    text = BASE_TOML.replace(
        '"process.roles" = "controller,broker"', '"process.roles" = ["broker", "controller"]'
    ).replace(
        '"controller.quorum.voters" = "1@127.0.0.1:9092,2@127.0.0.1:9093,3@127.0.0.1:9094"',
        '"controller.quorum.voters" = ["1@127.0.0.1:9092", "2@127.0.0.1:9093", "3@127.0.0.1:9094"]',
    )
    text = text.replace(
        'listeners = "rpc://127.0.0.1:9092,http://127.0.0.1:8080"',
        'listeners = ["http://127.0.0.1:8080", "rpc://127.0.0.1:9092"]',
    )
    assert load_toml(tmp_path, text) == load_toml(tmp_path, BASE_TOML)


def test_key_given_both_flat_and_nested_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_toml(tmp_path, BASE_TOML + "[node]\nid = 2\n")
    single = assert_reports(excinfo, "node.id", "must be set once", 2)
    assert single.source == str(tmp_path / "server.toml")


@pytest.mark.parametrize(
    ("toml_line", "key", "suggestion"),
    [
        ('"node.idd" = 1', "node.idd", "node.id"),
        ("[node]\nidd = 1", "node.idd", "node.id"),
        ('"controller.quorum.voter" = "x"', "controller.quorum.voter", "controller.quorum.voters"),
        (
            "[controller.quorum]\nelection.timeout = 1",
            "controller.quorum.election.timeout",
            "election.timeout.ms",
        ),
        ('"data_dir" = "/x"', "data_dir", "data.dir"),
        ('"log.lvl" = "INFO"', "log.lvl", "log.level"),
    ],
)
def test_unknown_file_key_is_an_error_naming_the_nearest(
    tmp_path: Path, toml_line: str, key: str, suggestion: str
) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_toml(tmp_path, toml_line + "\n" + BASE_TOML)
    single = assert_reports(excinfo, key, "is not a known key")
    assert f"did you mean '{suggestion}" in single.allowed or suggestion in single.allowed


def test_unknown_key_without_a_near_one_points_at_the_docs(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_toml(tmp_path, BASE_TOML + "zzzzzz = 1\n")
    assert_reports(excinfo, "zzzzzz", "docs/configuration.md")


@pytest.mark.parametrize(
    ("content", "fragment"),
    [(None, "No such file"), (b"node.id = = 1\n", "readable TOML"), (b"\xff\xfe = 1\n", "readable TOML")],
)
def test_unreadable_file_is_an_error(tmp_path: Path, content: bytes | None, fragment: str) -> None:
    path = tmp_path / "server.toml"
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError) as excinfo:
        load_config(path, env={})
    assert_reports(excinfo, "--config", fragment, str(path))


# --- precedence: file < env < flags ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "file_value", "env_value", "flag_value", "read", "expected"),
    [
        ("rack", '"az-file"', "az-env", "az-flag", lambda c: c.rack, ["az-file", "az-env", "az-flag"]),
        ("log.level", '"DEBUG"', "WARNING", "ERROR", lambda c: c.log_level, ["DEBUG", "WARNING", "ERROR"]),
        (
            "broker.session.timeout.ms",
            "3000",
            "4000",
            "5000",
            lambda c: c.session_timeout_ms,
            [3000, 4000, 5000],
        ),
        (
            "controller.quorum.fetch.timeout.ms",
            "3000",
            "4000",
            "5000",
            lambda c: c.raft.fetch_timeout_ms,
            [3000, 4000, 5000],
        ),
        (
            "replica.fetch.max.bytes",
            "1024",
            "2048",
            "4096",
            lambda c: c.replica.fetch_max_bytes,
            [1024, 2048, 4096],
        ),
        ("min.insync.replicas", "2", "3", "1", lambda c: c.replica.min_insync_replicas, [2, 3, 1]),
        (
            "replica.log.fsync",
            '"always"',
            "never",
            "ALWAYS",
            lambda c: c.replica_log_fsync,
            ["always", "never", "always"],
        ),
        ("produce.max.bytes", "1000", "2000", "3000", lambda c: c.produce_max_bytes, [1000, 2000, 3000]),
        (
            "heartbeat.send.interval.ms",
            "50",
            "200",
            "400",
            lambda c: c.liveness.heartbeat.send_interval_ms,
            [50, 200, 400],
        ),
        (
            "heartbeat.missed.threshold",
            "5",
            "4",
            "6",
            lambda c: c.liveness.heartbeat.missed_threshold,
            [5, 4, 6],
        ),
        (
            "lag.reporting.send.interval.ms",
            "1000",
            "2000",
            "3000",
            lambda c: c.liveness.lag_report_interval_ms,
            [1000, 2000, 3000],
        ),
        (
            "tags",
            '"a=file"',
            "a=env",
            "a=flag",
            lambda c: c.tags,
            [(("a", x),) for x in ("file", "env", "flag")],
        ),
        (
            "data.dir",
            '"/file"',
            "/env",
            "/flag",
            lambda c: c.data_dir,
            [Path("/file"), Path("/env"), Path("/flag")],
        ),
        ("node.id", "2", "3", "4", lambda c: c.node_id, [2, 3, 4]),
    ],
)
def test_flags_beat_env_beat_file(
    tmp_path: Path,
    key: str,
    file_value: str,
    env_value: str,
    flag_value: str,
    read: Callable[[ServerConfig], object],
    expected: list[object],
) -> None:
    lines = [line for line in BASE_TOML.splitlines() if not line.startswith(f'"{key}"')]
    text = "\n".join([*lines, f'"{key}" = {file_value}', ""])
    # Any node id works if every node is broker-only and none is a voter.
    overrides = {"process.roles": "broker"} if key == "node.id" else {}
    if key == "node.id":
        text = text.replace('"process.roles" = "controller,broker"', '"process.roles" = "broker"').replace(
            "1@127.0.0.1:9092,2@127.0.0.1:9093,3@127.0.0.1:9094", "9@127.0.0.1:9099"
        )
    env = {env_var_name(key): env_value}
    from_file = load_toml(tmp_path, text, flags=overrides)
    from_env = load_toml(tmp_path, text, env=env, flags=overrides)
    from_flag = load_toml(tmp_path, text, env=env, flags={**overrides, key: flag_value})
    assert [read(from_file), read(from_env), read(from_flag)] == expected


def test_the_heartbeat_window_rule_is_checked_on_the_merged_values(tmp_path: Path) -> None:
    text = BASE_TOML + '"heartbeat.window.ms" = 300\n'
    assert load_toml(tmp_path, text).liveness.heartbeat.window_ms == 300
    # The environment's send interval makes the file's window too short for 3 slots...
    env = {"HOTSTATE_HEARTBEAT_SEND_INTERVAL_MS": "200"}
    with pytest.raises(ConfigError) as excinfo:
        load_toml(tmp_path, text, env=env)
    single = assert_reports(excinfo, "heartbeat.window.ms", "must be at least 600", 300)
    assert "heartbeat.send.interval.ms=200" in single.allowed and single.source == str(
        tmp_path / "server.toml"
    )
    # ... and a flag widens it again.
    config = load_toml(tmp_path, text, env=env, flags={"heartbeat.window.ms": "600"})
    assert (config.liveness.heartbeat.send_interval_ms, config.liveness.heartbeat.window_ms) == (200, 600)


def test_every_required_key_can_come_from_env_alone() -> None:
    env = {env_var_name(key): value for key, value in BASE.items()}
    assert load_config(env=env) == load()


def test_replica_settings_from_env() -> None:
    env = {env_var_name(key): value for key, value in BASE.items()}
    env |= {
        "HOTSTATE_REPLICA_FETCH_MAX_WAIT_MS": "100",
        "HOTSTATE_REPLICA_FETCH_MAX_BYTES": "1_048_576",
        "HOTSTATE_REPLICA_FETCH_TIMEOUT_MS": "800",
        "HOTSTATE_REPLICA_FETCH_BACKOFF_MS": "0",
        "HOTSTATE_REPLICA_LAG_TIME_MAX_MS": "3000",
        "HOTSTATE_REPLICA_ISR_CHANGE_RETRY_MS": "250",
        "HOTSTATE_MIN_INSYNC_REPLICAS": "2",
        "HOTSTATE_REPLICA_LOG_RETENTION_RECORDS": "0",
        "HOTSTATE_REPLICA_LOG_FSYNC": "always",
        "HOTSTATE_PRODUCE_MAX_BYTES": "2097152",
    }
    config = load_config(env=env)
    assert config.replica == ReplicaConfig(
        fetch_max_wait_ms=100,
        fetch_max_bytes=1024 * 1024,
        fetch_timeout_ms=800,
        fetch_backoff_ms=0,
        replica_lag_time_max_ms=3000,
        isr_change_retry_ms=250,
        min_insync_replicas=2,
        log_retention_records=0,
    )
    assert config.replica_log_fsync == "always"
    assert config.produce_max_bytes == 2 * 1024 * 1024


def test_liveness_settings_from_env() -> None:
    env = {env_var_name(key): value for key, value in BASE.items()}
    env |= {
        "HOTSTATE_HEARTBEAT_SEND_INTERVAL_MS": "250",
        "HOTSTATE_HEARTBEAT_CHECK_INTERVAL_MS": "500",
        "HOTSTATE_HEARTBEAT_WINDOW_MS": "5_000",
        "HOTSTATE_HEARTBEAT_MISSED_THRESHOLD": "4",
        "HOTSTATE_HEARTBEAT_RECEIVED_THRESHOLD": "1",
        "HOTSTATE_LAG_REPORTING_SEND_INTERVAL_MS": "1000",
    }
    config = load_config(env=env)
    assert config.liveness == LivenessConfig(
        heartbeat=HeartbeatConfig(
            send_interval_ms=250,
            check_interval_ms=500,
            window_ms=5000,
            missed_threshold=4,
            received_threshold=1,
        ),
        lag_report_interval_ms=1000,
    )
    # The broker's heartbeat to the controller is untouched.
    assert config.heartbeat_interval_ms == 250 and config.session_timeout_ms == 2000


def test_env_defaults_to_the_process_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in BASE.items():
        monkeypatch.setenv(env_var_name(key), value)
    monkeypatch.setenv("HOTSTATE_RACK", "az-b")
    assert load_config().rack == "az-b"


def test_empty_env_var_counts_as_unset(tmp_path: Path) -> None:
    config = load_toml(tmp_path, BASE_TOML + '"rack" = "az-a"\n', env={"HOTSTATE_RACK": ""})
    assert config.rack == "az-a"


@pytest.mark.parametrize(("key", "read"), [("rack", lambda c: c.rack), ("tags", lambda c: c.tags)])
def test_empty_flag_clears_an_optional_value(
    tmp_path: Path, key: str, read: Callable[[ServerConfig], object]
) -> None:
    config = load_toml(tmp_path, BASE_TOML + '"rack" = "az-a"\ntags = { zone = "eu1" }\n', flags={key: ""})
    assert read(config) in (None, ())


def test_unknown_env_var_warns_and_is_ignored(caplog: pytest.LogCaptureFixture) -> None:
    env = {env_var_name(key): value for key, value in BASE.items()}
    env |= {"HOTSTATE_NODEID": "7", "HOTSTATE_SINK_BATCH": "x", "OTHER_NODE_ID": "9"}
    with caplog.at_level(logging.WARNING, logger="hotstate.server.config"):
        config = load_config(env=env)
    assert config.node_id == 1
    messages = [record.getMessage() for record in caplog.records]
    assert any("HOTSTATE_NODEID" in m and "did you mean HOTSTATE_NODE_ID" in m for m in messages)
    assert any("HOTSTATE_SINK_BATCH" in m for m in messages)
    assert not any("OTHER_NODE_ID" in m for m in messages)


def test_unknown_flag_is_an_error_naming_the_nearest() -> None:
    with pytest.raises(ConfigError) as excinfo:
        load({"node.idd": "1"})
    single = assert_reports(excinfo, "node.idd", "did you mean 'node.id'")
    assert single.source == "flag --node.idd"


@pytest.mark.parametrize(
    ("env", "flags", "source"),
    [
        ({"HOTSTATE_NODE_ID": "abc"}, {}, "env HOTSTATE_NODE_ID"),
        ({}, {"node.id": "abc"}, "flag --node.id"),
        ({"HOTSTATE_NODE_ID": "2"}, {"node.id": "abc"}, "flag --node.id"),
    ],
)
def test_errors_say_where_the_value_came_from(
    tmp_path: Path, env: dict[str, str], flags: dict[str, str], source: str
) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_toml(tmp_path, BASE_TOML, env=env, flags=flags)
    assert str(excinfo.value) == f"node.id='abc': must be a positive integer (from {source})"
    assert excinfo.value.source == source


def test_file_source_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_toml(tmp_path, BASE_TOML.replace('"node.id" = 1', '"node.id" = 0'))
    assert excinfo.value.source == str(tmp_path / "server.toml")
    assert str(excinfo.value).endswith(f"(from {tmp_path / 'server.toml'})")


def test_every_bad_key_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as excinfo:
        load(
            {
                "node.id": "abc",
                "log.level": "LOUD",
                "cluster.id": "no spaces",
                "controller.quorum.fetch.max.wait.ms": "5000",
                "broker.session.timeout.ms": "100",
            },
            drop=("data.dir",),
        )
    keys = {single.key for single in excinfo.value.errors}
    assert keys == {
        "node.id",
        "log.level",
        "cluster.id",
        "controller.quorum.fetch.max.wait.ms",
        "broker.heartbeat.interval.ms",
        "data.dir",
    }
    assert len(str(excinfo.value).splitlines()) == len(excinfo.value.errors) == 6


def test_every_bad_replica_key_is_reported_at_once() -> None:
    # A value that does not parse is reported once, not again by the rules that compare it with others.
    with pytest.raises(ConfigError) as excinfo:
        load(
            {
                "replica.fetch.max.wait.ms": "5000",
                "replica.fetch.max.bytes": "lots",
                "replica.fetch.backoff.ms": "-1",
                "min.insync.replicas": "0",
                "replica.log.fsync": "sometimes",
                "produce.max.bytes": "1.5",
                "rpc.max.frame.bytes": "2048",
            }
        )
    keys = [single.key for single in excinfo.value.errors]
    assert sorted(keys) == sorted(
        {
            "replica.fetch.max.wait.ms",
            "replica.fetch.max.bytes",
            "replica.fetch.backoff.ms",
            "min.insync.replicas",
            "replica.log.fsync",
            "produce.max.bytes",
            "rpc.max.frame.bytes",
        }
    )
    # The frame is checked against the quorum sizes only: the partition sizes did not parse.
    frame = next(single for single in excinfo.value.errors if single.key == "rpc.max.frame.bytes")
    assert "controller.quorum.fetch.max.bytes" in frame.allowed and "produce.max.bytes" not in frame.allowed


def test_every_bad_liveness_key_is_reported_at_once() -> None:
    # A value that does not parse is reported once, not again by the window rule that compares it with others.
    with pytest.raises(ConfigError) as excinfo:
        load(
            {
                "heartbeat.send.interval.ms": "fast",
                "heartbeat.check.interval.ms": "0",
                "heartbeat.window.ms": "1",
                "heartbeat.missed.threshold": "-3",
                "heartbeat.received.threshold": "true",
                "lag.reporting.send.interval.ms": str(2**31),
            }
        )
    keys = [single.key for single in excinfo.value.errors]
    assert sorted(keys) == sorted(
        {
            "heartbeat.send.interval.ms",
            "heartbeat.check.interval.ms",
            "heartbeat.missed.threshold",
            "heartbeat.received.threshold",
            "lag.reporting.send.interval.ms",
        }
    )
    assert all(isinstance(single, ConfigError) for single in excinfo.value.errors)


def test_bad_liveness_keys_are_reported_with_the_other_bad_keys() -> None:
    with pytest.raises(ConfigError) as excinfo:
        load({"heartbeat.window.ms": "200", "replica.fetch.max.bytes": "lots", "node.id": "0"})
    assert sorted(single.key for single in excinfo.value.errors) == [
        "heartbeat.window.ms",
        "node.id",
        "replica.fetch.max.bytes",
    ]


def test_a_value_standing_in_for_a_bad_one_is_not_reported() -> None:
    # Another bad key fails ServerConfig's rules too: the placeholder's error must not come along with it.
    with pytest.raises(ConfigError) as excinfo:
        load({"replica.fetch.max.bytes": "lots", "node.id": "0"})
    assert [(single.key, single.value) for single in excinfo.value.errors] == [
        ("replica.fetch.max.bytes", "lots"),
        ("node.id", 0),
    ]


# --- mapping and defaults ---------------------------------------------------------------------------------


@pytest.mark.parametrize(("key", "field_name"), sorted(RAFT_KEYS.items()))
def test_each_quorum_key_sets_its_raft_field(key: str, field_name: str) -> None:
    # Above the default fetch.max.wait.ms (200) for fetch.timeout.ms; harmless for every other field.
    value = 1500 if field_name == "fetch_timeout_ms" else 150
    config = load({key: str(value)})
    assert getattr(config.raft, field_name) == value
    others = {name for name in RAFT_KEYS.values() if name != field_name}
    assert all(getattr(config.raft, name) == getattr(RaftConfig(), name) for name in others)


@pytest.mark.parametrize(("key", "field_name"), sorted(REPLICA_KEYS.items()))
def test_each_replica_key_sets_its_replica_field(key: str, field_name: str) -> None:
    # Above the default fetch.max.wait.ms (200) for fetch.timeout.ms; harmless for every other field.
    value = 1500 if field_name == "fetch_timeout_ms" else 150
    config = load({key: str(value)})
    assert getattr(config.replica, field_name) == value
    others = {name for name in REPLICA_KEYS.values() if name != field_name}
    assert all(getattr(config.replica, name) == getattr(ReplicaConfig(), name) for name in others)
    assert config.raft == RaftConfig()


def test_replica_keys_cover_every_replica_config_field() -> None:
    assert set(REPLICA_KEYS.values()) == {field.name for field in dataclasses.fields(ReplicaConfig)}


@pytest.mark.parametrize(("key", "field_name"), sorted(HEARTBEAT_KEYS.items()))
def test_each_heartbeat_key_sets_its_heartbeat_field(key: str, field_name: str) -> None:
    # Within the default window (2000 ms) for the send interval times the thresholds, and vice versa.
    value = 1500 if field_name == "window_ms" else 150 if field_name.endswith("_ms") else 5
    config = load({key: str(value)})
    assert getattr(config.liveness.heartbeat, field_name) == value
    others = {name for name in HEARTBEAT_KEYS.values() if name != field_name}
    assert all(
        getattr(config.liveness.heartbeat, name) == getattr(HeartbeatConfig(), name) for name in others
    )
    assert config.liveness.lag_report_interval_ms == LivenessConfig().lag_report_interval_ms
    assert config.replica == ReplicaConfig() and config.heartbeat_interval_ms == 250


@pytest.mark.parametrize(("key", "field_name"), sorted(LAG_REPORTING_KEYS.items()))
def test_each_lag_reporting_key_sets_its_liveness_field(key: str, field_name: str) -> None:
    config = load({key: "150"})
    assert getattr(config.liveness, field_name) == 150
    assert config.liveness.heartbeat == HeartbeatConfig()


def test_liveness_keys_cover_every_liveness_config_field() -> None:
    assert set(HEARTBEAT_KEYS.values()) == {field.name for field in dataclasses.fields(HeartbeatConfig)}
    assert {"heartbeat", *LAG_REPORTING_KEYS.values()} == {
        field.name for field in dataclasses.fields(LivenessConfig)
    }
    assert set(LIVENESS_KEYS) == {*HEARTBEAT_KEYS, *LAG_REPORTING_KEYS}


def test_documented_defaults() -> None:
    assert DEFAULTS["broker.heartbeat.interval.ms"] == 250
    assert DEFAULTS["broker.session.timeout.ms"] == 2000
    assert DEFAULTS["metadata.snapshot.max.records"] == 10_000
    assert DEFAULTS["metadata.snapshot.interval.ms"] == 60_000
    assert DEFAULTS["rpc.max.frame.bytes"] == 16 * 1024 * 1024
    assert DEFAULTS["log.level"] == "INFO"
    assert all(DEFAULTS[key] == getattr(RaftConfig(), name) for key, name in RAFT_KEYS.items())
    assert all(DEFAULTS[key] == getattr(ReplicaConfig(), name) for key, name in REPLICA_KEYS.items())
    assert DEFAULTS["replica.log.fsync"] == "never"
    assert DEFAULTS["produce.max.bytes"] == 8 * 1024 * 1024
    assert all(DEFAULTS[key] == getattr(HeartbeatConfig(), name) for key, name in HEARTBEAT_KEYS.items())
    assert [DEFAULTS[key] for key in LIVENESS_KEYS] == [100, 200, 2000, 3, 2, 500]
    # ServerConfig built in code falls back to the same defaults as a loaded one.
    loaded = load()
    built = built_in_code(loaded)
    assert built == loaded


def test_loading_does_not_create_the_data_dir(tmp_path: Path) -> None:
    data_dir = tmp_path / "data" / "node-1"
    assert load({"data.dir": str(data_dir)}).data_dir == data_dir
    assert not (tmp_path / "data").exists()


def test_env_var_names() -> None:
    assert env_var_name("controller.quorum.voters") == "HOTSTATE_CONTROLLER_QUORUM_VOTERS"
    assert env_var_name("replica.fetch.max.wait.ms") == "HOTSTATE_REPLICA_FETCH_MAX_WAIT_MS"
    assert env_var_name("min.insync.replicas") == "HOTSTATE_MIN_INSYNC_REPLICAS"
    assert env_var_name("replica.log.fsync") == "HOTSTATE_REPLICA_LOG_FSYNC"
    assert env_var_name("produce.max.bytes") == "HOTSTATE_PRODUCE_MAX_BYTES"
    assert env_var_name("heartbeat.send.interval.ms") == "HOTSTATE_HEARTBEAT_SEND_INTERVAL_MS"
    assert env_var_name("heartbeat.missed.threshold") == "HOTSTATE_HEARTBEAT_MISSED_THRESHOLD"
    assert env_var_name("lag.reporting.send.interval.ms") == "HOTSTATE_LAG_REPORTING_SEND_INTERVAL_MS"
    assert len({env_var_name(key) for key in KNOWN_KEYS}) == len(KNOWN_KEYS)


def test_every_key_is_documented() -> None:
    text = DOCS.read_text(encoding="utf-8")
    documented = set(re.findall(r"^\| `([a-z._]+)` \|", text, re.MULTILINE))
    # The aliases' table too (client.tag.KEY is written with its placeholder).
    aliases = {alias.key for alias in ALIASES if not alias.key.endswith(".")}
    assert documented == set(KNOWN_KEYS) | aliases
    assert f"`{CLIENT_TAG_PREFIX}KEY`" in text


def test_docs_examples_load(tmp_path: Path) -> None:
    blocks = re.findall(r"```toml\n(.*?)```", DOCS.read_text(encoding="utf-8"), re.DOTALL)
    assert len(blocks) == 4
    env = {"HOTSTATE_CLUSTER_SECRET": "a-secret-from-the-environment"}
    configs = [load_toml(tmp_path, block, env=env) for block in blocks]
    combined_1, combined_2, broker, controller = configs
    assert controller.process_roles == frozenset({"controller"}) and controller.rack == "eu-west-1a"
    assert controller.assignor == AssignorConfig(
        rack_aware_assignment_strategy="balance_subtopology",
        rack_aware_assignment_tags=("zone", "rack"),
        traffic_cost=20,
    )
    assert broker.assignor == AssignorConfig()
    assert combined_1.is_controller and combined_1.is_broker and combined_2.node_id == 2
    assert combined_1.voters == combined_2.voters
    assert broker.process_roles == frozenset({"broker"}) and broker.tags == (
        ("cluster", "k8s-1"),
        ("zone", "eu1"),
    )
    assert broker.raft.fetch_timeout_ms == 800 and broker.session_timeout_ms == 1500

"""One test per rule: accepted values, and an error naming key, value and what is allowed for each bad one."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hotstate.raft.config import RaftConfig
from hotstate.replica.core import ReplicaConfig
from hotstate.routing.heartbeat import HeartbeatConfig, LivenessConfig
from hotstate.server.config import (
    HEARTBEAT_KEYS,
    LIVENESS_KEYS,
    MAX_INT32,
    RAFT_KEYS,
    REPLICA_KEYS,
    REQUIRED_KEYS,
    ConfigError,
    Listener,
    ServerConfig,
    Voter,
    env_var_name,
)

from .helpers import BASE, BASE_TOML, assert_reports, load, load_toml

# --- accepted values ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("listeners", "rpc", "http"),
    [
        ("rpc://127.0.0.1:9092", Listener("rpc", "127.0.0.1", 9092), None),
        ("rpc://[::1]:9092,http://[::1]:8080", Listener("rpc", "::1", 9092), Listener("http", "::1", 8080)),
        (
            "http://0.0.0.0:0, rpc://0.0.0.0:9092",
            Listener("rpc", "0.0.0.0", 9092),
            Listener("http", "0.0.0.0", 0),
        ),
        ("RPC://Node-1.example.com:9092", Listener("rpc", "Node-1.example.com", 9092), None),
        ("rpc://hotstate_1:9092,", Listener("rpc", "hotstate_1", 9092), None),
        ("rpc://[fe80::1%eth0]:9092", Listener("rpc", "fe80::1%eth0", 9092), None),
    ],
)
def test_listeners_accepted(listeners: str, rpc: Listener, http: Listener | None) -> None:
    config = load({"listeners": listeners})
    assert (config.rpc, config.http) == (rpc, http)


def test_listener_port_zero_is_allowed_for_a_broker() -> None:
    config = load(
        {"process.roles": "broker", "node.id": "4", "listeners": "rpc://127.0.0.1:0,http://127.0.0.1:0"}
    )
    assert config.rpc.port == 0 and config.http is not None and config.http.port == 0


@pytest.mark.parametrize(
    ("voters", "expected"),
    [
        ("1@127.0.0.1:9092", (Voter(1, "127.0.0.1", 9092),)),
        (" 1@[::1]:9092 , 2@[::1]:9093 ", (Voter(1, "::1", 9092), Voter(2, "::1", 9093))),
        ("1@a.example:9092,2@b.example:9092", (Voter(1, "a.example", 9092), Voter(2, "b.example", 9092))),
    ],
)
def test_voters_accepted(voters: str, expected: tuple[Voter, ...]) -> None:
    assert load({"controller.quorum.voters": voters}).voters == expected


def test_a_controller_missing_from_the_voters_may_join() -> None:
    # KIP-853: it follows the metadata log as an observer until `hotstate cluster voters add 4`.
    config = load({"node.id": "4", "listeners": "rpc://127.0.0.1:9095,http://127.0.0.1:8084"})
    assert config.is_controller and config.find_voter(4) is None


def test_controller_only_and_broker_only_roles() -> None:
    controller = load({"process.roles": "controller"})
    assert controller.is_controller and not controller.is_broker
    broker = load({"process.roles": "broker", "node.id": "4"})
    assert broker.is_broker and not broker.is_controller
    assert broker.find_voter(4) is None


@pytest.mark.parametrize(
    ("text", "level"), [("debug", "DEBUG"), ("Info", "INFO"), ("WARN", "WARNING"), ("error", "ERROR")]
)
def test_log_level_is_case_insensitive(text: str, level: str) -> None:
    assert load({"log.level": text}).log_level == level


@pytest.mark.parametrize(("text", "value"), [("500", 500), (" 500 ", 500), ("1_000", 1000), ("+300", 300)])
def test_integers_from_text(text: str, value: int) -> None:
    assert load({"broker.heartbeat.interval.ms": text}).heartbeat_interval_ms == value


def test_integers_from_toml_strings(tmp_path: Path) -> None:
    config = load_toml(tmp_path, BASE_TOML.replace('"node.id" = 1', '"node.id" = "1"'))
    assert config.node_id == 1


@pytest.mark.parametrize(
    ("tags", "expected"),
    [
        ("", ()),
        ("zone=eu1,cluster=k8s-1", (("cluster", "k8s-1"), ("zone", "eu1"))),
        (" zone = eu 1 ,", (("zone", "eu 1"),)),
        ("topology.kubernetes.io/zone=x", None),
    ],
)
def test_tags(tags: str, expected: tuple[tuple[str, str], ...] | None) -> None:
    if expected is None:  # '/' is not allowed in a tag key
        with pytest.raises(ConfigError):
            load({"tags": tags})
    else:
        assert load({"tags": tags}).tags == expected


def test_cluster_id_accepts_a_kafka_style_base64_uuid() -> None:
    assert load({"cluster.id": "MkU3OEVBNTcwNTJENDM2Qk"}).cluster_id == "MkU3OEVBNTcwNTJENDM2Qk"


# Partition messages small enough for any frame the quorum sizes allow.
SMALL_PARTITION_MESSAGES = {"replica.fetch.max.bytes": "4096", "produce.max.bytes": "4096"}


def test_small_frames_are_fine_with_small_quorum_messages() -> None:
    config = load(
        {
            "controller.quorum.fetch.max.bytes": "4096",
            "controller.quorum.snapshot.chunk.bytes": "4096",
            "rpc.max.frame.bytes": str(4096 + 64 * 1024),
            **SMALL_PARTITION_MESSAGES,
        }
    )
    assert config.max_frame_bytes == 4096 + 64 * 1024


def test_partition_messages_may_fill_half_a_frame() -> None:
    # The defaults sit right at the limit: produce.max.bytes is half of rpc.max.frame.bytes.
    assert load().produce_max_bytes * 2 == load().max_frame_bytes
    config = load({"replica.fetch.max.bytes": str(8 * 1024 * 1024), "produce.max.bytes": "1"})
    assert config.replica.fetch_max_bytes == 8 * 1024 * 1024
    frame = 4 * 1024 * 1024
    config = load(
        {
            "rpc.max.frame.bytes": str(frame),
            "replica.fetch.max.bytes": str(frame // 2),
            "produce.max.bytes": str(frame // 2),
        }
    )
    assert (config.replica.fetch_max_bytes, config.produce_max_bytes) == (frame // 2, frame // 2)


@pytest.mark.parametrize(
    ("text", "policy"), [("never", "never"), ("Always", "always"), (" ALWAYS ", "always")]
)
def test_replica_log_fsync_is_case_insensitive(text: str, policy: str) -> None:
    assert load({"replica.log.fsync": text}).replica_log_fsync == policy


@pytest.mark.parametrize("key", ["replica.fetch.backoff.ms", "replica.log.retention.records"])
def test_replica_settings_that_may_be_zero(key: str) -> None:
    assert getattr(load({key: "0"}).replica, REPLICA_KEYS[key]) == 0


@pytest.mark.parametrize(
    ("overrides", "heartbeat"),
    [
        # Exactly as many whole slots as the larger threshold.
        ({"heartbeat.window.ms": "300"}, HeartbeatConfig(window_ms=300)),
        # 3.5 slots of 100 ms: 3 whole slots.
        ({"heartbeat.window.ms": "350"}, HeartbeatConfig(window_ms=350)),
        (
            {
                "heartbeat.send.interval.ms": "500",
                "heartbeat.window.ms": "1000",
                "heartbeat.missed.threshold": "2",
            },
            HeartbeatConfig(send_interval_ms=500, window_ms=1000, missed_threshold=2),
        ),
        (
            {
                "heartbeat.send.interval.ms": "1",
                "heartbeat.check.interval.ms": "1",
                "heartbeat.window.ms": "1",
                "heartbeat.missed.threshold": "1",
                "heartbeat.received.threshold": "1",
            },
            HeartbeatConfig(1, 1, 1, 1, 1),
        ),
        # The check interval is free: it need not relate to the send interval or the window.
        ({"heartbeat.check.interval.ms": "60000"}, HeartbeatConfig(check_interval_ms=60_000)),
    ],
)
def test_heartbeat_window_at_its_limits(overrides: dict[str, str], heartbeat: HeartbeatConfig) -> None:
    assert load(overrides).liveness.heartbeat == heartbeat


_MS = st.integers(-2, 3000).map(str)
_THRESHOLDS = st.integers(-1, 40).map(str)


@settings(max_examples=300, deadline=None)
@given(
    send=_MS,
    check=_MS,
    window=_MS | st.sampled_from([str(MAX_INT32), str(MAX_INT32 + 1)]),
    missed=_THRESHOLDS,
    received=_THRESHOLDS,
)
def test_a_heartbeat_config_that_passes_constructs(
    send: str, check: str, window: str, missed: str, received: str
) -> None:
    # Every config that loads builds its HeartbeatConfig, and a bad one is a ConfigError naming a heartbeat
    # key, never HeartbeatConfig's bare ValueError. Within the int32 range, they accept the same values.
    values = dict(zip(HEARTBEAT_KEYS, (send, check, window, missed, received), strict=True))
    try:
        heartbeat = HeartbeatConfig(**{name: int(values[key]) for key, name in HEARTBEAT_KEYS.items()})
    except ValueError:
        heartbeat = None
    try:
        config = load(values)
    except ConfigError as error:
        assert {single.key for single in error.errors} <= set(HEARTBEAT_KEYS)
        assert heartbeat is None or int(window) > MAX_INT32
    else:
        assert config.liveness.heartbeat == heartbeat


# --- bad values ------------------------------------------------------------------------------------------

_REPLICA_KEYS_NON_NEGATIVE = [
    "replica.fetch.backoff.ms",
    "replica.log.retention.records",
    "replica.fetch.hw.delay.ms",
    "replica.move.throttle.bytes.per.sec",
]
_INT_KEYS_POSITIVE = [
    "node.id",
    "broker.heartbeat.interval.ms",
    "broker.session.timeout.ms",
    "metadata.snapshot.max.records",
    "metadata.snapshot.interval.ms",
    *[key for key in RAFT_KEYS if key != "controller.quorum.append.linger.ms"],
    *[key for key in REPLICA_KEYS if key not in _REPLICA_KEYS_NON_NEGATIVE],
    "produce.max.bytes",
    *LIVENESS_KEYS,
]

BAD_VALUES = [
    # (key, value, fragment of what is allowed, other overrides)
    *[(key, "0", "must be a positive integer", {}) for key in _INT_KEYS_POSITIVE],
    *[(key, "abc", "must be a positive integer", {}) for key in _INT_KEYS_POSITIVE],
    ("node.id", "-1", "must be a positive integer", {}),
    ("node.id", "1.5", "must be a positive integer", {}),
    ("node.id", "", "must be a positive integer", {}),
    ("node.id", "1__0", "must be a positive integer", {}),
    ("node.id", str(MAX_INT32 + 1), f"at most {MAX_INT32}", {}),
    ("controller.quorum.append.linger.ms", "-1", "must be an integer >= 0", {}),
    (
        "controller.quorum.fetch.max.wait.ms",
        "1000",
        "must be below controller.quorum.fetch.timeout.ms=750",
        {},
    ),
    *[(key, "-1", "must be an integer >= 0", {}) for key in _REPLICA_KEYS_NON_NEGATIVE],
    *[(key, "x", "must be an integer >= 0", {}) for key in _REPLICA_KEYS_NON_NEGATIVE],
    *[(key, str(MAX_INT32 + 1), f"at most {MAX_INT32}", {}) for key in REPLICA_KEYS],
    ("replica.fetch.max.wait.ms", "1500", "must be below replica.fetch.timeout.ms=1500", {}),
    (
        "replica.fetch.max.wait.ms",
        "200",
        "must be below replica.fetch.timeout.ms=100",
        {"replica.fetch.timeout.ms": "100"},
    ),
    *[(key, str(MAX_INT32 + 1), f"at most {MAX_INT32}", {}) for key in LIVENESS_KEYS],
    *[
        (key, "-1", "must be a positive integer (send intervals)", {})
        for key in LIVENESS_KEYS
        if "threshold" in key
    ],
    ("heartbeat.send.interval.ms", "1.5", "must be a positive integer (ms)", {}),
    (
        "heartbeat.window.ms",
        "299",
        "must be at least 300: 3 slots of heartbeat.send.interval.ms=100, the larger of the thresholds, "
        "heartbeat.missed.threshold=3, or a dead peer is never marked down",
        {},
    ),
    # The default window (2000 ms) holds only 2 slots of 1000 ms.
    ("heartbeat.window.ms", "2000", "must be at least 3000: 3 slots", {"heartbeat.send.interval.ms": "1000"}),
    ("heartbeat.window.ms", "2000", "must be at least 2100: 21 slots", {"heartbeat.missed.threshold": "21"}),
    (
        "heartbeat.window.ms",
        "2000",
        "must be at least 2500: 5 slots of heartbeat.send.interval.ms=500, the larger of the thresholds, "
        "heartbeat.received.threshold=5, or a peer marked down never comes back up",
        {"heartbeat.send.interval.ms": "500", "heartbeat.received.threshold": "5"},
    ),
    ("replica.log.fsync", "sometimes", "must be never or always", {}),
    ("replica.log.fsync", "", "must be never or always", {}),
    ("rpc.max.frame.bytes", "1023", "must be an integer >= 1024", {}),
    ("rpc.max.frame.bytes", str(1024 * 1024), "must be at least 1114112", SMALL_PARTITION_MESSAGES),
    # Twice the default produce.max.bytes (8 MiB).
    ("rpc.max.frame.bytes", str(8 * 1024 * 1024), "must be at least 16777216", {}),
    (
        "rpc.max.frame.bytes",
        str(16 * 1024 * 1024),
        "must be at least 20971520: 2 times the largest of replica.fetch.max.bytes and produce.max.bytes",
        {"replica.fetch.max.bytes": str(10 * 1024 * 1024)},
    ),
    (
        "rpc.max.frame.bytes",
        str(16 * 1024 * 1024),
        "must be at least 16777218: 2 times the largest of replica.fetch.max.bytes and produce.max.bytes "
        "(8388609)",
        {"produce.max.bytes": str(8 * 1024 * 1024 + 1)},
    ),
    (
        "rpc.max.frame.bytes",
        str(16 * 1024 * 1024),
        "the largest of controller.quorum.fetch.max.bytes",
        {"controller.quorum.fetch.max.bytes": str(16 * 1024 * 1024), **SMALL_PARTITION_MESSAGES},
    ),
    ("broker.heartbeat.interval.ms", "2000", "must be below broker.session.timeout.ms=2000", {}),
    (
        "broker.heartbeat.interval.ms",
        "250",
        "must be below broker.session.timeout.ms=100",
        {"broker.session.timeout.ms": "100"},
    ),
    ("process.roles", "", "controller, broker or controller,broker", {}),
    ("process.roles", "worker", "'worker' is not a role", {}),
    ("process.roles", "broker,broker", "given twice", {}),
    ("process.roles", "controller;broker", "is not a role", {}),
    ("listeners", "", "rpc://HOST:PORT", {}),
    ("listeners", "http://127.0.0.1:8080", "the rpc listener is missing", {}),
    ("listeners", "rpc://127.0.0.1", "the port is missing", {}),
    ("listeners", "rpc://127.0.0.1:http", "is not a port number", {}),
    ("listeners", "rpc://127.0.0.1:65536", "a port from 0 to 65535", {}),
    ("listeners", "tcp://127.0.0.1:9092", "the name must be rpc or http", {}),
    ("listeners", "127.0.0.1:9092", "the name must be rpc or http", {}),
    ("listeners", "rpc://127.0.0.1:9092,rpc://127.0.0.1:9093", "rpc is given twice", {}),
    ("listeners", "rpc://::1:9092", "put an IPv6 address in brackets", {}),
    ("listeners", "rpc://[localhost]:9092", "brackets are only for IPv6", {}),
    ("listeners", "rpc://[::1:9092", "rpc://HOST:PORT", {}),
    ("listeners", "rpc://[::g]:9092", "is not an IPv6 address", {}),
    ("listeners", "rpc://999.1.1.1:9092", "is not an IPv4 address", {}),
    ("listeners", "rpc://bad!host:9092", "is not a valid host name", {}),
    ("listeners", "rpc://-bad:9092", "is not a valid host name", {}),
    ("listeners", "rpc://:9092", "must name a host name", {}),
    ("listeners", "rpc://127.0.0.1:9092,http://127.0.0.1:9092", "different ports", {}),
    ("listeners", "rpc://127.0.0.1:9092,http://0.0.0.0:9092", "different ports", {}),
    ("controller.quorum.voters", "", "ID@HOST:PORT", {}),
    ("controller.quorum.voters", "x@127.0.0.1:9092", "ID@HOST:PORT", {}),
    ("controller.quorum.voters", "127.0.0.1:9092", "ID@HOST:PORT", {}),
    ("controller.quorum.voters", "1@127.0.0.1", "the port is missing", {}),
    ("controller.quorum.voters", "1@127.0.0.1:9092,1@127.0.0.1:9093", "must list node 1 only once", {}),
    ("controller.quorum.voters", "1@127.0.0.1:9092,2@127.0.0.1:9092", "is listed twice", {}),
    ("controller.quorum.voters", "1@127.0.0.1:9092,0@127.0.0.1:9093", "positive integer id", {}),
    ("controller.quorum.voters", "1@0.0.0.0:9092", "not a wildcard", {}),
    ("controller.quorum.voters", "1@[::]:9092", "not a wildcard", {}),
    ("controller.quorum.voters", "1@127.0.0.1:9092,2@127.0.0.1:0", "a port from 1 to 65535", {}),
    ("controller.quorum.voters", "1@bad!host:9092", "is not a valid host name", {}),
    # Membership: a listed controller is at its rpc port; a broker-only node is not a voter. (A controller
    # not listed is valid: it joins as an observer, test_a_controller_missing_from_the_voters_may_join.)
    ("controller.quorum.voters", "1@127.0.0.1:9095", "the port of its rpc listener", {}),
    (
        "controller.quorum.voters",
        "1@127.0.0.1:9092",
        "a controller cannot use port 0",
        {"listeners": "rpc://127.0.0.1:0"},
    ),
    (
        "controller.quorum.voters",
        BASE["controller.quorum.voters"],
        "must not include this node",
        {"process.roles": "broker"},
    ),
    ("data.dir", "", "must be a directory path", {}),
    ("data.dir", "   ", "must be a directory path", {}),
    ("data.dir", "a\0b", "without NUL", {}),
    ("rack", "a,b", "without ','", {}),
    ("rack", " az-a", "without leading or trailing spaces", {}),
    ("rack", "az\n", "printable", {}),
    ("rack", "x" * 256, "at most 255 characters", {}),
    ("tags", "zone", "key=value pairs", {}),
    ("tags", "zone=a,zone=b", "'zone' is repeated", {}),
    ("tags", "rack=az-a", "set the server's rack with the rack key", {}),
    ("tags", "bad key=x", "a tag key must be", {}),
    ("tags", "=x", "a tag key must be", {}),
    ("tags", "zone=", "the value must be a non-empty string", {}),
    ("tags", "zone=a=b", "the value must be printable, without ',' or '='", {}),
    ("cluster.id", "", "1-64 letters, digits", {}),
    ("cluster.id", "has space", "1-64 letters, digits", {}),
    ("cluster.id", "x" * 65, "1-64 letters, digits", {}),
    ("log.level", "verbose", "one of DEBUG, INFO, WARNING, ERROR", {}),
    ("log.level", "CRITICAL", "one of DEBUG, INFO, WARNING, ERROR", {}),
]


@pytest.mark.parametrize(("key", "value", "allowed", "others"), BAD_VALUES)
def test_bad_value_names_key_value_and_what_is_allowed(
    key: str, value: str, allowed: str, others: dict[str, str]
) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load({key: value, **others})
    single = assert_reports(excinfo, key, allowed)
    # Integers are reported parsed; list keys may report just the bad item, a part of what was given.
    assert str(single.value) in value or value in str(single.value)


@pytest.mark.parametrize(
    ("toml_value", "key", "allowed"),
    [
        ('"node.id" = true', "node.id", "must be a positive integer"),
        ('"node.id" = 1.0', "node.id", "must be a positive integer"),
        ('"node.id" = [1]', "node.id", "must be a positive integer"),
        ('"process.roles" = 1', "process.roles", "controller, broker"),
        ('"process.roles" = ["broker", 1]', "process.roles", "controller, broker"),
        ("listeners = { rpc = '127.0.0.1:9092' }", "listeners", "rpc://HOST:PORT"),
        ('"controller.quorum.voters" = 1', "controller.quorum.voters", "ID@HOST:PORT"),
        ('"data.dir" = 1', "data.dir", "must be a directory path"),
        ("rack = 1", "rack", "must be a string"),
        ("tags = { zone = 1 }", "tags", "tag values are strings"),
        ("tags = 3", "tags", "key=value pairs"),
        ("tags = ['zone=a', 3]", "tags", "key=value pairs"),
        ('"cluster.id" = 1', "cluster.id", "must be a string"),
        ('"log.level" = 10', "log.level", "one of DEBUG"),
        ('"broker.session.timeout.ms" = 2000.5', "broker.session.timeout.ms", "must be a positive integer"),
        (
            '"controller.quorum.fetch.max.bytes" = false',
            "controller.quorum.fetch.max.bytes",
            "positive integer",
        ),
        ('"replica.fetch.max.bytes" = true', "replica.fetch.max.bytes", "must be a positive integer"),
        ('"replica.fetch.backoff.ms" = 0.5', "replica.fetch.backoff.ms", "must be an integer >= 0"),
        ('"min.insync.replicas" = [2]', "min.insync.replicas", "must be a positive integer (replicas)"),
        ('"replica.log.fsync" = true', "replica.log.fsync", "must be never or always"),
        ('"produce.max.bytes" = "8 MiB"', "produce.max.bytes", "must be a positive integer (bytes)"),
        ('"heartbeat.window.ms" = 2000.0', "heartbeat.window.ms", "must be a positive integer (ms)"),
        (
            '"heartbeat.missed.threshold" = true',
            "heartbeat.missed.threshold",
            "must be a positive integer (send intervals)",
        ),
        ("heartbeat = { received.threshold = [2] }", "heartbeat.received.threshold", "positive integer"),
        (
            '"lag.reporting.send.interval.ms" = "fast"',
            "lag.reporting.send.interval.ms",
            "must be a positive integer (ms)",
        ),
    ],
)
def test_wrong_toml_type_names_key_value_and_what_is_allowed(
    tmp_path: Path, toml_value: str, key: str, allowed: str
) -> None:
    lines = [line for line in BASE_TOML.splitlines() if line.split("=")[0].strip().strip('"') != key]
    with pytest.raises(ConfigError) as excinfo:
        load_toml(tmp_path, "\n".join([toml_value, *lines, ""]))
    assert_reports(excinfo, key, allowed)


@pytest.mark.parametrize("key", REQUIRED_KEYS)
def test_required_key_missing(key: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load(drop=(key,))
    single = assert_reports(excinfo, key, "is required")
    assert str(single).startswith(f"{key} is not set: is required (")
    assert env_var_name(key) in single.allowed and f"--{key}" in single.allowed


def test_short_secret_says_why_and_never_shows_the_secret() -> None:
    with pytest.raises(ConfigError) as excinfo:
        load({"cluster.secret": "hunter2-hunter2"})  # 15 characters
    single = assert_reports(excinfo, "cluster.secret", "at least 16 characters")
    assert "can be guessed" in single.allowed
    assert "hunter2" not in str(excinfo.value)
    assert "<redacted: 15 characters>" in str(excinfo.value)


def test_secret_is_left_out_of_the_repr() -> None:
    config = load()
    assert BASE["cluster.secret"] not in repr(config)


def test_first_error_reads_as_in_the_issue() -> None:
    with pytest.raises(ConfigError) as excinfo:
        load({"node.id": "abc"})
    error = excinfo.value
    assert (error.key, error.value, error.allowed) == ("node.id", "abc", "must be a positive integer")
    assert error.line() == "node.id='abc': must be a positive integer (from flag --node.id)"


def test_undecodable_env_bytes_are_rejected() -> None:
    env = {env_var_name(key): value for key, value in BASE.items()}
    env["HOTSTATE_DATA_DIR"] = "/data/\udcff"
    with pytest.raises(ConfigError) as excinfo:
        from hotstate.server.config import load_config

        load_config(env=env)
    assert_reports(excinfo, "data.dir", "UTF-8")


# --- rules apply to configs built in code too --------------------------------------------------------------


def test_built_config_is_checked() -> None:
    good = load()
    with pytest.raises(ConfigError) as excinfo:
        dataclasses.replace(good, node_id=0)
    assert_reports(excinfo, "node.id", "must be a positive integer", 0)
    with pytest.raises(ConfigError) as excinfo:
        dataclasses.replace(good, rpc=Listener("rpc", "127.0.0.1", 70000))
    assert_reports(excinfo, "listeners", "a port from 0 to 65535", "rpc://127.0.0.1:70000")
    with pytest.raises(ConfigError) as excinfo:
        dataclasses.replace(good, raft=RaftConfig(fetch_max_bytes=32 * 1024 * 1024))
    assert_reports(excinfo, "rpc.max.frame.bytes", "must be at least")


@pytest.mark.parametrize(
    ("changes", "key", "allowed", "value"),
    [
        ({"replica": ReplicaConfig(fetch_max_wait_ms=0)}, "replica.fetch.max.wait.ms", "positive", 0),
        ({"replica": ReplicaConfig(fetch_backoff_ms=-5)}, "replica.fetch.backoff.ms", ">= 0", -5),
        ({"replica": ReplicaConfig(min_insync_replicas=0)}, "min.insync.replicas", "positive", 0),
        (
            {"replica": ReplicaConfig(fetch_timeout_ms=150)},
            "replica.fetch.max.wait.ms",
            "must be below replica.fetch.timeout.ms=150",
            200,
        ),
        (
            {"replica": ReplicaConfig(fetch_max_bytes=9 * 1024 * 1024)},
            "rpc.max.frame.bytes",
            "at least",
            None,
        ),
        ({"produce_max_bytes": 0}, "produce.max.bytes", "positive", 0),
        ({"produce_max_bytes": 16 * 1024 * 1024}, "rpc.max.frame.bytes", "at least 33554432", None),
        ({"replica_log_fsync": "NEVER"}, "replica.log.fsync", "must be never or always", "NEVER"),
        ({"replica": RaftConfig()}, "replica", "must be a ReplicaConfig", None),
    ],
)
def test_built_config_checks_the_replica_settings(
    changes: dict[str, object], key: str, allowed: str, value: object
) -> None:
    with pytest.raises(ConfigError) as excinfo:
        dataclasses.replace(load(), **changes)  # type: ignore[arg-type]
    assert_reports(excinfo, key, allowed, value)


@pytest.mark.parametrize(
    ("changes", "key", "allowed", "value"),
    [
        (
            {"liveness": LivenessConfig(lag_report_interval_ms=0)},
            "lag.reporting.send.interval.ms",
            "positive",
            0,
        ),
        (
            {"liveness": LivenessConfig(lag_report_interval_ms=MAX_INT32 + 1)},
            "lag.reporting.send.interval.ms",
            f"at most {MAX_INT32}",
            MAX_INT32 + 1,
        ),
        # HeartbeatConfig itself accepts these; ServerConfig does not.
        (
            {"liveness": LivenessConfig(HeartbeatConfig(window_ms=MAX_INT32 + 1))},
            "heartbeat.window.ms",
            f"at most {MAX_INT32}",
            MAX_INT32 + 1,
        ),
        (
            {"liveness": LivenessConfig(HeartbeatConfig(missed_threshold=True))},
            "heartbeat.missed.threshold",
            "positive",
            True,
        ),
        ({"liveness": ReplicaConfig()}, "liveness", "must be a LivenessConfig", None),
        ({"liveness": LivenessConfig(RaftConfig())}, "heartbeat", "must be a HeartbeatConfig", None),  # type: ignore[arg-type]
    ],
)
def test_built_config_checks_the_liveness_settings(
    changes: dict[str, object], key: str, allowed: str, value: object
) -> None:
    with pytest.raises(ConfigError) as excinfo:
        dataclasses.replace(load(), **changes)  # type: ignore[arg-type]
    assert_reports(excinfo, key, allowed, value)


def test_built_config_sorts_tags_and_freezes_roles() -> None:
    config = ServerConfig(
        node_id=4,
        process_roles=frozenset({"broker"}),
        rpc=Listener("rpc", "localhost", 9095),
        voters=(Voter(1, "localhost", 9092),),
        data_dir=Path("data"),
        tags=(("zone", "a"), ("cluster", "b")),
        cluster_id="c",
        cluster_secret="s" * 16,
    )
    assert config.tags == (("cluster", "b"), ("zone", "a"))
    assert config.http is None and config.raft == RaftConfig()
    assert config.replica == ReplicaConfig() and config.replica_log_fsync == "never"
    assert config.liveness == LivenessConfig()

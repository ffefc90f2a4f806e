"""parse_flag_overrides: the three spellings of a flag, and malformed arguments."""

from __future__ import annotations

import pytest

from hotstate.routing.heartbeat import HeartbeatConfig
from hotstate.server.config import ConfigError, parse_flag_overrides

from .helpers import assert_reports, load


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        ([], {}),
        (["--node.id=1"], {"node.id": "1"}),
        (["--node.id", "1"], {"node.id": "1"}),
        (["--set", "node.id=1"], {"node.id": "1"}),
        (["--set=node.id=1"], {"node.id": "1"}),
        (["--set", "tags=zone=eu1,cluster=k8s-1"], {"tags": "zone=eu1,cluster=k8s-1"}),
        (["--listeners=rpc://[::1]:9092"], {"listeners": "rpc://[::1]:9092"}),
        (["--rack="], {"rack": ""}),
        (["--node.id", "-1"], {"node.id": "-1"}),  # a value may start with one dash
        (["--node.id=1", "--node.id", "2"], {"node.id": "2"}),  # the last one wins
        (
            ["--rack", "az-a", "--set", "log.level=DEBUG", "--broker.session.timeout.ms=3000"],
            {"rack": "az-a", "log.level": "DEBUG", "broker.session.timeout.ms": "3000"},
        ),
        (
            [
                "--replica.fetch.max.bytes",
                "65536",
                "--set",
                "replica.log.fsync=always",
                "--min.insync.replicas=2",
            ],
            {"replica.fetch.max.bytes": "65536", "replica.log.fsync": "always", "min.insync.replicas": "2"},
        ),
        (
            [
                "--heartbeat.send.interval.ms",
                "50",
                "--set",
                "heartbeat.missed.threshold=5",
                "--lag.reporting.send.interval.ms=1000",
            ],
            {
                "heartbeat.send.interval.ms": "50",
                "heartbeat.missed.threshold": "5",
                "lag.reporting.send.interval.ms": "1000",
            },
        ),
    ],
)
def test_flag_spellings(args: list[str], expected: dict[str, str]) -> None:
    assert parse_flag_overrides(args) == expected


@pytest.mark.parametrize(
    ("args", "key", "allowed"),
    [
        (["node.id=1"], "flags", "must be --KEY=VALUE, --KEY VALUE or --set KEY=VALUE"),
        (["-n", "1"], "flags", "must be --KEY=VALUE"),
        (["--"], "flags", "must be --KEY=VALUE"),
        (["--node.id"], "node.id", "--node.id needs a value"),
        (["--node.id", "--rack", "x"], "node.id", "--node.id needs a value"),
        (["--set"], "--set", "must be followed by KEY=VALUE"),
        (["--set", "node.id"], "--set", "must be followed by KEY=VALUE"),
        (["--set", "=1"], "--set", "must be followed by KEY=VALUE"),
        (["--node.idd=1"], "node.idd", "did you mean 'node.id'"),
        (
            ["--set", "controller.quorum.voter=1@h:1"],
            "controller.quorum.voter",
            "did you mean 'controller.quorum.voters'",
        ),
        (["--node_id", "1"], "node_id", "did you mean 'node.id'"),
        (["--replica.fetch.max.byte=1"], "replica.fetch.max.byte", "did you mean 'replica.fetch.max.bytes'"),
        (["--min.isr=2"], "min.isr", "is not a known key"),
        (
            ["--heartbeat.send.interval=100"],
            "heartbeat.send.interval",
            "did you mean 'heartbeat.send.interval.ms'",
        ),
        (
            ["--set", "lag.reporting.interval.ms=500"],
            "lag.reporting.interval.ms",
            "did you mean 'lag.reporting.send.interval.ms'",
        ),
        (["--config", "x.toml"], "config", "is not a known key"),
    ],
)
def test_bad_flags(args: list[str], key: str, allowed: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_flag_overrides(args)
    assert_reports(excinfo, key, allowed)


def test_every_bad_flag_is_reported() -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_flag_overrides(["--nod.id=1", "stray", "--rack=az-a", "--set", "oops"])
    assert [single.key for single in excinfo.value.errors] == ["nod.id", "flags", "--set"]


def test_parsed_flags_feed_load_config() -> None:
    flags = parse_flag_overrides(["--rack", "az-c", "--set", "tags=zone=eu1"])
    config = load(flags)
    assert config.rack == "az-c" and config.tags == (("zone", "eu1"),)


def test_parsed_replica_flags_feed_load_config() -> None:
    flags = parse_flag_overrides(
        [
            "--replica.fetch.timeout.ms",
            "900",
            "--set",
            "produce.max.bytes=1_048_576",
            "--replica.log.fsync=always",
        ]
    )
    config = load(flags)
    assert config.replica.fetch_timeout_ms == 900
    assert config.produce_max_bytes == 1024 * 1024 and config.replica_log_fsync == "always"


def test_parsed_liveness_flags_feed_load_config() -> None:
    flags = parse_flag_overrides(
        [
            "--heartbeat.send.interval.ms",
            "1000",
            "--set",
            "heartbeat.window.ms=3_000",
            "--heartbeat.received.threshold=3",
            "--lag.reporting.send.interval.ms",
            "2000",
        ]
    )
    config = load(flags)
    assert config.liveness.heartbeat == HeartbeatConfig(
        send_interval_ms=1000, window_ms=3000, received_threshold=3
    )
    assert config.liveness.lag_report_interval_ms == 2000

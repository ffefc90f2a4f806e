"""render_toml writes what load_config reads back to an equal config."""

from __future__ import annotations

import ipaddress
import tomllib
from pathlib import Path
from typing import Literal

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from hotstate.assignor import STRATEGIES, AssignorConfig
from hotstate.raft.config import RaftConfig
from hotstate.replica.core import ReplicaConfig
from hotstate.routing.heartbeat import HeartbeatConfig, LivenessConfig
from hotstate.server.config import (
    LIVENESS_KEYS,
    LOG_LEVELS,
    MAX_INT32,
    REPLICA_KEYS,
    REPLICA_LOG_FSYNC_POLICIES,
    ConfigError,
    Listener,
    ServerConfig,
    Voter,
    load_config,
    render_toml,
)

from .helpers import BASE_TOML, load, load_toml


def round_trip(tmp_path: Path, config: ServerConfig, *, include_defaults: bool = False) -> ServerConfig:
    path = tmp_path / "rendered.toml"
    path.write_text(render_toml(config, include_defaults=include_defaults), encoding="utf-8")
    return load_config(path, env={})


def test_base_round_trip(tmp_path: Path) -> None:
    config = load_toml(tmp_path, BASE_TOML)
    assert round_trip(tmp_path, config) == config


def test_defaults_are_left_out_unless_asked_for(tmp_path: Path) -> None:
    config = load({"broker.session.timeout.ms": "3000"})
    short = render_toml(config)
    assert '"broker.session.timeout.ms" = 3000' in short
    assert "broker.heartbeat.interval.ms" not in short and "rack" not in short
    full = render_toml(config, include_defaults=True)
    assert '"broker.heartbeat.interval.ms" = 250' in full
    assert '"controller.quorum.election.timeout.ms" = 500' in full
    assert '"replica.fetch.max.bytes" = 1048576' in full
    assert '"min.insync.replicas" = 1' in full
    assert '"replica.log.fsync" = "never"' in full
    assert '"produce.max.bytes" = 8388608' in full
    assert '"heartbeat.send.interval.ms" = 100' in full
    assert '"heartbeat.window.ms" = 2000' in full
    assert '"heartbeat.received.threshold" = 2' in full
    assert '"lag.reporting.send.interval.ms" = 500' in full
    assert round_trip(tmp_path, config, include_defaults=True) == config


def test_replica_settings_round_trip(tmp_path: Path) -> None:
    config = load(
        {
            "replica.fetch.max.wait.ms": "100",
            "replica.fetch.hw.delay.ms": "2",
            "replica.fetch.max.bytes": "65536",
            "replica.fetch.timeout.ms": "101",
            "replica.fetch.backoff.ms": "0",
            "replica.lag.time.max.ms": "30000",
            "replica.isr.change.retry.ms": "500",
            "min.insync.replicas": "2",
            "replica.log.retention.records": "0",
            "replica.log.fsync": "Always",
            "produce.max.bytes": "1048576",
        }
    )
    text = render_toml(config)
    assert all(f'"{key}" = ' in text for key in [*REPLICA_KEYS, "replica.log.fsync", "produce.max.bytes"])
    assert '"replica.log.fsync" = "always"' in text
    assert round_trip(tmp_path, config) == config
    assert "replica" not in render_toml(load())


def test_liveness_settings_round_trip(tmp_path: Path) -> None:
    config = load(
        {
            "heartbeat.send.interval.ms": "250",
            "heartbeat.check.interval.ms": "125",
            "heartbeat.window.ms": "1_000",
            "heartbeat.missed.threshold": "4",
            "heartbeat.received.threshold": "1",
            "lag.reporting.send.interval.ms": "750",
        }
    )
    text = render_toml(config)
    assert all(f'"{key}" = ' in text for key in LIVENESS_KEYS)
    assert '"heartbeat.window.ms" = 1000' in text
    assert round_trip(tmp_path, config) == config
    # Only what differs from the defaults is written.
    one = load({"heartbeat.missed.threshold": "5"})
    assert [key for key in LIVENESS_KEYS if f'"{key}"' in render_toml(one)] == ["heartbeat.missed.threshold"]
    assert round_trip(tmp_path, one) == one
    assert not any(key in render_toml(load()) for key in LIVENESS_KEYS)


def test_strings_that_need_escaping(tmp_path: Path) -> None:
    config = load(
        {
            "data.dir": 'C:\\data\\"hot"\tstate\x7f é 🐍',
            "cluster.secret": 'quote"back\\slash\nnewline\x00nul',
            "rack": "rack #1 'a'",
            "tags": 'zone=eu 1 # not a comment,k="v"',
        }
    )
    text = render_toml(config)
    tomllib.loads(text)
    assert round_trip(tmp_path, config) == config


def test_ipv6_and_port_zero_round_trip(tmp_path: Path) -> None:
    config = load(
        {
            "process.roles": "broker",
            "node.id": "9",
            "listeners": "rpc://[::]:0,http://[fe80::1%eth0]:0",
            "controller.quorum.voters": "1@[2001:db8::1]:9092",
        }
    )
    assert round_trip(tmp_path, config) == config


# --- property: every valid config survives render -> load ---------------------------------------------

_TEXT = st.characters(exclude_categories=["Cs"])
_LABEL = st.text(
    st.characters(blacklist_categories=("Cs", "Cc", "Zl", "Zp"), blacklist_characters=",="),
    min_size=1,
    max_size=12,
).filter(lambda s: s == s.strip() and s.isprintable())
_HOST_NAMES = st.from_regex(
    r"[a-z0-9_]([a-z0-9_-]{0,10}[a-z0-9_])?(\.[a-z]{1,5}){0,2}", fullmatch=True
).filter(lambda s: not all(c in "0123456789." for c in s))
_HOSTS = st.one_of(
    _HOST_NAMES,
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(str),
    st.sampled_from(["localhost", "0.0.0.0", "::", "::1"]),
)
_DIALABLE = _HOSTS.filter(lambda host: not _unspecified(host))


def _unspecified(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False


@st.composite
def raft_configs(draw: st.DrawFn) -> RaftConfig:
    fetch_timeout = draw(st.integers(2, 100_000))
    return RaftConfig(
        election_timeout_ms=draw(st.integers(1, 100_000)),
        fetch_timeout_ms=fetch_timeout,
        election_backoff_max_ms=draw(st.integers(1, 100_000)),
        append_linger_ms=draw(st.integers(0, 1000)),
        request_timeout_ms=draw(st.integers(1, 100_000)),
        fetch_max_wait_ms=draw(st.integers(1, fetch_timeout - 1)),
        fetch_max_bytes=draw(st.integers(1, 64 * 1024 * 1024)),
        snapshot_chunk_bytes=draw(st.integers(1, 64 * 1024 * 1024)),
    )


@st.composite
def replica_configs(draw: st.DrawFn) -> ReplicaConfig:
    fetch_timeout = draw(st.integers(2, MAX_INT32))
    return ReplicaConfig(
        fetch_max_wait_ms=draw(st.integers(1, fetch_timeout - 1)),
        fetch_max_bytes=draw(st.integers(1, 64 * 1024 * 1024)),
        fetch_timeout_ms=fetch_timeout,
        fetch_backoff_ms=draw(st.integers(0, MAX_INT32)),
        replica_lag_time_max_ms=draw(st.integers(1, MAX_INT32)),
        isr_change_retry_ms=draw(st.integers(1, MAX_INT32)),
        min_insync_replicas=draw(st.integers(1, 7)),
        log_retention_records=draw(st.integers(0, MAX_INT32)),
    )


@st.composite
def liveness_configs(draw: st.DrawFn) -> LivenessConfig:
    send = draw(st.integers(1, 10_000))
    missed, received = draw(st.integers(1, 50)), draw(st.integers(1, 50))
    return LivenessConfig(
        heartbeat=HeartbeatConfig(
            send_interval_ms=send,
            check_interval_ms=draw(st.integers(1, MAX_INT32)),
            window_ms=draw(st.integers(send * max(missed, received), MAX_INT32)),
            missed_threshold=missed,
            received_threshold=received,
        ),
        lag_report_interval_ms=draw(st.integers(1, MAX_INT32)),
    )


_TAG_KEYS = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,10}", fullmatch=True)


@st.composite
def assignor_configs(draw: st.DrawFn) -> AssignorConfig:
    return AssignorConfig(
        rack_aware_assignment_strategy=draw(st.sampled_from(STRATEGIES)),
        rack_aware_assignment_tags=tuple(draw(st.lists(_TAG_KEYS, max_size=3, unique=True))),
        traffic_cost=draw(st.integers(0, MAX_INT32)),
        non_overlap_cost=draw(st.integers(0, MAX_INT32)),
        acceptable_recovery_lag=draw(st.integers(0, MAX_INT32)),
        max_warmup_replicas=draw(st.integers(1, MAX_INT32)),
    )


@st.composite
def server_configs(draw: st.DrawFn) -> ServerConfig:
    node_id = draw(st.integers(1, MAX_INT32))
    roles: frozenset[Literal["controller", "broker"]] = draw(
        st.sampled_from(
            [frozenset({"controller"}), frozenset({"broker"}), frozenset({"controller", "broker"})]
        )
    )
    controller = "controller" in roles
    rpc = Listener("rpc", draw(_HOSTS), draw(st.integers(1 if controller else 0, 65535)))
    http = draw(st.none() | st.builds(Listener, st.just("http"), _HOSTS, st.integers(0, 65535)))
    assume(http is None or http.port != rpc.port or http.port == 0)
    others = draw(
        st.lists(
            st.builds(Voter, st.integers(1, MAX_INT32), _DIALABLE, st.integers(1, 65535)),
            min_size=0 if controller else 1,
            max_size=4,
            unique_by=(lambda v: v.node_id, lambda v: (v.host.lower(), v.port)),
        ).filter(lambda voters: all(v.node_id != node_id for v in voters))
    )
    voters = list(others)
    if controller:
        me = Voter(node_id, draw(_DIALABLE), rpc.port)
        assume(all((v.host.lower(), v.port) != (me.host.lower(), me.port) for v in others))
        voters.insert(draw(st.integers(0, len(others))), me)
    raft = draw(raft_configs())
    replica = draw(replica_configs())
    produce_max_bytes = draw(st.integers(1, 64 * 1024 * 1024))
    smallest_frame = max(
        max(raft.fetch_max_bytes, raft.snapshot_chunk_bytes) + 64 * 1024,
        2 * max(replica.fetch_max_bytes, produce_max_bytes),
    )
    session = draw(st.integers(2, 600_000))
    tag_keys = _TAG_KEYS.filter(lambda k: k != "rack")
    return ServerConfig(
        node_id=node_id,
        process_roles=roles,
        rpc=rpc,
        http=http,
        voters=tuple(voters),
        data_dir=Path(
            draw(st.text(_TEXT, min_size=1, max_size=20).filter(lambda s: s.strip() and "\0" not in s))
        ),
        rack=draw(st.none() | _LABEL),
        tags=tuple(draw(st.dictionaries(tag_keys, _LABEL, max_size=3)).items()),
        cluster_id=draw(st.from_regex(r"[A-Za-z0-9_-]{1,22}", fullmatch=True)),
        cluster_secret=draw(st.text(_TEXT, min_size=16, max_size=40)),
        raft=raft,
        heartbeat_interval_ms=draw(st.integers(1, session - 1)),
        session_timeout_ms=session,
        snapshot_max_records=draw(st.integers(1, MAX_INT32)),
        snapshot_interval_ms=draw(st.integers(1, MAX_INT32)),
        max_frame_bytes=draw(st.integers(smallest_frame, MAX_INT32)),
        replica=replica,
        replica_log_fsync=draw(st.sampled_from(REPLICA_LOG_FSYNC_POLICIES)),
        produce_max_bytes=produce_max_bytes,
        liveness=draw(st.one_of(st.just(LivenessConfig()), liveness_configs())),
        assignor=draw(st.one_of(st.just(AssignorConfig()), assignor_configs())),
        log_level=draw(st.sampled_from(LOG_LEVELS)),
    )


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(config=server_configs(), include_defaults=st.booleans())
def test_render_then_load_gives_an_equal_config(
    tmp_path: Path, config: ServerConfig, include_defaults: bool
) -> None:
    text = render_toml(config, include_defaults=include_defaults)
    # Flat dotted keys only: a reader greps a written file for `"node.id"`.
    assert all(isinstance(value, str | int) for value in tomllib.loads(text).values())
    assert round_trip(tmp_path, config, include_defaults=include_defaults) == config


def test_a_config_that_does_not_load_is_not_rendered_silently() -> None:
    # render_toml takes only ServerConfig, which cannot be built invalid.
    try:
        load({"node.id": "0"})
    except ConfigError as error:
        assert error.key == "node.id"
    else:  # pragma: no cover
        raise AssertionError("node.id=0 was accepted")

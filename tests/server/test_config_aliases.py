"""The anchors' names (issue 29 §3): `num.standby.replicas` as a server default, `client.tag.*` as tags,
`rack.aware.assignment.enabled`, ksqlDB's forwarding timeout for `query.timeout.ms`, the warning for a `rack`
that `rack.aware.assignment.tags` does not list, and a table's `acceptable.offset.lag`."""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest

from hotstate.server.config import ConfigError, config_warnings, load_config, parse_flag_overrides
from hotstate.server.http.tables import TableRequestRefused, create_request

from .helpers import BASE, BASE_TOML, assert_reports, load, load_toml


def test_num_standby_replicas_is_the_count_of_a_table_created_over_http_without_one() -> None:
    assert load().default_standby_replicas == 1
    config = load({"num.standby.replicas": "2"})
    assert config.default_standby_replicas == 2
    assert load({"num.standby.replicas": "0"}).default_standby_replicas == 0
    with pytest.raises(ConfigError) as excinfo:
        load({"num.standby.replicas": "-1"})
    assert_reports(excinfo, "num.standby.replicas", ">= 0")

    body = orjson.dumps({"name": "t", "key_columns": [{"name": "k", "type": "STRING"}]})
    assert create_request(body, config.default_standby_replicas).standby_replicas == 2
    assert create_request(body).standby_replicas == 1  # the server's own default
    given = orjson.dumps(
        {"name": "t", "key_columns": [{"name": "k", "type": "STRING"}], "standby_replicas": 0}
    )
    assert create_request(given, 2).standby_replicas == 0


def test_a_tables_acceptable_offset_lag_is_its_acceptable_lag() -> None:
    key = [{"name": "k", "type": "STRING"}]
    made = create_request(orjson.dumps({"name": "t", "key_columns": key, "acceptable.offset.lag": 50}))
    assert made.acceptable_lag == 50
    same = {"name": "t", "key_columns": key, "acceptable.offset.lag": 50, "acceptable_lag": 50}
    assert create_request(orjson.dumps(same)).acceptable_lag == 50
    with pytest.raises(TableRequestRefused) as refused:
        create_request(orjson.dumps(same | {"acceptable_lag": 7}))
    assert b"two names" in refused.value.answer[1]


def test_client_tags_are_tags_in_every_source(tmp_path: Path) -> None:
    assert load({"client.tag.zone": "eu1"}).tags == (("zone", "eu1"),)
    # With `tags`, merged; client.tag.rack is the rack.
    merged = load({"tags": "cluster=k8s", "client.tag.zone": "eu1", "client.tag.rack": "r2"})
    assert merged.tags == (("cluster", "k8s"), ("zone", "eu1")) and merged.rack == "r2"
    # A TOML table, and the environment.
    toml = load_toml(tmp_path, BASE_TOML + '[client.tag]\nzone = "eu1"\n', env={})
    assert toml.tags == (("zone", "eu1"),)
    env = {f"HOTSTATE_{k.upper().replace('.', '_')}": v for k, v in BASE.items()}
    assert load_config(env=env | {"HOTSTATE_CLIENT_TAG_ZONE": "eu1"}).tags == (("zone", "eu1"),)
    assert parse_flag_overrides(["--client.tag.zone=eu1"]) == {"client.tag.zone": "eu1"}
    # Given both ways: an error naming the alias.
    with pytest.raises(ConfigError) as excinfo:
        load({"tags": "zone=eu2", "client.tag.zone": "eu1"})
    assert_reports(excinfo, "client.tag.zone", "gives too")
    with pytest.raises(ConfigError) as excinfo:
        load({"rack": "r1", "client.tag.rack": "r2"})
    assert_reports(excinfo, "client.tag.rack", "rack='r1'")
    # A bad value is reported as the tags' own rule reports it.
    with pytest.raises(ConfigError) as excinfo:
        load({"client.tag.zone": "a=b"})
    assert excinfo.value.key == "tags"


def test_rack_aware_assignment_enabled() -> None:
    off = load({"rack.aware.assignment.enabled": "false"})
    assert off.assignor.rack_aware_assignment_strategy == "none"
    assert off.assignor.rack_aware_assignment_tags == ()
    on = load({"rack.aware.assignment.enabled": "true"})
    assert on.assignor == load().assignor
    for contradiction in (
        {"rack.aware.assignment.enabled": "false", "rack.aware.assignment.strategy": "min_traffic"},
        {"rack.aware.assignment.enabled": "false", "rack.aware.assignment.tags": "rack"},
        {"rack.aware.assignment.enabled": "true", "rack.aware.assignment.strategy": "none"},
    ):
        with pytest.raises(ConfigError) as excinfo:
            load(contradiction)
        assert_reports(excinfo, "rack.aware.assignment.enabled", "cannot be")
    with pytest.raises(ConfigError) as excinfo:
        load({"rack.aware.assignment.enabled": "maybe"})
    assert_reports(excinfo, "rack.aware.assignment.enabled", "true or false")


def test_query_timeout_and_ksqldbs_name_for_it() -> None:
    assert load().query_timeout_ms == 10_000
    assert load({"query.timeout.ms": "20000"}).query_timeout_ms == 20_000
    assert load({"ksql.query.pull.forwarding.timeout.ms": "15000"}).query_timeout_ms == 15_000
    with pytest.raises(ConfigError) as excinfo:
        load({"query.timeout.ms": "300001"})
    assert_reports(excinfo, "query.timeout.ms", "at most 300000")
    # Both from one source: they must agree; from two, the flag beats the environment.
    with pytest.raises(ConfigError) as excinfo:
        load({"query.timeout.ms": "20000", "ksql.query.pull.forwarding.timeout.ms": "15000"})
    assert_reports(excinfo, "ksql.query.pull.forwarding.timeout.ms", "must equal")
    env = {f"HOTSTATE_{k.upper().replace('.', '_')}": v for k, v in BASE.items()}
    config = load_config(
        env=env | {"HOTSTATE_QUERY_TIMEOUT_MS": "20000"},
        flags={"ksql.query.pull.forwarding.timeout.ms": "15000"},
    )
    assert config.query_timeout_ms == 15_000


def test_a_rack_the_assignment_tags_do_not_list_is_warned_about() -> None:
    assert config_warnings(load({"rack": "r1"})) == []  # the default tags list rack
    assert config_warnings(load({"rack.aware.assignment.tags": "zone"})) == []  # no rack set
    [warning] = config_warnings(load({"rack": "r1", "rack.aware.assignment.tags": "zone"}))
    assert "rack='r1'" in warning and "rack.aware.assignment.tags=rack,zone" in warning
    [warning] = config_warnings(load({"rack": "r1", "rack.aware.assignment.enabled": "false"}))
    assert "(nothing)" in warning

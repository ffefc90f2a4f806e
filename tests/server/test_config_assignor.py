"""The assignor keys (ServerConfig.assignor): defaults, every source, every bad value, render_toml."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import socket
from pathlib import Path

import pytest

from hotstate.assignor import AssignorConfig
from hotstate.assignor.config import PROPERTY_NAMES
from hotstate.server.config import (
    ASSIGNMENT_TAGS_KEY,
    ASSIGNOR_INT_KEYS,
    ASSIGNOR_KEYS,
    DEFAULTS,
    KNOWN_KEYS,
    MAX_INT32,
    OPTIONAL_KEYS,
    STRATEGY_KEY,
    ConfigError,
    ServerConfig,
    env_var_name,
    load_config,
    parse_flag_overrides,
    render_toml,
)

from .helpers import BASE, BASE_TOML, assert_reports, built_in_code, error_for, load, load_toml

STRATEGY = STRATEGY_KEY
TAGS = ASSIGNMENT_TAGS_KEY
TRAFFIC = "rack.aware.assignment.traffic_cost"
NON_OVERLAP = "rack.aware.assignment.non_overlap_cost"
LAG = "acceptable.recovery.lag"
WARMUPS = "max.warmup.replicas"

# A valid non-default value per key, as text (flags, env) and as what it loads to.
NON_DEFAULTS: dict[str, tuple[str, object]] = {
    STRATEGY: ("balance_subtopology", "balance_subtopology"),
    TAGS: ("zone,rack", ("zone", "rack")),
    TRAFFIC: ("0", 0),
    NON_OVERLAP: ("7", 7),
    LAG: ("0", 0),
    WARMUPS: ("5", 5),
}


def field_of(config: ServerConfig, key: str) -> object:
    return getattr(config.assignor, ASSIGNOR_KEYS[key])


def base_config(assignor: AssignorConfig) -> ServerConfig:
    return dataclasses.replace(load(), assignor=assignor)


# --- keys and defaults ---------------------------------------------------------------------------------


def test_keys_are_the_assignor_property_names() -> None:
    assert set(ASSIGNOR_KEYS) == {STRATEGY, TAGS, TRAFFIC, NON_OVERLAP, LAG, WARMUPS}
    assert all(PROPERTY_NAMES[name] == key for key, name in ASSIGNOR_KEYS.items())
    # Every AssignorConfig field but the standby count, which every table sets itself.
    assert {*ASSIGNOR_KEYS.values(), "num_standby_replicas"} == {
        field.name for field in dataclasses.fields(AssignorConfig)
    }
    # num.standby.replicas is a server key of its own: the count of a table made over HTTP without one.
    assert "num.standby.replicas" in KNOWN_KEYS and "num.standby.replicas" not in ASSIGNOR_KEYS
    assert load({"num.standby.replicas": "2"}).assignor == AssignorConfig()
    assert set(ASSIGNOR_KEYS) <= set(OPTIONAL_KEYS)
    assert set(ASSIGNOR_INT_KEYS) == {TRAFFIC, NON_OVERLAP, LAG, WARMUPS}


def test_defaults() -> None:
    assert load().assignor == AssignorConfig()
    assert AssignorConfig() == AssignorConfig(
        rack_aware_assignment_strategy="min_traffic",
        rack_aware_assignment_tags=("rack",),
        traffic_cost=10,
        non_overlap_cost=1,
        acceptable_recovery_lag=10_000,
        max_warmup_replicas=2,
    )
    assert DEFAULTS[STRATEGY] == "min_traffic" and DEFAULTS[TAGS] == "rack"
    assert [DEFAULTS[key] for key in (TRAFFIC, NON_OVERLAP, LAG, WARMUPS)] == [10, 1, 10_000, 2]
    # Built in code, a ServerConfig gets the same assignor as a loaded one.
    loaded = load()
    built = built_in_code(loaded)
    assert built.assignor == loaded.assignor == AssignorConfig()


def test_env_var_names() -> None:
    assert env_var_name(STRATEGY) == "HOTSTATE_RACK_AWARE_ASSIGNMENT_STRATEGY"
    assert env_var_name(TAGS) == "HOTSTATE_RACK_AWARE_ASSIGNMENT_TAGS"
    assert env_var_name(TRAFFIC) == "HOTSTATE_RACK_AWARE_ASSIGNMENT_TRAFFIC_COST"
    assert env_var_name(NON_OVERLAP) == "HOTSTATE_RACK_AWARE_ASSIGNMENT_NON_OVERLAP_COST"
    assert env_var_name(LAG) == "HOTSTATE_ACCEPTABLE_RECOVERY_LAG"
    assert env_var_name(WARMUPS) == "HOTSTATE_MAX_WARMUP_REPLICAS"


# --- each key from each source -------------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(ASSIGNOR_KEYS))
def test_each_key_from_a_flag(key: str) -> None:
    text, expected = NON_DEFAULTS[key]
    config = load({key: text})
    assert field_of(config, key) == expected
    others = [name for other, name in ASSIGNOR_KEYS.items() if other != key]
    assert all(getattr(config.assignor, name) == getattr(AssignorConfig(), name) for name in others)


@pytest.mark.parametrize("key", sorted(ASSIGNOR_KEYS))
def test_each_key_from_the_environment(key: str) -> None:
    text, expected = NON_DEFAULTS[key]
    env = {env_var_name(k): v for k, v in BASE.items()} | {env_var_name(key): text}
    assert field_of(load_config(env=env), key) == expected


@pytest.mark.parametrize("key", sorted(ASSIGNOR_KEYS))
def test_each_key_from_the_file(tmp_path: Path, key: str) -> None:
    text, expected = NON_DEFAULTS[key]
    shown = text if key in ASSIGNOR_INT_KEYS else f'"{text}"'
    assert field_of(load_toml(tmp_path, BASE_TOML + f'"{key}" = {shown}\n'), key) == expected


@pytest.mark.parametrize(
    ("key", "values", "expected"),
    [
        (
            STRATEGY,
            ('"none"', "balance_subtopology", "min_traffic"),
            ["none", "balance_subtopology", "min_traffic"],
        ),
        (TAGS, ('["zone"]', "cluster,zone", ""), [("zone",), ("cluster", "zone"), ()]),
        (TRAFFIC, ("1", "2", "3"), [1, 2, 3]),
        (WARMUPS, ("4", "5", "6"), [4, 5, 6]),
    ],
)
def test_flags_beat_env_beat_file(
    tmp_path: Path, key: str, values: tuple[str, str, str], expected: list[object]
) -> None:
    file_value, env_value, flag_value = values
    text = BASE_TOML + f'"{key}" = {file_value}\n'
    env = {env_var_name(key): env_value}
    assert field_of(load_toml(tmp_path, text), key) == expected[0]
    assert field_of(load_toml(tmp_path, text, env=env), key) == expected[1]
    assert field_of(load_toml(tmp_path, text, env=env, flags={key: flag_value}), key) == expected[2]


def test_nested_tables_equal_flat_dotted_keys(tmp_path: Path) -> None:
    nested = (
        BASE_TOML
        + """[rack.aware.assignment]
strategy = "none"
tags = ["zone", "rack"]
traffic_cost = 3
non_overlap_cost = 4

[acceptable.recovery]
lag = 500

[max.warmup]
replicas = 1
"""
    )
    flat = BASE_TOML + (
        '"rack.aware.assignment.strategy" = "none"\n'
        '"rack.aware.assignment.tags" = "zone,rack"\n'
        '"rack.aware.assignment.traffic_cost" = 3\n'
        '"rack.aware.assignment.non_overlap_cost" = 4\n'
        '"acceptable.recovery.lag" = 500\n'
        '"max.warmup.replicas" = 1\n'
    )
    from_nested, from_flat = load_toml(tmp_path, nested), load_toml(tmp_path, flat)
    assert from_nested == from_flat
    assert from_nested.assignor == AssignorConfig(
        rack_aware_assignment_strategy="none",
        rack_aware_assignment_tags=("zone", "rack"),
        traffic_cost=3,
        non_overlap_cost=4,
        acceptable_recovery_lag=500,
        max_warmup_replicas=1,
    )
    assert from_nested.rack is None


def test_rack_and_flat_quoted_assignor_keys_in_one_file(tmp_path: Path) -> None:
    text = BASE_TOML + 'rack = "az-a"\n"rack.aware.assignment.strategy" = "none"\n'
    config = load_toml(tmp_path, text)
    assert config.rack == "az-a" and config.assignor.rack_aware_assignment_strategy == "none"


def test_rack_with_a_rack_table_is_a_toml_error(tmp_path: Path) -> None:
    # TOML cannot make `rack` a string and a table; docs/configuration.md says to write the keys flat.
    text = BASE_TOML + 'rack = "az-a"\n[rack.aware.assignment]\nstrategy = "none"\n'
    with pytest.raises(ConfigError) as excinfo:
        load_toml(tmp_path, text)
    assert_reports(excinfo, "--config", "must be a readable TOML file")


def test_a_key_given_both_flat_and_nested_is_an_error(tmp_path: Path) -> None:
    text = BASE_TOML + '"rack.aware.assignment.traffic_cost" = 1\n[rack.aware.assignment]\ntraffic_cost = 2\n'
    with pytest.raises(ConfigError) as excinfo:
        load_toml(tmp_path, text)
    assert_reports(excinfo, TRAFFIC, "must be set once")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("MIN_TRAFFIC", "min_traffic"),
        (" None ", "none"),
        ("Balance_Subtopology", "balance_subtopology"),
    ],
)
def test_strategy_case_and_spaces_do_not_matter(text: str, expected: str) -> None:
    assert load({STRATEGY: text}).assignor.rack_aware_assignment_strategy == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("rack", ("rack",)),
        ("zone, rack", ("zone", "rack")),  # in the order given: the first key is spread over first
        ("rack,zone,cluster.name", ("rack", "zone", "cluster.name")),
        ("", ()),
        ("  ", ()),
    ],
)
def test_tags_from_text(text: str, expected: tuple[str, ...]) -> None:
    assert load({TAGS: text}).assignor.rack_aware_assignment_tags == expected


@pytest.mark.parametrize(
    ("toml_value", "expected"),
    [('["zone", "rack"]', ("zone", "rack")), ("[]", ()), ('""', ()), ('" zone "', ("zone",))],
)
def test_tags_from_the_file(tmp_path: Path, toml_value: str, expected: tuple[str, ...]) -> None:
    config = load_toml(tmp_path, BASE_TOML + f'"{TAGS}" = {toml_value}\n')
    assert config.assignor.rack_aware_assignment_tags == expected


def test_empty_tags_flag_means_no_tags_and_empty_env_var_means_unset(tmp_path: Path) -> None:
    text = BASE_TOML + f'"{TAGS}" = "zone"\n'
    assert load_toml(tmp_path, text, flags={TAGS: ""}).assignor.rack_aware_assignment_tags == ()
    # An empty environment variable counts as not set, as for every key: the file's value stands.
    env = {env_var_name(TAGS): ""}
    assert load_toml(tmp_path, text, env=env).assignor.rack_aware_assignment_tags == ("zone",)
    assert load_config(env={env_var_name(k): v for k, v in BASE.items()} | env).assignor == AssignorConfig()


def test_flag_spellings() -> None:
    args = ["--rack.aware.assignment.strategy", "none", "--set", "rack.aware.assignment.tags=zone,rack"]
    args += ["--rack.aware.assignment.traffic_cost=0", "--max.warmup.replicas", "3"]
    flags = parse_flag_overrides(args)
    assert flags == {STRATEGY: "none", TAGS: "zone,rack", TRAFFIC: "0", WARMUPS: "3"}
    assert load(flags).assignor == AssignorConfig(
        rack_aware_assignment_strategy="none",
        rack_aware_assignment_tags=("zone", "rack"),
        traffic_cost=0,
        max_warmup_replicas=3,
    )


@pytest.mark.parametrize(
    ("key", "nearest"),
    [
        ("rack.aware.assignment.strategie", STRATEGY),
        ("rack.aware.assignment.traffic.cost", TRAFFIC),
        ("rack_aware_assignment_non_overlap_cost", NON_OVERLAP),
        ("rack.aware.assignment.tag", TAGS),
    ],
)
def test_misspelled_keys_name_the_nearest(key: str, nearest: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        parse_flag_overrides([f"--{key}=1"])
    assert_reports(excinfo, key, f"did you mean {nearest!r}")


def test_misspelled_env_var_warns(caplog: pytest.LogCaptureFixture) -> None:
    env = {env_var_name(k): v for k, v in BASE.items()} | {"HOTSTATE_RACK_AWARE_ASSIGNMENT_STRATEGI": "none"}
    with caplog.at_level(logging.WARNING, logger="hotstate.server.config"):
        config = load_config(env=env)
    assert config.assignor == AssignorConfig()
    assert "did you mean HOTSTATE_RACK_AWARE_ASSIGNMENT_STRATEGY?" in caplog.text


# --- bad values ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "fragment", "shown"),
    [
        (STRATEGY, "fastest", "must be none, min_traffic or balance_subtopology", "fastest"),
        (STRATEGY, "min-traffic", "did you mean 'min_traffic'?", "min-traffic"),
        (STRATEGY, "", "must be none, min_traffic or balance_subtopology", ""),
        (TAGS, "rack,,zone", "a tag key must not be empty", "rack,,zone"),
        (TAGS, "rack,", "a tag key must not be empty", "rack,"),
        (TAGS, ",", "a tag key must not be empty", ","),
        (TAGS, "rack,zone,rack", "must give each tag key once; 'rack' is repeated", "rack,zone,rack"),
        (TAGS, "zone=eu1", "a tag key must be 1-64 letters", "zone=eu1"),
        (TAGS, "rack,my zone", "a tag key must be 1-64 letters", "my zone"),
        (TAGS, "-zone", "starting with a letter or digit", "-zone"),
        (TAGS, "k" * 65, "a tag key must be 1-64 letters", "k" * 65),
        (TRAFFIC, "-1", "must be an integer >= 0", -1),
        (TRAFFIC, "ten", "must be an integer >= 0", "ten"),
        (TRAFFIC, "1.5", "must be an integer >= 0", "1.5"),
        (TRAFFIC, str(MAX_INT32 + 1), f"at most {MAX_INT32}", MAX_INT32 + 1),
        (NON_OVERLAP, "-3", "must be an integer >= 0", -3),
        (NON_OVERLAP, "true", "must be an integer >= 0", "true"),
        (LAG, "-1", "must be an integer >= 0 (records)", -1),
        (WARMUPS, "0", "must be a positive integer (replicas)", 0),
        (WARMUPS, "two", "must be a positive integer (replicas)", "two"),
    ],
)
def test_bad_value_from_a_flag(key: str, value: str, fragment: str, shown: object) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load({key: value})
    single = assert_reports(excinfo, key, fragment, shown)
    assert single.source == f"flag --{key}"
    assert [e.key for e in excinfo.value.errors] == [key]


@pytest.mark.parametrize(
    ("key", "toml_value", "fragment"),
    [
        (STRATEGY, "1", "must be none, min_traffic or balance_subtopology"),
        (STRATEGY, '["none"]', "must be none, min_traffic or balance_subtopology"),
        (TAGS, "5", "must be tag keys, comma-separated"),
        (TAGS, '["rack", 1]', "must be tag keys, comma-separated"),
        (TAGS, '["rack", ""]', "a tag key must not be empty"),
        (TAGS, '{ zone = "eu1" }', "must be tag keys, comma-separated"),
        (TRAFFIC, "true", "must be an integer >= 0"),
        (TRAFFIC, "1.5", "must be an integer >= 0"),
        (TRAFFIC, '"lots"', "must be an integer >= 0"),
        (NON_OVERLAP, "-1", "must be an integer >= 0"),
        (LAG, "-10", "must be an integer >= 0"),
        (WARMUPS, "0", "must be a positive integer"),
    ],
)
def test_bad_value_from_the_file(tmp_path: Path, key: str, toml_value: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        load_toml(tmp_path, BASE_TOML + f'"{key}" = {toml_value}\n')
    single = assert_reports(excinfo, key, fragment)
    assert single.source == str(tmp_path / "server.toml")


def test_bad_value_from_the_environment_names_the_variable() -> None:
    env = {env_var_name(k): v for k, v in BASE.items()}
    env[env_var_name(STRATEGY)] = "cheapest"
    with pytest.raises(ConfigError) as excinfo:
        load_config(env=env)
    assert str(excinfo.value) == (
        "rack.aware.assignment.strategy='cheapest': must be none, min_traffic or balance_subtopology "
        "(from env HOTSTATE_RACK_AWARE_ASSIGNMENT_STRATEGY)"
    )


def test_every_bad_assignor_key_is_reported_at_once_with_the_others() -> None:
    with pytest.raises(ConfigError) as excinfo:
        load(
            {
                STRATEGY: "fast",
                TAGS: "rack,rack",
                TRAFFIC: "-1",
                NON_OVERLAP: "x",
                LAG: "-1",
                WARMUPS: "0",
                "node.id": "0",
                "heartbeat.window.ms": "lots",
            }
        )
    assert sorted(e.key for e in excinfo.value.errors) == sorted(
        [*ASSIGNOR_KEYS, "node.id", "heartbeat.window.ms"]
    )
    assert len(str(excinfo.value).splitlines()) == 8


def test_good_assignor_keys_next_to_a_bad_one_are_not_reported() -> None:
    with pytest.raises(ConfigError) as excinfo:
        load({STRATEGY: "none", TAGS: "zone", TRAFFIC: "-1"})
    assert [e.key for e in excinfo.value.errors] == [TRAFFIC]


def test_an_assignor_config_error_is_reported_as_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """Should AssignorConfig get a rule the server's checks lack, its ValueError still names the key."""
    original = AssignorConfig.__post_init__

    def stricter(self: AssignorConfig) -> None:
        original(self)
        if self.traffic_cost == 7:
            raise ValueError(
                "traffic_cost (rack.aware.assignment.traffic_cost) = 7 is invalid: allowed is anything but 7"
            )
        if self.max_warmup_replicas == 7:
            raise ValueError("seven warmups are unlucky")

    monkeypatch.setattr(AssignorConfig, "__post_init__", stricter)
    with pytest.raises(ConfigError) as excinfo:
        load({TRAFFIC: "7"})
    single = assert_reports(excinfo, TRAFFIC, "must be anything but 7", 7)
    assert single.source == f"flag --{TRAFFIC}"
    with pytest.raises(ConfigError) as excinfo:
        load({WARMUPS: "7"})
    assert_reports(excinfo, "assignor", "seven warmups are unlucky")


# --- rules on a ServerConfig built in code ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("assignor", "key", "fragment"),
    [
        (AssignorConfig(rack_aware_assignment_tags=("my zone",)), TAGS, "a tag key must be 1-64 letters"),
        (AssignorConfig(rack_aware_assignment_tags=("x" * 65,)), TAGS, "a tag key must be 1-64 letters"),
        (AssignorConfig(traffic_cost=MAX_INT32 + 1), TRAFFIC, f"at most {MAX_INT32}"),
        (AssignorConfig(acceptable_recovery_lag=MAX_INT32 + 1), LAG, f"at most {MAX_INT32}"),
        (AssignorConfig(num_standby_replicas=2), "assignor", "every table sets its own standby count"),
    ],
)
def test_rules_on_a_built_config(assignor: AssignorConfig, key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as excinfo:
        base_config(assignor)
    assert_reports(excinfo, key, fragment)


def test_a_built_config_needs_an_assignor_config() -> None:
    with pytest.raises(ConfigError) as excinfo:
        base_config({"traffic_cost": 1})  # type: ignore[arg-type]
    assert_reports(excinfo, "assignor", "must be an AssignorConfig")


def test_rack_is_a_valid_assignment_tag_but_not_a_server_tag() -> None:
    config = load({TAGS: "rack,zone", "tags": "zone=eu1", "rack": "az-a"})
    assert config.assignor.rack_aware_assignment_tags == ("rack", "zone")
    with pytest.raises(ConfigError) as excinfo:
        load({"tags": "rack=az-a"})
    error_for(excinfo.value, "tags")


# --- render_toml ---------------------------------------------------------------------------------------


def round_trip(tmp_path: Path, config: ServerConfig, *, include_defaults: bool = False) -> ServerConfig:
    path = tmp_path / "rendered.toml"
    path.write_text(render_toml(config, include_defaults=include_defaults), encoding="utf-8")
    return load_config(path, env={})


def test_defaults_are_left_out_unless_asked_for(tmp_path: Path) -> None:
    config = load()
    assert not any(f'"{key}"' in render_toml(config) for key in ASSIGNOR_KEYS)
    full = render_toml(config, include_defaults=True)
    assert '"rack.aware.assignment.strategy" = "min_traffic"' in full
    assert '"rack.aware.assignment.tags" = "rack"' in full
    assert '"rack.aware.assignment.traffic_cost" = 10' in full
    assert '"rack.aware.assignment.non_overlap_cost" = 1' in full
    assert '"acceptable.recovery.lag" = 10000' in full
    assert '"max.warmup.replicas" = 2' in full
    assert round_trip(tmp_path, config, include_defaults=True) == config


@pytest.mark.parametrize(
    "assignor",
    [
        AssignorConfig(
            rack_aware_assignment_strategy="balance_subtopology",
            rack_aware_assignment_tags=("zone", "rack", "cluster.name"),
            traffic_cost=0,
            non_overlap_cost=0,
            acceptable_recovery_lag=0,
            max_warmup_replicas=MAX_INT32,
        ),
        AssignorConfig(rack_aware_assignment_strategy="none", rack_aware_assignment_tags=()),
        AssignorConfig(rack_aware_assignment_tags=("zone",)),
        AssignorConfig(traffic_cost=MAX_INT32),
    ],
)
@pytest.mark.parametrize("include_defaults", [False, True])
def test_round_trip(tmp_path: Path, assignor: AssignorConfig, include_defaults: bool) -> None:
    config = dataclasses.replace(base_config(assignor), rack="az-a")
    assert round_trip(tmp_path, config, include_defaults=include_defaults) == config


def test_only_what_differs_from_the_defaults_is_written() -> None:
    text = render_toml(base_config(AssignorConfig(rack_aware_assignment_tags=())))
    assert [key for key in ASSIGNOR_KEYS if f'"{key}"' in text] == [TAGS]
    assert '"rack.aware.assignment.tags" = ""' in text


# --- the server hands the settings to its controller -----------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_the_server_gives_the_assignor_config_to_its_controller(tmp_path: Path) -> None:
    from hotstate.server.app import Server

    port = _free_port()
    config = load(
        {
            "listeners": f"rpc://127.0.0.1:{port}",
            "controller.quorum.voters": f"1@127.0.0.1:{port}",
            "data.dir": str(tmp_path / "data"),
            STRATEGY: "none",
            TAGS: "zone",
            TRAFFIC: "3",
        }
    )

    async def start_and_stop() -> AssignorConfig:
        server = Server(config)
        try:
            await server.start()
            assert server.controller is not None
            return server.controller._config.assignor
        finally:
            await server.stop(controlled=False)

    assert asyncio.run(start_and_stop()) == config.assignor

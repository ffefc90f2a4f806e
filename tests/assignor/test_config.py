"""Config validation: every bad value names the key (both spellings), the value and what is allowed."""

from __future__ import annotations

import pytest

from hotstate.assignor import STRATEGIES, AssignorConfig


def test_defaults_are_valid_and_documented_names_round_trip() -> None:
    cfg = AssignorConfig()
    props = cfg.properties()
    assert props["acceptable.recovery.lag"] == 10_000
    assert props["rack.aware.assignment.strategy"] == "min_traffic"
    assert AssignorConfig.from_properties(props) == cfg


@pytest.mark.parametrize(
    ("field", "prop", "value", "allowed"),
    [
        ("acceptable_recovery_lag", "acceptable.recovery.lag", -1, "integer >= 0"),
        ("acceptable_recovery_lag", "acceptable.recovery.lag", 1.5, "integer >= 0"),
        ("acceptable_recovery_lag", "acceptable.recovery.lag", True, "integer >= 0"),
        ("max_warmup_replicas", "max.warmup.replicas", 0, "integer >= 1"),
        ("num_standby_replicas", "num.standby.replicas", -2, "integer >= 0"),
        ("traffic_cost", "rack.aware.assignment.traffic_cost", -1, "integer >= 0"),
        ("non_overlap_cost", "rack.aware.assignment.non_overlap_cost", "1", "integer >= 0"),
        (
            "rack_aware_assignment_strategy",
            "rack.aware.assignment.strategy",
            "fastest",
            " | ".join(STRATEGIES),
        ),
        ("rack_aware_assignment_tags", "rack.aware.assignment.tags", "rack", "tuple of distinct"),
        ("rack_aware_assignment_tags", "rack.aware.assignment.tags", ("zone", "zone"), "tuple of distinct"),
        ("rack_aware_assignment_tags", "rack.aware.assignment.tags", ("",), "tuple of distinct"),
    ],
)
def test_bad_values_raise_a_value_error_naming_key_value_and_allowed(
    field: str, prop: str, value: object, allowed: str
) -> None:
    with pytest.raises(ValueError) as err:
        AssignorConfig(**{field: value})  # type: ignore[arg-type]
    msg = str(err.value)
    assert field in msg and prop in msg and repr(value) in msg and allowed in msg


def test_from_properties_reads_kafka_names_and_comma_separated_tags() -> None:
    cfg = AssignorConfig.from_properties(
        {"rack.aware.assignment.tags": "zone, cluster", "max.warmup.replicas": 5, "num.standby.replicas": 2}
    )
    assert cfg.rack_aware_assignment_tags == ("zone", "cluster")
    assert cfg.max_warmup_replicas == 5
    assert cfg.num_standby_replicas == 2


def test_from_properties_rejects_unknown_keys_listing_the_allowed_ones() -> None:
    with pytest.raises(
        ValueError, match=r"unknown assignor property 'acceptable\.lag'.*acceptable\.recovery\.lag"
    ):
        AssignorConfig.from_properties({"acceptable.lag": 5})

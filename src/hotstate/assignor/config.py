"""Assignor configuration, with Kafka Streams' names.

Each field is the Python spelling of a Kafka Streams config (``acceptable.recovery.lag`` ->
``acceptable_recovery_lag``); ``AssignorConfig.from_properties`` accepts the dotted names.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Final

STRATEGIES: Final = ("none", "min_traffic", "balance_subtopology")

# Python field name -> Kafka-style property name, used in error messages and from_properties.
PROPERTY_NAMES: Final[Mapping[str, str]] = {
    "acceptable_recovery_lag": "acceptable.recovery.lag",
    "max_warmup_replicas": "max.warmup.replicas",
    "num_standby_replicas": "num.standby.replicas",
    "rack_aware_assignment_tags": "rack.aware.assignment.tags",
    "rack_aware_assignment_strategy": "rack.aware.assignment.strategy",
    "traffic_cost": "rack.aware.assignment.traffic_cost",
    "non_overlap_cost": "rack.aware.assignment.non_overlap_cost",
}


def _bad(name: str, value: object, allowed: str) -> ValueError:
    return ValueError(f"{name} ({PROPERTY_NAMES[name]}) = {value!r} is invalid: allowed is {allowed}")


def _check_int(name: str, value: object, minimum: int) -> None:
    # bool is an int subclass; True as a lag bound is almost certainly a mistake.
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise _bad(name, value, f"an integer >= {minimum}")


@dataclass(frozen=True, slots=True)
class AssignorConfig:
    """How the assignor trades balance, availability and cost.

    - ``acceptable_recovery_lag`` (``acceptable.recovery.lag``, default 10000): a replica whose offset
      lag is at most this is *caught up* and may take the active at once (KIP-441).
    - ``max_warmup_replicas`` (``max.warmup.replicas``, default 2): warmups in the whole cluster at
      one time, the extra replicas that move an active or a standby to its balanced target; bounds the
      restore traffic of a rebalance. Standbys that rebuild a lost copy are always assigned, as in Kafka
      Streams (restoring.py).
    - ``num_standby_replicas`` (``num.standby.replicas``, default 1): standbys per partition for tables
      that do not set their own. (Kafka's default is 0; hotstate exists for high availability.)
    - ``rack_aware_assignment_tags`` (``rack.aware.assignment.tags``, default ``("rack",)``): tag keys
      standbys are spread over (KIP-708). A server's ``rack`` is the tag ``rack``. Empty: least loaded.
    - ``rack_aware_assignment_strategy`` (``rack.aware.assignment.strategy``, default ``min_traffic``):
      ``none`` (plain balanced, sticky), ``min_traffic`` (min-cost flow, KIP-925) or
      ``balance_subtopology`` (min-cost flow that also balances each table over the servers).
    - ``traffic_cost`` (``rack.aware.assignment.traffic_cost``, default 10): cost of a replica outside
      its partition's source racks.
    - ``non_overlap_cost`` (``rack.aware.assignment.non_overlap_cost``, default 1): cost of a replica
      on a server that held no replica of the partition before.
    """

    acceptable_recovery_lag: int = 10_000
    max_warmup_replicas: int = 2
    num_standby_replicas: int = 1
    rack_aware_assignment_tags: tuple[str, ...] = ("rack",)
    rack_aware_assignment_strategy: str = "min_traffic"
    traffic_cost: int = 10
    non_overlap_cost: int = 1

    def __post_init__(self) -> None:
        _check_int("acceptable_recovery_lag", self.acceptable_recovery_lag, 0)
        # Kafka requires at least one warmup: with zero, an active could never move to a new server.
        _check_int("max_warmup_replicas", self.max_warmup_replicas, 1)
        _check_int("num_standby_replicas", self.num_standby_replicas, 0)
        _check_int("traffic_cost", self.traffic_cost, 0)
        _check_int("non_overlap_cost", self.non_overlap_cost, 0)
        if self.rack_aware_assignment_strategy not in STRATEGIES:
            raise _bad(
                "rack_aware_assignment_strategy", self.rack_aware_assignment_strategy, " | ".join(STRATEGIES)
            )
        tags = self.rack_aware_assignment_tags
        allowed_tags = "a tuple of distinct non-empty strings"
        if not isinstance(tags, tuple):  # a bare string is not a tuple, so "rack" is caught here too
            raise _bad("rack_aware_assignment_tags", tags, allowed_tags)
        if len(set(tags)) != len(tags) or not all(isinstance(t, str) and t for t in tags):
            raise _bad("rack_aware_assignment_tags", tags, allowed_tags)

    @classmethod
    def from_properties(cls, props: Mapping[str, object]) -> AssignorConfig:
        """Build from Kafka-style names (``{"acceptable.recovery.lag": 500}``).

        ``rack.aware.assignment.tags`` may be a comma-separated string, as in a properties file.
        """
        by_property = {prop: name for name, prop in PROPERTY_NAMES.items()}
        kwargs: dict[str, object] = {}
        for key in sorted(props):
            if key not in by_property:
                raise ValueError(
                    f"unknown assignor property {key!r}: allowed are {', '.join(sorted(by_property))}"
                )
            value = props[key]
            name = by_property[key]
            if name == "rack_aware_assignment_tags":
                value = _parse_tags(value)
            kwargs[name] = value
        return cls(**kwargs)  # type: ignore[arg-type]

    def properties(self) -> dict[str, object]:
        """The config under its Kafka-style names (for logs and docs)."""
        return {PROPERTY_NAMES[f.name]: getattr(self, f.name) for f in fields(self)}


def _parse_tags(value: object) -> object:
    if isinstance(value, str):
        return tuple(t.strip() for t in value.split(",") if t.strip())
    if isinstance(value, Iterable):
        return tuple(value)
    return value

"""Timing and size settings of the metadata quorum, named after Kafka's `controller.quorum.*`."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RaftConfig:
    """Settings of one quorum member. Defaults are tuned for a LAN (Kafka's are for a WAN-ish data centre).

    All durations are milliseconds of the caller's clock; the core never reads a clock itself.
    """

    # controller.quorum.election.timeout.ms: an election runs for a random time in [T, 2T) before retrying;
    # an unattached voter waits as long before standing.
    election_timeout_ms: int = 500
    # controller.quorum.fetch.timeout.ms: a follower with no successful Fetch answer for this long stands
    # for election; a leader without Fetches from a majority for 1.5x this long resigns (check quorum).
    # 750: 3.75x the long poll below, so a healthy follower never times out, and a leader's death is
    # noticed fast enough for a failover to commit within ~1 s (measured in bench/results/metadata.json).
    fetch_timeout_ms: int = 750
    # controller.quorum.election.backoff.max.ms: cap of the exponential backoff after a lost election.
    election_backoff_max_ms: int = 500
    # controller.quorum.append.linger.ms: how long the leader gathers proposals into one batch.
    append_linger_ms: int = 5
    # controller.quorum.request.timeout.ms: an unanswered request is sent again after this long.
    request_timeout_ms: int = 500
    # How long the leader may park a Fetch that has nothing new (long poll); below fetch_timeout_ms.
    fetch_max_wait_ms: int = 200
    fetch_max_bytes: int = 1024 * 1024
    snapshot_chunk_bytes: int = 64 * 1024
    # Proposals the leader holds unflushed before it refuses more (back-pressure, not a correctness bound).
    max_pending_proposals: int = 10_000

    def __post_init__(self) -> None:
        positive = (
            "election_timeout_ms",
            "fetch_timeout_ms",
            "election_backoff_max_ms",
            "request_timeout_ms",
            "fetch_max_wait_ms",
            "fetch_max_bytes",
            "snapshot_chunk_bytes",
            "max_pending_proposals",
        )
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(
                    f"controller.quorum.{_kafka_name(name)}={value!r}: must be a positive integer"
                )
        if not isinstance(self.append_linger_ms, int) or self.append_linger_ms < 0:
            raise ValueError(
                f"controller.quorum.append.linger.ms={self.append_linger_ms!r}: must be an integer >= 0"
            )
        if self.fetch_max_wait_ms >= self.fetch_timeout_ms:
            raise ValueError(
                f"controller.quorum.fetch.max.wait.ms={self.fetch_max_wait_ms}: must be below "
                f"controller.quorum.fetch.timeout.ms={self.fetch_timeout_ms}, or healthy followers time out"
            )


def _kafka_name(field: str) -> str:
    return field.replace("_", ".")

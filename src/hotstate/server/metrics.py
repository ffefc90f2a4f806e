"""The server's Prometheus metrics: queries, their latency, forwards, failures by reason, replica lags,
peers' heartbeat status, refused HTTP requests and connections. One registry per server (not the
process-global one), so nothing leaks between servers that share a process in tests."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.queries = Counter(
            "hotstate_queries", "Pull queries received, by outcome", ["outcome"], registry=self.registry
        )
        self.latency = Histogram(
            "hotstate_query_seconds",
            "Pull query latency at the receiving server",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.forwards = Counter(
            "hotstate_query_forwards",
            "Partitions of a query forwarded to another server, by outcome",
            ["outcome"],
            registry=self.registry,
        )
        self.failures = Counter(
            "hotstate_query_failures",
            "Pull queries that failed, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.auth_failures = Counter(
            "hotstate_http_auth_failures",
            "HTTP requests refused by authentication or authorization, by reason (missing, "
            "bad_credentials, forbidden)",
            ["reason"],
            registry=self.registry,
        )
        self.connections_refused = Counter(
            "hotstate_http_connections_refused",
            "HTTP connections closed at once because the server had http.max.connections open",
            registry=self.registry,
        )
        self.replica_lag = Gauge(
            "hotstate_replica_offset_lag",
            "Offset lag of each local replica (KIP-535)",
            ["table", "partition", "state"],
            registry=self.registry,
        )
        self.replica_position = Gauge(
            "hotstate_replica_position",
            "Store position of each local replica",
            ["table", "partition"],
            registry=self.registry,
        )
        self.peer_alive = Gauge(
            "hotstate_peer_alive",
            "Heartbeat status of each peer (1 alive, 0 down)",
            ["peer"],
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)

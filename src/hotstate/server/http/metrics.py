"""The server's Prometheus metrics: queries (by outcome and by table), their latency, forwards, failures by
reason, replica lags, peers' heartbeat status, refused HTTP requests and connections; the control plane's
are in http/control_metrics.py. One registry per server (not the
process-global one), so nothing leaks between servers that share a process in tests."""

from __future__ import annotations

import bisect
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

LOOP_PROBE_S = 0.01
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class LoopCount:
    """One label's count of a LoopCounter."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0

    def inc(self, amount: int = 1) -> None:
        self.value += amount


class LoopCounter:
    """A labelled counter that only the event loop's thread counts: plain ints, no lock. prometheus_client's
    Counter takes a lock and its Histogram a lock and a bucket search in Python, a tenth of a point
    lookup's CPU; these count every pull query. Collected (read) from any thread: a read may miss the
    increment under way, never sees a count go down."""

    def __init__(self, name: str, documentation: str, label: str, registry: CollectorRegistry) -> None:
        self._name = name
        self._documentation = documentation
        self._label = label
        self._counts: dict[str, LoopCount] = {}
        registry.register(self)

    def labels(self, value: str) -> LoopCount:
        count = self._counts.get(value)
        if count is None:
            count = self._counts[value] = LoopCount()
        return count

    def collect(self) -> Iterator[Metric]:
        family = CounterMetricFamily(self._name, self._documentation, labels=[self._label])
        for value, count in list(self._counts.items()):
            family.add_metric([value], count.value)
        yield family


class LoopHistogram:
    """A histogram that only the event loop's thread observes (see LoopCounter), with Prometheus buckets."""

    def __init__(
        self, name: str, documentation: str, buckets: tuple[float, ...], registry: CollectorRegistry
    ) -> None:
        self._name = name
        self._documentation = documentation
        self._bounds = buckets
        self._counts = [0] * (len(buckets) + 1)  # the last: above every bound (+Inf)
        self._sum = 0.0
        registry.register(self)

    def observe(self, value: float) -> None:
        self._counts[bisect.bisect_left(self._bounds, value)] += 1
        self._sum += value

    def collect(self) -> Iterator[Metric]:
        counts, total = list(self._counts), self._sum
        cumulative, buckets = 0, []
        for bound, count in zip((*self._bounds, float("inf")), counts, strict=True):
            cumulative += count
            buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
        yield HistogramMetricFamily(self._name, self._documentation, buckets=buckets, sum_value=total)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.queries = LoopCounter(
            "hotstate_queries", "Pull queries received, by outcome", "outcome", self.registry
        )
        self.latency = LoopHistogram(
            "hotstate_query_seconds",
            "Pull query latency at the receiving server",
            LATENCY_BUCKETS,
            self.registry,
        )
        self.forwards = LoopCounter(
            "hotstate_query_forwards",
            "Partitions of a query forwarded to another server, by outcome",
            "outcome",
            self.registry,
        )
        self.table_queries = LoopCounter(
            "hotstate_table_queries", "Pull queries answered, by table", "table", self.registry
        )
        self.failures = LoopCounter(
            "hotstate_query_failures", "Pull queries that failed, by reason", "reason", self.registry
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
        self.push_subscriptions = Gauge(
            "hotstate_push_subscriptions",
            "Push-query feeds this server serves (at most push.max.subscriptions)",
            registry=self.registry,
        )
        self.push_ended = Counter(
            "hotstate_push_feeds_ended",
            "Push-query feeds ended by the server, by reason (fell_behind, replica_gone, shutdown, dropped)",
            ["reason"],
            registry=self.registry,
        )
        self.scans_running = Gauge(
            "hotstate_partition_scans_running",
            "Partition scans (filters, aggregates, top-N) this server runs now (at most "
            "query.scan.max.concurrent)",
            registry=self.registry,
        )
        self.column_copies = Gauge(
            "hotstate_scan_column_copies",
            "Column copies of partitions this server keeps for scans (query.scan.cache.bytes)",
            registry=self.registry,
        )
        self.column_copy_bytes = Gauge(
            "hotstate_scan_column_copy_bytes",
            "Bytes of the column copies of partitions this server keeps for scans",
            registry=self.registry,
        )
        self.scans_cancelled = LoopCounter(
            "hotstate_partition_scans_cancelled",
            "Partition scans stopped before their end, by reason (client_gone: nobody waited for the answer "
            "any more: the HTTP client disconnected, or the server that took the query gave up)",
            "reason",
            self.registry,
        )
        self.push_dropped = Counter(
            "hotstate_push_clients_dropped",
            "Push-query connections dropped because the client read nothing for push.send.timeout.ms",
            registry=self.registry,
        )
        self.peer_alive = Gauge(
            "hotstate_peer_alive",
            "Heartbeat status of each peer (1 alive, 0 down)",
            ["peer"],
            registry=self.registry,
        )

        # The event loop's stalls: how late a timer due every LOOP_PROBE_S fired (server.app's probe), so a
        # step that held the loop (a scan page, an expiry page, a store write) shows as a late tick.
        self.loop_stall = LoopHistogram(
            "hotstate_event_loop_stall_seconds",
            f"How late the event loop ran a timer due every {LOOP_PROBE_S * 1000:g} ms",
            LATENCY_BUCKETS,
            self.registry,
        )
        self.loop_stall_max = Gauge(
            "hotstate_event_loop_stall_max_seconds",
            "The longest event-loop stall since the server started",
            registry=self.registry,
        )
        self.expired_rows = Gauge(
            "hotstate_expired_rows",
            "Rows this server's actives deleted by expiry (window retention and TTL) since it started",
            registry=self.registry,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)

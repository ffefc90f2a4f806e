"""The pull-query counters and latency histogram (metrics.LoopCounter, LoopHistogram) in the Prometheus
text format, as prometheus_client's own Counter and Histogram write them."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from hotstate.server.http.metrics import LATENCY_BUCKETS, LoopCounter, LoopHistogram, Metrics


def _samples(registry: CollectorRegistry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(registry).decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if not sample.name.endswith("_created")
    }


def test_loop_metrics_write_what_prometheus_clients_own_write() -> None:
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    counter = LoopCounter("q", "queries", "outcome", ours)
    histogram = LoopHistogram("q_seconds", "latency", LATENCY_BUCKETS, ours)
    their_counter = Counter("q", "queries", ["outcome"], registry=theirs)
    their_histogram = Histogram("q_seconds", "latency", buckets=LATENCY_BUCKETS, registry=theirs)
    observations = [0.0001, 0.0005, 0.0007, 0.003, 0.003, 0.2, 9.99, 10.0, 11.0, 400.0]
    for value in observations:
        histogram.observe(value)
        their_histogram.observe(value)
    for outcome, times in (("ok", 5), ("timeout", 2), ("not_found", 1)):
        for _ in range(times):
            counter.labels(outcome).inc()
            their_counter.labels(outcome).inc()
    assert _samples(ours) == _samples(theirs)
    assert _samples(ours)[("q_seconds_bucket", (("le", "+Inf"),))] == len(observations)


def test_the_query_counter_feeds_the_consoles_rate() -> None:
    metrics = Metrics()
    metrics.queries.labels("ok").inc()
    metrics.queries.labels("bad_request").inc(2)
    total = sum(
        sample.value
        for family in metrics.queries.collect()
        for sample in family.samples
        if sample.name.endswith("_total")
    )
    assert total == 3

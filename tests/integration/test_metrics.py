"""Prometheus metrics scraped over HTTP after a real batch (sweep, worker, Apache Kafka, PostgreSQL)."""

from __future__ import annotations

import urllib.request
from datetime import UTC, datetime, timedelta

from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import insert

from lapse.devtools.brokers import free_port
from lapse.devtools.demo_data import add_reservations
from lapse.kernel.database import make_engine
from lapse.kernel.ledger import expiry_event, pending_row
from lapse.kernel.models import cleanup_ledger
from lapse.readers.status import status_report
from lapse.shell import metrics
from tests.fixtures.pipeline import make_pipeline_settings
from tests.fixtures.readers import READER_TOPICS, produce_events, sweep
from tests.fixtures.workers import process_until_done


def scrape(port: int) -> dict[tuple, float]:
    """(sample name, sorted labels) → value, from the live /metrics endpoint."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_after_a_real_batch(kafka_bootstrap, pg_url, unique):
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, **READER_TOPICS,
                                      runtime={"metrics_port": free_port()})
    port = metrics.serve(settings)
    before = scrape(port)
    engine = make_engine(pg_url)
    now = datetime.now(UTC)
    with engine.begin() as conn:
        add_reservations(conn, 3, expires_at=now - timedelta(minutes=10))
    sweep(settings)
    bad = expiry_event("release-reservation", "x1", "t1", now, source="sweep", correlation_id="c")
    produce_events(settings, [bad, bad])  # an invalid subject, delivered twice
    process_until_done(settings, terminal=4)

    after = scrape(port)

    def delta(name: str, **labels) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after.get(key, 0.0) - before.get(key, 0.0)

    assert delta("lapse_events_consumed_total") == 5
    assert delta("lapse_effects_applied_total") == 3
    assert delta("lapse_dead_letters_total", failure_class="ledger") == 1
    assert delta("lapse_duplicates_absorbed_total") == 1
    batches = delta("lapse_batch_size_count")
    assert batches >= 1 and delta("lapse_batch_seconds_count") == batches
    assert delta("lapse_batch_size_sum") == 5

    # The status gauges: a stuck pending row ten minutes overdue, and the group caught up.
    event = expiry_event("release-reservation", 999, "t1", now - timedelta(minutes=10), source="sweep",
                         correlation_id="c")
    with engine.begin() as conn:
        conn.execute(insert(cleanup_ledger), [pending_row(event, now)])
    metrics.observe_status(status_report(settings, engine, now))
    gauges = scrape(port)
    assert gauges[("lapse_oldest_eligible_age_seconds", ())] == 600
    assert gauges[("lapse_ledger_rows", (("state", "applied"),))] == 3
    lag = (("group", settings.topology.groups.cleanup), ("topic", settings.topology.expiry))
    assert gauges[("lapse_consumer_lag_records", lag)] == 0
    engine.dispose()

"""The analytics Faust app in a real worker subprocess against Apache Kafka: its web view's
figures match the outcomes produced (lz4-compressed, as the relay sends them)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest

from lapse.devtools.brokers import free_port
from tests.fixtures.pipeline import connection_env, make_pipeline_settings
from tests.fixtures.polling import eventually
from tests.fixtures.readers import READER_TOPICS, analytics_view, outcome_record, produce_outcomes


@pytest.mark.slow
def test_faust_worker_serves_outcome_figures(kafka_bootstrap, pg_url, unique, tmp_path):
    settings = make_pipeline_settings(kafka_bootstrap, pg_url, unique, **READER_TOPICS)
    now = datetime.now(UTC)
    due = now - timedelta(seconds=3)
    produce_outcomes(settings, [
        outcome_record(1, "1", due_at=due, occurred_at=now),
        outcome_record(2, "2", due_at=due, occurred_at=now),
        outcome_record(3, "3", due_at=due, occurred_at=now, attempt=2),
        outcome_record(4, "4", "skipped", occurred_at=now),
        outcome_record(5, "x", "dead_letter", failure_class="invalid", occurred_at=now),
        outcome_record(6, "y", "dead_letter", failure_class="invalid", occurred_at=now),
    ])
    port = free_port()
    env = {**os.environ, **connection_env(settings), "LAPSE_PROCESSOR__SESSION_TIMEOUT_MS": "6000",
           "LAPSE_RUNTIME__LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "lapse", "analytics", "--app-id", unique("analytics"),
         "--web-port", str(port), "--data-dir", str(tmp_path / "faust")],
        env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    want = {"release-reservation|applied": 3, "release-reservation|skipped": 1,
            "release-reservation|dead_letter": 2}
    shown = None

    def settled() -> bool:
        nonlocal shown
        shown = analytics_view(port)
        return proc.poll() is not None or bool(shown and shown["totals"] == want)

    try:
        # On a timeout the assertion below fails with the worker's stderr, which says more.
        with contextlib.suppress(TimeoutError):
            eventually(settled, timeout_s=90, interval_s=0.5, what="the analytics view's totals")
    finally:
        proc.terminate()
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
        err = proc.stderr.read().decode(errors="replace")[-1500:]
    assert shown is not None and shown["totals"] == want, err
    minute = now.replace(second=0, microsecond=0).isoformat()
    assert {(w["start"], w["status"]): w["count"] for w in shown["windows"]} == {
        (minute, "applied"): 3, (minute, "skipped"): 1, (minute, "dead_letter"): 2}
    attempts = shown["attempts_per_completion"]["release-reservation"]
    assert attempts["by_attempt"] == {"1": 5, "2": 1}
    latency = shown["latency_due_to_applied_s"]["release-reservation"]
    assert latency["count"] == 3 and latency["p50"] == 5 and latency["p99"] == 5
    assert shown["dead_letter_growth"] == [{"start": minute, "kind": "release-reservation",
                                            "failure_class": "invalid", "count": 2}]

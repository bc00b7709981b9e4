"""Call limits with every role running (`lapse run --workers 3`) on Apache Kafka and PostgreSQL,
against a real HTTP server on loopback that enforces its own limit: 200 requests in a second of
its clock, a 429 with `Retry-After: 1` above it. The kind declares the same 200 calls/s and 10
in flight for its 5,000 due operations.

The server saw at most 1.05 x the declared rate in every second and never more than 10 requests
at once; once the first seconds of adaptation were over, fewer than 1 % of the calls it got were
answered 429; each operation's call was answered 200 exactly once; `lapse status --json` showed
the route and the endpoint while the calls ran."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from datetime import timedelta

import pytest
import yaml
from sqlalchemy import func, select

from lapse.kernel.codec import Codec
from lapse.kernel.models import cleanup_ledger
from tests.fixtures.effects import hook_kind, hooks_table, limited_http_server
from tests.fixtures.pipeline import PAST, Pipeline, connection_env
from tests.fixtures.polling import eventually
from tests.fixtures.running import lapse_run

RATE, CONCURRENCY, OPS, WORKERS = 200, 10, 5_000, 3
ADAPTATION_S = 5  # the first seconds of calls, while the workers find their pace

pytestmark = pytest.mark.slow
hooks = hooks_table("limited_hooks")


def notified(p: Pipeline) -> int:
    with p.engine.connect() as conn:
        return conn.execute(select(func.count()).where(hooks.c.status == "notified")).scalar_one()


def status_json(p: Pipeline) -> dict:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("LAPSE_")}, **connection_env(p.settings)}
    done = subprocess.run([sys.executable, "-m", "lapse", "status", "--json", "--no-lag"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_three_workers_keep_to_the_declared_rate_and_concurrency_of_a_far_side(pipeline, tmp_path):
    with limited_http_server(RATE, delay_s=0.02) as server:
        kinds = tmp_path / "kinds.yaml"
        kinds.write_text(yaml.safe_dump({"kinds": {"notify": {
            **hook_kind(hooks, server.url), "limits": {"rate_per_s": RATE, "concurrency": CONCURRENCY}}}}))
        settings = pipeline.settings.with_(kinds={"file": str(kinds)})
        p = Pipeline(settings, pipeline.engine, Codec.from_settings(settings))
        hooks.create(p.engine)
        with p.engine.begin() as conn:
            conn.execute(hooks.insert(), [{"id": i, "tenant": "t1", "script": "x", "status": "open",
                                           "due_at": PAST - timedelta(minutes=1)} for i in range(1, OPS + 1)])
        with lapse_run(p.settings, tmp_path, workers=WORKERS) as running:
            eventually(lambda: len(server.seen) >= OPS // 4, timeout_s=120, what="calls under way")
            shown = status_json(p)["limits"]
            eventually(lambda: notified(p) == OPS, timeout_s=240, interval_s=1, what="every hook notified")
            running.assert_alive()

    (route,) = shown["routes"]
    assert (route["kind"], route["route"], route["ceiling_per_s"], route["concurrency"]) == (
        "notify", "", RATE, CONCURRENCY)
    assert 0 < route["rate_per_s"] <= RATE and 0 <= route["slots_held"] <= CONCURRENCY
    (endpoint,) = shown["endpoints"]
    assert endpoint["kind"] == "notify" and endpoint["endpoint"] == server.url.removeprefix("http://")
    assert endpoint["calls_per_minute"] > 0 and 0 <= endpoint["in_flight"] <= CONCURRENCY

    per_second = server.per_second_seen()
    assert max(per_second.values()) <= 1.05 * RATE, sorted(per_second.items())
    assert server.max_in_flight <= CONCURRENCY
    ok = Counter(s.op_key for s in server.seen if s.status == 200)
    assert len(ok) == OPS and set(ok.values()) == {1}  # each operation called through once
    start = min(s.at for s in server.seen)
    later = [s for s in server.seen if s.at >= start + ADAPTATION_S]
    refused = sum(s.status == 429 for s in later)
    assert refused < 0.01 * len(later), (refused, len(later))
    assert len(server.seen) == OPS + sum(s.status == 429 for s in server.seen)  # exact: nothing else came
    with p.engine.connect() as conn:
        states = Counter(conn.execute(select(cleanup_ledger.c.state, cleanup_ledger.c.attempt)).all())
    assert states == Counter({("applied", 1): OPS})  # a 429 burns no attempt

"""Three Apache Kafka brokers, replication 3 and min.insync.replicas 2: killing one broker mid-run
loses nothing and applies nothing twice."""

from __future__ import annotations

import threading
from collections import Counter

import pytest
from sqlalchemy import select

from lapse.devtools.brokers import ApacheKafkaCluster
from lapse.kernel.models import ledger_transitions
from lapse.processors.worker import CleanupWorker
from tests.pipeline_env import Pipeline, make_pipeline_settings
from tests.test_pipeline import all_committed, expiry_event, produce, seed
from tests.test_resilience import applied, wait_until

REPLICATED = {
    "offsets.topic.replication.factor": "3",
    "transaction.state.log.replication.factor": "3",
    "transaction.state.log.min.isr": "2",
    "default.replication.factor": "3",
    "min.insync.replicas": "2",
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    with ApacheKafkaCluster(3, base_dir=tmp_path_factory.mktemp("cluster"), overrides=REPLICATED) as c:
        yield c


@pytest.mark.slow
def test_killing_one_of_three_brokers_loses_nothing(cluster, pg_url, unique):
    from lapse.kernel.codec import Codec
    from lapse.kernel.database import make_engine

    settings = make_pipeline_settings(cluster.bootstrap, pg_url, unique, replication_factor=3)
    pipeline = Pipeline(settings, make_engine(pg_url), Codec.from_settings(settings))
    ids = seed(pipeline, 2000)
    produce(pipeline, [expiry_event(i) for i in ids[:1000]])
    worker = CleanupWorker(settings)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        wait_until(lambda: applied(pipeline) == 1000, what="the first 1,000 applied")
        cluster.nodes[1].kill()  # a broker dies: leaders and maybe the group coordinator move
        produce(pipeline, [expiry_event(i) for i in ids[1000:]])
        wait_until(lambda: applied(pipeline) == 2000, timeout_s=120, what="all 2,000 applied")
    finally:
        worker.stop.set()
        thread.join(60)
    with pipeline.engine.connect() as conn:
        per_key = Counter(conn.execute(select(ledger_transitions.c.op_key)).scalars())
    assert len(per_key) == 2000 and set(per_key.values()) == {1}
    assert all_committed(pipeline)
    pipeline.engine.dispose()

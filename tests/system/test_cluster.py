"""Three Apache Kafka brokers, replication 3 and min.insync.replicas 2: killing one broker mid-run
loses nothing and applies nothing twice."""

from __future__ import annotations

import pytest

from lapse.kernel.codec import Codec
from lapse.kernel.database import make_engine
from tests.fixtures.kafka import whole_again
from tests.fixtures.pipeline import (
    Pipeline,
    applied,
    assert_each_applied_once,
    expiry_event,
    make_pipeline_settings,
    produce,
    seed,
)
from tests.fixtures.polling import eventually
from tests.fixtures.workers import running_workers


@pytest.mark.slow
def test_killing_one_of_three_brokers_loses_nothing(three_brokers, pg_url, unique):
    cluster = three_brokers
    settings = make_pipeline_settings(cluster.bootstrap, pg_url, unique, replication_factor=3)
    pipeline = Pipeline(settings, make_engine(pg_url), Codec.from_settings(settings))
    ids = seed(pipeline, 2000)
    produce(pipeline, [expiry_event(i) for i in ids[:1000]])
    try:
        with running_workers(settings) as running:
            eventually(lambda: applied(pipeline) == 1000, timeout_s=90, what="the first 1,000 applied")
            cluster.nodes[1].kill()  # a broker dies: leaders and maybe the group coordinator move
            produce(pipeline, [expiry_event(i) for i in ids[1000:]])
            eventually(lambda: applied(pipeline) == 2000, timeout_s=120, what="all 2,000 applied")
        running.stats()  # stopped, and no worker thread failed
        assert_each_applied_once(pipeline, 2000)
    finally:
        pipeline.engine.dispose()
        whole_again(cluster)  # the session's next cluster test starts from three brokers

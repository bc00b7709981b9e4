"""Three Apache Kafka brokers, replication 3 and min.insync.replicas 2: killing one broker mid-run
loses nothing and applies nothing twice; killing the group coordinator's broker under load
delivers little of the backlog twice."""

from __future__ import annotations

import pytest
from sqlalchemy import func, select

from lapse.kernel.codec import Codec
from lapse.kernel.database import make_engine
from lapse.kernel.kafka_clients import make_admin
from lapse.kernel.models import cleanup_ledger
from tests.fixtures.kafka import whole_again
from tests.fixtures.pipeline import (
    Pipeline,
    all_committed,
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


# The most of a backlog a coordinator's death may deliver twice (issue 24: offsets committed
# without waiting are sent again until the new coordinator accepts them).
REDELIVERED_AT_MOST = 0.05


# In `make scale` for its time (40 to 55 s with three brokers). The two faults that once left a
# partition's offset uncommitted under load are tested on their own: a partition held for a stall,
# taken and given back by rebalances, never resumed (tests/integration/test_commit_stall.py); and
# commits queued before the kill, written by the new coordinator after newer ones, which put the
# group's offset back (tests/unit/test_offset_commits.py; under two busy loops, 9 partitions in 5 of
# 30 runs, each sent again and committed).
@pytest.mark.scale
def test_killing_the_group_coordinator_redelivers_little(three_brokers, pg_url, unique):
    """A backlog of 14,000 events is being drained when the broker coordinating the cleanup group
    is killed: every event is applied once, and the events delivered again (counted by the ledger
    as absorbed duplicates) are at most REDELIVERED_AT_MOST of the backlog."""
    cluster = three_brokers
    # The default session (the tests' 6 s is shorter than the ~9 s the controller takes to fence a
    # dead broker, after which the offsets topic's leader, and so the coordinator, moves).
    settings = make_pipeline_settings(cluster.bootstrap, pg_url, unique, replication_factor=3,
                                      processor={"session_timeout_ms": 10_000})
    pipeline = Pipeline(settings, make_engine(pg_url), Codec.from_settings(settings))
    backlog = 14_000  # as measured in issue 24: about half of it was delivered twice
    ids = seed(pipeline, backlog)
    try:
        with running_workers(settings) as running:
            produce(pipeline, [expiry_event(i) for i in ids])
            eventually(lambda: applied(pipeline) >= backlog // 6, timeout_s=90, what="a sixth applied")
            admin = make_admin(settings)
            group = settings.topology.groups.cleanup
            coordinator = admin.describe_consumer_groups([group])[group].result(30).coordinator.id
            next(node for node in cluster.nodes if node.node_id == coordinator).kill()
            eventually(lambda: applied(pipeline) == backlog, timeout_s=180, what="the whole backlog applied")
            # The commits refused while the coordinator moved are sent again until accepted.
            eventually(lambda: all_committed(pipeline), timeout_s=120, what="every offset committed")
        running.stats()
        with pipeline.engine.connect() as conn:
            redelivered = conn.execute(select(func.sum(cleanup_ledger.c.duplicates))).scalar() or 0
        print(f"coordinator {coordinator} killed: {redelivered} of {backlog} events delivered again")
        assert_each_applied_once(pipeline, backlog)
        assert redelivered <= REDELIVERED_AT_MOST * backlog
    finally:
        pipeline.engine.dispose()
        whole_again(cluster)

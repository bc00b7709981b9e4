"""An audit fails on what it could not read (Apache Kafka): a topic trimmed by a short retention and a
rolled segment, and `--since` before the retained head, exit 1 naming per partition the first
offset it could not read and the time of the first record kept; `--allow-gaps` exits 0 and still
names them; `--since` after the head has nothing missing. The trimmed events were produced an hour
ago (their timestamps say so) and the retention set to 10 minutes: the broker deletes their rolled
segment at its next retention check and keeps the segment the roll record began."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from click.testing import CliRunner

from lapse.kernel.codec import Codec
from lapse.kernel.kafka_clients import make_producer
from lapse.kernel.ledger import expiry_event, expiry_record, millis
from lapse.shell.app import main
from tests.fixtures.kafka import trim_by_retention
from tests.fixtures.pipeline import connection_env, make_pipeline_settings
from tests.fixtures.readers import READER_TOPICS

EVENTS = 30


def _audit(settings, *args: str) -> tuple[int, dict]:
    env = {**connection_env(settings), "LAPSE_RUNTIME__LOG_LEVEL": "WARNING"}
    result = CliRunner().invoke(main, ["audit", *args, "--grace", "3h", "--no-record", "--read-timeout", "15s",
                                       "--json"], env=env)
    assert result.exit_code in (0, 1), result.output
    return result.exit_code, json.loads(result.stdout.splitlines()[-1])


def _producer(settings):
    """Produce one expiry event for `subject` to a partition with a timestamp (default: now)."""
    codec, producer = Codec.from_settings(settings), make_producer(settings)

    def produce(subject: str, partition: int | None = None, at: datetime | None = None) -> None:
        at = at or datetime.now(UTC)
        event = expiry_event("release-reservation", subject, "t1", at, source="sweep")
        extra = {} if partition is None else {"partition": partition}
        producer.produce(settings.topology.expiry, key=event.op_key.encode(), timestamp=millis(at),
                         value=codec.encode("expiry_event", expiry_record(event, at)), **extra)
        assert producer.flush(10) == 0

    return produce


def test_a_trimmed_topic_and_since_before_the_head_are_gaps(kafka_bootstrap, unique, tmp_path):
    settings = make_pipeline_settings(kafka_bootstrap, f"sqlite:///{tmp_path / 'lapse.db'}", unique, **READER_TOPICS)
    produce = _producer(settings)
    hour_ago = datetime.now(UTC) - timedelta(hours=1)
    for i in range(EVENTS):
        produce(str(i), at=hour_ago)
    assert _audit(settings, "--from-beginning")[0] == 0

    rolled = []

    def roll(partition: int) -> None:
        rolled.append(f"roll-{len(rolled)}")
        produce(rolled[-1], partition)

    lows = trim_by_retention(kafka_bootstrap, settings.topology.expiry, [0, 1, 2], roll)

    code, report = _audit(settings, "--from-beginning")
    assert (code, report["verdict"]) == (1, "incomplete")
    gaps = {(g["topic"], g["partition"]): g for g in report["gaps"]}
    assert {key: (g["first_offset"], g["end_offset"]) for key, g in gaps.items()} == {
        (settings.topology.expiry, p): (0, low) for p, low in lows.items()}
    assert all(g["before_time"] is not None and g["reason"].startswith("no longer on the topic") for g in gaps.values())
    assert report["events_seen"] == len(rolled)
    assert report["incomplete"][0] == (f"{sum(lows.values())} offsets in the window could not be read, in 3 "
                                       "partitions (--allow-gaps accepts that)")

    code, allowed = _audit(settings, "--from-beginning", "--allow-gaps")
    assert (code, allowed["verdict"], allowed["gaps"]) == (0, "invariants hold", report["gaps"])

    # --since before the retained head: the records trimmed may have been in the window.
    code, since = _audit(settings, "--since", (hour_ago - timedelta(minutes=1)).isoformat())
    assert code == 1
    assert {(g["partition"], g["first_offset"], g["end_offset"]) for g in since["gaps"]} == {
        (p, 0, low) for p, low in lows.items()}

    # --since after the head: Kafka answers with an offset past the head, which is older.
    after = datetime.now(UTC)
    produce("late")
    code, late = _audit(settings, "--since", after.isoformat())
    assert (code, late["gaps"], late["events_seen"]) == (0, [], 1)

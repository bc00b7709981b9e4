"""The brokers the tests and the demo start: data survives an Apache Kafka restart, the embedded
broker round-trips a record, and missing prerequisites are one-line how-to errors."""

from __future__ import annotations

import subprocess
import sys

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from lapse.devtools.brokers import ApacheKafkaServer, BrokerUnavailable, UnsafeProperty, find_kafka_jars
from lapse.devtools.brokers.secured import SecuredKafkaServer
from tests.fixtures.kafka import admin, broker_tools, create_topics
from tests.fixtures.polling import eventually
from tests.fixtures.processes import run_lapse


def _produce(bootstrap: str, topic: str, key: bytes, value: bytes) -> None:
    delivered = []
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True})
    producer.produce(topic, value, key, on_delivery=lambda err, msg: delivered.append(err))
    assert producer.flush(30) == 0
    assert delivered == [None]


def _read_first(bootstrap: str, topic: str, timeout_s: float = 60.0) -> tuple:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-reader",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])

    def first_record() -> tuple | None:
        msg = consumer.poll(0.2)
        return (msg.key(), msg.value(), msg.offset()) if msg is not None and not msg.error() else None

    try:
        return eventually(first_record, timeout_s=timeout_s, interval_s=0, what=f"a record read back from {topic}")
    finally:
        consumer.close()


@pytest.mark.slow
def test_restart_keeps_a_produced_record(kafka_server, unique):
    topic = unique("topic")
    create_topics(kafka_server.bootstrap, {topic: 1})
    _produce(kafka_server.bootstrap, topic, b"op-1", b"payload-1")
    bootstrap = kafka_server.bootstrap

    kafka_server.restart()

    assert kafka_server.bootstrap == bootstrap
    assert _read_first(bootstrap, topic) == (b"op-1", b"payload-1", 0)


@pytest.mark.embedded
def test_embedded_broker_round_trips_a_record(embedded_bootstrap, unique):
    topic = unique("topic")
    create_topics(embedded_bootstrap, {topic: 1})
    _produce(embedded_bootstrap, topic, b"op-2", b"payload-2")
    assert _read_first(embedded_bootstrap, topic) == (b"op-2", b"payload-2", 0)


def test_missing_jars_is_a_one_line_how_to(tmp_path):
    missing = tmp_path / "no-jars"
    with pytest.raises(BrokerUnavailable) as err:
        find_kafka_jars(missing)
    assert str(missing) in str(err.value) and "make kafka-jars" in str(err.value)
    assert "\n" not in str(err.value)

    server = ApacheKafkaServer(tmp_path / "data", jars_dir=missing, java_home=broker_tools()["java_home"])
    with pytest.raises(BrokerUnavailable, match="make kafka-jars"):
        server.start()
    assert server.proc is None


def test_a_broker_that_cannot_start_says_why(tmp_path):
    server = ApacheKafkaServer(tmp_path / "data", overrides={"num.partitions": "many"}, **broker_tools())
    with pytest.raises(BrokerUnavailable) as err:
        server.start()
    assert "num.partitions" in str(err.value) and "\n" not in str(err.value)
    assert server.proc is None


INJECTED = "\nauthorizer.class.name=org.example.Anything\nsuper.users=User:ANONYMOUS"


@pytest.mark.parametrize("kind", [ApacheKafkaServer, SecuredKafkaServer])
def test_a_data_dir_that_would_add_lines_to_server_properties_is_refused_before_anything(tmp_path, kind):
    server = kind(tmp_path / f"data{INJECTED}", **broker_tools())
    with pytest.raises(UnsafeProperty, match=r"^log\.dirs = .* cannot go into a properties file"):
        server.prepare()
    assert not any(path.name.startswith("data") for path in tmp_path.iterdir())
    assert server.proc is None

    (done,) = run_lapse(["broker", "--kind", "apache", "--data-dir", str(tmp_path / f"cli{INJECTED}")],
                        env={}, cwd=tmp_path, bound_s=60)
    assert (done.code, len(done.stderr)) == (2, 1), done.stderr
    assert done.stderr[0].startswith("lapse: broker: log.dirs = ")
    assert not any(path.name.startswith("cli") for path in tmp_path.iterdir())


@pytest.mark.embedded
def test_broker_command_prints_bootstrap_first_and_stops_on_sigterm():
    proc = subprocess.Popen(
        [sys.executable, "-c", "from lapse.shell.app import main; main()", "broker", "--kind", "embedded"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        bootstrap = proc.stdout.readline().strip()
        assert bootstrap.startswith("127.0.0.1:")
        assert admin(bootstrap).list_topics(timeout=10).brokers
        proc.terminate()
        assert proc.wait(30) == 0
        assert "broker stopped" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

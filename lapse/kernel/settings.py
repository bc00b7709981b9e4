"""The one settings object: read once from `LAPSE_*` variables (and CLI flags), then frozen.

Every Kafka-facing setting turns into a librdkafka key in `kafka_common()`, so the clients are
configured in one place and a real cluster's SASL/SSL settings pass straight through.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "LAPSE_"
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_STATE_DIR = Path(".lapse")


def default_worker_id() -> str:
    """A stable-enough identity for claim ownership and logs: host and pid."""
    return f"{socket.gethostname()}-{os.getpid()}"


class Settings(BaseSettings):
    """Typed configuration for every Lapse process. Construct with `load_settings()`."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, frozen=True, extra="forbid")

    # Where things are.
    bootstrap_servers: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers.")
    database_url: SecretStr = Field(
        SecretStr(f"sqlite:///{DEFAULT_STATE_DIR}/lapse.db"),
        description="SQLAlchemy URL of the ledger database (postgresql+psycopg://… in production).",
    )
    schema_registry_url: str | None = Field(
        None, description="Confluent schema registry URL; unset means Avro single-object encoding."
    )
    schema_registry_auth: SecretStr | None = Field(
        None, description="Schema registry basic auth as user:password."
    )
    schemas_dir: Path = Field(REPO_ROOT / "schemas", description="Folder of the .avsc schemas.")
    topics_file: Path = Field(REPO_ROOT / "topics.yaml", description="Declared topics and groups.")

    # Kafka security, passed through to librdkafka.
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="Kafka security.protocol."
    )
    sasl_mechanism: str | None = Field(None, description="Kafka sasl.mechanism (PLAIN, SCRAM-SHA-512…).")
    sasl_username: str | None = Field(None, description="Kafka sasl.username.")
    sasl_password: SecretStr | None = Field(None, description="Kafka sasl.password.")
    ssl_ca_location: str | None = Field(None, description="Kafka ssl.ca.location.")
    ssl_certificate_location: str | None = Field(None, description="Kafka ssl.certificate.location.")
    ssl_key_location: str | None = Field(None, description="Kafka ssl.key.location.")
    ssl_key_password: SecretStr | None = Field(None, description="Kafka ssl.key.password.")
    kafka_extra: dict[str, str] = Field(
        default_factory=dict, description="Extra librdkafka settings as a JSON object."
    )

    # Topics and groups (topics.yaml declares them; these name them for the clients).
    expiry_topic: str = Field("lapse.expiry", description="Topic of expiry events.")
    outcomes_topic: str = Field("lapse.outcomes", description="Topic of cleanup outcomes.")
    dlq_topic: str = Field("lapse.dlq", description="Topic of dead letters.")
    delay_topic_prefix: str = Field("lapse.delay.", description="Prefix of the delay tier topics.")
    cleanup_group: str = Field("lapse-cleanup", description="Consumer group of the processors.")
    delay_group: str = Field("lapse-delay", description="Consumer group of the delay tiers.")

    # Consumer behaviour.
    batch_size: int = Field(500, ge=1, le=100_000, description="Records per processing batch.")
    poll_timeout_s: float = Field(0.2, gt=0, description="Longest wait for a batch to fill.")
    session_timeout_ms: int = Field(10_000, ge=1000, description="Kafka session.timeout.ms.")
    max_poll_interval_ms: int = Field(300_000, ge=1000, description="Kafka max.poll.interval.ms.")
    lease_seconds: float = Field(30.0, gt=0, description="Claim lease for effects outside the DB.")

    # Producers and relay.
    sweep_page_size: int = Field(500, ge=1, le=100_000, description="Rows per sweep page.")
    sweep_interval_s: float = Field(5.0, gt=0, description="Pause between sweeps in `lapse run`.")
    relay_batch_size: int = Field(500, ge=1, le=100_000, description="Outbox rows per relay batch.")
    relay_interval_s: float = Field(0.2, gt=0, description="Relay pause when the outbox is empty.")

    # Reconciler and daily report.
    reconcile_page_size: int = Field(5000, ge=1, le=100_000, description="Rows per reconciler page.")
    reconcile_grace_s: float = Field(
        300.0, ge=0, description="How long work may look stuck before the reconciler re-emits it (s)."
    )
    reconcile_rate: float = Field(500.0, gt=0, description="Most events the reconciler re-emits per second.")
    reconcile_interval_s: float = Field(60.0, gt=0, description="Pause between reconciler passes.")
    report_notifier: Literal["file", "smtp"] = Field("file", description="Where daily reports go.")
    report_dir: Path = Field(DEFAULT_STATE_DIR / "reports", description="Folder of the file notifier.")
    smtp_host: str | None = Field(None, description="SMTP host of the smtp report notifier.")
    smtp_port: int = Field(25, ge=1, le=65535, description="SMTP port of the smtp report notifier.")
    report_mail_from: str = Field("lapse@localhost", description="Sender of daily report mails.")
    report_mail_to: str | None = Field(None, description="Comma-separated recipients of report mails.")

    # Cleanup kinds and effects.
    extra_kinds: list[str] = Field(
        default_factory=list, description="Extra cleanup kinds as JSON list of module:ATTRIBUTE."
    )

    object_store_dir: Path = Field(
        DEFAULT_STATE_DIR / "objects", description="Folder of the filesystem object store (artifact-delete)."
    )
    object_store_fault_rate: float = Field(
        0.0, ge=0, le=1, description="Share of object deletes that fail on purpose (demo: 429, 503, invalid key)."
    )
    circuit_threshold: float = Field(
        0.5, gt=0, le=1, description="Share of failed outcomes in a partition's window that pauses it."
    )
    circuit_min_events: int = Field(20, ge=1, description="Outcomes seen before the circuit may trip.")
    circuit_window: int = Field(200, ge=1, description="Outcomes per partition the circuit looks at.")
    circuit_cooldown_s: float = Field(60.0, gt=0, description="How long a tripped partition stays paused.")
    effect_concurrency: int = Field(8, ge=1, le=256, description="External effects run at once per worker.")

    # Operations.
    worker_id: str = Field(default_factory=default_worker_id, description="Claim owner name.")
    log_level: str = Field("INFO", description="Log level.")
    log_format: Literal["json", "text"] = Field("json", description="Log line format.")
    metrics_port: int | None = Field(None, description="Serve Prometheus metrics on this port.")
    crash_point: Literal["after_db_commit", "after_produce"] | None = Field(
        None, description="Test hook: exit the worker process abruptly at this point of a batch."
    )

    @field_validator("bootstrap_servers")
    @classmethod
    def _servers_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must name at least one host:port")
        return value.strip()

    def database_url_plain(self) -> str:
        return self.database_url.get_secret_value()

    def kafka_common(self) -> dict[str, Any]:
        """librdkafka settings shared by producers, consumers and admin clients."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
        }
        optional = {
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.sasl_username,
            "sasl.password": self.sasl_password.get_secret_value() if self.sasl_password else None,
            "ssl.ca.location": self.ssl_ca_location,
            "ssl.certificate.location": self.ssl_certificate_location,
            "ssl.key.location": self.ssl_key_location,
            "ssl.key.password": self.ssl_key_password.get_secret_value() if self.ssl_key_password else None,
        }
        conf.update({k: v for k, v in optional.items() if v is not None})
        conf.update(self.kafka_extra)
        return conf

    def delay_topic(self, tier: str) -> str:
        return f"{self.delay_topic_prefix}{tier}"


def env_var(field_name: str) -> str:
    """The environment variable that sets `field_name`, as shown in `--help`."""
    return f"{ENV_PREFIX}{field_name.upper()}"


def load_settings(**overrides: Any) -> Settings:
    """Read the environment once, with explicit overrides (CLI flags) winning; None means unset."""
    return Settings(**{k: v for k, v in overrides.items() if v is not None})

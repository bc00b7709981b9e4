"""The one settings object: read once from CLI flags, `LAPSE_*` variables and the config file, then frozen.

Settings are nested by concern — Kafka connection, schemas, database, topics, kinds, processor,
producer, reconciler, report, runtime, and dev (test hooks and demo fault injection) — and set by
environment variables with a double underscore between section and field
(`LAPSE_KAFKA__BOOTSTRAP_SERVERS`, `LAPSE_PROCESSOR__BATCH_SIZE`) or by the same names as tables and
keys of the TOML config file (`lapse.kernel.config_file`). Precedence: flags > environment > file >
defaults. Every Kafka-facing setting turns into a librdkafka key in `KafkaSettings.client_config()`,
so the clients are configured in one place.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
import re
import socket
from collections.abc import Mapping
from contextvars import ContextVar
from pathlib import Path
from typing import Any, Literal
from urllib.parse import unquote, urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from lapse.kernel import package_files
from lapse.kernel.config_file import CONFIG_ENV_VAR, ConfigFileSource, choose_config_file, file_keys
from lapse.kernel.schema_names import DATABASE_SCHEMA
from lapse.kernel.secret_keys import is_secret_key
from lapse.kernel.topology import Topology, load_topology

ENV_PREFIX = "LAPSE_"
ENV_NESTED_DELIMITER = "__"
TEST_ENV_PREFIX = "LAPSE_TEST_"
# Only for dev-tool defaults (the Kafka server jars fetched into the checkout); the schemas and
# topics.yaml come from the installed package (lapse.kernel.package_files).
REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_STATE_DIR = Path(".lapse")
# Where endpoints listen unless configured: this host only.
LOOPBACK = "127.0.0.1"
# The URL scheme of PostgreSQL through psycopg 3 (the driver a `postgres://` URL is given).
PSYCOPG_SCHEME = "postgresql+psycopg"
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOST_NAME = re.compile(rf"(?=.{{1,253}}$){_LABEL}(?:\.{_LABEL})*")


def default_worker_id() -> str:
    """A stable-enough identity for claim ownership and logs: host and pid, within the ledger's
    claim_owner column (host names may be up to 255 bytes and not all ASCII)."""
    host = "".join(c if "!" <= c <= "~" else "_" for c in socket.gethostname())[:100] or "host"
    return f"{host}-{os.getpid()}"


def bind_address(value: str) -> str:
    """A listening address: an IPv4 or IPv6 literal or a host name (one line of error otherwise)."""
    value = value.strip()
    try:
        return str(ipaddress.ip_address(value.strip("[]")))
    except ValueError:
        pass
    if not _HOST_NAME.fullmatch(value):
        raise ValueError("must be an IP address (127.0.0.1, 0.0.0.0, ::) or a host name")
    return value


# A console token's floor: long enough and varied enough that guessing it through the sign-in's
# rate limit is hopeless (`secrets.token_urlsafe(24)` gives 32 characters, about 190 bits).
MIN_TOKEN_CHARS = 16
MIN_TOKEN_BITS = 80
MIN_TOKEN_DISTINCT = 6
MIN_SECRET_KEY_CHARS = 32
_CHARACTER_CLASSES = ((str.islower, 26), (str.isupper, 26), (str.isdigit, 10))


def weak_token(token: str) -> str | None:
    """Why `token` is too weak to guard the console (None: strong enough): shorter than
    MIN_TOKEN_CHARS, spaces around it, fewer than MIN_TOKEN_DISTINCT different characters, or under
    MIN_TOKEN_BITS by its length and the classes of characters it uses (lower, upper, digits, other)."""
    if len(token) < MIN_TOKEN_CHARS:
        return f"{len(token)} characters: a token needs at least {MIN_TOKEN_CHARS}"
    if token != token.strip():
        return "surrounded by spaces: a token has none"
    if len(set(token)) < MIN_TOKEN_DISTINCT:
        return f"made of {len(set(token))} different characters: a token needs at least {MIN_TOKEN_DISTINCT}"
    pool = sum(size for test, size in _CHARACTER_CLASSES if any(test(c) and c.isascii() for c in token))
    pool += 33 if any(not (c.isascii() and c.isalnum()) for c in token) else 0
    bits = len(token) * math.log2(pool)
    if bits < MIN_TOKEN_BITS:
        return (f"about {bits:.0f} bits strong: a token needs {MIN_TOKEN_BITS} "
                "(generate one: python -c 'import secrets; print(secrets.token_urlsafe(24))')")
    return None


def _path_text(path: Path | None) -> str | None:
    return None if path is None else str(path)


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class KafkaSettings(_Section):
    """How to reach the Kafka cluster; passed through to librdkafka."""

    bootstrap_servers: str = Field("127.0.0.1:9092", description="Kafka bootstrap servers.")
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = Field(
        "PLAINTEXT", description="Kafka security.protocol.")
    sasl_mechanism: str | None = Field(None, description="Kafka sasl.mechanism (PLAIN, SCRAM-SHA-512…).")
    sasl_username: str | None = Field(None, description="Kafka sasl.username.")
    sasl_password: SecretStr | None = Field(None, description="Kafka sasl.password.")
    # Paths (not plain strings), so a relative path in the config file means one next to the file.
    ssl_ca_location: Path | None = Field(None, description="Kafka ssl.ca.location.")
    ssl_certificate_location: Path | None = Field(None, description="Kafka ssl.certificate.location.")
    ssl_key_location: Path | None = Field(None, description="Kafka ssl.key.location.")
    ssl_key_password: SecretStr | None = Field(None, description="Kafka ssl.key.password.")
    extra: dict[str, str | SecretStr] = Field(
        default_factory=dict,
        description="Extra librdkafka settings as a JSON object; the value of a key naming a password, "
                    "secret, token or key (ssl.keystore.password, sasl.oauthbearer.client.secret…) is kept "
                    "as a secret.")

    @field_validator("bootstrap_servers")
    @classmethod
    def _servers_not_blank(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must name at least one host:port")
        return value.strip()

    @field_validator("extra")
    @classmethod
    def _extra_secrets_hidden(cls, value: dict[str, str | SecretStr]) -> dict[str, str | SecretStr]:
        """Hold the value of every secret-named key as a SecretStr, so repr, str and model_dump(_json)
        never show it; `client_config()` passes the real value on."""
        return {key: SecretStr(v) if isinstance(v, str) and is_secret_key(key) else v for key, v in value.items()}

    def client_config(self) -> dict[str, Any]:
        """librdkafka settings shared by producers, consumers and admin clients."""
        conf: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
        }
        optional = {
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.sasl_username,
            "sasl.password": self.sasl_password.get_secret_value() if self.sasl_password else None,
            "ssl.ca.location": _path_text(self.ssl_ca_location),
            "ssl.certificate.location": _path_text(self.ssl_certificate_location),
            "ssl.key.location": _path_text(self.ssl_key_location),
            "ssl.key.password": self.ssl_key_password.get_secret_value() if self.ssl_key_password else None,
        }
        conf.update({k: v for k, v in optional.items() if v is not None})
        conf.update({k: v.get_secret_value() if isinstance(v, SecretStr) else v for k, v in self.extra.items()})
        return conf

    def secret_values(self) -> list[str]:
        """The plain values of every Kafka secret (for masking them wherever they might be printed)."""
        secrets = [self.sasl_password, self.ssl_key_password, *self.extra.values()]
        return [s.get_secret_value() for s in secrets if isinstance(s, SecretStr) and s.get_secret_value()]


class SchemaSettings(_Section):
    """Where the Avro schemas come from: the local files, and optionally a schema registry."""

    dir: Path = Field(package_files.schemas_dir(), description="Folder of the .avsc schemas (default: packaged).")
    registry_url: str | None = Field(
        None, description="Confluent schema registry URL; unset means Avro single-object encoding.")
    registry_auth: SecretStr | None = Field(None, description="Schema registry basic auth as user:password.")
    registry_bearer_token: SecretStr | None = Field(
        None, description="Schema registry bearer token (instead of registry_auth).")
    registry_ca_location: Path | None = Field(
        None, description="CA that signed the https schema registry's certificate (default: the system's).")
    registry_certificate_location: Path | None = Field(
        None, description="Client certificate for the schema registry (https).")
    registry_key_location: Path | None = Field(None, description="Key of the schema registry client certificate.")
    registry_key_password: SecretStr | None = Field(
        None, description="Password of the schema registry client certificate's key.")

    @model_validator(mode="before")
    @classmethod
    def _credentials_out_of_the_url(cls, data: Any) -> Any:
        """`https://user:password@registry` becomes that URL without its credentials plus `registry_auth`
        (unless set too), so the URL — which messages and logs print — never carries a password."""
        if not isinstance(data, dict) or not isinstance(data.get("registry_url"), str):
            return data
        url = data["registry_url"]
        try:
            parts = urlsplit(url)
            user, password, host = parts.username, parts.password, parts.hostname
        except ValueError:
            raise ValueError("registry_url is not a URL") from None
        if user is None and password is None:
            return data
        if host is None:
            raise ValueError("registry_url has credentials but no host")
        netloc = parts.netloc.rpartition("@")[2]
        plain = urlunsplit(parts._replace(netloc=netloc))
        auth = data.get("registry_auth") or f"{unquote(user or '')}:{unquote(password or '')}"
        return {**data, "registry_url": plain, "registry_auth": auth}


class DatabaseSettings(_Section):
    """The ledger database."""

    url: SecretStr = Field(
        SecretStr(f"sqlite:///{DEFAULT_STATE_DIR}/lapse.db"),
        description="SQLAlchemy URL of the ledger database (postgresql+psycopg://… in production).",
    )

    schema_name: str = Field(
        DATABASE_SCHEMA, pattern=r"^[a-z_][a-z0-9_]{0,62}$",
        description="PostgreSQL schema of Lapse's own tables (SQLite uses the lapse_ table prefix instead).")
    connect_timeout_s: float = Field(
        10.0, gt=0, le=600, description="Longest wait for a database connection before it counts as unreachable.")
    statement_timeout_s: float = Field(
        60.0, gt=0, le=86_400, description="Longest a statement may run on PostgreSQL (statement_timeout).")
    sslmode: Literal["disable", "allow", "prefer", "require", "verify-ca", "verify-full"] | None = Field(
        None, description="PostgreSQL sslmode (libpq's default: prefer); verify-ca and verify-full need "
                          "ssl_root_cert.")
    ssl_root_cert: Path | None = Field(
        None, description="PostgreSQL sslrootcert: CA that signed the server's certificate.")
    ssl_cert: Path | None = Field(None, description="PostgreSQL sslcert: client certificate.")
    ssl_key: Path | None = Field(None, description="PostgreSQL sslkey: client certificate's key.")
    ssl_key_password: SecretStr | None = Field(None, description="PostgreSQL sslpassword: the client key's password.")

    @field_validator("url", mode="before")
    @classmethod
    def _psycopg_driver(cls, value: Any) -> Any:
        """`postgres://` and `postgresql://` (libpq's and most platforms' spelling) mean PostgreSQL
        through psycopg 3, the driver Lapse ships with; another PostgreSQL driver is refused with the fix."""
        text = value.get_secret_value() if isinstance(value, SecretStr) else value
        if not isinstance(text, str):
            return value
        scheme, sep, rest = text.partition("://")
        if not sep or not (scheme in ("postgres", "postgresql") or scheme.startswith(("postgres+", "postgresql+"))):
            return value
        if scheme.partition("+")[2] not in ("", "psycopg"):
            raise ValueError(f"Lapse reaches PostgreSQL through psycopg 3: write {PSYCOPG_SCHEME}:// "
                             f"instead of {scheme[:40]}://")
        return f"{PSYCOPG_SCHEME}://{rest}"

    def url_plain(self) -> str:
        return self.url.get_secret_value()


class TopicsSettings(_Section):
    """The declared topology (topics.yaml) and an optional prefix for every topic and group name."""

    file: Path = Field(package_files.topics_file(), description="Declared topics and groups (default: packaged).")
    prefix: str = Field("", description="Prefix of every topic and group name (side-by-side environments).")


class KindsSettings(_Section):
    """The declared cleanup kinds."""

    file: Path | None = Field(None, description="Kinds file (YAML) declaring the cleanup kinds.")


class ProcessorSettings(_Section):
    """The cleanup worker: batches, consumer timing, leases, the dead-letter circuit, effects."""

    batch_size: int = Field(500, ge=1, le=100_000, description="Records per processing batch.")
    poll_timeout_s: float = Field(0.2, gt=0, description="Longest an idle worker waits for a record "
                                  "before it checks its partitions (batches never wait to fill).")
    session_timeout_ms: int = Field(10_000, ge=1000, description="Kafka session.timeout.ms.")
    max_poll_interval_ms: int = Field(300_000, ge=1000, description="Kafka max.poll.interval.ms.")
    lease_seconds: float = Field(30.0, gt=0, description="Claim lease for effects outside the DB.")
    circuit_threshold: float = Field(
        0.5, gt=0, le=1, description="Share of failed outcomes in a partition's window that pauses it.")
    circuit_min_events: int = Field(20, ge=1, description="Outcomes seen before the circuit may trip.")
    circuit_window: int = Field(200, ge=1, description="Outcomes per partition the circuit looks at.")
    circuit_cooldown_s: float = Field(60.0, gt=0, description="How long a tripped partition stays paused.")
    effect_concurrency: int = Field(8, ge=1, le=256, description="External effects run at once per worker.")
    partition_fetch_bytes: int = Field(
        4096, ge=1, le=10_485_760,
        description="Most bytes fetched from one expiry partition at a time (max.partition.fetch.bytes; the broker "
                    "still sends at least one record batch): small, so a batch takes records from every partition "
                    "in turn and work queued in one partition is not held back by a backlog in the others.")


class ProducerSettings(_Section):
    """The sweep and the outbox relay."""

    sweep_page_size: int = Field(500, ge=1, le=100_000, description="Rows per sweep page.")
    sweep_interval_s: float = Field(5.0, gt=0, description="Pause between sweeps in `lapse run`.")
    sweep_in_flight: int = Field(
        20_000, ge=1, le=1_000_000,
        description="Most events of one kind the sweep keeps emitted but not yet done (fewer when the processors "
                    "are slower: about 2 s of their pace), so a backlog waits in the business table, where the "
                    "next page still puts another tenant or a high-priority kind first.")
    # Each batch waits once for the broker's acknowledgements and once for its commit: at 500 rows
    # that wait was most of a batch and the relay fell behind one worker (3,365 rows/s on 2 cores).
    relay_batch_size: int = Field(2000, ge=1, le=100_000, description="Outbox rows per relay batch.")
    relay_interval_s: float = Field(0.2, gt=0, description="Relay pause when the outbox is empty.")


class ReconcilerSettings(_Section):
    """The reconciler's passes."""

    page_size: int = Field(5000, ge=1, le=100_000, description="Rows per reconciler page.")
    grace_s: float = Field(
        300.0, ge=0, description="How long work may look stuck before the reconciler re-emits it (s).")
    rate: float = Field(500.0, gt=0, description="Most events the reconciler re-emits per second.")
    interval_s: float = Field(60.0, gt=0, description="Pause between reconciler passes.")


class RetentionSettings(_Section):
    """How long finished work is kept before `lapse prune` removes it. Unset horizons are derived
    from topics.yaml (lapse.retention.horizons says how); a shorter one is refused."""

    ledger_horizon_s: float | None = Field(
        None, gt=0, description="Keep applied and skipped ledger rows (and their transitions) this long after they "
                                "finished (default: the expiry topic's retention + reconciler.grace_s).")
    dead_letter_horizon_s: float | None = Field(
        None, gt=0, description="Keep dead-letter ledger rows this long after they finished (default: the "
                                "dead-letter topic's retention + reconciler.grace_s, at least the ledger horizon).")
    outbox_horizon_s: float = Field(86_400.0, gt=0, description="Keep sent outbox rows this long (s).")
    history_horizon_s: float | None = Field(
        None, gt=0, description="Keep transitions this long on PostgreSQL, whole time partitions at a time (default: "
                                "the dead-letter horizon; at least the ledger horizon).")
    batch_size: int = Field(5000, ge=1, le=100_000, description="Rows removed per prune statement.")
    interval_s: float = Field(300.0, gt=0, description="Pause between prune passes in `lapse run`.")


class ArchiveSettings(_Section):
    """The archive (`lapse archive`, and a role of `lapse run` when `url` is set): the expiry events,
    outcomes, dead letters and the ledger's transitions as files, one per partition and span."""

    url: str | None = Field(
        None, description="Where the archive writes: s3://bucket/prefix (the `s3` extra) or file:///folder "
                          "(unset: no archive).")
    endpoint_url: str | None = Field(None, description="Endpoint of an S3-compatible store (unset: AWS S3).")
    region: str | None = Field(None, description="Region of the S3 store (unset: boto3's default).")
    file_span_s: int = Field(
        3600, ge=1, le=86_400, description="Each file holds a partition's records of one span of this many "
                                           "seconds (by record time); the archive lags by up to a span.")
    close_after_s: float = Field(
        60.0, ge=0, description="How long after its span a quiet partition's file waits for more records before "
                                "it is closed (s, by the database's clock).")
    max_file_records: int = Field(
        1_000_000, ge=1, le=100_000_000, description="Most records in one file (a busy span is split).")
    transitions_lookback_s: float = Field(
        3600.0, gt=0, description="How far before a transitions window's start its rows' `at` may lie: longer "
                                  "than any transaction that writes transitions stays open (s).")


class ReportSettings(_Section):
    """Where the daily report goes."""

    notifier: Literal["file", "smtp"] = Field("file", description="Where daily reports go.")
    dir: Path = Field(DEFAULT_STATE_DIR / "reports", description="Folder of the file notifier.")
    smtp_host: str | None = Field(None, description="SMTP host of the smtp report notifier.")
    smtp_port: int = Field(25, ge=1, le=65535, description="SMTP port of the smtp report notifier.")
    mail_from: str = Field("lapse@localhost", description="Sender of daily report mails.")
    mail_to: str | None = Field(None, description="Comma-separated recipients of report mails.")
    smtp_starttls: bool | None = Field(
        None, description="Upgrade the SMTP connection with STARTTLS, refusing a server without it "
                          "(default: on unless smtp_host is this machine).")
    smtp_ca_location: Path | None = Field(
        None, description="CA that signed the SMTP server's certificate (default: the system's).")
    smtp_username: str | None = Field(None, description="SMTP login user name (needs smtp_password).")
    smtp_password: SecretStr | None = Field(None, description="SMTP login password.")
    grace_s: float = Field(
        300.0, ge=0, le=86_400, description="How long after midnight UTC a day counts as closed and its final "
                                            "report is built (transactions begun before midnight commit late).")
    interval_s: float = Field(
        300.0, gt=0, description="Pause between report passes of the report role (the open day's partial "
                                 "report is rebuilt each pass).")


class RuntimeSettings(_Section):
    """This process: its identity, logs, and where its endpoints (metrics, analytics web) listen."""

    worker_id: str = Field(default_factory=default_worker_id, min_length=1, max_length=128,
                           pattern=r"^[\x21-\x7e]+$",
                           description="Claim owner name (printable ASCII, at most the ledger's 128 characters).")
    log_level: str = Field("INFO", description="Log level.")
    log_format: Literal["auto", "text", "json"] = Field(
        "auto", description="Log line format: text (time, level, role, message, then key=value fields) or JSON "
                            "(one object per line); auto: text on a terminal, JSON otherwise.")
    log_tracebacks: bool = Field(
        False, description="Log each error's whole traceback, not only its last line (`lapse --debug` and the "
                           "DEBUG level turn it on).")
    log_file: Path | None = Field(None, description="Append the log lines to this file instead of stderr.")
    metrics_port: int | None = Field(None, description="Serve Prometheus metrics on this port.")
    clock_skew_bound_s: float = Field(
        5.0, gt=0, description="How far this machine's wall clock may be from the database's before each "
                               "role warns (every few minutes) and `lapse status` flags it. Decisions about "
                               "time are the database's whatever the skew; logs and displays are not.")
    clock_check_interval_s: float = Field(
        60.0, gt=0, description="How often each long-running role measures its wall clock against the "
                                "database's (the `lapse_clock_skew_seconds` gauge, `lapse status`).")
    metrics_bind: str = Field(
        LOOPBACK, description="Address the metrics endpoint listens on (0.0.0.0: every interface, for a "
                              "scraper in another host or container).")
    web_bind: str = Field(
        LOOPBACK, description="Address the analytics web server (Faust) listens on (0.0.0.0: every interface).")

    @field_validator("metrics_bind", "web_bind")
    @classmethod
    def _bind_address(cls, value: str) -> str:
        return bind_address(value)


class ConsoleSettings(_Section):
    """The operator console (`lapse console`): where it listens and who may use it. Without tokens it
    serves loopback only; a token's name is the actor recorded with each action taken through it."""

    bind: str = Field(LOOPBACK, description="Address the console listens on (anything but loopback needs tokens "
                                            "and TLS).")
    port: int = Field(8088, ge=1, le=65535, description="Port the console listens on.")
    viewer_tokens: dict[str, SecretStr] = Field(
        default_factory=dict, description="Tokens that may look, as a JSON object {name: token}.")
    operator_tokens: dict[str, SecretStr] = Field(
        default_factory=dict, description="Tokens that may also replay dead letters, as a JSON object "
                                          "{name: token}; the name is recorded as the actor.")
    secret_key: SecretStr | None = Field(
        None, description="Key that signs console session cookies and form tokens (default: a random one "
                          "per process); at least 32 characters. Sessions live in the console process, so "
                          "they end when it restarts either way.")
    allowed_hosts: tuple[str, ...] = Field(
        (), description="Host names browsers reach the console by (`console.example.com`), besides its bind "
                        "address, IP literals and `localhost`; a request naming any other `Host` is refused "
                        "(421), so a DNS-rebinding page cannot read or post to the console.")
    tls_cert: Path | None = Field(
        None, description="PEM certificate (chain) the console serves HTTPS with; with `tls_key`. Needed to "
                          "bind beyond loopback; session cookies are then `Secure`.")
    tls_key: Path | None = Field(None, description="PEM private key of `tls_cert`.")

    @field_validator("bind")
    @classmethod
    def _bind_address(cls, value: str) -> str:
        return bind_address(value)

    @field_validator("allowed_hosts", mode="before")
    @classmethod
    def _host_names(cls, value: Any) -> Any:
        names = [value] if isinstance(value, str) else value
        if isinstance(names, (list, tuple)):
            return tuple(bind_address(str(name)).lower() for name in names)
        return value

    @field_validator("viewer_tokens", "operator_tokens")
    @classmethod
    def _strong_tokens(cls, tokens: dict[str, SecretStr]) -> dict[str, SecretStr]:
        for name, token in tokens.items():
            problem = weak_token(token.get_secret_value())
            if problem:
                raise ValueError(f"the token of {name!r} is {problem}")
        return tokens

    @model_validator(mode="after")
    def _consistent(self) -> ConsoleSettings:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("tls_cert and tls_key go together: give both or neither")
        values = [t.get_secret_value() for t in (*self.viewer_tokens.values(), *self.operator_tokens.values())]
        if len(values) != len(set(values)):
            raise ValueError("two console tokens are the same: each name needs its own token")
        if self.secret_key is not None and len(self.secret_key.get_secret_value()) < MIN_SECRET_KEY_CHARS:
            raise ValueError(f"secret_key must be at least {MIN_SECRET_KEY_CHARS} characters")
        return self


class DevSettings(_Section):
    """Dev tools and test hooks; never needed in production."""

    crash_point: Literal["after_db_commit", "after_produce", "archive_after_file", "archive_after_manifest"] | None = (
        Field(None, description="Test hook: exit the worker process abruptly at this point of a batch (or the archive "
                                "at this point of a file's commit)."))
    object_store_fault_rate: float = Field(
        0.0, ge=0, le=1, description="Share of object deletes that fail on purpose (demo: 429, 503, invalid key).")
    kafka_jars: Path = Field(
        REPO_ROOT / "build" / "kafka" / "libs", description="Apache Kafka server jars for brokers started here.")
    java_home: Path | None = Field(None, description="JDK for brokers started here (else java on PATH).")


class Settings(BaseSettings):
    """Typed configuration for every Lapse process. Construct with `load_settings()`."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter=ENV_NESTED_DELIMITER, frozen=True, extra="forbid")

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    schemas: SchemaSettings = Field(default_factory=SchemaSettings)
    database: DatabaseSettings = Field(default_factory=DatabaseSettings)
    topics: TopicsSettings = Field(default_factory=TopicsSettings)
    kinds: KindsSettings = Field(default_factory=KindsSettings)
    processor: ProcessorSettings = Field(default_factory=ProcessorSettings)
    producer: ProducerSettings = Field(default_factory=ProducerSettings)
    reconciler: ReconcilerSettings = Field(default_factory=ReconcilerSettings)
    retention: RetentionSettings = Field(default_factory=RetentionSettings)
    archive: ArchiveSettings = Field(default_factory=ArchiveSettings)
    report: ReportSettings = Field(default_factory=ReportSettings)
    runtime: RuntimeSettings = Field(default_factory=RuntimeSettings)
    console: ConsoleSettings = Field(default_factory=ConsoleSettings)
    dev: DevSettings = Field(default_factory=DevSettings)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        """Flags (init values) over `LAPSE_*` over the config file `load_settings` chose; defaults last.
        No .env or secrets folder: one place for each way of setting a value."""
        config_file = _CONFIG_FILE.get()
        from_file = (ConfigFileSource(settings_cls, config_file),) if config_file is not None else ()
        return init_settings, env_settings, *from_file

    @property
    def topology(self) -> Topology:
        """The topics and groups of topics.yaml with the prefix applied (read once per process)."""
        return load_topology(Path(self.topics.file), self.topics.prefix)

    def with_(self, **sections: dict[str, Any]) -> Settings:
        """A copy with some fields of some sections changed and validated:
        `with_(processor={"batch_size": 10})`. Fields not named keep whether they were set."""
        changed: dict[str, BaseModel] = {}
        for name, values in sections.items():
            section: BaseModel = getattr(self, name)
            changed[name] = type(section).model_validate({**section.model_dump(exclude_unset=True), **values})
        return self.model_copy(update=changed)


def env_var(path: str) -> str:
    """The environment variable that sets the field at dotted `path`, as shown in `--help`."""
    return ENV_PREFIX + path.upper().replace(".", ENV_NESTED_DELIMITER)


def field_info(path: str) -> Any:
    """The pydantic FieldInfo of the field at dotted `path` (`"processor.batch_size"`)."""
    section, _, name = path.partition(".")
    model: type[BaseModel] = Settings.model_fields[section].annotation  # type: ignore[assignment]
    return model.model_fields[name]


def nest(flat: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{"processor.batch_size": 10} → {"processor": {"batch_size": 10}}; None values are dropped."""
    nested: dict[str, dict[str, Any]] = {}
    for path, value in flat.items():
        if value is not None:
            section, _, name = path.partition(".")
            nested.setdefault(section, {})[name] = value
    return nested


class UnknownSetting(ValueError):
    """A `LAPSE_*` environment variable that names no setting (a typo, or a name from before the
    settings were nested): refused, so a deployment never runs on a default it meant to change."""


def known_env_vars() -> set[str]:
    """Every `LAPSE_<SECTION>__<FIELD>` variable that sets a field."""
    return {env_var(f"{section}.{name}")
            for section, info in Settings.model_fields.items()
            for name in info.annotation.model_fields}  # type: ignore[union-attr]


# `LAPSE_*` variables that are not settings: the config file's name, and what the test suite reads
# (tests/fixtures: an existing cluster, the PostgreSQL admin URL). Every `LAPSE_TEST_*` name is the
# test suite's (no settings section is called `test`), so no deployment variable hides behind it.
NON_SETTING_ENV_VARS = frozenset({CONFIG_ENV_VAR, "LAPSE_TEST_BOOTSTRAP_SERVERS", "LAPSE_TEST_DATABASE_URL"})


def check_environment(environ: Mapping[str, str]) -> None:
    """Raise UnknownSetting for the first `LAPSE_*` variable that sets nothing, naming the closest
    known one. Names are compared upper-cased, as pydantic-settings reads them whatever their case.
    NON_SETTING_ENV_VARS and `LAPSE_TEST_*` are not settings and pass."""
    known = known_env_vars()
    for var in sorted(environ):
        name = var.upper()
        if not name.startswith(ENV_PREFIX) or name in known or name in NON_SETTING_ENV_VARS \
                or name.startswith(TEST_ENV_PREFIX):
            continue
        close = difflib.get_close_matches(name, sorted(known | {CONFIG_ENV_VAR}), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        raise UnknownSetting(f"unknown setting {var}{hint}")


# The config file of the Settings being built: set by load_settings around the constructor and read by
# Settings.settings_customise_sources (pydantic-settings builds its sources inside the constructor).
_CONFIG_FILE: ContextVar[Path | None] = ContextVar("lapse_config_file", default=None)


def load_settings(config_file: Path | str | None = None, **sections: dict[str, Any]) -> Settings:
    """Read the environment and the config file once; explicit values (CLI flags, tests) win field by
    field: `load_settings(kafka={"bootstrap_servers": "…"}, processor={"batch_size": 10})`.
    `config_file` is `--config`; without it `LAPSE_CONFIG`, then `./lapse.toml` when present.
    Raises UnknownSetting, ConfigFileError or pydantic's ValidationError."""
    check_environment(os.environ)
    token = _CONFIG_FILE.set(choose_config_file(config_file, os.environ))
    try:
        return Settings(**sections)  # type: ignore[arg-type]
    finally:
        _CONFIG_FILE.reset(token)


def config_file_in_use(config_file: Path | str | None = None) -> Path | None:
    """The config file `load_settings(config_file)` reads (None: none), or ConfigFileError."""
    return choose_config_file(config_file, os.environ)


def setting_origins(config_file: Path | str | None = None, **sections: dict[str, Any]) -> dict[str, str]:
    """Where each effective setting of `load_settings(config_file, **sections)` comes from, by dotted
    path: `flag`, `env LAPSE_X__Y`, `file <path>` or `default`."""
    chosen = config_file_in_use(config_file)
    in_file = file_keys(ConfigFileSource(Settings, chosen).toml_data) if chosen is not None else set()
    in_env = {var.upper() for var in os.environ}
    origins: dict[str, str] = {}
    for section, info in Settings.model_fields.items():
        for name in info.annotation.model_fields:  # type: ignore[union-attr]
            path = f"{section}.{name}"
            if name in sections.get(section, {}):
                origins[path] = "flag"
            elif env_var(path) in in_env:
                origins[path] = f"env {env_var(path)}"
            elif path in in_file:
                origins[path] = f"file {chosen}"
            else:
                origins[path] = "default"
    return origins

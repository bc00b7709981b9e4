"""The connection model: how the settings' security becomes each client's own arguments.

librdkafka takes the Kafka settings as they are (`KafkaSettings.client_config`); every other client
needs them mapped: Faust (aiokafka) takes credentials and an `ssl.SSLContext`, PostgreSQL (libpq)
takes sslmode and certificate paths, the SMTP notifier takes STARTTLS and a login, the schema
registry client takes its own basic auth, bearer token and `ssl.*` keys. The mapping lives
here, once per client, and a client whose security cannot be mapped refuses to start with one line
(`ConnectionRefused`) rather than connect with less than the settings ask for.
"""

from __future__ import annotations

import ipaddress
import ssl
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from pydantic import SecretStr

from lapse.kernel.logs import get_logger
from lapse.kernel.schema_registry import SchemaRegistryClient, auth_config
from lapse.kernel.settings import DatabaseSettings, KafkaSettings, ReportSettings, SchemaSettings

if TYPE_CHECKING:
    from faust.types.auth import CredentialsT

# The SASL mechanisms Faust (aiokafka) authenticates with from a user name and a password.
FAUST_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
# The one librdkafka security key of `kafka.extra` Faust can honour (as the context's host check).
HOSTNAME_CHECK_KEY = "ssl.endpoint.identification.algorithm"
# libpq's sslmodes that check the server's certificate against a root certificate.
VERIFYING_SSLMODES = ("verify-ca", "verify-full")
# The http:// registries this process has warned about (credentials in clear), each once.
_WARNED_PLAIN_REGISTRIES: set[str] = set()

log = get_logger("connections")


class ConnectionRefused(ValueError):
    """The settings ask for a security the client cannot provide: it does not start (one line)."""


def ssl_context(what: str, ca: Path | None = None, certificate: Path | None = None, key: Path | None = None,
                key_password: SecretStr | None = None, *, check_hostname: bool = True) -> ssl.SSLContext:
    """A client-side TLS context that verifies the server against `ca` (the system's roots without
    one) and presents `certificate`/`key` when given. `what` names the client in a refusal."""
    if key is not None and certificate is None:
        raise ConnectionRefused(f"{what}: a client key needs its client certificate")
    try:
        context = ssl.create_default_context(cafile=str(ca) if ca is not None else None)
    except (OSError, ssl.SSLError) as exc:
        raise ConnectionRefused(f"{what}: cannot load the CA certificate {ca}: {_reason(exc)}") from None
    if certificate is not None:
        password = key_password.get_secret_value() if key_password is not None else None
        try:
            context.load_cert_chain(str(certificate), str(key) if key is not None else None, password)
        except (OSError, ssl.SSLError) as exc:
            raise ConnectionRefused(
                f"{what}: cannot load the client certificate {certificate}: {_reason(exc)}") from None
    context.check_hostname = check_hostname
    return context


def _reason(exc: BaseException) -> str:
    """An OSError's or SSLError's reason without its errno tuple (never a password: none is in it)."""
    return str(getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc).splitlines()[0]


# --- Kafka: Faust (aiokafka) ----------------------------------------------------------------------

def kafka_ssl_context(kafka: KafkaSettings, what: str = "kafka") -> ssl.SSLContext | None:
    """The TLS context of the SSL and SASL_SSL protocols (None for the others), from the same
    ssl_* settings librdkafka reads."""
    if kafka.security_protocol not in ("SSL", "SASL_SSL"):
        return None
    check = str(kafka.extra.get(HOSTNAME_CHECK_KEY, "https")).lower()
    return ssl_context(what, kafka.ssl_ca_location, kafka.ssl_certificate_location, kafka.ssl_key_location,
                       kafka.ssl_key_password, check_hostname=check != "none")


def faust_broker(kafka: KafkaSettings) -> list[str]:
    """Faust's broker URLs, one per bootstrap server."""
    return [f"kafka://{server.strip()}" for server in kafka.bootstrap_servers.split(",") if server.strip()]


def faust_credentials(kafka: KafkaSettings) -> CredentialsT | None:
    """Faust's `broker_credentials` for the Kafka settings (None for PLAINTEXT). Refused: a SASL
    mechanism other than PLAIN/SCRAM, SASL without a user name or password, and security keys in
    `kafka.extra` (ssl.*, sasl.*, security.protocol) that Faust has no way to take."""
    from faust.auth import SASLCredentials, SSLCredentials  # function-local: faust is slow to import

    what = "analytics (Faust) on Kafka"
    unmappable = sorted(key for key in kafka.extra
                        if key.startswith(("ssl.", "sasl.", "security.")) and key != HOSTNAME_CHECK_KEY)
    if unmappable:
        raise ConnectionRefused(f"{what} cannot take kafka.extra {', '.join(unmappable)}; "
                                "set them through the kafka.ssl_*/sasl_* settings or run it without them")
    protocol = kafka.security_protocol
    if protocol == "PLAINTEXT":
        return None
    context = kafka_ssl_context(kafka, what)
    if protocol == "SSL":
        return SSLCredentials(context)
    mechanism = (kafka.sasl_mechanism or "").upper()
    if mechanism not in FAUST_MECHANISMS:
        raise ConnectionRefused(f"{what} supports SASL {', '.join(FAUST_MECHANISMS)}, "
                                f"not {kafka.sasl_mechanism or 'an unset kafka.sasl_mechanism'}")
    if not kafka.sasl_username or kafka.sasl_password is None:
        raise ConnectionRefused(f"{what}: SASL {mechanism} needs kafka.sasl_username and kafka.sasl_password")
    return SASLCredentials(username=kafka.sasl_username, password=kafka.sasl_password.get_secret_value(),
                           ssl_context=context, mechanism=mechanism)


def faust_connection(kafka: KafkaSettings) -> dict[str, Any]:
    """The keyword arguments of `faust.App` that say where the brokers are and how to reach them."""
    return {"broker": faust_broker(kafka), "broker_credentials": faust_credentials(kafka)}


# --- PostgreSQL (libpq) ---------------------------------------------------------------------------

def postgres_tls_args(db: DatabaseSettings, url_query: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """libpq's sslmode, sslrootcert, sslcert, sslkey and sslpassword from the database settings.
    What the URL's query sets itself stays the URL's (the settings must not say otherwise). Refused:
    an sslmode that verifies the server (verify-ca, verify-full) without a root certificate, and a
    certificate file that does not exist."""
    query = dict(url_query or {})
    wanted: dict[str, Any] = {
        "sslmode": db.sslmode,
        "sslrootcert": db.ssl_root_cert,
        "sslcert": db.ssl_cert,
        "sslkey": db.ssl_key,
    }
    args: dict[str, Any] = {}
    for key, value in wanted.items():
        if value is None:
            continue
        text = str(value)
        if key in query and str(query[key]) != text:
            raise ConnectionRefused(f"database: the URL's {key} and database.{_field(key)} differ; set it once")
        if key not in query:
            args[key] = text
    if db.ssl_key_password is not None and "sslpassword" not in query:
        args["sslpassword"] = db.ssl_key_password.get_secret_value()
    sslmode = str(query.get("sslmode", db.sslmode or "prefer"))
    rootcert = query.get("sslrootcert", db.ssl_root_cert)
    if sslmode in VERIFYING_SSLMODES and rootcert is None:
        raise ConnectionRefused(f"database: sslmode {sslmode} needs a root certificate "
                                "(database.ssl_root_cert, or sslrootcert in the URL)")
    for key in ("sslrootcert", "sslcert", "sslkey"):
        path = query.get(key, wanted[key])
        if path is not None and str(path) != "system" and not Path(str(path)).is_file():
            raise ConnectionRefused(f"database.{_field(key)}: no such file {path}")
    return args


def _field(libpq_key: str) -> str:
    return {"sslmode": "sslmode", "sslrootcert": "ssl_root_cert", "sslcert": "ssl_cert",
            "sslkey": "ssl_key"}[libpq_key]


# --- SMTP -----------------------------------------------------------------------------------------

def is_loopback(host: str) -> bool:
    """Whether `host` names this machine (localhost or a loopback address)."""
    if host.lower() in ("localhost", "localhost.localdomain"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def smtp_starttls(report: ReportSettings) -> bool:
    """Whether the SMTP notifier must upgrade with STARTTLS: as set, else on for every host but
    this machine's own."""
    if report.smtp_starttls is not None:
        return report.smtp_starttls
    return not is_loopback(report.smtp_host or "")


def smtp_security(report: ReportSettings) -> dict[str, Any]:
    """The SMTP notifier's `starttls` (an SSL context, or None for none), `username` and `password`.
    Refused: a login without STARTTLS to another host (the password would cross the network in
    clear), and a user name without a password or the other way round."""
    host = report.smtp_host or ""
    starttls = smtp_starttls(report)
    if (report.smtp_username is None) != (report.smtp_password is None):
        raise ConnectionRefused("report: SMTP login needs both report.smtp_username and report.smtp_password")
    if report.smtp_username is not None and not starttls and not is_loopback(host):
        raise ConnectionRefused(f"report: SMTP login to {host} without STARTTLS would send the password "
                                "in clear; leave report.smtp_starttls on")
    context = ssl_context("report: SMTP", report.smtp_ca_location) if starttls else None
    return {"starttls": context, "username": report.smtp_username, "password": report.smtp_password}


# --- Schema registry ------------------------------------------------------------------------------

def registry_client(schemas: SchemaSettings, timeout_s: float = 5.0) -> SchemaRegistryClient | None:
    """The schema registry client of the settings (None without `registry_url`: the codec then uses
    the registry-free single-object encoding)."""
    if not schemas.registry_url:
        return None
    return SchemaRegistryClient(schemas.registry_url, timeout_s=timeout_s, config=registry_config(schemas))


def registry_config(schemas: SchemaSettings) -> dict[str, Any]:
    """The schema registry client's authentication and TLS keys from the settings: basic auth as
    `basic.auth.user.info`, a bearer token as a static token, the CA, client certificate, key and key
    password as `ssl.*` (the system's CAs when no CA is set). The CA and client certificate are loaded
    here first, so a wrong path or key password is refused in one line. Refused also: basic auth and
    a bearer token together, and a CA or client certificate for a registry that is not https.
    Credentials for an http:// registry on another host are warned about, once."""
    what = "schema registry"
    if schemas.registry_auth is not None and schemas.registry_bearer_token is not None:
        raise ConnectionRefused(f"{what}: set schemas.registry_auth or schemas.registry_bearer_token, not both")
    ca, certificate, key = (schemas.registry_ca_location, schemas.registry_certificate_location,
                            schemas.registry_key_location)
    https = (schemas.registry_url or "").lower().startswith("https://")
    if any(path is not None for path in (ca, certificate, key)) and not https:
        raise ConnectionRefused(f"{what}: a CA or client certificate needs an https:// schemas.registry_url")
    auth, token = schemas.registry_auth, schemas.registry_bearer_token
    if (auth is not None or token is not None) and not https:
        warn_plain_registry_credentials(schemas.registry_url or "")
    config: dict[str, Any] = auth_config(auth.get_secret_value() if auth else None,
                                         token.get_secret_value() if token else None)
    if https:
        ssl_context(what, ca, certificate, key, schemas.registry_key_password)
        system = ssl.get_default_verify_paths()  # the library's own default would be certifi's bundle
        ca_location = ca or next((p for p in (system.cafile, system.capath) if p and Path(p).exists()), None)
        if ca_location is not None:
            config["ssl.ca.location"] = str(ca_location)
        if certificate is not None:
            config["ssl.certificate.location"] = str(certificate)
        if key is not None:
            config["ssl.key.location"] = str(key)
        if schemas.registry_key_password is not None:
            config["ssl.key.password"] = schemas.registry_key_password.get_secret_value()
    return config


def warn_plain_registry_credentials(url: str) -> None:
    """Warn, once per process and registry, that its credentials cross the network in clear: an
    http:// registry on another host (compose's, inside its own network, is one). Not refused, so
    such a deployment keeps working; the warning names the fix."""
    host = urlsplit(url).hostname or ""
    if is_loopback(host) or url in _WARNED_PLAIN_REGISTRIES:
        return
    _WARNED_PLAIN_REGISTRIES.add(url)
    log.warning("schema registry credentials are sent in clear over http:// to another host; "
                "use an https:// schemas.registry_url", extra={"registry": url})

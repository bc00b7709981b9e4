"""The connection model: the settings' security mapped to Faust (aiokafka), libpq, SMTP and the schema
registry client, and the one-line refusals where it cannot be. TLS contexts are proved by real
handshakes with a local TLS server that requires the client's certificate (generated here)."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

import pytest
from faust.auth import SASLCredentials, SSLCredentials
from faust.transport.drivers.aiokafka import credentials_to_aiokafka_auth

from lapse.devtools.brokers.secured import Certificates, make_certificates
from lapse.kernel.codec import Codec
from lapse.kernel.connections import (
    ConnectionRefused,
    faust_connection,
    faust_credentials,
    postgres_tls_args,
    registry_client,
    smtp_security,
)
from lapse.kernel.settings import DatabaseSettings, KafkaSettings, ReportSettings, SchemaSettings, load_settings
from lapse.readers.analytics import AnalyticsOptions, build_app
from tests.fixtures.registry import serving

KEY_PASSWORD = "key-pass-7f3a"
SASL_PASSWORD = "sasl-pass-91c2"


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"), KEY_PASSWORD)


def _secured(certs: Certificates, **changes) -> KafkaSettings:
    values = {"bootstrap_servers": "localhost:9093,127.0.0.1:9094", "security_protocol": "SASL_SSL",
              "sasl_mechanism": "SCRAM-SHA-512", "sasl_username": "analytics", "sasl_password": SASL_PASSWORD,
              "ssl_ca_location": certs.ca, "ssl_certificate_location": certs.client_cert,
              "ssl_key_location": certs.client_key, "ssl_key_password": KEY_PASSWORD}
    return KafkaSettings.model_validate({**values, **changes})


def _handshake(certs: Certificates, client: ssl.SSLContext, server_name: str = "localhost") -> dict:
    """Complete a TLS handshake from `client` with a local server holding the broker's certificate
    and requiring a client certificate signed by the CA; returns the client certificate it saw."""
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(certs.ca))
    server.load_cert_chain(str(certs.keystore))
    server.verify_mode = ssl.CERT_REQUIRED
    seen: dict = {}
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def serve() -> None:
            conn, _ = listener.accept()
            try:
                with server.wrap_socket(conn, server_side=True) as tls:
                    seen.update(tls.getpeercert() or {})
                    tls.sendall(b"ok")
            except (ssl.SSLError, OSError):
                pass

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw, \
                client.wrap_socket(raw, server_hostname=server_name) as tls:
            assert tls.recv(2) == b"ok"
        thread.join(10)
    return seen


def _subject_cn(cert: dict) -> str:
    return next(value for rdn in cert["subject"] for key, value in rdn if key == "commonName")


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_ssl_maps_to_faust_credentials_with_a_context_that_verifies_and_presents_the_client_certificate(
        certs, mechanism):
    credentials = faust_credentials(_secured(certs, sasl_mechanism=mechanism))
    assert isinstance(credentials, SASLCredentials)
    auth = credentials_to_aiokafka_auth(credentials)
    assert {k: auth[k] for k in ("security_protocol", "sasl_mechanism", "sasl_plain_username",
                                 "sasl_plain_password")} == {
        "security_protocol": "SASL_SSL", "sasl_mechanism": mechanism, "sasl_plain_username": "analytics",
        "sasl_plain_password": SASL_PASSWORD}
    context = auth["ssl_context"]
    assert context.verify_mode == ssl.CERT_REQUIRED and context.check_hostname
    assert _subject_cn(_handshake(certs, context)) == "lapse-client"
    assert SASL_PASSWORD not in repr(credentials)


def test_the_context_refuses_a_server_whose_name_is_not_in_its_certificate(certs):
    context = faust_credentials(_secured(certs)).ssl_context  # type: ignore[union-attr]
    with pytest.raises(ssl.SSLCertVerificationError):
        _handshake(certs, context, server_name="elsewhere.example")


def test_hostname_check_off_only_when_librdkafka_is_told_so_too(certs):
    kafka = _secured(certs, extra={"ssl.endpoint.identification.algorithm": "none"})
    context = faust_credentials(kafka).ssl_context  # type: ignore[union-attr]
    assert not context.check_hostname
    assert _subject_cn(_handshake(certs, context, server_name="elsewhere.example")) == "lapse-client"


def test_sasl_plaintext_and_ssl_and_plaintext(certs):
    plain = faust_credentials(_secured(certs, security_protocol="SASL_PLAINTEXT", sasl_mechanism="PLAIN"))
    assert credentials_to_aiokafka_auth(plain)["security_protocol"] == "SASL_PLAINTEXT"
    assert plain.ssl_context is None  # type: ignore[union-attr]
    tls = faust_credentials(_secured(certs, security_protocol="SSL"))
    assert isinstance(tls, SSLCredentials)
    assert credentials_to_aiokafka_auth(tls)["security_protocol"] == "SSL"
    assert _subject_cn(_handshake(certs, tls.context)) == "lapse-client"
    assert faust_connection(KafkaSettings(bootstrap_servers="a:9092, b:9092")) == {
        "broker": ["kafka://a:9092", "kafka://b:9092"], "broker_credentials": None}


@pytest.mark.parametrize(("changes", "message"), [
    ({"sasl_mechanism": "OAUTHBEARER"}, "analytics (Faust) on Kafka supports SASL PLAIN, SCRAM-SHA-256, "
                                        "SCRAM-SHA-512, not OAUTHBEARER"),
    ({"sasl_mechanism": "GSSAPI"}, "analytics (Faust) on Kafka supports SASL PLAIN, SCRAM-SHA-256, "
                                   "SCRAM-SHA-512, not GSSAPI"),
    ({"sasl_mechanism": None}, "analytics (Faust) on Kafka supports SASL PLAIN, SCRAM-SHA-256, SCRAM-SHA-512, "
                               "not an unset kafka.sasl_mechanism"),
    ({"sasl_password": None}, "analytics (Faust) on Kafka: SASL SCRAM-SHA-512 needs kafka.sasl_username and "
                              "kafka.sasl_password"),
    ({"extra": {"sasl.oauthbearer.client.secret": "oauth-secret-55", "ssl.keystore.location": "/k.p12"}},
     "analytics (Faust) on Kafka cannot take kafka.extra sasl.oauthbearer.client.secret, ssl.keystore.location; "
     "set them through the kafka.ssl_*/sasl_* settings or run it without them"),
    ({"ssl_key_password": "wrong"}, "analytics (Faust) on Kafka: cannot load the client certificate "),
    ({"ssl_certificate_location": None}, "analytics (Faust) on Kafka: a client key needs its client certificate"),
])
def test_security_faust_cannot_take_is_refused_in_one_line(certs, changes, message):
    with pytest.raises(ConnectionRefused) as refused:
        faust_credentials(_secured(certs, **changes))
    text = str(refused.value)
    assert text.startswith(message) and "\n" not in text
    for secret in (SASL_PASSWORD, KEY_PASSWORD, "oauth-secret-55", "wrong"):
        assert secret not in text


def test_a_missing_ca_file_is_refused_in_one_line(certs, tmp_path):
    with pytest.raises(ConnectionRefused, match=r"^analytics \(Faust\) on Kafka: cannot load the CA certificate "):
        faust_credentials(_secured(certs, ssl_ca_location=tmp_path / "absent.pem"))


def test_the_analytics_app_is_built_with_the_credentials_and_refuses_what_it_cannot_map(certs):
    settings = load_settings(kafka=_secured(certs).model_dump(mode="python")
                             | {"sasl_password": SASL_PASSWORD, "ssl_key_password": KEY_PASSWORD})
    app = build_app(settings, AnalyticsOptions(), partitions=1)
    assert [str(url) for url in app.conf.broker] == ["kafka://localhost:9093", "kafka://127.0.0.1:9094"]
    credentials = app.conf.broker_credentials
    assert isinstance(credentials, SASLCredentials) and credentials.mechanism.value == "SCRAM-SHA-512"
    oauth = settings.with_(kafka={"sasl_mechanism": "OAUTHBEARER"})
    with pytest.raises(ConnectionRefused):
        build_app(oauth, AnalyticsOptions(), partitions=1)


# --- PostgreSQL ---------------------------------------------------------------------------------

def test_postgres_tls_settings_become_libpq_arguments(certs):
    db = DatabaseSettings(sslmode="verify-full", ssl_root_cert=certs.ca, ssl_cert=certs.client_cert,
                          ssl_key=certs.client_key, ssl_key_password=KEY_PASSWORD)
    assert postgres_tls_args(db) == {"sslmode": "verify-full", "sslrootcert": str(certs.ca),
                                     "sslcert": str(certs.client_cert), "sslkey": str(certs.client_key),
                                     "sslpassword": KEY_PASSWORD}
    assert postgres_tls_args(DatabaseSettings()) == {}
    # What the URL says itself stays the URL's.
    assert postgres_tls_args(DatabaseSettings(sslmode="require"), {"sslmode": "require"}) == {}


@pytest.mark.parametrize(("db", "query", "message"), [
    ({"sslmode": "verify-full"}, {}, "database: sslmode verify-full needs a root certificate "
                                     "(database.ssl_root_cert, or sslrootcert in the URL)"),
    ({}, {"sslmode": "verify-ca"}, "database: sslmode verify-ca needs a root certificate "
                                   "(database.ssl_root_cert, or sslrootcert in the URL)"),
    ({"sslmode": "require"}, {"sslmode": "disable"}, "database: the URL's sslmode and database.sslmode differ; "
                                                     "set it once"),
    ({"sslmode": "verify-full", "ssl_root_cert": "/nonexistent/root.crt"}, {},
     "database.ssl_root_cert: no such file /nonexistent/root.crt"),
])
def test_postgres_tls_that_cannot_be_honoured_is_refused_in_one_line(db, query, message):
    with pytest.raises(ConnectionRefused) as refused:
        postgres_tls_args(DatabaseSettings.model_validate(db), query)
    assert str(refused.value) == message


# --- SMTP ---------------------------------------------------------------------------------------

def test_smtp_starttls_is_on_by_default_except_on_this_machine(certs):
    remote = smtp_security(ReportSettings(notifier="smtp", smtp_host="mail.example.com", smtp_username="lapse",
                                          smtp_password="mail-pass", smtp_ca_location=certs.ca))
    assert isinstance(remote["starttls"], ssl.SSLContext) and remote["starttls"].check_hostname
    assert remote["username"] == "lapse" and remote["password"].get_secret_value() == "mail-pass"
    for host in ("127.0.0.1", "localhost", "::1"):
        assert smtp_security(ReportSettings(notifier="smtp", smtp_host=host))["starttls"] is None
    forced = smtp_security(ReportSettings(notifier="smtp", smtp_host="127.0.0.1", smtp_starttls=True))
    assert isinstance(forced["starttls"], ssl.SSLContext)


@pytest.mark.parametrize(("report", "message"), [
    ({"smtp_host": "mail.example.com", "smtp_starttls": False, "smtp_username": "u", "smtp_password": "mail-pass"},
     "report: SMTP login to mail.example.com without STARTTLS would send the password in clear; "
     "leave report.smtp_starttls on"),
    ({"smtp_host": "mail.example.com", "smtp_username": "u"},
     "report: SMTP login needs both report.smtp_username and report.smtp_password"),
])
def test_smtp_security_that_would_leak_is_refused_in_one_line(report, message):
    with pytest.raises(ConnectionRefused) as refused:
        smtp_security(ReportSettings.model_validate({"notifier": "smtp", **report}))
    assert str(refused.value) == message


def test_secrets_stay_out_of_the_settings_repr(certs):
    settings = load_settings(database={"url": "postgresql+psycopg://lapse@db/lapse", "ssl_key_password": "pg-kp"},
                             report={"smtp_password": "mail-pass-77"})
    assert "pg-kp" not in repr(settings) and "mail-pass-77" not in repr(settings)
    assert "mail-pass-77" not in settings.model_dump_json()


def test_a_relative_certificate_path_stays_a_path():
    assert DatabaseSettings(ssl_root_cert="certs/root.crt").ssl_root_cert == Path("certs/root.crt")


# --- Schema registry ----------------------------------------------------------------------------

def test_no_registry_url_keeps_the_registry_free_encoding():
    assert registry_client(SchemaSettings()) is None
    assert Codec.from_settings(load_settings()).registry is None


def test_an_https_registry_is_reached_with_the_ca_a_client_certificate_and_a_bearer_token(certs):
    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH, cafile=str(certs.ca))
    server.load_cert_chain(str(certs.keystore))
    server.verify_mode = ssl.CERT_REQUIRED  # no client certificate, no handshake
    with serving() as registry:
        registry.socket = server.wrap_socket(registry.socket, server_side=True)
        url = f"https://localhost:{registry.server_address[1]}"
        settings = load_settings(schemas={
            "registry_url": url, "registry_bearer_token": "bearer-tok-1b", "registry_ca_location": certs.ca,
            "registry_certificate_location": certs.client_cert, "registry_key_location": certs.client_key,
            "registry_key_password": KEY_PASSWORD})
        codec = Codec.from_settings(settings)
        assert codec.registry is not None
        schema_id = codec.registry.register("lapse-test-value", '"string"')
        assert codec.registry.schema_by_id(schema_id) == '"string"'
        assert registry.authorizations == ["Bearer bearer-tok-1b"]  # the second call hit the cache
        assert "bearer-tok-1b" not in repr(settings)


@pytest.mark.parametrize(("schemas", "message"), [
    ({"registry_url": "https://r:8081", "registry_auth": "u:p", "registry_bearer_token": "t"},
     "schema registry: set schemas.registry_auth or schemas.registry_bearer_token, not both"),
    ({"registry_url": "http://r:8081", "registry_ca_location": "/etc/ssl/certs/ca-certificates.crt"},
     "schema registry: a CA or client certificate needs an https:// schemas.registry_url"),
])
def test_registry_security_that_cannot_be_honoured_is_refused_in_one_line(schemas, message):
    with pytest.raises(ConnectionRefused) as refused:
        registry_client(SchemaSettings.model_validate(schemas))
    assert str(refused.value) == message

"""The schema registry client: the settings mapped to the registry library's keys (basic auth, bearer
token, CA, client certificate), the negative cache in front of it (a burst of records with one unknown
id costs one request), and its failures as one-line errors that hold no credential. The registry is
the real-HTTP test double of tests/fixtures/registry.py, which counts the requests it gets."""

from __future__ import annotations

import base64
import json
import socket
import ssl
import threading
from pathlib import Path

import pytest

from lapse.devtools.brokers.secured import Certificates, make_certificates
from lapse.kernel.codec import Codec, DecodeError, SchemaStore
from lapse.kernel.connections import ConnectionRefused, registry_client, registry_config
from lapse.kernel.package_files import schemas_dir
from lapse.kernel.schema_registry import SchemaRegistryClient, SchemaRegistryError
from lapse.kernel.settings import SchemaSettings
from tests.fixtures.registry import serving

KEY_PASSWORD = "registry-key-pass-5c0e"
TOKEN = "bearer-tok-9d27"
PASSWORD = "basic-pass-44af"


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"), KEY_PASSWORD)


def _schemas(**values) -> SchemaSettings:
    return SchemaSettings.model_validate(values)


def _confluent(schema_id: int) -> bytes:
    return b"\x00" + schema_id.to_bytes(4, "big") + b"\x02"


# --- The mapping ---------------------------------------------------------------------------------

def test_basic_auth_maps_to_the_user_info_key_and_no_tls_key_for_http():
    assert registry_config(_schemas(registry_url="http://r:8081", registry_auth=f"reader:{PASSWORD}")) == {
        "basic.auth.user.info": f"reader:{PASSWORD}"}


def test_credentials_for_an_http_registry_on_another_host_are_warned_about_once(caplog):
    caplog.set_level("WARNING", logger="lapse.connections")
    cases = [("http://plain-registry-a.test:8081", {"registry_auth": f"reader:{PASSWORD}"}),
             ("http://plain-registry-a.test:8081", {"registry_auth": f"reader:{PASSWORD}"}),  # the same: no second
             ("http://plain-registry-b.test:8081", {"registry_bearer_token": TOKEN}),
             ("http://127.0.0.1:8081", {"registry_auth": f"reader:{PASSWORD}"}),  # this machine: no warning
             ("http://localhost:8081", {"registry_auth": f"reader:{PASSWORD}"}),
             ("http://plain-registry-c.test:8081", {})]  # no credentials: no warning
    for url, credentials in cases:
        registry_config(_schemas(registry_url=url, **credentials))
    warned = [(r.levelname, r.getMessage(), r.registry) for r in caplog.records]
    assert warned == [("WARNING", "schema registry credentials are sent in clear over http:// to another host; "
                                  "use an https:// schemas.registry_url", url)
                      for url in ("http://plain-registry-a.test:8081", "http://plain-registry-b.test:8081")]
    assert not any(PASSWORD in r.getMessage() or TOKEN in r.getMessage() for r in caplog.records)


def test_a_bearer_token_maps_to_a_static_token(certs):
    config = registry_config(_schemas(registry_url="https://r:8081", registry_bearer_token=TOKEN,
                                      registry_ca_location=certs.ca))
    assert config == {"bearer.auth.credentials.source": "STATIC_TOKEN", "bearer.auth.token": TOKEN,
                      "bearer.auth.logical.cluster": "", "ssl.ca.location": str(certs.ca)}


def test_the_ca_client_certificate_key_and_key_password_map_to_the_ssl_keys(certs):
    config = registry_config(_schemas(
        registry_url="https://r:8081", registry_ca_location=certs.ca, registry_certificate_location=certs.client_cert,
        registry_key_location=certs.client_key, registry_key_password=KEY_PASSWORD))
    assert config == {"ssl.ca.location": str(certs.ca), "ssl.certificate.location": str(certs.client_cert),
                      "ssl.key.location": str(certs.client_key), "ssl.key.password": KEY_PASSWORD}


def test_without_a_ca_an_https_registry_is_verified_against_the_systems_cas():
    system = ssl.get_default_verify_paths()
    expected = next((p for p in (system.cafile, system.capath) if p and Path(p).exists()), None)
    config = registry_config(_schemas(registry_url="https://r:8081"))
    assert config == ({"ssl.ca.location": expected} if expected else {})


@pytest.mark.parametrize(("changes", "message"), [
    ({"registry_key_password": "wrong-password-0b1d"}, "schema registry: cannot load the client certificate"),
    ({"registry_ca_location": "/nonexistent/ca.pem"}, "schema registry: cannot load the CA certificate"),
    ({"registry_certificate_location": None}, "schema registry: a client key needs its client certificate"),
])
def test_a_certificate_that_cannot_be_loaded_is_refused_in_one_line(certs, changes, message):
    values = {"registry_url": "https://r:8081", "registry_ca_location": certs.ca,
              "registry_certificate_location": certs.client_cert, "registry_key_location": certs.client_key,
              "registry_key_password": KEY_PASSWORD, **changes}
    with pytest.raises(ConnectionRefused) as refused:
        registry_client(_schemas(**values))
    assert str(refused.value).startswith(message) and "\n" not in str(refused.value)
    assert KEY_PASSWORD not in str(refused.value) and "wrong-password-0b1d" not in str(refused.value)


def test_a_configuration_the_library_refuses_is_one_line():
    with pytest.raises(ValueError) as refused:
        SchemaRegistryClient("http://r:8081", config={"bogus.key": 1})
    assert str(refused.value) == "schema registry http://r:8081: Unrecognized properties: bogus.key"


def test_basic_auth_and_a_bearer_token_reach_the_registry(certs):
    with serving() as registry:
        basic = registry_client(_schemas(registry_url=registry.url, registry_auth=f"reader:{PASSWORD}"))
        bearer = registry_client(_schemas(registry_url=registry.url, registry_bearer_token=TOKEN))
        assert basic is not None and bearer is not None
        schema_id = basic.register("lapse-test-value", '"string"')
        assert bearer.schema_by_id(schema_id) == '"string"'
        assert registry.authorizations == [
            "Basic " + base64.b64encode(f"reader:{PASSWORD}".encode()).decode(), f"Bearer {TOKEN}"]


# --- The negative cache --------------------------------------------------------------------------

def test_a_burst_of_records_with_one_unknown_id_costs_one_request():
    with serving() as registry:
        codec = Codec(SchemaStore(schemas_dir()), SchemaRegistryClient(registry.url))
        errors: list[DecodeError] = []

        def decode_many() -> None:
            for _ in range(100):
                try:
                    codec.decode(_confluent(777))
                except DecodeError as exc:
                    errors.append(exc)

        decode_many()  # the first one asks; then the cache answers, from every thread
        threads = [threading.Thread(target=decode_many) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(errors) == 500
        assert {(e.reason, str(e), e.transient) for e in errors} == {
            ("unknown_schema_id", "schema id 777 is not in the registry", False)}
        assert registry.gets == 1
        with pytest.raises(DecodeError):
            codec.decode(_confluent(778))  # another unknown id is asked for once too
        assert registry.gets == 2


def test_an_id_registered_after_it_was_unknown_is_found_once_its_time_is_up():
    now = [0.0]
    with serving() as registry:
        client = SchemaRegistryClient(registry.url, not_found_ttl_s=30, clock=lambda: now[0])
        for _ in range(3):
            with pytest.raises(SchemaRegistryError) as unknown:
                client.schema_by_id(1)
            assert unknown.value.not_found and unknown.value.error_code == 40403
        registry.add("lapse-test-value", '"long"')
        now[0] = 31.0
        assert client.schema_by_id(1) == '"long"'
        assert client.schema_by_id(1) == '"long"'
        assert registry.gets == 2 and client.requests == 2


# --- Errors ----------------------------------------------------------------------------------------

@pytest.mark.parametrize(("status", "body", "transient", "error_code"), [
    (401, {"error_code": 40101, "message": f"Unauthorized: bad credentials reader:{PASSWORD}"}, False, 40101),
    (503, {"error_code": 50003, "message": "Error while forwarding the request\nto the leader"}, True, 50003),
    (500, None, True, None),
])
def test_registry_failures_are_one_line_with_no_credential(status, body, transient, error_code):
    with serving() as registry:
        registry.failure = (status, json.dumps(body).encode() if body else b"<html>\n oops \n</html>")
        client = SchemaRegistryClient(registry.url.replace("http://", f"http://reader:{PASSWORD}@"))
        for call in (lambda: client.schema_by_id(5), lambda: client.register("s", '"string"')):
            with pytest.raises(SchemaRegistryError) as failed:
                call()
            message = str(failed.value)
            assert message.startswith("schema registry ") and f"HTTP {status}" in message
            assert "\n" not in message and PASSWORD not in message
            assert (failed.value.status, failed.value.transient, failed.value.error_code) == (
                status, transient, error_code)
        assert registry.gets == 1  # only a 404 is remembered; the library does not retry


def test_an_unreachable_registry_is_one_transient_line_without_the_urls_credentials():
    with socket.socket() as sock:  # a port nothing listens on
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = SchemaRegistryClient(f"http://reader:{PASSWORD}@127.0.0.1:{port}", timeout_s=2)
    with pytest.raises(SchemaRegistryError) as failed:
        client.schema_by_id(1)
    message = str(failed.value)
    assert message.startswith(f"schema registry http://127.0.0.1:{port} unreachable: ")
    assert "\n" not in message and PASSWORD not in message and failed.value.transient
    assert client.requests == 1


def test_basic_auth_and_a_bearer_token_together_are_refused():
    with pytest.raises(ValueError, match="give basic auth or a bearer token, not both"):
        SchemaRegistryClient("http://r:8081", f"reader:{PASSWORD}", bearer_token=TOKEN)

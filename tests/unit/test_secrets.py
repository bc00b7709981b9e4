"""Secrets stay secret: `kafka.extra` secrets are never printed yet reach librdkafka, registry
credentials never stay in the printed URL, unknown `LAPSE_*` variables are refused naming the
closest, engines hide bound parameters, and endpoints listen on 127.0.0.1 unless configured."""

from __future__ import annotations

import json
import os
import pickle
import socket
import string
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text
from sqlalchemy.exc import StatementError

from lapse.kernel.database import make_engine
from lapse.kernel.secret_keys import is_secret_key
from lapse.kernel.settings import (
    NON_SETTING_ENV_VARS,
    Settings,
    UnknownSetting,
    check_environment,
    env_var,
    known_env_vars,
    load_settings,
)
from lapse.shell import metrics
from lapse.shell.app import main

SECRET_KEYS = ("sasl.oauthbearer.client.secret", "ssl.keystore.password", "ssl.truststore.password",
               "ssl.key.pem", "sasl.oauthbearer.config", "ssl.key", "sasl.kerberos.keytab.token", "apiToken")
PLAIN_KEYS = ("client.rack", "ssl.key.location", "ssl.keystore.location", "sasl.oauthbearer.scope",
              "socket.keepalive.enable")
# Long enough, of its own alphabet and behind a mark no output holds, so that it cannot occur in
# output but as itself (without the mark, the search found `schemas.regi`, a part of a setting's name).
_SECRET = st.text(string.ascii_letters + string.digits + "!#%&()*+,-./;<>?@[]^_{|}~", min_size=6,
                  max_size=34).map(lambda text_: "s3cr3t" + text_)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No LAPSE_* variable of the caller's shell, and an empty working folder (no ./lapse.toml)."""
    for var in list(os.environ):
        if var.upper().startswith("LAPSE_") and not var.startswith("LAPSE_TEST_"):
            monkeypatch.delenv(var)
    monkeypatch.chdir(tmp_path)


def test_key_names_that_hold_secrets_are_recognised() -> None:
    assert all(is_secret_key(key) for key in SECRET_KEYS)
    assert not any(is_secret_key(key) for key in PLAIN_KEYS)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(secret=_SECRET, key=st.sampled_from(SECRET_KEYS))
def test_kafka_extra_secret_from_the_environment_is_never_shown_but_reaches_the_client(
        monkeypatch: pytest.MonkeyPatch, secret: str, key: str) -> None:
    monkeypatch.setenv(env_var("kafka.extra"), json.dumps({key: secret, "client.rack": "r1"}))
    loaded = load_settings()

    assert loaded.kafka.client_config()[key] == secret
    assert loaded.kafka.client_config()["client.rack"] == "r1"
    assert secret in loaded.kafka.secret_values()
    shown = [repr(loaded), str(loaded), repr(loaded.kafka), str(loaded.model_dump()), loaded.model_dump_json(),
             loaded.kafka.model_dump_json()]
    assert [text_ for text_ in shown if secret in text_] == []
    # A copy with other changes, and the pickled form a role process receives, keep the real value.
    assert loaded.with_(kafka={"bootstrap_servers": "k:9092"}).kafka.client_config()[key] == secret
    assert pickle.loads(pickle.dumps(loaded)).kafka.client_config()[key] == secret

    for args in (["config", "show"], ["config", "show", "--json"]):
        result = CliRunner().invoke(main, args)
        assert result.exit_code == 0, result.output
        assert secret not in result.output
    shown_json = json.loads(CliRunner().invoke(main, ["config", "show", "--json"]).output)
    assert shown_json["settings"]["kafka"]["extra"]["value"] == {key: "********", "client.rack": "r1"}


def test_registry_credentials_in_the_url_move_to_registry_auth() -> None:
    loaded = Settings(schemas={"registry_url": "https://reader:p%40ss-w0rd@registry.example:8081/sr"})
    assert loaded.schemas.registry_url == "https://registry.example:8081/sr"
    assert loaded.schemas.registry_auth is not None
    assert loaded.schemas.registry_auth.get_secret_value() == "reader:p@ss-w0rd"
    assert "p%40ss-w0rd" not in repr(loaded) and "p@ss-w0rd" not in loaded.model_dump_json()
    # An explicit registry_auth wins over the URL's.
    both = Settings(schemas={"registry_url": "https://a:b@r:1", "registry_auth": "c:d"})
    assert (both.schemas.registry_url, both.schemas.registry_auth.get_secret_value()) == ("https://r:1", "c:d")


@pytest.mark.parametrize(("var", "closest"), [
    ("LAPSE_KAFKA__SECURITY_PROTOCAL", "LAPSE_KAFKA__SECURITY_PROTOCOL"),
    ("LAPSE_SECURITY_PROTOCAL", "LAPSE_KAFKA__SECURITY_PROTOCOL"),
    ("lapse_runtime__metrics_bnd", "LAPSE_RUNTIME__METRICS_BIND"),
])
def test_a_misspelt_variable_is_refused_in_one_line_naming_the_closest(
        monkeypatch: pytest.MonkeyPatch, var: str, closest: str) -> None:
    with pytest.raises(UnknownSetting, match=f"unknown setting {var}; did you mean {closest}"):
        check_environment({var: "x"})
    monkeypatch.setenv(var, "SASL_SSL")
    result = CliRunner().invoke(main, ["config", "show"])
    assert result.exit_code == 3  # ExitCode.CONFIG
    assert result.output.strip().splitlines() == [f"lapse: unknown setting {var}; did you mean {closest}?"]


@given(name=st.text(string.ascii_uppercase + string.digits + "_", min_size=1, max_size=40))
def test_every_lapse_variable_is_a_setting_or_refused(name: str) -> None:
    var = "LAPSE_" + name
    allowed = var in known_env_vars() or var in NON_SETTING_ENV_VARS or var.startswith("LAPSE_TEST_")
    try:
        check_environment({var: "x", "PATH": "/bin"})
    except UnknownSetting as exc:
        assert not allowed and str(exc).startswith(f"unknown setting {var}") and "\n" not in str(exc)
    else:
        assert allowed


def test_variables_lapse_and_its_tests_set_are_not_refused() -> None:
    check_environment({var: "x" for var in
                       {*NON_SETTING_ENV_VARS, "LAPSE_TEST_BOOTSTRAP_SERVERS", "LAPSE_TEST_DATABASE_URL"}})
    check_environment({var: "x" for var in known_env_vars()})


def test_a_statement_error_from_a_real_engine_does_not_show_the_bound_value(tmp_path: Path) -> None:
    bound = "op-key-of-a-customer-4711"
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}")
    try:
        with engine.connect() as conn, pytest.raises(StatementError) as caught:
            conn.execute(text("SELECT * FROM no_such_table WHERE op_key = :k"), {"k": bound})
    finally:
        engine.dispose()
    assert bound not in str(caught.value) and bound not in repr(caught.value)
    assert "hidden" in str(caught.value)


def _listening(port: int) -> list[str]:
    """The local addresses of the TCP sockets listening on `port`, as the kernel reports them."""
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, _, port_hex = local.partition(":")
            if state == "0A" and int(port_hex, 16) == port and len(address) == width:
                found.append(socket.inet_ntop(socket.AF_INET if width == 8 else socket.AF_INET6,
                                              bytes.fromhex(address)[::-1] if width == 8 else
                                              b"".join(bytes.fromhex(address[i:i + 8])[::-1] for i in range(0, 32, 8))))
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads listening sockets from Linux's /proc/net/tcp")
def test_metrics_endpoint_listens_on_loopback_by_default() -> None:
    port = _free_port()
    loaded = Settings(runtime={"metrics_port": port})
    assert loaded.runtime.metrics_bind == "127.0.0.1"
    assert metrics.serve(loaded) == port
    assert _listening(port) == ["127.0.0.1"]
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
        assert conn.recv(12).startswith(b"HTTP/1.0 200")


@pytest.mark.skipif(not Path("/proc/net/tcp").exists(), reason="reads listening sockets from Linux's /proc/net/tcp")
def test_metrics_endpoint_listens_where_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    port = _free_port()
    monkeypatch.setenv(env_var("runtime.metrics_bind"), "0.0.0.0")
    monkeypatch.setenv(env_var("runtime.metrics_port"), str(port))
    metrics.serve(load_settings())
    assert _listening(port) == ["0.0.0.0"]


@pytest.mark.parametrize("value", ["", "0.0.0.0:80", "a b", "http://x"])
def test_a_bind_address_that_is_no_address_is_refused(value: str) -> None:
    with pytest.raises(ValueError, match="metrics_bind"):
        Settings(runtime={"metrics_bind": value})


def test_faust_web_server_binds_to_loopback_unless_configured() -> None:
    from lapse.readers.analytics import AnalyticsOptions, build_app

    assert build_app(Settings(), AnalyticsOptions(), 1).conf.web_bind == "127.0.0.1"
    configured = Settings(runtime={"web_bind": "0.0.0.0"})
    assert build_app(configured, AnalyticsOptions(), 1).conf.web_bind == "0.0.0.0"


def test_a_kafka_extra_secret_quoted_in_an_error_is_masked_in_its_one_line():
    """The one line a failed command prints masks every Kafka secret, `kafka.extra` ones included,
    wherever the error quotes it."""
    from lapse.shell.error_boundary import diagnose

    secret = "oauth-Client-s3cr3t"
    loaded = load_settings(kafka={"extra": {"sasl.oauthbearer.client.secret": secret}})
    said = diagnose(RuntimeError(f"token endpoint refused client secret {secret}"), loaded)
    assert secret not in said.line

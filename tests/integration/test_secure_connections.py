"""Secured connections against real servers: PostgreSQL over TLS (a throwaway cluster this module
starts with a generated certificate, next to one without TLS) and an SMTP server with STARTTLS and
AUTH (aiosmtpd). Certificates are generated per module; every server is stopped at the end."""

from __future__ import annotations

import json
import os
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiosmtpd.controller import Controller
from aiosmtpd.smtp import AuthResult, LoginPassword
from click.testing import CliRunner
from sqlalchemy import text

from lapse.devtools.brokers import free_port, free_ports
from lapse.devtools.brokers.secured import Certificates, make_certificates
from lapse.kernel.database import engine_from_settings
from lapse.kernel.settings import load_settings
from lapse.shell.app import main
from tests.fixtures.db import admin_url
from tests.fixtures.private_postgres import as_server_owner, pg_bindir

KEY_PASSWORD = "pg-client-key-3d1e"
SMTP_USER, SMTP_PASSWORD = "reports", "smtp-pass-a81f"


@pytest.fixture(scope="module")
def certs(tmp_path_factory) -> Certificates:
    return make_certificates(tmp_path_factory.mktemp("tls"), KEY_PASSWORD)


# --- PostgreSQL ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Clusters:
    """Two throwaway PostgreSQL servers from one initdb: `tls_port` with the generated server
    certificate (and the CA, so it asks for a client certificate), `plain_port` with ssl off."""

    tls_port: int
    plain_port: int

    def url(self, port: int) -> str:
        return f"postgresql+psycopg://postgres@localhost:{port}/postgres"


@pytest.fixture(scope="module")
def clusters(certs: Certificates) -> Iterator[Clusters]:
    bindir = pg_bindir()
    base = Path(tempfile.mkdtemp(prefix="lapse-tls-pg-"))
    tls_data, plain_data = base / "tls", base / "plain"
    if os.geteuid() == 0:
        shutil.chown(base, "postgres", "postgres")
    subprocess.run(as_server_owner([str(bindir / "initdb"), "-D", str(tls_data), "-U", "postgres",
                                      "--auth=trust", "--no-sync", "-E", "UTF8"]),
                   check=True, capture_output=True)
    pem = certs.keystore.read_text()
    key_end = pem.index("-----END PRIVATE KEY-----") + len("-----END PRIVATE KEY-----\n")
    (tls_data / "server.key").write_text(pem[:key_end])
    (tls_data / "server.crt").write_text(pem[key_end:])
    shutil.copy(certs.ca, tls_data / "root.crt")
    for name in ("server.key", "server.crt", "root.crt"):
        (tls_data / name).chmod(0o600)
        if os.geteuid() == 0:
            shutil.chown(tls_data / name, "postgres", "postgres")
    subprocess.run(as_server_owner(["cp", "-a", str(tls_data), str(plain_data)]), check=True)
    ports = Clusters(*free_ports(2))
    started: list[Path] = []
    try:
        for data, port, tls in ((tls_data, ports.tls_port, True), (plain_data, ports.plain_port, False)):
            options = (f"-c listen_addresses=127.0.0.1 -c port={port} -c unix_socket_directories={base} "
                       f"-c fsync=off -c ssl={'on' if tls else 'off'}")
            if tls:
                options += " -c ssl_cert_file=server.crt -c ssl_key_file=server.key -c ssl_ca_file=root.crt"
            subprocess.run(as_server_owner([str(bindir / "pg_ctl"), "-D", str(data), "-o", options,
                                              "-l", str(base / f"{port}.log"), "-w", "-t", "30", "start"]),
                           check=True, capture_output=True)
            started.append(data)
        yield ports
    finally:
        for data in started:
            subprocess.run(as_server_owner([str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate",
                                              "-w", "stop"]), capture_output=True)
        shutil.rmtree(base, ignore_errors=True)


def _ssl_row(database: dict) -> tuple:
    """(ssl, client_dn) of a session made by `engine_from_settings` with these database settings."""
    engine = engine_from_settings(load_settings(database=database))
    try:
        with engine.connect() as conn:
            return tuple(conn.execute(text(
                "SELECT ssl, client_dn FROM pg_stat_ssl WHERE pid = pg_backend_pid()")).one())
    finally:
        engine.dispose()


def test_verify_full_with_the_root_certificate_and_a_client_certificate(clusters, certs):
    assert _ssl_row({"url": clusters.url(clusters.tls_port), "sslmode": "verify-full",
                     "ssl_root_cert": str(certs.ca), "ssl_cert": str(certs.client_cert),
                     "ssl_key": str(certs.client_key), "ssl_key_password": KEY_PASSWORD}) == (True, "/CN=lapse-client")
    assert _ssl_row({"url": clusters.url(clusters.tls_port), "sslmode": "verify-full",
                     "ssl_root_cert": str(certs.ca)}) == (True, None)


def _db_current(env: dict[str, str]):
    return CliRunner().invoke(main, ["db", "current", "--json"], env=env)


def test_verify_full_refuses_a_server_certificate_from_another_ca_in_one_line(clusters, tmp_path):
    other = make_certificates(tmp_path / "other", "x")
    result = _db_current({"LAPSE_DATABASE__URL": clusters.url(clusters.tls_port),
                          "LAPSE_DATABASE__SSLMODE": "verify-full", "LAPSE_DATABASE__SSL_ROOT_CERT": str(other.ca)})
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "SSL error" in lines[0], result.output  # both CAs are called lapse-test-ca


def test_verify_full_without_a_root_certificate_is_refused_before_connecting(clusters):
    result = _db_current({"LAPSE_DATABASE__URL": clusters.url(clusters.tls_port),
                          "LAPSE_DATABASE__SSLMODE": "verify-full"})
    assert result.exit_code != 0
    assert result.output.strip().splitlines() == [
        "lapse: database: sslmode verify-full needs a root certificate "
        "(database.ssl_root_cert, or sslrootcert in the URL)"]


def test_require_against_a_server_without_tls_fails_in_one_line_while_disable_and_prefer_connect(clusters):
    plain = clusters.url(clusters.plain_port)
    assert _ssl_row({"url": plain, "sslmode": "disable"}) == (False, None)
    assert _ssl_row({"url": plain, "sslmode": "prefer"}) == (False, None)
    result = _db_current({"LAPSE_DATABASE__URL": plain, "LAPSE_DATABASE__SSLMODE": "require"})
    assert result.exit_code != 0
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and "server does not support SSL" in lines[0], result.output


def test_the_shared_test_database_takes_disable_and_prefer():
    assert _ssl_row({"url": admin_url(), "sslmode": "disable"})[0] is False
    ok = CliRunner().invoke(main, ["db", "current", "--json"],
                            env={"LAPSE_DATABASE__URL": admin_url(), "LAPSE_DATABASE__SSLMODE": "prefer"})
    assert ok.exit_code == 0, ok.output
    assert "revision" in json.loads(ok.output)


# --- SMTP ---------------------------------------------------------------------------------------

@dataclass
class Mailbox:
    """What the SMTP server accepted: per message, the session's login, whether TLS was on, the data."""

    messages: list[dict] = field(default_factory=list)

    async def handle_DATA(self, server, session, envelope) -> str:  # aiosmtpd calls its hook by this name
        self.messages.append({"login": session.auth_data, "tls": session.ssl is not None,
                              "rcpt": list(envelope.rcpt_tos), "data": envelope.content.decode()})
        return "250 OK"


def _authenticate(server, session, envelope, mechanism, auth_data) -> AuthResult:
    ok = isinstance(auth_data, LoginPassword) and (auth_data.login.decode(), auth_data.password.decode()) == (
        SMTP_USER, SMTP_PASSWORD)
    return AuthResult(success=ok, auth_data=auth_data.login.decode() if ok else None)


@pytest.fixture
def smtp_server(request, certs) -> Iterator[tuple[int, Mailbox]]:
    """An SMTP server on localhost; with STARTTLS (the generated certificate) and required AUTH
    unless the test is parametrized with False."""
    secured = getattr(request, "param", True)
    mailbox = Mailbox()
    kwargs: dict = {}
    if secured:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(str(certs.keystore))
        kwargs = {"tls_context": context, "require_starttls": True, "authenticator": _authenticate,
                  "auth_required": True}
    controller = Controller(mailbox, hostname="127.0.0.1", port=free_port(), **kwargs)
    controller.start()
    try:
        yield controller.port, mailbox
    finally:
        controller.stop()


def _report_env(pg_url: str, port: int, certs: Certificates, **extra: str) -> dict[str, str]:
    return {"LAPSE_DATABASE__URL": pg_url, "LAPSE_REPORT__NOTIFIER": "smtp", "LAPSE_REPORT__SMTP_HOST": "localhost",
            "LAPSE_REPORT__SMTP_PORT": str(port), "LAPSE_REPORT__MAIL_TO": "ops@example.com",
            "LAPSE_REPORT__SMTP_STARTTLS": "true", "LAPSE_REPORT__SMTP_CA_LOCATION": str(certs.ca), **extra}


def test_a_report_is_delivered_over_starttls_with_login(pg_url, smtp_server, certs):
    port, mailbox = smtp_server
    env = _report_env(pg_url, port, certs, LAPSE_REPORT__SMTP_USERNAME=SMTP_USER,
                      LAPSE_REPORT__SMTP_PASSWORD=SMTP_PASSWORD)
    result = CliRunner().invoke(main, ["report", "--date", "2026-11-29", "--json"], env=env)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["delivered"] == ["daily-report:2026-11-29"]
    assert [(m["login"], m["tls"], m["rcpt"]) for m in mailbox.messages] == [(SMTP_USER, True, ["ops@example.com"])]
    assert "X-Idempotency-Key: daily-report:2026-11-29" in mailbox.messages[0]["data"]
    assert SMTP_PASSWORD not in result.output


@pytest.mark.parametrize("smtp_server", [False], indirect=True)
def test_a_server_without_starttls_is_refused_when_starttls_is_required(pg_url, smtp_server, certs):
    port, mailbox = smtp_server
    result = CliRunner().invoke(main, ["report", "--date", "2026-11-29"], env=_report_env(pg_url, port, certs))
    assert result.exit_code == 1, result.output
    assert result.stdout.strip().splitlines() == [
        "daily-report:2026-11-29: stored; delivered 0 via smtp; failed 1 (retried next run): "
        "SMTPNotSupportedError: STARTTLS extension not supported by server."]
    assert mailbox.messages == []

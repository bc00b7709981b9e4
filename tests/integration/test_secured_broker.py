"""Every role over SASL_SSL (SCRAM-SHA-512, the standard authorizer, no access without an ACL),
each as its own SCRAM user with only the ACLs `lapse topics apply` derived from topics.yaml; a
principal without WRITE on the expiry topic cannot produce to it; and no secret of the settings
(SCRAM passwords, the client key's password) shows in any output or log of the scenario.
(Planning, creating and drift of the ACLs themselves: test_acls.py.)"""

from __future__ import annotations

import json
import logging
import os
import socket
import ssl
import struct
import subprocess
import sys
from collections import Counter
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from sqlalchemy import func, insert, select

from lapse.devtools.brokers import free_port
from lapse.devtools.demo_tables import reservations
from lapse.kernel.codec import Codec
from lapse.kernel.database import make_engine
from lapse.kernel.kafka_clients import DeliveryFailed, DeliveryTracker, make_producer
from lapse.kernel.models import cleanup_ledger
from lapse.kernel.settings import Settings, env_var, load_settings
from lapse.producers.emit import emit_events
from lapse.producers.publish import schedule_cleanup
from lapse.readers.offsets import read_to_end
from lapse.shell.app import main
from tests.fixtures.pipeline import TEST_SECTIONS, connection_env, expiry_event
from tests.fixtures.polling import eventually
from tests.fixtures.readers import analytics_view

KIND = "release-reservation"
# What the scenario's commands share besides their Kafka user: quick group joins, short polls.
QUICK = {env_var("processor.session_timeout_ms"): "6000", env_var("processor.poll_timeout_s"): "0.1",
         env_var("runtime.log_format"): "text", env_var("runtime.log_level"): "DEBUG"}  # the most output to search


def settings_as(secure_kafka, pg_url: str, prefix: str, role: str | None) -> Settings:
    """The settings of `role` (None: the admin) on the secured broker, this test's database and prefix."""
    user = secure_kafka.user_of(role) if role else None
    return load_settings(kafka=secure_kafka.kafka_section(user), database={"url": pg_url},
                         topics={"prefix": prefix}, **TEST_SECTIONS)


class Scenario:
    """Runs `lapse` commands, each as one role, and keeps everything they printed."""

    def __init__(self, secure_kafka, pg_url: str, prefix: str, folder: Path) -> None:
        self.kafka, self.pg_url, self.prefix, self.folder = secure_kafka, pg_url, prefix, folder
        self.printed: list[str] = []
        self.outputs: dict[int, Path] = {}

    def env(self, role: str | None, **extra: str) -> dict[str, str]:
        settings = settings_as(self.kafka, self.pg_url, self.prefix, role)
        user = self.kafka.user_of(role) if role else None
        return {**connection_env(settings), **self.kafka.env(user), **QUICK, **extra}

    def run(self, role: str | None, *args: str, **extra: str) -> Result:
        result = CliRunner().invoke(main, list(args), env=self.env(role, **extra))
        self.printed.append(result.output)  # stdout and stderr, as a terminal shows them
        return result

    def start(self, role: str, *args: str, **extra: str) -> subprocess.Popen[bytes]:
        """`lapse *args` in the background, its stdout and stderr to a file (a pipe nobody reads
        while it runs would fill and block it)."""
        output = self.folder / f"{role}-{len(self.outputs)}.out"
        with open(output, "wb") as sink:
            proc = subprocess.Popen([sys.executable, "-m", "lapse", *args],
                                    env={**os.environ, **self.env(role, **extra)},
                                    stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
        self.outputs[proc.pid] = output
        return proc

    def stop(self, proc: subprocess.Popen[bytes]) -> int:
        """SIGTERM, wait; keeps what it printed. Returns its exit status."""
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        self.printed.append(self.outputs[proc.pid].read_text(errors="replace"))
        return proc.returncode



def hold(engine, expires_at: datetime) -> int:
    with engine.begin() as conn:
        return conn.execute(insert(reservations).values(tenant="t1", status="held", expires_at=expires_at)
                            .returning(reservations.c.id)).scalar()


def applied(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).where(cleanup_ledger.c.state == "applied")).scalar()


@pytest.mark.slow
def test_every_role_runs_with_only_its_acls_and_no_secret_is_printed(secure_kafka, pg_url, unique, caplog,
                                                                     tmp_path):
    caplog.set_level(logging.DEBUG)
    prefix = unique("lapse") + "."
    s = Scenario(secure_kafka, pg_url, prefix, tmp_path)
    admin_settings = settings_as(secure_kafka, pg_url, prefix, None)
    engine = make_engine(pg_url)
    try:
        # The administrator creates the topics and every role's ACLs.
        applied_acls = s.run(None, "topics", "apply", "--replication-factor", "1", "--json")
        assert applied_acls.exit_code == 0, applied_acls.output
        result = json.loads(applied_acls.stdout)
        assert result["acls"] == "managed"
        assert {a["status"] for a in result["actions"] if a["kind"] == "create_acl"} == {"done"}

        # Two due reservations for the sweep; one not yet due, published through the outbox to a
        # delay tier (relay, then delay forwards it when due); one found later by the reconciler.
        swept = [hold(engine, datetime.now(UTC) - timedelta(minutes=1)) for _ in range(2)]
        due = datetime.now(UTC) + timedelta(seconds=4)
        later = hold(engine, due)
        with engine.begin() as conn:
            assert schedule_cleanup(conn, KIND, later, "t1", due, settings=admin_settings)

        sweep = s.run("sweep", "sweep", "--once", "--json")
        assert sweep.exit_code == 0, sweep.output
        assert json.loads(sweep.stdout)["emitted"] == 2
        missed = hold(engine, datetime.now(UTC) - timedelta(minutes=1))
        reconcile = s.run("reconcile", "reconcile", "--once", "--json", **{env_var("reconciler.grace_s"): "0"})
        assert reconcile.exit_code == 0, reconcile.output
        relay = s.run("relay", "relay", "--exit-when-idle", "0.5")
        assert relay.exit_code == 0 and "relayed 1 outbox rows" in relay.output, relay.output

        delay, process = s.start("delay", "delay"), s.start("process", "process")

        def all_applied() -> bool:
            for proc in (delay, process):
                assert proc.poll() is None, f"{proc.args[3:]} exited with {proc.returncode}"
            return applied(engine) == 4

        try:
            eventually(all_applied, timeout_s=90, interval_s=0.2, what="all four reservations applied")
        finally:
            assert s.stop(process) == 0, s.printed[-1][-2000:]
            assert s.stop(delay) == 0, s.printed[-1][-2000:]
        with engine.connect() as conn:
            released = set(conn.execute(select(reservations.c.id).where(reservations.c.status == "released"))
                           .scalars())
        assert released == {*swept, later, missed}

        relay = s.run("relay", "relay", "--exit-when-idle", "0.5")
        assert relay.exit_code == 0, relay.output
        codec = Codec.from_settings(admin_settings)
        outcomes = [codec.decode_expected("cleanup_outcome", m.value())
                    for m in read_to_end(admin_settings, admin_settings.topology.outcomes)]
        assert {o["op_key"] for o in outcomes if o["status"] == "applied"} == {
            f"{KIND}:{rid}" for rid in (*swept, later, missed)}

        archive = s.run("archive", "archive", "--exit-when-idle", "1", "--json",
                        **{env_var("archive.url"): f"file://{tmp_path / 'archive'}"})
        assert archive.exit_code == 0, archive.output
        assert json.loads(archive.stdout.splitlines()[-1])["records"] >= len(outcomes) + 4  # and at least 4 events

        # What the analytics view must count: every outcome on the topic (it counts at least once).
        expected = dict(sorted(Counter(f"{o['kind']}|{o['status']}" for o in outcomes).items()))

        # Faust's app id is its group: the declared one, whose ACLs cover its changelog topics too.
        # Its session outlasts a busy machine's stalls: a rebalance while Faust recovers its tables
        # can leave it waiting on a recovery that never ends (faust-streaming #596, #175).
        web_port = free_port()
        analytics = s.start("analytics", "analytics", "--app-id", admin_settings.topology.groups.analytics,
                            "--web-port", str(web_port), "--data-dir", str(tmp_path / "faust"),
                            **{env_var("processor.session_timeout_ms"): "30000"})
        audit = s.run("audit", "audit", "--from-beginning", "--json")
        assert audit.exit_code == 0, audit.output
        status = s.run("status", "status", "--json")
        assert status.exit_code == 0, status.output
        lag = {row["group"]: row for row in json.loads(status.stdout)["lag"]}
        assert all("error" not in row for row in lag.values()), lag
        assert lag[admin_settings.topology.groups.cleanup]["records"] == 0
        report = s.run("report", "report", "--report-dir", str(tmp_path), "--json")
        assert report.exit_code == 0, report.output

        last_shown: list[dict | None] = [None]

        def counted() -> dict | None:
            assert analytics.poll() is None, f"analytics exited with {analytics.returncode}"
            last_shown[0] = shown = analytics_view(web_port) or last_shown[0]
            return shown if shown and shown["totals"] == expected else None

        try:
            eventually(counted, timeout_s=90, interval_s=0.5, what="the analytics view's totals")
        except (AssertionError, TimeoutError) as exc:
            s.stop(analytics)
            notable = [line for line in s.printed[-1].splitlines()
                       if any(word in line for word in ("WARN", "ERROR", "ebalanc", "ecover", "Traceback"))]
            pytest.fail(f"{exc}; expected {expected}, last view {last_shown[0] and last_shown[0]['totals']}; "
                        f"analytics' notable lines: {notable[-40:]}")
        s.stop(analytics)
    finally:
        engine.dispose()

    assert len(s.printed) == 12 and all(out.strip() for out in s.printed)  # every command's output kept
    printed = "\n".join([*s.printed, caplog.text, *(r.getMessage() for r in caplog.records)])
    leaked = [secret for secret in secure_kafka.secrets() if secret in printed]
    assert not leaked, f"{len(leaked)} secret(s) printed"


def test_a_principal_without_write_on_the_expiry_topic_cannot_produce_to_it(secure_kafka, pg_url, unique,
                                                                          tmp_path):
    prefix = unique("lapse") + "."
    apply = Scenario(secure_kafka, pg_url, prefix, tmp_path).run(None, "topics", "apply", "--replication-factor", "1")
    assert apply.exit_code == 0, apply.output

    def produce_as(role: str) -> None:
        settings = settings_as(secure_kafka, pg_url, prefix, role)
        producer, delivery = make_producer(settings), DeliveryTracker()
        emit_events(producer, Codec.from_settings(settings), delivery, settings.topology.expiry,
                    [expiry_event(1)], datetime.now(UTC))
        delivery.flush(producer, 30)

    produce_as("sweep")  # WRITE on the expiry topic: accepted
    # The cleanup worker reads the expiry topic and writes delay tiers and dead letters, so its
    # idempotent producer gets a producer id, but it may not forge expiry events.
    with pytest.raises(DeliveryFailed, match="Topic authorization failed") as refused:
        produce_as("process")
    assert refused.value.permanent  # TOPIC_AUTHORIZATION_FAILED is never retried as transient
    # The audit role may write nothing at all, so its idempotent producer is refused a producer id:
    # a fatal producer error, reported as one permanent refusal like any other.
    with pytest.raises(DeliveryFailed, match=r"(?i)authorization") as fatal:
        produce_as("audit")
    assert fatal.value.permanent and "\n" not in str(fatal.value)
    admin = settings_as(secure_kafka, pg_url, prefix, None)
    assert len(list(read_to_end(admin, admin.topology.expiry))) == 1  # the sweep's record alone


def answers_kafka(sock: socket.socket) -> bool:
    """Whether the listener answers an ApiVersions v0 request (correlation id 7) on `sock` with a
    Kafka response, rather than closing, resetting, refusing the TLS handshake or sending a TLS alert."""
    client = b"lapse-test"
    request = struct.pack(">hhih", 18, 0, 7, len(client)) + client
    try:
        if isinstance(sock, ssl.SSLSocket):
            sock.do_handshake()
        sock.sendall(struct.pack(">i", len(request)) + request)
        head = sock.recv(8)
    except OSError:  # ssl.SSLError and timeouts included
        return False
    return len(head) == 8 and struct.unpack(">i", head[4:]) == (7,)


def test_the_controller_listener_takes_only_tls_with_a_certificate_of_the_test_ca(secure_kafka):
    server = secure_kafka.server
    certs = server.certificates
    address = ("127.0.0.1", server.controller_port)

    def over_tls(context: ssl.SSLContext) -> bool:
        with socket.create_connection(address, timeout=10) as raw, context.wrap_socket(
                raw, server_hostname="localhost", do_handshake_on_connect=False) as wrapped:
            return answers_kafka(wrapped)

    with socket.create_connection(address, timeout=10) as plain:
        assert not answers_kafka(plain)  # no PLAINTEXT
    assert not over_tls(ssl.create_default_context(cafile=str(certs.ca)))  # no TLS without a client certificate
    with_certificate = ssl.create_default_context(cafile=str(certs.ca))
    with_certificate.load_cert_chain(certs.client_cert, certs.client_key, certs.key_password)
    assert over_tls(with_certificate)  # the listener itself works
    assert "ANONYMOUS" not in server.properties()["super.users"]

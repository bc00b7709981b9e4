"""Apache Kafka from the jars with every client authenticated and encrypted, for least-privilege
tests: one SASL_SSL listener (SCRAM-SHA-512, client certificates required), the standard authorizer
with no access unless an ACL grants it, and certificates made here (a CA, a server certificate for
127.0.0.1/localhost, a client certificate whose key is encrypted with a password).

The broker principal `User:<admin_user>` (created at format time, also used broker to broker) is a
super user, and so is the node's own certificate (`User:CN=localhost`), with which it reaches its
controller: the controller listener takes TLS with a client certificate signed by the test CA, and
no anonymous principal has any right. Other users are added with `add_users` and get only the ACLs
someone creates for them.
"""

from __future__ import annotations

import ipaddress
import secrets
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Self

from confluent_kafka.admin import (
    AdminClient,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialUpsertion,
)
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from lapse.devtools.brokers.apache import ApacheKafkaServer
from lapse.devtools.brokers.processes import summarize_output
from lapse.devtools.brokers.unavailable import BrokerUnavailable

MECHANISM = "SCRAM-SHA-512"
AUTHORIZER = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
SERVER_NAME = "localhost"  # the broker certificate's subject, also its principal on the controller listener
NODE_PRINCIPAL = f"CN={SERVER_NAME}"


@dataclass(frozen=True)
class Certificates:
    """PEM files: the CA clients and the broker trust, the broker's keystore (key + chain), and a
    client certificate with its key encrypted by `key_password`."""

    ca: Path
    keystore: Path
    client_cert: Path
    client_key: Path
    key_password: str


def _cert(subject: str, key: ec.EllipticCurvePrivateKey, issuer: x509.Name, signer: ec.EllipticCurvePrivateKey,
          *, ca: bool = False, san: list[x509.GeneralName] | None = None,
          usage: x509.ObjectIdentifier | None = None) -> x509.Certificate:
    now = datetime.now(UTC)
    builder = (x509.CertificateBuilder()
               .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
               .issuer_name(issuer).public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - timedelta(minutes=5)).not_valid_after(now + timedelta(days=2))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
               # What strict verification (Python 3.13's default context) asks of every certificate.
               .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(signer.public_key()), critical=False)
               .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=ca, crl_sign=ca,
                                            content_commitment=False, key_encipherment=False, data_encipherment=False,
                                            key_agreement=False, encipher_only=False, decipher_only=False),
                              critical=True))
    if san:
        builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
    if usage is not None:
        builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    return builder.sign(signer, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def make_certificates(folder: Path, key_password: str) -> Certificates:
    """A throwaway CA (valid two days) and the server and client certificates it signs, in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _cert("lapse-test-ca", ca_key, x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "lapse-test-ca")]),
                    ca_key, ca=True)
    server_key = ec.generate_private_key(ec.SECP256R1())
    server_cert = _cert(SERVER_NAME, server_key, ca_cert.subject, ca_key,
                        san=[x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    client_key = ec.generate_private_key(ec.SECP256R1())
    client_cert = _cert("lapse-client", client_key, ca_cert.subject, ca_key, usage=ExtendedKeyUsageOID.CLIENT_AUTH)
    plain = serialization.NoEncryption()
    files = Certificates(folder / "ca.pem", folder / "broker-keystore.pem", folder / "client.pem",
                         folder / "client.key", key_password)
    files.ca.write_bytes(_pem(ca_cert))
    # The broker's key stays unencrypted: the JVM's PEM reader does not take every PKCS#8 cipher.
    files.keystore.write_bytes(server_key.private_bytes(serialization.Encoding.PEM,
                                                        serialization.PrivateFormat.PKCS8, plain)
                               + _pem(server_cert) + _pem(ca_cert))
    files.client_cert.write_bytes(_pem(client_cert))
    files.client_key.write_bytes(client_key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(key_password.encode())))
    for path in (files.keystore, files.client_key):
        path.chmod(0o600)
    return files


class SecuredKafkaServer(ApacheKafkaServer):
    """One KRaft node whose only client listener is SASL_SSL with SCRAM-SHA-512 and the standard
    authorizer (`allow.everyone.if.no.acl.found=false`), its controller listener SSL with client
    certificates; certificates are made in its data dir."""

    what = "Apache Kafka (SASL_SSL)"

    def __init__(self, data_dir: str | Path | None = None, *, admin_user: str = "admin",
                 admin_password: str | None = None, key_password: str | None = None, **kwargs: Any) -> None:
        super().__init__(data_dir, **kwargs)
        self.admin_user = admin_user
        self.admin_password = admin_password or secrets.token_hex(16)
        self.key_password = key_password or secrets.token_hex(16)
        self._certificates: Certificates | None = None

    @property
    def certificates(self) -> Certificates:
        """The PEM files (made on first use, in the data dir's tls/)."""
        if self._certificates is None:
            self._certificates = make_certificates(self.data_dir / "tls", self.key_password)
        return self._certificates

    def properties(self) -> dict[str, str]:
        conf = super().properties()
        certs = self.certificates
        jaas = (f'org.apache.kafka.common.security.scram.ScramLoginModule required '
                f'username="{self.admin_user}" password="{self.admin_password}";')
        secured: dict[str, str] = {
            "listeners": f"SASL_SSL://127.0.0.1:{self.port},CONTROLLER://127.0.0.1:{self.controller_port}",
            "advertised.listeners": f"SASL_SSL://127.0.0.1:{self.port}",
            "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:SSL",
            "inter.broker.listener.name": "SASL_SSL",
            "sasl.enabled.mechanisms": MECHANISM,
            "sasl.mechanism.inter.broker.protocol": MECHANISM,
            f"listener.name.sasl_ssl.{MECHANISM.lower()}.sasl.jaas.config": jaas,
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(certs.keystore),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(certs.ca),
            "ssl.client.auth": "required",
            "authorizer.class.name": AUTHORIZER,
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{self.admin_user};User:{NODE_PRINCIPAL}",
        }
        conf.update(secured)
        conf.update({k: str(v) for k, v in self.overrides.items()})
        return conf

    def format_options(self) -> list[str]:
        """The admin's SCRAM credential, written at format time: the broker logs in with it."""
        return ["--add-scram", f"{MECHANISM}=[name={self.admin_user},password={self.admin_password}]"]

    def client_config(self, user: str | None = None, password: str | None = None) -> dict[str, Any]:
        """librdkafka settings for `user` (default: the admin) over the SASL_SSL listener."""
        certs = self.certificates
        return {"bootstrap.servers": self.bootstrap, "security.protocol": "SASL_SSL",
                "sasl.mechanism": MECHANISM, "sasl.username": user or self.admin_user,
                "sasl.password": password if user else self.admin_password,
                "ssl.ca.location": str(certs.ca), "ssl.certificate.location": str(certs.client_cert),
                "ssl.key.location": str(certs.client_key), "ssl.key.password": certs.key_password}

    def admin(self) -> AdminClient:
        """An AdminClient as the super user."""
        return AdminClient({**self.client_config(), "log_level": 0})

    def start(self) -> Self:
        """Launch and wait until the admin sees the broker over SASL_SSL; returns self."""
        proc = self.launch()
        client = AdminClient({**self.client_config(), "socket.connection.setup.timeout.ms": 2000,
                              "log_level": 0})  # refused connections until it listens are expected
        deadline = time.monotonic() + self.start_timeout
        try:
            while True:
                if proc.poll() is not None:
                    raise BrokerUnavailable(f"{self.what} exited with status {proc.returncode} during start; "
                                            f"log {self.log_path}: {self._log_tail()}")
                try:
                    if client.list_topics(timeout=2).brokers:
                        return self
                except Exception:  # KafkaException while the listener is not up yet
                    pass
                if time.monotonic() > deadline:
                    raise BrokerUnavailable(f"{self.what} not ready on {self.bootstrap} after "
                                            f"{self.start_timeout:.0f}s; log {self.log_path}: {self._log_tail()}")
                time.sleep(0.2)
        except BaseException:
            self.stop(self.failed_start_grace)
            raise

    def add_users(self, users: dict[str, str], timeout: float = 30.0) -> None:
        """Create or update SCRAM-SHA-512 users ({name: password}); returns once the broker knows them."""
        client = self.admin()
        info = ScramCredentialInfo(ScramMechanism.SCRAM_SHA_512, 8192)
        futures = client.alter_user_scram_credentials(
            [UserScramCredentialUpsertion(name, info, password.encode()) for name, password in users.items()])
        for future in futures.values():
            future.result(timeout)
        deadline = time.monotonic() + timeout
        while True:
            try:
                described = client.describe_user_scram_credentials(list(users))
                for future in (described.values() if isinstance(described, dict) else [described]):
                    future.result(timeout)  # RESOURCE_NOT_FOUND until the broker knows the user
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def _log_tail(self) -> str:
        try:
            return summarize_output(self.log_path.read_text(errors="replace"), 8) or "(empty log)"
        except OSError:
            return "(no log)"

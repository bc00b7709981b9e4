"""Where daily reports go: a notifier sends one report under its idempotency key, and sending the
same key twice must not notify twice (the file notifier keeps the first file; the SMTP notifier
uses the key as Message-ID so receivers and providers can drop a repeat). The SMTP notifier upgrades
with STARTTLS and logs in as lapse.kernel.connections maps the report settings."""

from __future__ import annotations

import json
import os
import smtplib
import ssl
import uuid
from email.message import EmailMessage
from pathlib import Path
from typing import Any, Protocol

from pydantic import SecretStr

from lapse.kernel.connections import smtp_security
from lapse.kernel.settings import Settings


class Notifier(Protocol):
    name: str

    def send(self, key: str, report: dict[str, Any]) -> None:
        """Deliver `report` under idempotency key `key`; raise if it was not accepted."""


class FileNotifier:
    """One JSON file per report key in a folder; an existing file for the key means already sent."""

    name = "file"

    def __init__(self, folder: Path | str) -> None:
        self.folder = Path(folder)

    def path_for(self, key: str) -> Path:
        return self.folder / f"{key.replace(':', '_')}.json"

    def send(self, key: str, report: dict[str, Any]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        target = self.path_for(key)
        if target.exists():
            return
        tmp = self.folder / f".{target.name}.{uuid.uuid4().hex}.tmp"
        tmp.write_text(json.dumps({"idempotency_key": key, "report": report}, sort_keys=True, indent=2))
        try:
            os.link(tmp, target)  # atomic create-if-absent: a concurrent sender keeps the first file
        except FileExistsError:
            pass
        finally:
            tmp.unlink()


def message_id(key: str, domain: str = "lapse") -> str:
    """An RFC 5322 Message-ID from the key (':' is not allowed on its left side, so it becomes '.')."""
    return f"<{key.replace(':', '.')}@{domain}>"


class SmtpNotifier:
    """Mails the report as JSON to the configured recipients through one SMTP host. With `starttls`
    (a TLS context) the session is upgraded before anything else is said, and a server that does not
    offer STARTTLS is refused (smtplib.SMTPNotSupportedError) rather than sent the report in clear;
    with `username` it logs in, after the upgrade."""

    name = "smtp"

    def __init__(self, host: str, port: int, sender: str, recipients: list[str], timeout: float = 30.0, *,
                 starttls: ssl.SSLContext | None = None, username: str | None = None,
                 password: SecretStr | None = None):
        self.host, self.port, self.sender, self.recipients, self.timeout = host, port, sender, recipients, timeout
        self.starttls, self.username, self.password = starttls, username, password

    def build(self, key: str, report: dict[str, Any]) -> EmailMessage:
        msg = EmailMessage()
        msg["Subject"] = f"Lapse daily report {report.get('date', key)}"
        msg["From"] = self.sender
        msg["To"] = ", ".join(self.recipients)
        msg["Message-ID"] = message_id(key)
        msg["X-Idempotency-Key"] = key
        msg.set_content(json.dumps(report, sort_keys=True, indent=2))
        return msg

    def send(self, key: str, report: dict[str, Any]) -> None:
        with smtplib.SMTP(self.host, self.port, timeout=self.timeout) as smtp:
            if self.starttls is not None:
                smtp.starttls(context=self.starttls)  # SMTPNotSupportedError when the server has none
            if self.username is not None and self.password is not None:
                smtp.login(self.username, self.password.get_secret_value())
            smtp.send_message(self.build(key, report))


def notifier_from_settings(settings: Settings) -> Notifier:
    """The configured notifier; ValueError (one line) when smtp is chosen but not configured, and
    ConnectionRefused when its STARTTLS or login settings cannot be honoured."""
    if settings.report.notifier == "file":
        return FileNotifier(settings.report.dir)
    recipients = [r.strip() for r in (settings.report.mail_to or "").split(",") if r.strip()]
    if not settings.report.smtp_host or not recipients:
        raise ValueError("the smtp notifier needs LAPSE_REPORT__SMTP_HOST and LAPSE_REPORT__MAIL_TO")
    return SmtpNotifier(settings.report.smtp_host, settings.report.smtp_port, settings.report.mail_from, recipients,
                        **smtp_security(settings.report))

"""`lapse demo`: the pipeline end to end on the embedded broker and SQLite, with checks.

The demo seeds and deletes data and makes topics: pointed at a broker or database that is not on
this machine (a loopback address, `localhost`, a Unix socket, an SQLite file) it refuses before
doing anything, unless `--force`.
"""

from __future__ import annotations

import ipaddress
import shutil
import sys
from pathlib import Path
from typing import Any

import click

from lapse.kernel.logs import configure_logging
from lapse.kernel.settings import DEFAULT_STATE_DIR, Settings
from lapse.shell.cli import main
from lapse.shell.cli_options import emit, pass_settings, setting_option
from lapse.shell.error_boundary import CommandFailed, ExitCode


def is_loopback_host(host: str | None) -> bool:
    """Whether `host` names this machine: a loopback address, `localhost`, or none (a Unix socket)."""
    if not host or host.startswith("/"):
        return True
    name = host.strip("[]").lower()
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def remote_brokers(bootstrap_servers: str) -> list[str]:
    """The bootstrap servers (`host:port`, `[v6]:port`, `SSL://host:port`) not on this machine."""
    remote = []
    for server in filter(None, (s.strip() for s in bootstrap_servers.split(","))):
        address = server.rpartition("://")[2]
        bracketed = address.startswith("[")  # an IPv6 address: [::1]:9092
        host = address[1:].partition("]")[0] if bracketed else address.rpartition(":")[0] or address
        if not is_loopback_host(host):
            remote.append(server)
    return remote


def remote_database(url: str) -> str | None:
    """The host of a database URL not on this machine (an SQLite file is), else None."""
    # function-local: keeps `lapse --help` fast
    from sqlalchemy.engine import make_url

    parsed = make_url(url)
    if parsed.get_backend_name() == "sqlite":
        return None
    hosts = [parsed.host]
    for key in ("host", "hostaddr"):  # libpq's own parameters, possibly several hosts each
        value = parsed.query.get(key)
        for item in [value] if isinstance(value, str) else list(value or ()):
            hosts += item.split(",")
    return next((h for h in hosts if h and not is_loopback_host(h)), None)


@main.command()
@click.option("--reservations", type=click.IntRange(10, 1_000_000), default=2000, show_default=True,
              help="Reservations to seed (70% expired holds).")
@click.option("--workers", type=click.IntRange(1, 16), default=2, show_default=True,
              help="Processor processes.")
@setting_option("kafka.bootstrap_servers", help="Use this Kafka cluster instead of the embedded broker.")
@setting_option("database.url", help="Use this database instead of a fresh SQLite file under .lapse/.")
@click.option("--state-dir", type=click.Path(path_type=Path), default=DEFAULT_STATE_DIR,
              show_default=True, help="Where the embedded database and broker logs go.")
@click.option("--timeout", "timeout_s", type=float, default=300.0, show_default=True,
              help="Give up when the pipeline has not settled after this many seconds.")
@setting_option("dev.object_store_fault_rate", "--fault-rate", type=click.FloatRange(0, 0.9),
                help="Share of object-store deletes that fail (429 with Retry-After, 503, invalid key).")
@click.option("--force", is_flag=True,
              help="Run against a broker or database that is not on this machine (it seeds and deletes data).")
@click.option("--json", "as_json", is_flag=True, help="Print the summary as one JSON object.")
@pass_settings
def demo(settings: Settings, reservations: int, workers: int, state_dir: Path, timeout_s: float, force: bool,
         as_json: bool) -> None:
    """Seed reservations, run sweep, processors and relay until every due hold is terminal, and
    check one effect per op key. Exit status 0 only when every check passes. Refuses a broker or
    database not on this machine unless --force."""
    # function-local: keeps `lapse --help` fast
    from lapse.devtools.brokers import BrokerUnavailable, EmbeddedBroker
    from lapse.devtools.demo import run_demo
    from lapse.devtools.demo_kinds import write_demo_kinds

    ctx = click.get_current_context()
    own_broker = ctx.params.get("kafka__bootstrap_servers") is None
    own_db = ctx.params.get("database__url") is None
    if not force:
        brokers = [] if own_broker else remote_brokers(settings.kafka.bootstrap_servers)
        database = None if own_db else remote_database(settings.database.url_plain())
        if brokers or database:
            what = " and ".join(([f"broker {', '.join(brokers)}"] if brokers else [])
                                + ([f"database host {database}"] if database else []))
            raise CommandFailed(ExitCode.USAGE, f"demo refused: {what} is not on this machine, and the demo "
                                "seeds and deletes data there; pass --force to run it anyway")
    state_dir.mkdir(parents=True, exist_ok=True)
    shutil.rmtree(state_dir / "objects", ignore_errors=True)
    # The demo's kinds file in the state folder: its `file:objects` store is state_dir/objects. The
    # roles log to a file there: the terminal gets the progress and the summary.
    changes: dict[str, dict[str, Any]] = {
        "processor": {"session_timeout_ms": 6000}, "kinds": {"file": write_demo_kinds(state_dir)}}
    if settings.runtime.log_file is None:
        changes["runtime"] = {"log_file": state_dir / "demo.log"}
    if own_db:
        db_path = state_dir / "demo.db"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db_path}{suffix}").unlink(missing_ok=True)
        changes["database"] = {"url": f"sqlite:///{db_path}"}
    broker = None
    try:
        if own_broker:
            try:
                broker = EmbeddedBroker(log_dir=state_dir).start()
            except BrokerUnavailable as exc:
                raise click.ClickException(str(exc)) from None
            changes["kafka"] = {"bootstrap_servers": broker.bootstrap}
            click.echo(f"embedded broker on {broker.bootstrap}", err=True)
        settings = settings.with_(**changes)
        configure_logging(settings)
        click.echo(f"logs in {settings.runtime.log_file}", err=True)
        summary = run_demo(settings, reservations_n=reservations, workers=workers, timeout_s=timeout_s)
    finally:
        if broker is not None:
            broker.stop()
    emit(summary.to_dict(), as_json, lambda _: summary.text())
    sys.exit(0 if summary.ok else 1)

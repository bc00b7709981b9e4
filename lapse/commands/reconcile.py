"""`lapse reconcile`: rescan for lapsed work that never produced an event or got stuck."""

from __future__ import annotations

import re

import click

from lapse.cli import main
from lapse.cli_options import connection_options, emit, pass_settings, setting_option

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)\s*$")
_SECONDS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(text: str) -> float:
    """Seconds in a duration like "30s", "5m", "1h", "2d" or "500ms"; ValueError otherwise."""
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration like 30s, 5m, 1h or 2d")
    return float(match.group(1)) * _SECONDS[match.group(2)]


class Duration(click.ParamType):
    name = "DURATION"

    def convert(self, value, param, ctx):
        if isinstance(value, (int, float)):
            return float(value)
        try:
            return parse_duration(value)
        except ValueError as exc:
            self.fail(str(exc), param, ctx)


def _summary(r: dict) -> str:
    gaps = ", ".join(f"{k}={v}" for k, v in sorted(r["gaps"].items())) or "none"
    anomalies = ", ".join(f"{k}={v}" for k, v in sorted(r["anomalies"].items())) or "none"
    return (f"scanned {r['scanned']} business rows and {r['ledger_scanned']} ledger rows; "
            f"gaps: {gaps}; re-emitted {r['reemitted']}; anomalies: {anomalies}")


@main.command()
@connection_options
@setting_option("reconcile_grace_s", "--grace", type=Duration(), metavar="DURATION",
                help="Leave work alone until it has looked stuck this long (30s, 5m, 1h).")
@setting_option("reconcile_page_size", "--page-size", type=click.IntRange(1, 100_000))
@setting_option("reconcile_rate", "--rate", type=click.FloatRange(min=0, min_open=True),
                help="Most events re-emitted per second.")
@setting_option("reconcile_interval_s", "--interval", type=Duration(), metavar="DURATION")
@setting_option("metrics_port")
@click.option("--once", is_flag=True, help="One pass, then exit.")
@click.option("--json", "as_json", is_flag=True, help="Print the pass summary as JSON.")
@pass_settings
def reconcile(settings, once: bool, as_json: bool) -> None:
    """Re-emit eligible work with no ledger row or stuck past the grace period; report anomalies."""
    from lapse.codec import Codec
    from lapse.database import engine_from_settings
    from lapse.kafka_clients import make_producer
    from lapse.kinds import registry
    from reconciler.scan import reconcile_once, run_reconcile_role

    if not once:
        from lapse.metrics import serve

        serve(settings)
        run_reconcile_role(settings, {})
        return
    engine = engine_from_settings(settings)
    producer = make_producer(settings)
    try:
        report = reconcile_once(engine, producer, Codec.from_settings(settings), settings,
                                registry(settings.extra_kinds))
    finally:
        producer.flush(10)
        engine.dispose()
    emit(report.to_dict(), as_json, _summary)

"""`lapse audit`: replay the history (with `--archive`, the archive's files and the topics as one)
and check the invariants.

Exit 0 when they hold (or the window holds no records: "nothing to audit"; with `--allow-gaps`, over
what could be read, the gaps named); 1 when one is broken or the audit could not read everything in
the window — a gap (offsets retention deleted and no archive holds, an archive file missing or
altered, a partition that delivered nothing for --read-timeout), named per partition with its
first offset and time; 2 for a wrong window; 3 when a topic is missing or the archive URL or its
manifest is not usable; 4 when the broker, the database or the archive's store cannot be reached
(the error boundary's one line).
"""

from __future__ import annotations

import json
import sys
from datetime import datetime, timedelta
from typing import Any

import click

from lapse.kernel.settings import Settings
from lapse.shell.cli import main
from lapse.shell.cli_options import connection_options, emit, pass_settings
from lapse.shell.error_boundary import CommandFailed, ExitCode
from lapse.shell.time_args import DURATION, TIMESTAMP, TIMESTAMP_FORMS


def _text(r: dict[str, Any]) -> str:
    from lapse.readers import gap_line  # function-local: keeps `lapse --help` fast

    lines = [
        "records read: " + ", ".join(f"{t}={n}" for t, n in r["records"].items()),
        f"events seen: {r['events_seen']} ({r['op_keys_seen']} op keys)",
        f"outcomes: {r['outcomes']} (+{r['outcome_repeats']} relay repeats dropped) "
        + " ".join(f"{s}={n}" for s, n in r["outcomes_by_status"].items()),
        "final status: " + " ".join(f"{s}={n}" for s, n in r["final_by_status"].items()),
        f"without terminal outcome after grace: {r['without_terminal']}",
        f"applied more than once: {len(r['applied_twice'])}",
        f"dead letters: {r['dead_letters']}, unresolved {r['unresolved_dead_letters']} "
        f"(poison {r['poison_dead_letters']})",
    ]
    lines += [f"replay {rid}: " + " ".join(f"{k}={v}" for k, v in c.items())
              for rid, c in r["replays"].items()]
    undecodable = {t: n for t, n in r["undecodable"].items() if n}
    if undecodable:
        lines.append("undecodable records: " + ", ".join(f"{t}={n}" for t, n in undecodable.items()))
    if r["archive"]:
        lines.append(f"read from the archive {r['archive']}: "
                     + ", ".join(f"{t}={n}" for t, n in r["archived"].items()))
    if r["gaps_allowed"]:
        lines += [f"GAP (allowed): {gap_line(g)}" for g in r["gaps"]]
    lines += [f"INCOMPLETE: {i}" for i in r["incomplete"]]
    lines += [f"BROKEN: {b}" for b in r["broken"]]
    lines.append(_VERDICTS[r["verdict"]])
    return "\n".join(lines)


def _record_verdict(settings: Settings, report: dict[str, Any]) -> None:
    """Keep the verdict as the audit's finding; a database that cannot take it is one warning."""
    from lapse.kernel.database import engine_from_settings
    from lapse.kernel.findings import AUDIT, LAST_VERDICT, Finding, record_quietly

    summary = (f"{_VERDICTS[report['verdict']]}: {report['events_seen']} events ({report['op_keys_seen']} op keys), "
               f"{report['without_terminal']} without a terminal outcome, "
               f"{len(report['applied_twice'])} applied more than once, "
               f"{report['unresolved_dead_letters']} unresolved dead letters")
    details = {k: report[k] for k in ("verdict", "events_seen", "op_keys_seen", "without_terminal",
                                      "unresolved_dead_letters")}
    details |= {"applied_twice": len(report["applied_twice"]), "broken": report["broken"][:20],
                "incomplete": report["incomplete"][:20], "gaps": len(report["gaps"])}
    engine = engine_from_settings(settings)
    try:
        record_quietly(engine, Finding(AUDIT, LAST_VERDICT, datetime.fromisoformat(report["at"]), summary, details))
    finally:
        engine.dispose()


def _database_now(settings: Settings) -> datetime:
    """The database's now: the grace ("should be done by now") is judged by the one clock."""
    # function-local: keeps `lapse --help` fast
    from lapse.kernel.clock import engine_now
    from lapse.kernel.database import engine_from_settings

    engine = engine_from_settings(settings)
    try:
        return engine_now(engine)
    finally:
        engine.dispose()


_VERDICTS = {"invariants hold": "invariants hold", "broken": "invariants broken",
             "incomplete": "audit incomplete: the invariants could not be checked on everything in the window",
             "nothing to audit": "nothing to audit: no records in the window"}


@main.command()
@connection_options
@click.option("--since", type=TIMESTAMP, help=f"Read records from this time ({TIMESTAMP_FORMS}).")
@click.option("--from-beginning", is_flag=True, help="Read everything retained.")
@click.option("--until", type=TIMESTAMP, help="Ignore records at or after this time.")
@click.option("--grace", type=DURATION, default="5m", show_default=True,
              help="How long an event may wait for its terminal outcome.")
@click.option("--read-timeout", "read_timeout", type=DURATION, default="30s", show_default=True,
              help="A partition that delivers neither a record nor its end for this long is a gap.")
@click.option("--archive", "archive_url", metavar="URL",
              help="Also read the archive at URL (s3://bucket/prefix or file:///folder) for what the topics no "
                   "longer hold: archive and topics as one history.")
@click.option("--allow-gaps", is_flag=True,
              help="Accept what could not be read: the gaps are named, the exit status is the invariants'.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option("--out", type=click.Path(dir_okay=False, writable=True), help="Also write the JSON report here.")
@click.option("--record/--no-record", default=True, show_default=True,
              help="Keep the verdict in the database's findings, where status and the console show it.")
@pass_settings
def audit(settings: Settings, since: datetime | None, from_beginning: bool, until: datetime | None,
          grace: timedelta, read_timeout: timedelta, archive_url: str | None, allow_gaps: bool, as_json: bool,
          out: str | None, record: bool) -> None:
    """Replay lapse.expiry, lapse.outcomes and lapse.dlq (manual assignment, no commits) and check
    that every event reached one terminal outcome and no op key was applied twice. Every partition
    is read to its end (partition EOF, at or past the high watermark asked at the start); what
    could not be read in the window is a gap, and fails the audit unless --allow-gaps."""
    # function-local: keeps `lapse --help` fast
    from lapse.archive import ArchiveReader, ArchiveRefused, ArchiveUrlError, ManifestError
    from lapse.kernel.kafka_logs import leave_connection_failures_to_caller
    from lapse.readers import BROKEN, INCOMPLETE, OffsetsError, run_audit

    if bool(since) == from_beginning:
        raise click.UsageError("give exactly one of --since TS or --from-beginning")
    if read_timeout.total_seconds() <= 0:
        raise click.UsageError("--read-timeout must be longer than 0s")
    if since is not None and until is not None and since >= until:
        raise click.UsageError(f"--since {since.isoformat()} is not before --until {until.isoformat()}: "
                               "the window holds nothing")
    leave_connection_failures_to_caller()  # an unreachable broker is the error boundary's one line
    try:
        archive = ArchiveReader.open(archive_url, settings) if archive_url is not None else None
    except (ArchiveUrlError, ArchiveRefused) as exc:
        raise CommandFailed(ExitCode.CONFIG, f"audit: --archive: {exc}") from None
    try:
        report = run_audit(settings, clock=lambda: _database_now(settings), since=since, until=until, grace=grace,
                           stall_s=read_timeout.total_seconds(), archive=archive, allow_gaps=allow_gaps).to_dict()
    except OffsetsError as exc:  # a topic of the topology is not on the cluster
        raise CommandFailed(ExitCode.CONFIG, f"audit: {exc} (`lapse topics apply` creates it; "
                                             "is the topic prefix right?)") from None
    except (ArchiveRefused, ManifestError) as exc:  # a store that refuses reads, an entry it did not write
        raise CommandFailed(ExitCode.CONFIG, f"audit: --archive: {exc}") from None
    finally:
        if archive is not None:
            archive.close()
    if out:
        with open(out, "w") as fh:
            json.dump(report, fh, indent=2, sort_keys=True)
    if record:
        _record_verdict(settings, report)
    emit(report, as_json, _text)
    sys.exit(int(ExitCode.PROBLEM_FOUND if report["verdict"] in (BROKEN, INCOMPLETE) else ExitCode.OK))

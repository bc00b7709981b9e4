"""`lapse show OP_KEY`: one operation's whole history — ledger row, transitions, outbox records,
dead letter — as a compact timeline for a person or JSON for a machine. `--subject KIND ID` finds
it by its business row's id, `--correlation-id ID` finds the op keys a correlation id was seen
with and shows each, and `--tenant T [--kind K]` lists a tenant's operations a page at a time.
`<kind>:<subject_id>` of a kind with a generation shows every lapse of the subject, one operation each.
`--archive URL` adds what the archive and the topics hold of it — its events, outcomes and dead
letters, and the transitions the ledger no longer keeps — so an operation whose ledger row was
pruned still has its history.

Exit 0 when found; 1 with one line ("no operation OP_KEY in the ledger") when not; 2 for a
malformed op key, an unknown kind or tenant, or a wrong window; 3 when the archive URL or its
manifest is not usable.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import click

from lapse.kernel.schema_names import CLEANUP_OUTCOME, DEAD_LETTER_RECORD
from lapse.kernel.settings import Settings
from lapse.shell.cli import main
from lapse.shell.cli_options import emit, log_options, pass_settings, setting_option
from lapse.shell.error_boundary import CommandFailed, ExitCode
from lapse.shell.time_args import TIMESTAMP, TIMESTAMP_FORMS

# How far back `--correlation-id` looks by default, and how many op keys it shows at most.
CORRELATION_LOOKBACK = timedelta(days=1)
CORRELATION_LIMIT = 20
# Operations per page of `--tenant`: by default, and at most.
TENANT_PAGE = 50
TENANT_PAGE_MAX = 1000


def _failure(failure_class: str | None, reason: str | None) -> str:
    return f"{failure_class}: {reason or ''}".rstrip(": ") if failure_class else ""


def _transition_line(t: dict[str, Any]) -> str:
    line = f"{t['at']}  {t['from_state'] or '-'} -> {t['to_state']}  attempt {t['attempt']}  by {t['actor']}"
    if t["failure_class"]:
        line += f"  FAILED {_failure(t['failure_class'], t['reason'])}"
    elif t["reason"]:
        line += f"  ({t['reason']})"
    if t["replay_id"]:
        line += f"  replay {t['replay_id']}"
    if t["event_topic"] is not None:
        line += f"  event {t['event_topic']}[{t['event_partition']}]@{t['event_offset']}"
    return line


def _outbox_line(o: dict[str, Any]) -> str:
    r = o["record"]
    if o["schema"] == CLEANUP_OUTCOME:
        what = f"outcome {r.get('status')} attempt {r.get('attempt')}"
        failure = _failure(r.get("failure_class"), r.get("reason"))
        what += f" {failure}" if failure else ""
    elif o["schema"] == DEAD_LETTER_RECORD:
        what = f"dead letter {_failure(r.get('failure_class'), r.get('reason'))}"
    else:
        what = f"event attempt {r.get('attempt')} due {r.get('due_at')} ({r.get('source')})"
    if r.get("replay_id"):
        what += f" replay {r['replay_id']}"
    where = o["topic"] + (f" [{o['role']}]" if o["role"] else "")
    sent = f"sent {o['sent_at']}" if o["sent_at"] else "not sent yet"
    return f"{o['created_at']}  -> {where}: {what}; {sent}"


def _record_line(r: dict[str, Any]) -> str:
    """One record of the op key on a topic, from the archive or the topic."""
    rec, role = r["record"], r["role"]
    if "undecodable" in rec:
        what = f"undecodable record ({rec['undecodable']})"
    elif role == "outcomes":
        what = f"outcome {rec.get('status')} attempt {rec.get('attempt')}"
        failure = _failure(rec.get("failure_class"), rec.get("reason"))
        what += f" {failure}" if failure else ""
    elif role == "dlq":
        what = f"dead letter {_failure(rec.get('failure_class'), rec.get('reason'))}"
    else:
        what = f"event attempt {rec.get('attempt')} due {rec.get('due_at')} ({rec.get('source')})"
    if rec.get("replay_id"):
        what += f" replay {rec['replay_id']}"
    return f"{r['at']}  <- {r['topic']}[{r['partition']}]@{r['offset']} ({r['from']}): {what}"


def _header(row: dict[str, Any] | None, op_key: str) -> list[str]:
    if row is None:
        return [f"{op_key}  no ledger row (pruned, or never written): the archive's history follows"]
    lines = [f"{row['op_key']}  {row['state']}  attempt {row['attempt']}  tenant {row['tenant']}  "
             f"correlation {row['correlation_id']}  source {row['source']}",
             f"  created {row['created_at']}  updated {row['updated_at']}  due {row['due_at']}"
             + (f"  finished {row['finished_at']}" if row["finished_at"] else "")
             + (f"  duplicates {row['duplicates']}" if row["duplicates"] else "")]
    if row["claim_owner"]:
        lines.append(f"  claimed by {row['claim_owner']} until {row['claim_until']}")
    if row["last_failure_class"]:
        lines.append(f"  last failure {_failure(row['last_failure_class'], row['last_failure'])}")
    return lines


def history_text(h: dict[str, Any]) -> str:
    """The history as a person reads it: a header from the ledger row, then one timeline of
    transitions, outbox records and (with an archive) the records on the topics (a transition
    before the records its transaction wrote)."""
    lines = _header(h["ledger"], h["op_key"])
    if h["replay_ids"]:
        lines.append(f"  replays {', '.join(h['replay_ids'])}")
    dead = h["dead_letter"]
    if dead is not None:
        lines.append(f"  DEAD LETTER since {dead['at']} after {len(dead['history'])} failed attempt(s)")
    archive = h.get("archive") or {"records": [], "damaged": []}
    timeline = ([(t["at"], 0, t["id"], "  " + _transition_line(t)) for t in h["transitions"]]
                + [(o["created_at"], 1, o["id"], "  " + _outbox_line(o)) for o in h["outbox"]]
                + [(r["at"], 2, r["offset"], "  " + _record_line(r)) for r in archive["records"]])
    lines.append("timeline:" if timeline else "timeline: no transitions or outbox records kept")
    lines += [line for *_, line in sorted(timeline)]
    lines += [f"  ARCHIVE FILE NOT READ: {d}" for d in archive["damaged"]]
    return "\n".join(lines)


def _with_archive(history: dict[str, Any] | None, op_key: str, archived: dict[str, Any]) -> dict[str, Any] | None:
    """`history` (None: no ledger row) with what the archive and the topics hold of the op key; the
    archived transitions the ledger no longer keeps join its timeline. None when neither has any."""
    if history is None and not archived["records"] and not archived["transitions"]:
        return None
    history = history or {"op_key": op_key, "ledger": None, "transitions": [], "outbox": [], "replay_ids": [],
                          "dead_letter": None}
    kept = {t["id"] for t in history["transitions"]}
    history["transitions"] = sorted([*history["transitions"],
                                     *(t for t in archived["transitions"] if t["id"] not in kept)],
                                    key=lambda t: t["id"])
    history["archive"] = archived
    return history


def tenant_text(page: dict[str, Any]) -> str:
    """A tenant's page as a person reads it: one line per operation, then how to see more."""
    what = f"tenant {page['tenant']}" + (f", kind {page['kind']}" if page["kind"] else "")
    lines = [f"{what}: {len(page['operations'])} operation(s)" + (" on this page" if page["next"] else "")]
    lines += [f"  {o['op_key']}  {o['state']}  attempt {o['attempt']}  due {o['due_at']}  updated {o['updated_at']}"
              + (f"  last failure {o['last_failure_class']}" if o["last_failure_class"] else "")
              for o in page["operations"]]
    if page["next"]:
        lines.append(f"more: add --after {page['next']}")
    return "\n".join(lines)


def _several_text(operations: list[dict[str, Any]], more: bool, narrow: str) -> str:
    """Several operations' histories, and a last line when there were more than shown."""
    return "\n\n".join([history_text(h) for h in operations]
                        + ([f"(more than {CORRELATION_LIMIT} {narrow})"] if more else []))


@main.command()
@click.argument("op_key", required=False)
@click.option("--subject", nargs=2, default=None, metavar="KIND ID",
              help="Show the operation of this kind on the business row with this id instead.")
@click.option("--correlation-id", default=None, metavar="ID",
              help="Show the operations created with this correlation id (or, if none was, whose "
                   "transitions carry it) instead.")
@click.option("--tenant", default=None, help="List this tenant's operations instead, a page at a time, by kind.")
@click.option("--kind", default=None, help="With --tenant: only this kind's operations.")
@click.option("--after", default=None, metavar="OP_KEY", help="With --tenant: the page after this op key.")
@click.option("--limit", type=click.IntRange(1, TENANT_PAGE_MAX), default=TENANT_PAGE, show_default=True,
              help="With --tenant: operations per page.")
@click.option("--since", type=TIMESTAMP, default=None,
              help=f"With --correlation-id: look at transitions from this time ({TIMESTAMP_FORMS}). "
                   "[default: 24 hours ago]")
@click.option("--until", type=TIMESTAMP, default=None,
              help="With --correlation-id: look at transitions before this time. [default: now]")
@click.option("--archive", "archive_url", metavar="URL",
              help="With OP_KEY: also its records in the archive at URL and on the topics, and the transitions the "
                   "archive keeps (--since/--until bound that read).")
@setting_option("database.url")
@setting_option("kafka.bootstrap_servers")
@setting_option("kinds.file", "--kinds-file")
@setting_option("topics.file")
@setting_option("topics.prefix")
@log_options
@click.option("--json", "as_json", is_flag=True, help="Print the history as JSON.")
@pass_settings
def show(settings: Settings, op_key: str | None, subject: tuple[str, str] | None, correlation_id: str | None,
         tenant: str | None, kind: str | None, after: str | None, limit: int, since: datetime | None,
         until: datetime | None, archive_url: str | None, as_json: bool) -> None:
    """One operation's whole history: its ledger row, transitions (failed attempts with class and
    reason, replays), outbox records with when each was sent, and its dead letter; times in UTC.
    Or a tenant's operations (--tenant), a page at a time. KIND:SUBJECT of a kind with a generation
    shows each lapse of the subject (KIND:SUBJECT@GENERATION one of them)."""
    # function-local: keeps `lapse --help` fast
    from lapse.kernel.database import engine_from_settings
    from lapse.kernel.ledger import InvalidOpKey, parse_op_key
    from lapse.kernel.ledger import op_key as key_of
    from lapse.readers import correlated_op_keys, iso, lapse_op_keys, operation_history, tenant_operations
    from lapse.shell.known_names import refuse_unknown

    if sum(x is not None for x in (op_key, subject, correlation_id, tenant)) != 1:
        raise click.UsageError("give exactly one of OP_KEY, --subject KIND ID, --correlation-id ID or --tenant T")
    if archive_url is not None and op_key is None and subject is None:
        raise click.UsageError("--archive goes with OP_KEY or --subject")
    if correlation_id is None and (since or until) and archive_url is None:
        raise click.UsageError("--since and --until go with --correlation-id or --archive")
    if tenant is None and (kind or after):
        raise click.UsageError("--kind and --after go with --tenant")
    try:
        if subject is not None:
            op_key = key_of(*subject)
        for key in (op_key, after):
            if key is not None:
                parse_op_key(key)
    except InvalidOpKey as exc:
        raise click.UsageError(str(exc)) from None
    if tenant is not None:
        engine = engine_from_settings(settings)
        try:
            with engine.connect() as conn:
                refuse_unknown(conn, settings, kind=kind, tenant=tenant)
                page = tenant_operations(conn, tenant, kind, after, limit)
        finally:
            engine.dispose()
        emit(page, as_json, tenant_text)
        return
    asked = (since, until)  # --archive reads what they bound; unbounded when not given
    now = datetime.now(UTC)
    until = until or now
    since = since or until - CORRELATION_LOOKBACK
    if since >= until:
        raise click.UsageError(f"--since {iso(since)} is not before --until {iso(until)}: the window holds nothing")
    topology = settings.topology
    engine = engine_from_settings(settings)
    try:
        with engine.connect() as conn:
            if subject is not None:
                refuse_unknown(conn, settings, kind=subject[0])
            if correlation_id is None:
                history = operation_history(conn, str(op_key), topology)
                lapses = lapse_op_keys(conn, str(op_key), CORRELATION_LIMIT + 1)
                several = bool(lapses) and lapses != [op_key]  # the lapses of a kind with a generation
                found = [h for h in (operation_history(conn, k, topology) for k in lapses[:CORRELATION_LIMIT])
                         if h is not None] if several else []
            else:
                keys = correlated_op_keys(conn, correlation_id, since, until, CORRELATION_LIMIT + 1)
                found = [h for h in (operation_history(conn, k, topology) for k in keys[:CORRELATION_LIMIT])
                         if h is not None]
    finally:
        engine.dispose()
    if correlation_id is None:
        if several:
            emit({"op_key": op_key, "more": len(lapses) > CORRELATION_LIMIT, "operations": found}, as_json,
                 lambda d: _several_text(d["operations"], d["more"], "operations: name one with its @generation"))
            return
        if archive_url is not None:
            history = _with_archive(history, str(op_key), _archived(settings, archive_url, str(op_key), *asked))
            if history is None:
                raise CommandFailed(ExitCode.PROBLEM_FOUND, f"no operation {op_key} in the ledger, the archive "
                                                            "or the topics")
        if history is None:
            raise CommandFailed(ExitCode.PROBLEM_FOUND, f"no operation {op_key} in the ledger")
        emit(history, as_json, history_text)
        return
    if not found:
        raise CommandFailed(ExitCode.PROBLEM_FOUND, f"no operation with correlation id {correlation_id} "
                                                    f"in transitions from {iso(since)} to {iso(until)}")
    more = len(keys) > CORRELATION_LIMIT
    emit({"correlation_id": correlation_id, "since": iso(since), "until": iso(until), "more": more,
          "operations": found}, as_json,
         lambda d: _several_text(d["operations"], d["more"], "operations: narrow --since/--until"))


def _archived(settings: Settings, url: str, op_key: str, since: datetime | None, until: datetime | None
              ) -> dict[str, Any]:
    """What the archive at `url` and the topics hold of `op_key` (a refused archive: one line, exit 3)."""
    # function-local: keeps `lapse --help` fast
    from lapse.archive import ArchiveReader, ArchiveRefused, ArchiveUrlError, ManifestError
    from lapse.kernel.kafka_logs import leave_connection_failures_to_caller
    from lapse.readers import archived_operation

    leave_connection_failures_to_caller()  # an unreachable broker is the error boundary's one line
    try:
        with ArchiveReader.open(url, settings) as archive:
            return archived_operation(settings, archive, op_key, since, until)
    except (ArchiveUrlError, ArchiveRefused, ManifestError) as exc:
        raise CommandFailed(ExitCode.CONFIG, f"show: --archive: {exc}") from None

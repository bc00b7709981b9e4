"""Dead letters: grouped by kind, failure class and reason with their counts and the total, listed
a page at a time (keyset along ix_lapse_ledger_dead_letters), and the poison records of the DLQ
topic. An operator replays or discards the ticked ones, or every one matching the filters up to
the replay bound, after a dry run and a confirmation with a reason (recorded as an operator
action). `/api/v1/dead-letters` is the same list as JSON."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from starlette.concurrency import run_in_threadpool
from starlette.datastructures import FormData
from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import BaseRoute, Route

from lapse import operator_actions
from lapse.readers import dead_letter_groups
from lapse.shell.console import views
from lapse.shell.console.access import AccessRefused, Identity

if TYPE_CHECKING:
    from lapse.shell.console.core import Console

PAGE_SIZE = 100
FILTER_FIELDS = ("kind", "tenant", "failure_class", "reason", "since", "until")


def list_data(console: Console, flt: views.DeadLetterFilter) -> dict[str, Any]:
    """One page of dead letters under `flt`, their groups and total, and the poison records."""
    with ThreadPoolExecutor(1, thread_name_prefix="console-poison") as pool:  # the broker while the database
        poisoned = pool.submit(views.poison_of, console.settings, flt)
        with console.engine.connect() as conn:
            rows = flt.rows(conn, limit=PAGE_SIZE + 1)
            grouped = dead_letter_groups(conn, kind=flt.kind, tenant=flt.tenant, failure_class=flt.failure_class,
                                         since=flt.since, until=flt.until)
        poison, poison_error = poisoned.result()
    if flt.reason:  # the groups stay those of the other filters; the total is the chosen group's
        chosen = [g for g in grouped["groups"] if g["reason"] == flt.reason]
        grouped = {**grouped, "total": sum(g["count"] for g in chosen)}
    more = len(rows) > PAGE_SIZE
    rows = rows[:PAGE_SIZE]
    following = flt.query(after_at=rows[-1]["finished_at"].isoformat(), after_key=rows[-1]["op_key"]) if more else None
    return {"dead_letters": rows, "groups": grouped["groups"], "total": grouped["total"],
            "total_capped": grouped["capped"], "next": following, "poison": poison, "poison_error": poison_error,
            "page_size": PAGE_SIZE, "replay_limit": views.REPLAY_LIMIT}


def selected(console: Console, form: FormData, *, discard: bool) -> list[str]:
    """The op keys a form names: those ticked, or with `match=1` every dead letter under the form's
    filters up to the replay bound (a replay skips those replayed once, unless asked not to)."""
    if form.get("match") != "1":
        return [str(k) for k in form.getlist("op_key")]
    flt = views.DeadLetterFilter.parse({f: str(form.get(f) or "") for f in FILTER_FIELDS})
    if flt.problems:
        raise AccessRefused(400, "; ".join(flt.problems))
    replayed = None if discard or form.get("include_replayed") == "1" else False
    with console.engine.connect() as conn:
        rows = flt.rows(conn, limit=views.REPLAY_LIMIT, replayed=replayed, paged=False)
    return [r["op_key"] for r in rows]


def routes(console: Console) -> list[BaseRoute]:
    def page(request: Request, who: Identity) -> dict[str, Any]:
        flt = views.DeadLetterFilter.parse(dict(request.query_params))
        return {"filter": flt, **list_data(console, flt)}

    def api(request: Request, who: Identity) -> dict[str, Any]:
        flt = views.DeadLetterFilter.parse(dict(request.query_params))
        if flt.problems:
            raise AccessRefused(400, "; ".join(flt.problems))
        return list_data(console, flt)

    async def preview(request: Request, discard: bool) -> Response:
        """The dry run of a replay or discard, with the confirmation form."""
        try:
            who, form = await console.acting(request)
            op_keys = await run_in_threadpool(selected, console, form, discard=discard)
        except AccessRefused as exc:
            return console.refused(request, console.who_quietly(request), exc)
        include_replayed = form.get("include_replayed") == "1"
        selection = (operator_actions.discard_selection(op_keys=tuple(op_keys)) if discard
                     else views.replay_selection(op_keys, include_replayed))
        noun = "discard" if discard else "replay"
        if not selection.op_keys:
            return console.render(request, who, "error.html", 400, title="Nothing selected",
                                  message=f"tick the dead letters to {noun} first, or choose every one matching")
        found = await run_in_threadpool(operator_actions.preview, console.engine, selection, views.REPLAY_LIMIT)
        count = found["matching"]
        action = {"title": noun.capitalize(), "noun": noun, "verb": "discard" if discard else "release",
                  "count": count, "none": "is still a dead letter" if discard else "is waiting for a replay"}
        if discard:
            action |= {"warning": "A discarded dead letter is never retried or replayed.",
                       "button": f"Discard {count} dead letter(s) for good"}
        else:
            action |= {"button": f"Release {count} dead letter(s)"}
        return console.render(request, who, "action_preview.html", preview=found, include_replayed=include_replayed,
                              action=action)

    async def confirm(request: Request, discard: bool) -> Response:
        """The confirmed action, recorded with the actor's name; then the action's page."""
        try:
            who, form = await console.acting(request)
        except AccessRefused as exc:
            return console.refused(request, console.who_quietly(request), exc)
        reason = str(form.get("reason") or "").strip()
        op_keys = [str(k) for k in form.getlist("op_key")]
        noun = "discard" if discard else "replay"
        if not reason or not op_keys:
            return console.render(request, who, "error.html", 400, title="Not done",
                                  message=f"a {noun} needs the dead letters and a reason (kept in the audit trail)")
        shown_text = str(form.get("shown") or "0")
        shown = int(shown_text) if shown_text.isdigit() else 0
        if discard:
            done = await run_in_threadpool(lambda: operator_actions.run_discard(
                console.engine, operator_actions.discard_selection(op_keys=tuple(op_keys)), limit=views.REPLAY_LIMIT,
                actor=who.name, reason=reason, shown=shown, via="console"))
        else:
            selection = views.replay_selection(op_keys, form.get("include_replayed") == "1")
            done = await run_in_threadpool(lambda: operator_actions.run_replay(
                console.engine, selection, limit=views.REPLAY_LIMIT, actor=who.name, reason=reason, shown=shown,
                expiry_topic=console.settings.topology.expiry, via="console"))
        if done["action_id"] is None:
            waiting = "is still a dead letter" if discard else "is waiting any more"
            return console.render(request, who, "error.html", 409, title="Not done",
                                  message=f"nothing done: none of those dead letters {waiting}")
        return RedirectResponse(f"/actions/{done['action_id']}", status_code=303)

    async def replay_preview(request: Request) -> Response:
        return await preview(request, discard=False)

    async def discard_preview(request: Request) -> Response:
        return await preview(request, discard=True)

    async def replay_confirm(request: Request) -> Response:
        return await confirm(request, discard=False)

    async def discard_confirm(request: Request) -> Response:
        return await confirm(request, discard=True)

    return [Route("/dead-letters", console.page("dead_letters.html", page)),
            Route("/api/v1/dead-letters", console.api(api)),
            Route("/dead-letters/replay", replay_preview, methods=["POST"]),
            Route("/dead-letters/replay/confirm", replay_confirm, methods=["POST"]),
            Route("/dead-letters/discard", discard_preview, methods=["POST"]),
            Route("/dead-letters/discard/confirm", discard_confirm, methods=["POST"])]

"""The compose layout proven as processes: every service of compose/docker-compose.yml built from
the Lapse image runs its own command, with its own environment and config file, as a local process
against a local three-broker Apache Kafka cluster and PostgreSQL; a workload with retries and dead
letters runs to completion; every process stops on SIGTERM with exit 0; the audit's verdict holds.

What is kept as compose says: each service's command and arguments, its LAPSE_* variables (log
format and level, the sweep interval, the processor's session timeout and batch size, the report's
notifier), its config file as compose/make-secrets.sh makes it (minus what is mapped below), the
process service's three replicas, the one-shot migrate service's entrypoint (`lapse db upgrade &&
lapse topics apply`, run first, as depends_on orders it), topics.yaml as packaged (replication
factor 3, no prefix: the session's other cluster tests use prefixed names) and every horizon and
interval. Nothing is shortened for time (tests/fixtures/compose.py TIME_OVERRIDES is empty, and
asserted small).

What is mapped (tests/fixtures/compose.py MAPPED_ENV, MAPPED_FLAGS, its config-file list), because only
compose's network, TLS and volumes have it:
- the brokers `kafka-1..3:9092` become the local cluster, which speaks PLAINTEXT: each config
  file's [kafka] table (SASL_SSL, SCRAM-SHA-512, the role's own user, the CA) is dropped. SASL_SSL
  with a user per role and the ACLs `topics apply` creates are proven by
  tests/integration/test_secured_broker.py and tests/integration/test_acls.py;
- the schema registry becomes none (Avro single-object encoding): the repo has only a test double
  of it (tests/fixtures/registry.py), which the codec tests use for the Confluent format;
- the database `postgres:5432/lapse` with TLS becomes a fresh database of the local server, without
  TLS, prepared as compose's postgres first start prepares it: compose/postgres/init-roles.sh run by
  the cluster's owner makes one role per service, and the db-grants service (the same script's
  grants step, as the tables' owner) runs after migrate. Each service connects as its own role, with
  the password make-secrets.sh made; the roles' names carry a prefix of the test (roles are
  cluster-wide, the server shared). The application (its business tables, its publish API) is the
  test's: it grants its tables to the roles of the services that read or change them;
- ports (metrics 9400, analytics 6066, console 8088) become free local ports, bind addresses
  (0.0.0.0) 127.0.0.1, container paths (the reports volume, Faust's data folder) folders of the test.
- the kinds file compose mounts (compose/kinds.yaml, which declares no kind until a deployment
  declares its own) becomes the test's: the demo's reservations and a webhook kind (an HTTP server
  of the test answering 200, 503 then 200, 429 then 204, or 400) over the test's tables.

What cannot run as a local process, and is checked by tests/integration/test_compose.py instead: the
non-Lapse services (kafka-1..3 and kafka-init, postgres, schema-registry, kafka-ui, prometheus,
grafana: their images are not here and Docker cannot run on these machines; the postgres image's
init-roles.sh does run, see above), the Lapse
image itself (compose/Dockerfile), named volumes, the secrets' mounts and healthchecks/depends_on
conditions (their structure only).
"""

from __future__ import annotations

import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import func, select, text

from lapse.devtools.demo_data import add_reservations
from lapse.devtools.demo_kinds import RELEASE, packaged_kinds_file
from lapse.devtools.demo_tables import create_demo_tables, reservations
from lapse.kernel.codec import Codec
from lapse.kernel.database import make_engine
from lapse.kernel.ledger import expiry_event
from lapse.kernel.models import cleanup_ledger, findings, ledger_transitions, outbox
from lapse.kernel.settings import load_settings
from lapse.readers.analytics import VIEW_PATH
from tests.fixtures.compose import (
    ADDED_ENV,
    MAPPED_ENV,
    TIME_OVERRIDES,
    LocalStack,
    depends_on,
    is_one_shot,
    lapse_services,
    load_compose,
    start_order,
)
from tests.fixtures.effects import Answer, ScriptedHttpServer, hook_kind, hooks_table
from tests.fixtures.kafka import partitions_behind
from tests.fixtures.pipeline import Pipeline, produce
from tests.fixtures.polling import eventually
from tests.fixtures.processes import RoleProcess, run_lapse

HOOK = "notify-hook"
RESERVATIONS = 20
# One script per hook (the server's answers per script are consumed in order across requests).
HOOK_SCRIPTS = {
    **{f"ok-{i}": [Answer(200)] for i in range(4)},
    **{f"flaky-{i}": [Answer(503), Answer(200)] for i in range(3)},           # temporary: one retry
    **{f"limited-{i}": [Answer(429, {"Retry-After": "1"}), Answer(204)] for i in range(2)},  # no attempt burnt
    **{f"bad-{i}": [Answer(400, body=b'{"error": "unknown hook"}')] for i in range(3)},  # invalid: dead letter
}
INVALID_SUBJECTS = ["not-a-number-1", "not-a-number-2"]  # published by the application: dead letters
RETRIED = [s for s in HOOK_SCRIPTS if s.startswith(("flaky", "limited"))]
DEAD = [s for s in HOOK_SCRIPTS if s.startswith("bad")]
APPLIED = RESERVATIONS + len(HOOK_SCRIPTS) - len(DEAD)
DEAD_LETTERS = len(DEAD) + len(INVALID_SUBJECTS)
OPERATIONS = RESERVATIONS + len(HOOK_SCRIPTS) + len(INVALID_SUBJECTS)
# The outcomes the analytics view counts, by kind and status.
ANALYTICS_TOTALS = {f"{RELEASE}|applied": RESERVATIONS, f"{RELEASE}|dead_letter": len(INVALID_SUBJECTS),
                    f"{HOOK}|applied": len(HOOK_SCRIPTS) - len(DEAD), f"{HOOK}|dead_letter": len(DEAD),
                    f"{HOOK}|retry_scheduled": len(RETRIED)}
EXIT_BOUND_S = 30.0
# Long-running services and what each serves over HTTP locally (compose: metrics on 9400 for those
# with LAPSE_RUNTIME__METRICS_PORT and a handler; analytics' view; the console's login page).
SERVES_METRICS = {"sweep", "process", "relay", "delay", "reconcile", "monitor", "report"}
# The long-running services with a database role (`lapse status --watch` keeps no clock finding).
CLOCK_FINDINGS = {"sweep", "process", "relay", "reconcile", "prune", "report", "console"}
# What a role's log shows when PostgreSQL refused it a statement.
REFUSED = ("permission denied", "InsufficientPrivilege", "must be owner")


def kinds_file(folder, hook_url: str):
    """The demo's release-reservation and a webhook kind (a retry a second or two later)."""
    demo = yaml.safe_load(packaged_kinds_file().read_text())["kinds"]
    kinds = {RELEASE: demo[RELEASE], HOOK: hook_kind(hooks_table("hooks"), hook_url)}
    path = folder / "kinds.yaml"
    path.write_text(yaml.safe_dump({"kinds": kinds}))
    return path


def scrape(port: int) -> dict[tuple, float] | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as resp:
            text = resp.read().decode()
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def get(url: str, context: ssl.SSLContext | None = None) -> tuple[int, str, dict[str, str]] | None:
    """(status, body, headers) of a GET that follows no redirect (over HTTPS trusting `context`);
    None while nothing listens."""
    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    try:
        with urllib.request.build_opener(NoRedirect, urllib.request.HTTPSHandler(context=context)).open(
                url, timeout=3) as resp:
            return resp.status, resp.read().decode(errors="replace"), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode(errors="replace"), dict(exc.headers)
    except (urllib.error.URLError, ConnectionError, TimeoutError):
        return None


def test_the_mapping_is_explicit_and_the_time_overrides_few():
    """Each variable a Lapse service sets is mapped (MAPPED_ENV) or kept; nothing is added; no
    value is changed for time."""
    compose = load_compose()
    services = lapse_services(compose)
    assert set(services) == {"migrate", "sweep", "process", "relay", "delay", "reconcile", "analytics",
                             "monitor", "prune", "report", "console"}
    set_anywhere = {var for s in services.values() for var in s.get("environment") or {}}
    assert set(MAPPED_ENV) <= set_anywhere  # the table names nothing compose no longer sets
    assert not ADDED_ENV
    assert len(TIME_OVERRIDES) <= 3
    order = start_order(services)
    assert order[0] == "migrate" and [n for n in order if is_one_shot(services[n])] == ["migrate"]
    grants = compose["services"]["db-grants"]
    assert depends_on(grants) == {"migrate": "service_completed_successfully"} and is_one_shot(grants)
    assert all(depends_on(services[n]) == {"db-grants": "service_completed_successfully"} for n in order[1:])


def _after(compose: dict, name: str) -> list[dict]:
    """The one-shot services outside the Lapse image that wait for `name` to complete (db-grants)."""
    return [spec for other, spec in compose["services"].items() if other not in lapse_services(compose)
            and is_one_shot(spec) and depends_on(spec).get(name) == "service_completed_successfully"]


@pytest.mark.slow
def test_compose_services_as_processes_run_a_workload_to_its_audit(three_brokers, compose_database, tmp_path):
    cluster = three_brokers  # compose's cluster: replication 3, min.insync.replicas 2
    """migrate runs to exit 0 as lapse_migrate on a database init-roles.sh prepared (with the
    application's tables), db-grants after it; then the other services start at once, 12
    processes, each as its own role, and clean up 34 operations: 20 reservations and 9 webhooks
    applied once each (5 after a retry through a delay tier), 3 webhooks and 2 published events
    dead-lettered with their reason. Each process served what it serves and recorded its clock
    finding, no statement of any was refused, each exits 0 on SIGTERM, and `lapse audit` over all
    history (migrate's settings) finds the invariants hold."""
    t0 = time.monotonic()
    phases: dict[str, float] = {}
    compose = load_compose()
    services = lapse_services(compose)
    server = ScriptedHttpServer()
    server.start()
    for script, answers in HOOK_SCRIPTS.items():
        server.script(script, *answers)
    # The application's tables, before Lapse is installed (compose's database starts empty), owned by
    # the application's role, which grants them to the services that read or change them.
    app = make_engine(compose_database.url)
    create_demo_tables(app)
    hooks = hooks_table("hooks")
    hooks.create(app)
    role = compose_database.role
    with app.begin() as conn:
        conn.execute(text(f"GRANT SELECT ON reservations, hooks TO {role('lapse_sweep')}, {role('lapse_reconcile')}, "
                          f"{role('lapse_monitor')}, {role('lapse_console')}"))
        conn.execute(text(f"GRANT SELECT, UPDATE ON reservations, hooks TO {role('lapse_process')}"))
    engine = make_engine(compose_database.service_url("migrate"))  # Lapse's tables, as their owner reads them
    stack = LocalStack(bootstrap=cluster.bootstrap, database=compose_database,
                       kinds_file=kinds_file(tmp_path, server.url), root=tmp_path / "stack")
    base = {k: v for k, v in os.environ.items() if not k.startswith("LAPSE_")}
    base["PATH"] = f"{os.path.dirname(sys.executable)}{os.pathsep}{base.get('PATH', '')}"  # the image's `lapse`
    logs = tmp_path / "logs"
    logs.mkdir()
    running: dict[str, RoleProcess] = {}
    env_of: dict[str, dict[str, str]] = {}
    try:
        for name in start_order(services):
            spec = services[name]
            replicas = int((spec.get("deploy") or {}).get("replicas", 1))
            for n in range(1, replicas + 1):
                process = name if replicas == 1 else f"{name}-{n}"
                env = stack.service_env(process, name, spec)
                env_of[process] = env
                argv = stack.argv(process, spec)
                if is_one_shot(spec):
                    phases[f"setup until {name}"] = time.monotonic() - t0
                    done = _run_one_shot(argv, {**base, **env}, stack.workdir(process))
                    assert done[0] == 0, f"{name}: {argv} exited {done[0]}\n{done[1]}"
                    for follower in _after(compose, name):  # db-grants, once migrate made the tables
                        compose_database.run_service(follower)
                    continue
                log = logs / f"{process}.log"
                with log.open("w") as err:
                    proc = subprocess.Popen(argv, env={**base, **env}, cwd=stack.workdir(process),
                                            stdin=subprocess.DEVNULL, stdout=err, stderr=err)
                running[process] = RoleProcess(name, proc, log)
            if name == "migrate":  # the business rows arrive once Lapse is installed
                phases["migrate done"] = time.monotonic() - t0
                _seed(app, hooks)
        _publish_invalid(engine, stack)  # the publish API, on the owner's connection
        assert {r.command for r in running.values()} == set(services) - {"migrate"}
        assert sum(r.command == "process" for r in running.values()) == 3

        def alive() -> None:
            for process, role in running.items():
                assert role.proc.poll() is None, f"{process} exited {role.proc.returncode}:\n{role.tail(30)}"

        def done() -> bool:
            alive()
            with engine.connect() as conn:
                states = dict(conn.execute(select(cleanup_ledger.c.state, func.count())
                                           .group_by(cleanup_ledger.c.state)).all())
                unsent = conn.execute(select(func.count()).where(outbox.c.sent_at.is_(None))).scalar()
            return (states == {"applied": APPLIED, "dead_letter": DEAD_LETTERS} and unsent == 0
                    and not partitions_behind(cluster.bootstrap, "lapse-cleanup", "lapse.expiry", 12))

        eventually(done, timeout_s=120, interval_s=0.5, what="every operation terminal and every outcome relayed")
        phases["work done"] = time.monotonic() - t0

        def served() -> dict | None:
            alive()
            shown = {}
            for process, role in running.items():
                ports = stack.ports.get(process, {})
                if role.command in SERVES_METRICS:
                    shown[process] = scrape(ports["metrics"])
                elif role.command == "analytics":
                    page = get(f"http://127.0.0.1:{ports['web-port']}{VIEW_PATH}")
                    shown[process] = json.loads(page[1]) if page and page[0] == 200 else None
                elif role.command == "console":
                    trust = ssl.create_default_context(cafile=str(stack.database.secrets / "ca.pem"))  # compose's CA
                    shown[process] = (get(f"https://127.0.0.1:{ports['port']}/login", trust),
                                      get(f"https://127.0.0.1:{ports['port']}/", trust))
            monitor, view = shown.get("monitor") or {}, shown.get("analytics") or {}
            reports = list(stack.container_path("report", "/app/.lapse/reports").iterdir())
            ok = (all(shown.values()) and monitor.get(("lapse_ledger_rows", (("state", "applied"),))) == APPLIED
                  and view.get("totals") == ANALYTICS_TOTALS and reports)
            return shown if ok else None

        shown = eventually(served, timeout_s=60, interval_s=0.5,
                           what="metrics, the analytics view, the console and a report file")
        phases["served"] = time.monotonic() - t0
    finally:
        for role in running.values():
            if role.proc.poll() is None:
                role.terminate()
        codes = {process: role.wait_exit(EXIT_BOUND_S) for process, role in running.items()}
        for role in running.values():
            if role.proc.poll() is None:
                role.kill()
        server.stop()
        phases["stopped"] = time.monotonic() - t0
    assert codes == dict.fromkeys(running, 0), {p: (c, running[p].tail(15)) for p, c in codes.items() if c != 0}

    # What each process served while it ran.
    monitor = shown["monitor"]
    assert monitor[("lapse_ledger_rows", (("state", "dead_letter"),))] == DEAD_LETTERS
    applied_by_replica = [shown[f"process-{n}"].get(("lapse_effects_applied_total", ()), 0) for n in (1, 2, 3)]
    assert sum(applied_by_replica) == APPLIED, applied_by_replica
    login, home = shown["console"]
    assert login[0] == 200 and "token" in login[1].lower()
    assert home[0] == 303 and home[2]["location"].startswith("/login")  # its config's tokens are in force
    assert shown["analytics"]["totals"] == ANALYTICS_TOTALS  # every outcome the relay published, counted once

    # Each operation applied once or dead-lettered with its reason; retries did not reset attempts.
    with engine.connect() as conn:
        rows = {r["op_key"]: r for r in conn.execute(select(cleanup_ledger)).mappings()}
        applied_per_key = Counter(conn.execute(select(ledger_transitions.c.op_key)
                                               .where(ledger_transitions.c.to_state == "applied")).scalars())
        clocks = set(conn.execute(select(findings.c.subject).where(findings.c.role == "clock")).scalars())
    with app.connect() as conn:
        released = conn.execute(select(func.count()).where(reservations.c.status == "released")).scalar()
        hook_status = dict(conn.execute(select(hooks.c.script, hooks.c.status)).all())
    # Each service with a database role ran as that role and was refused nothing.
    refused = {p: line for p, r in running.items() for line in r.log.read_text().splitlines()
               if any(word in line for word in REFUSED)}
    assert not refused, refused
    assert {subject.split()[0] for subject in clocks} == CLOCK_FINDINGS
    assert len(rows) == OPERATIONS and set(applied_per_key.values()) == {1} and len(applied_per_key) == APPLIED
    dead = {k: r for k, r in rows.items() if r["state"] == "dead_letter"}
    assert {r["last_failure_class"] for r in dead.values()} == {"invalid"}
    assert all(r["last_failure"] for r in dead.values())
    assert all(r["last_failure"].startswith("HTTP 400") for k, r in dead.items() if k.startswith(HOOK))
    assert released == RESERVATIONS
    assert hook_status == {s: "open" if s in DEAD else "notified" for s in HOOK_SCRIPTS}
    by_script = {s: len([r for r in server.received if r.path.startswith(f"/hooks/{s}/")]) for s in HOOK_SCRIPTS}
    assert by_script == {s: 2 if s in RETRIED else 1 for s in HOOK_SCRIPTS}

    # The audit, as compose's README runs it (the migrate service's settings), over all history.
    (audit,) = run_lapse(["audit", "--from-beginning", "--grace", "0s", "--json"], env=env_of["migrate"],
                         cwd=stack.workdir("migrate"))
    assert audit.code == 0, "\n".join(audit.stderr[-20:])
    report = json.loads(audit.stdout.splitlines()[-1])
    assert (report["verdict"], report["broken"], report["incomplete"]) == ("invariants hold", [], [])
    assert report["op_keys_seen"] == OPERATIONS and report["events_seen"] >= OPERATIONS + len(RETRIED)
    assert report["final_by_status"] == {"applied": APPLIED, "dead_letter": DEAD_LETTERS}
    assert report["outcomes_by_status"] == {"applied": APPLIED, "dead_letter": DEAD_LETTERS,
                                            "retry_scheduled": len(RETRIED)}
    assert (report["dead_letters"], report["applied_twice"], report["without_terminal"]) == (DEAD_LETTERS, {}, 0)
    engine.dispose()
    app.dispose()
    phases["audited"] = time.monotonic() - t0
    print("compose as processes:", {k: round(v, 1) for k, v in phases.items()},
          {p: round(r.exit_s or -1, 1) for p, r in running.items()})


def _run_one_shot(argv: list[str], env: dict[str, str], cwd) -> tuple[int, str]:
    done = subprocess.run(argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    return done.returncode, (done.stdout + done.stderr)[-3000:]


def _seed(engine, hooks) -> None:
    """The business rows: due reservations and webhooks (the sweep finds them; due a minute ago,
    within the reconciler's grace, so it re-emits none)."""
    due = datetime.now(UTC) - timedelta(minutes=1)
    with engine.begin() as conn:
        add_reservations(conn, RESERVATIONS, expires_at=due, tenant="t1")
        conn.execute(hooks.insert(), [{"tenant": "t1", "script": s, "status": "open", "due_at": due}
                                      for s in HOOK_SCRIPTS])


def _publish_invalid(engine, stack: LocalStack) -> None:
    """Two events the application publishes with a subject that is not a reservation id."""
    due = datetime.now(UTC) - timedelta(minutes=1)
    url = engine.url.render_as_string(hide_password=False)
    settings = load_settings(kafka={"bootstrap_servers": stack.bootstrap}, database={"url": url},
                             kinds={"file": stack.kinds_file})
    produce(Pipeline(settings, engine, Codec.from_settings(settings)),
            [expiry_event(RELEASE, s, "t1", due, source="publish", correlation_id=s) for s in INVALID_SUBJECTS])

#!/usr/bin/env bash
# One login role per Lapse service, each allowed only the statements its code runs. Two steps:
#
#   init-roles.sh          PostgreSQL's first start (docker-entrypoint-initdb.d, as the superuser):
#                          the roles and their passwords (the secrets compose/make-secrets.sh made),
#                          CONNECT for each, TEMPORARY for lapse_migrate only, and the schema `lapse`
#                          owned by lapse_migrate. Nobody but the superuser may create in the
#                          database or in `public`.
#   init-roles.sh grants   after every `lapse db upgrade` (compose's db-grants service), as
#                          lapse_migrate, the owner of every table it grants on: each role's grants,
#                          table by table, and column by column where it updates. Everything is
#                          revoked first, in the same transaction, so a run leaves exactly what is
#                          written below (and a table not listed is granted to nobody).
#
# Grants cannot be made at the first start: the tables do not exist before `lapse db upgrade`, and
# PostgreSQL's default privileges are per kind of statement on every future table, not per table
# or column. The grants step connects with libpq's variables (PGHOST, PGDATABASE, PGSSLMODE, …).
#
# The audit trail is append-only: lapse_transitions and lapse_operator_actions take INSERT (and
# SELECT) only, but for prune's horizon deletes of transitions. No service role is a member of the
# owner: prune rotates the time partitions through the owner's functions (migration 0011), which
# check their arguments. delay and analytics use no database and have no role. A declared kind's
# business table is granted to sweep/process/reconcile by its owner, table by table, next to the
# kinds file.
#
# A NEW TABLE: one line in the block of each role that uses it, below (and the test
# tests/integration/test_compose_roles.py fails for a table of the models no role is granted).
#
# SECRETS_DIR (default /run/secrets) and ROLE_PREFIX (default lapse_) exist for the tests, which run
# this script on a shared server where roles must not collide.
set -euo pipefail
secrets=${SECRETS_DIR:-/run/secrets}
prefix=${ROLE_PREFIX:-lapse_}
[[ $prefix =~ ^[a-z_][a-z0-9_]*$ ]] || { echo "init-roles.sh: bad ROLE_PREFIX $prefix" >&2; exit 2; }
secret() { cat "$secrets/db-$1.password"; }
migrate=${prefix}migrate sweep=${prefix}sweep process=${prefix}process relay=${prefix}relay
reconcile=${prefix}reconcile monitor=${prefix}monitor prune=${prefix}prune report=${prefix}report
console=${prefix}console
services="$sweep, $process, $relay, $reconcile, $monitor, $prune, $report, $console"
long_running="$sweep, $process, $relay, $reconcile, $prune, $report, $console"  # each keeps a clock finding

roles() {
  psql -v ON_ERROR_STOP=1 -q --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" <<SQL
REVOKE ALL ON DATABASE "$POSTGRES_DB" FROM PUBLIC;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
CREATE ROLE $migrate LOGIN PASSWORD '$(secret migrate)';
CREATE ROLE $sweep LOGIN PASSWORD '$(secret sweep)';
CREATE ROLE $process LOGIN PASSWORD '$(secret process)';
CREATE ROLE $relay LOGIN PASSWORD '$(secret relay)';
CREATE ROLE $reconcile LOGIN PASSWORD '$(secret reconcile)';
CREATE ROLE $monitor LOGIN PASSWORD '$(secret monitor)';
CREATE ROLE $prune LOGIN PASSWORD '$(secret prune)';
CREATE ROLE $report LOGIN PASSWORD '$(secret report)';
CREATE ROLE $console LOGIN PASSWORD '$(secret console)';
GRANT CONNECT ON DATABASE "$POSTGRES_DB" TO $migrate, $services;
-- Migrations may use temporary tables (0009 keeps index definitions in one while it rebuilds a
-- table): the schema's owner may create tables in it anyway, so TEMPORARY gives it nothing new.
-- No other role gets it.
GRANT TEMPORARY ON DATABASE "$POSTGRES_DB" TO $migrate;
CREATE SCHEMA lapse AUTHORIZATION $migrate;
SQL
  echo "lapse: database roles created (${migrate} owns schema lapse; one role per service)"
}

grants() {
  export PGUSER=${PGUSER:-$migrate}
  PGPASSWORD=$(secret migrate)
  export PGPASSWORD
  psql -v ON_ERROR_STOP=1 -q --single-transaction <<SQL
SET LOCAL search_path = lapse;
DO \$\$ BEGIN  -- an older version of this script made prune a member of the owner: refuse to go on
  IF pg_has_role('$prune', '$migrate', 'MEMBER') THEN
    RAISE EXCEPTION '$prune is a member of $migrate: as postgres, REVOKE $migrate FROM $prune';
  END IF;
END \$\$;
ALTER DEFAULT PRIVILEGES IN SCHEMA lapse REVOKE ALL ON TABLES FROM $services;
ALTER DEFAULT PRIVILEGES IN SCHEMA lapse REVOKE ALL ON SEQUENCES FROM $services;
REVOKE ALL ON ALL TABLES IN SCHEMA lapse FROM PUBLIC, $services;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA lapse FROM PUBLIC, $services;
REVOKE ALL ON ALL FUNCTIONS IN SCHEMA lapse FROM PUBLIC, $services;
REVOKE ALL ON SCHEMA lapse FROM PUBLIC, $services;

-- Every service: the schema, its version (the start-up check) and the findings, which the
-- long-running ones write (each process's clock; the reconciler's last pass; a worker's circuit).
GRANT USAGE ON SCHEMA lapse TO $services;
GRANT SELECT ON lapse_alembic_version TO $services;
GRANT SELECT ON lapse_findings TO $services;
GRANT INSERT, DELETE, UPDATE (at, until, summary, details) ON lapse_findings TO $long_running;

-- sweep: finds due business rows, creates their pending ledger rows, brings waiting ones forward.
GRANT SELECT, INSERT, UPDATE (due_at, updated_at)          ON lapse_ledger                       TO $sweep;
GRANT INSERT                                               ON lapse_transitions                  TO $sweep;
GRANT USAGE                                                ON SEQUENCE lapse_transitions_id_seq  TO $sweep;

-- process: claims, applies, retries and dead-letters; withdraws a ledger row it inserted in the
-- same batch when its effect changed nothing.
GRANT SELECT, INSERT, DELETE, UPDATE (state, attempt, due_at, claim_owner, claim_until, last_failure_class,
  last_failure, duplicates, updated_at, finished_at)       ON lapse_ledger                       TO $process;
GRANT SELECT, INSERT                                       ON lapse_transitions                  TO $process;
GRANT INSERT                                               ON lapse_outbox                       TO $process;
GRANT USAGE                                                ON SEQUENCE lapse_transitions_id_seq  TO $process;
GRANT USAGE                                                ON SEQUENCE lapse_outbox_id_seq       TO $process;
-- the brakes: reads the pauses every batch, pauses a kind whose budget it spent, counts budgets
-- (deleting usage far past its window), records what a shadow-mode kind would do.
GRANT SELECT, INSERT                                       ON lapse_pauses                       TO $process;
GRANT SELECT, INSERT, DELETE                               ON lapse_budget_usage                 TO $process;
GRANT USAGE                                                ON SEQUENCE lapse_budget_usage_id_seq TO $process;
GRANT SELECT, INSERT, UPDATE (at, outcome, would)          ON lapse_shadow_effects               TO $process;
-- call limits shared by every worker: the routes' pacing, the concurrency slots, the last minute's figures.
GRANT SELECT, INSERT, UPDATE (ceiling_per_s, rate_per_s, rate_at, next_at, lowered_at, blocked_until, concurrency)
                                                           ON lapse_limit_routes                 TO $process;
GRANT SELECT, INSERT, UPDATE (holder, until)               ON lapse_limit_slots                  TO $process;
GRANT SELECT, INSERT, DELETE, UPDATE (at, in_flight, calls, throttled, waited_s, called_s, window_s)
                                                           ON lapse_limit_stats                  TO $process;

-- relay: publishes the outbox and marks its rows sent.
GRANT SELECT, UPDATE (sent_at)                             ON lapse_outbox                       TO $relay;

-- reconcile: re-emits what never produced an event or got stuck; releases parked work whose brake
-- is off (held or shadowed → pending, its event through the outbox).
GRANT SELECT, INSERT, UPDATE (state, due_at, updated_at)   ON lapse_ledger                       TO $reconcile;
GRANT INSERT                                               ON lapse_transitions                  TO $reconcile;
GRANT INSERT                                               ON lapse_outbox                       TO $reconcile;
GRANT SELECT                                               ON lapse_pauses                       TO $reconcile;
GRANT USAGE                                                ON SEQUENCE lapse_transitions_id_seq  TO $reconcile;
GRANT USAGE                                                ON SEQUENCE lapse_outbox_id_seq       TO $reconcile;

-- monitor (lapse status --watch): reads.
GRANT SELECT                                               ON lapse_ledger                       TO $monitor;
GRANT SELECT                                               ON lapse_transitions                  TO $monitor;
GRANT SELECT                                               ON lapse_transitions_default          TO $monitor;
GRANT SELECT                                               ON lapse_outbox                       TO $monitor;
GRANT SELECT                                               ON lapse_outbox_default               TO $monitor;
GRANT SELECT                                               ON lapse_daily_reports                TO $monitor;
GRANT SELECT                                               ON lapse_operator_actions             TO $monitor;
GRANT SELECT                                               ON lapse_pauses                       TO $monitor;
GRANT SELECT                                               ON lapse_limit_routes                 TO $monitor;
GRANT SELECT                                               ON lapse_limit_slots                  TO $monitor;
GRANT SELECT                                               ON lapse_limit_stats                  TO $monitor;

-- prune: removes what retention no longer keeps, deletes DEFAULT's old rows, and rotates the time
-- partitions through the owner's functions.
GRANT SELECT, DELETE                                       ON lapse_ledger                       TO $prune;
GRANT SELECT, DELETE                                       ON lapse_transitions                  TO $prune;
GRANT SELECT, DELETE                                       ON lapse_transitions_default          TO $prune;
GRANT SELECT, DELETE                                       ON lapse_outbox                       TO $prune;
GRANT SELECT, DELETE                                       ON lapse_outbox_default               TO $prune;
GRANT SELECT, DELETE                                       ON lapse_shadow_effects               TO $prune;
GRANT EXECUTE                                              ON FUNCTION lapse_create_partition(text, timestamptz) TO $prune;
GRANT EXECUTE                                              ON FUNCTION lapse_drop_partition(text, text) TO $prune;

-- report: reads the ledger and transitions; stores, rebuilds and marks delivered the daily reports.
GRANT SELECT                                               ON lapse_ledger                       TO $report;
GRANT SELECT                                               ON lapse_transitions                  TO $report;
GRANT SELECT, INSERT, UPDATE (payload, created_at, delivered_at, attempts, last_error)
                                                           ON lapse_daily_reports                TO $report;

-- console: every page reads; a replay or discard moves dead letters and records the operator action.
GRANT SELECT, UPDATE (state, attempt, due_at, claim_owner, claim_until, replay_id, updated_at,
  finished_at)                                             ON lapse_ledger                       TO $console;
GRANT SELECT, INSERT                                       ON lapse_transitions                  TO $console;
GRANT SELECT                                               ON lapse_transitions_default          TO $console;
GRANT SELECT, INSERT                                       ON lapse_outbox                       TO $console;
GRANT SELECT                                               ON lapse_outbox_default               TO $console;
GRANT SELECT                                               ON lapse_daily_reports                TO $console;
GRANT SELECT, INSERT                                       ON lapse_operator_actions             TO $console;
GRANT USAGE                                                ON SEQUENCE lapse_transitions_id_seq  TO $console;
GRANT USAGE                                                ON SEQUENCE lapse_outbox_id_seq       TO $console;
GRANT USAGE                                                ON SEQUENCE lapse_operator_actions_id_seq TO $console;
-- the brakes' page: pause and resume (a resumed budget's usage forgotten), the shadow runs' results.
GRANT SELECT, INSERT, DELETE                               ON lapse_pauses                       TO $console;
GRANT SELECT, DELETE                                       ON lapse_budget_usage                 TO $console;
GRANT SELECT                                               ON lapse_shadow_effects               TO $console;
GRANT SELECT                                               ON lapse_limit_routes                 TO $console;
GRANT SELECT                                               ON lapse_limit_slots                  TO $console;
GRANT SELECT                                               ON lapse_limit_stats                  TO $console;
SQL
  echo "lapse: grants applied (each service's role: its tables, and its columns where it updates)"
}

case "${1:-roles}" in
  roles) roles ;;
  grants) grants ;;
  *) echo "usage: init-roles.sh [roles|grants]" >&2; exit 2 ;;
esac

#!/usr/bin/env bash
# PostgreSQL's first start (docker-entrypoint-initdb.d): one login role per Lapse service, each with
# only what its work needs. `lapse_migrate` owns the schema `lapse` and creates Lapse's tables in it
# (`lapse db upgrade`); the others get, through default privileges on what lapse_migrate creates
# there, only the statements their code runs. Nobody but the postgres superuser may create in the
# database or in `public`. Passwords come from the secrets compose/make-secrets.sh generated.
#
#   migrate    owner of schema lapse (DDL: tables, indexes, the version table)
#   sweep      SELECT, INSERT, UPDATE   (pending ledger rows, outbox rows)
#   process    SELECT, INSERT, UPDATE, DELETE (claims, transitions, outbox rows; a ledger row it
#                                       inserted in the same batch withdrawn when its effect
#                                       changed nothing)
#   relay      SELECT, UPDATE           (the outbox: read, mark sent; prune removes sent rows)
#   reconcile  SELECT, INSERT, UPDATE   (re-emits: pending ledger rows, stuck rows, outbox rows)
#   monitor    SELECT                   (`lapse status`)
#   prune      SELECT, DELETE           (retention: finished ledger rows, sent outbox rows), and a
#                                       member of lapse_migrate: rotating the time partitions of
#                                       transitions and the outbox (create, attach, detach, drop)
#                                       is DDL, which PostgreSQL allows only the tables' owner
#   report     SELECT, INSERT, UPDATE   (reads the ledger and transitions; stores, rebuilds and
#                                       marks delivered the daily reports)
#   console    SELECT, INSERT, UPDATE   (every page reads; a replay updates ledger rows and adds
#                                       transitions, outbox rows and an operator action)
# delay and analytics use no database and have no role. Privileges are granted per kind of
# statement on every table lapse_migrate creates (the tables do not exist yet when this runs), so
# report's INSERT and UPDATE reach beyond its reports table. A declared kind's business table is
# granted to sweep/process/reconcile by its owner, table by table, next to the kinds file.
set -euo pipefail
secret() { cat "/run/secrets/db-$1.password"; }
psql -v ON_ERROR_STOP=1 -q --username "$POSTGRES_USER" --dbname "$POSTGRES_DB" <<SQL
REVOKE ALL ON DATABASE "$POSTGRES_DB" FROM PUBLIC;
REVOKE CREATE ON SCHEMA public FROM PUBLIC;
CREATE ROLE lapse_migrate LOGIN PASSWORD '$(secret migrate)';
CREATE ROLE lapse_sweep LOGIN PASSWORD '$(secret sweep)';
CREATE ROLE lapse_process LOGIN PASSWORD '$(secret process)';
CREATE ROLE lapse_relay LOGIN PASSWORD '$(secret relay)';
CREATE ROLE lapse_reconcile LOGIN PASSWORD '$(secret reconcile)';
CREATE ROLE lapse_monitor LOGIN PASSWORD '$(secret monitor)';
CREATE ROLE lapse_prune LOGIN PASSWORD '$(secret prune)';
CREATE ROLE lapse_report LOGIN PASSWORD '$(secret report)';
CREATE ROLE lapse_console LOGIN PASSWORD '$(secret console)';
GRANT CONNECT ON DATABASE "$POSTGRES_DB"
  TO lapse_migrate, lapse_sweep, lapse_process, lapse_relay, lapse_reconcile, lapse_monitor, lapse_prune,
     lapse_report, lapse_console;
CREATE SCHEMA lapse AUTHORIZATION lapse_migrate;
GRANT lapse_migrate TO lapse_prune;
GRANT USAGE ON SCHEMA lapse TO lapse_sweep, lapse_process, lapse_relay, lapse_reconcile, lapse_monitor,
  lapse_prune, lapse_report, lapse_console;
ALTER DEFAULT PRIVILEGES FOR ROLE lapse_migrate IN SCHEMA lapse
  GRANT SELECT, INSERT, UPDATE ON TABLES TO lapse_sweep, lapse_reconcile, lapse_report, lapse_console;
ALTER DEFAULT PRIVILEGES FOR ROLE lapse_migrate IN SCHEMA lapse
  GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO lapse_process;
ALTER DEFAULT PRIVILEGES FOR ROLE lapse_migrate IN SCHEMA lapse
  GRANT SELECT, UPDATE ON TABLES TO lapse_relay;
ALTER DEFAULT PRIVILEGES FOR ROLE lapse_migrate IN SCHEMA lapse
  GRANT SELECT, DELETE ON TABLES TO lapse_prune;
ALTER DEFAULT PRIVILEGES FOR ROLE lapse_migrate IN SCHEMA lapse
  GRANT SELECT ON TABLES TO lapse_monitor;
ALTER DEFAULT PRIVILEGES FOR ROLE lapse_migrate IN SCHEMA lapse
  GRANT USAGE ON SEQUENCES TO lapse_sweep, lapse_process, lapse_reconcile, lapse_console;
SQL
echo "lapse: database roles created (lapse_migrate owns schema lapse; one role per service)"

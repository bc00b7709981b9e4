#!/usr/bin/env bash
# Installs (where missing) and starts the local PostgreSQL cluster, trusts 127.0.0.1 for the
# test role, and creates the `lapse` role and database. Idempotent: a second run changes nothing.
set -euo pipefail
if ! command -v pg_ctlcluster >/dev/null 2>&1 || [ -z "$(ls /etc/postgresql 2>/dev/null)" ]; then
  echo "postgresql: installing Debian's postgresql package" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >/dev/null
  apt-get install -y -qq postgresql >/dev/null
fi
ver=$(ls /etc/postgresql | sort -V | tail -n 1)
hba=/etc/postgresql/$ver/main/pg_hba.conf
if ! grep -q '^# lapse: trust loopback' "$hba"; then
  # First match wins in pg_hba.conf: put the trust lines on top.
  { echo '# lapse: trust loopback for the local test and demo database'
    echo 'host all all 127.0.0.1/32 trust'
    echo 'host all all ::1/128 trust'
    cat "$hba"; } > "$hba.new" && mv "$hba.new" "$hba"
  chown postgres:postgres "$hba"
  reload=1
fi
conf=/etc/postgresql/$ver/main/postgresql.conf
if ! grep -q '^# lapse: tuning' "$conf"; then
  { echo '# lapse: tuning for a shared 2-core test machine'
    echo 'max_connections = 200'
  } >> "$conf"
  restart=1
fi
if ! pg_ctlcluster "$ver" main status >/dev/null 2>&1; then
  pg_ctlcluster --skip-systemctl-redirect "$ver" main start
elif [ -n "${restart:-}" ]; then
  pg_ctlcluster --skip-systemctl-redirect "$ver" main restart
elif [ -n "${reload:-}" ]; then
  pg_ctlcluster --skip-systemctl-redirect "$ver" main reload
fi
for _ in $(seq 1 30); do
  pg_isready -q -h 127.0.0.1 && break
  sleep 0.5
done
pg_isready -h 127.0.0.1 >/dev/null || { echo "postgresql did not start: see /var/log/postgresql" >&2; exit 1; }
psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_roles WHERE rolname='lapse'" | grep -q 1 ||
  psql -h 127.0.0.1 -U postgres -qc "CREATE ROLE lapse LOGIN SUPERUSER"
psql -h 127.0.0.1 -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname='lapse'" | grep -q 1 ||
  psql -h 127.0.0.1 -U postgres -qc "CREATE DATABASE lapse OWNER lapse"
echo "postgresql $ver ready: postgresql+psycopg://lapse@127.0.0.1:5432/lapse"

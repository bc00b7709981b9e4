#!/usr/bin/env bash
# Installs (where missing) and starts the local PostgreSQL cluster, and gives the tests and the demo
# a role with only the rights they use: `lapse`, LOGIN and CREATEDB (no SUPERUSER, no CREATEROLE,
# no predefined roles: a test database is dropped after ending its own sessions, and a plain DROP
# DATABASE stops autovacuum workers itself, so pg_signal_backend, which lets a role end any
# non-superuser's session, is not needed), owner of the database `lapse`, logging in by password
# (scram-sha-256, PostgreSQL's default rule for loopback). The password is generated once and kept
# in libpq's password file (~/.pgpass of the user who runs this, mode 0600; PGPASSFILE if set), so
# every client finds it and no URL carries it: postgresql+psycopg://lapse@127.0.0.1:5432/lapse.
#
# pg_hba.conf is never changed unless --edit-hba is given; then the trust-everyone lines an earlier
# version of this script put on top are removed and, if the lapse role cannot log in by password
# over loopback, a scram-sha-256 rule for that role alone is added (a copy of the file is kept).
# An existing setup (a SUPERUSER lapse role) is converged. Every change is printed; a second run
# changes nothing.
#
# Usage: scripts/ensure-postgres.sh [--edit-hba] [--cluster VERSION/NAME]   (default: newest/main)
set -euo pipefail

edit_hba=
cluster=
while [ $# -gt 0 ]; do
  case "$1" in
    --edit-hba) edit_hba=1 ;;
    --cluster) cluster="${2:?--cluster needs VERSION/NAME}"; shift ;;
    -h|--help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "ensure-postgres: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done

. "$(dirname "$0")/lib/apt-missing.sh"
say() { echo "postgresql: $*"; }
changed=0
change() { say "$*"; changed=1; }

if ! command -v pg_ctlcluster >/dev/null 2>&1 || [ -z "$(ls /etc/postgresql 2>/dev/null)" ]; then
  change "installing Debian's postgresql package"
  install_missing postgresql
fi
ver=${cluster%%/*}
name=${cluster#*/}
if [ -z "$cluster" ]; then
  ver=$(ls /etc/postgresql | sort -V | tail -n 1)
  name=main
fi
etc=/etc/postgresql/$ver/$name
[ -d "$etc" ] || { echo "ensure-postgres: no cluster $ver/$name (pg_lsclusters lists them)" >&2; exit 1; }
port=$(pg_lsclusters -h | awk -v v="$ver" -v n="$name" '$1 == v && $2 == n { print $3 }')
hba=$etc/pg_hba.conf

# The cluster's superuser, through the local socket (peer authentication, Debian's default).
as_postgres() {
  if [ "$(id -un)" = postgres ]; then "$@"
  elif [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"
  else sudo -u postgres -- "$@"
  fi
}
admin_sql() { as_postgres psql -X -q -p "$port" -v ON_ERROR_STOP=1 -tA "$@"; }

conf=$etc/postgresql.conf
if ! grep -q '^# lapse: tuning' "$conf"; then
  { echo '# lapse: tuning for a shared 2-core test machine'
    echo 'max_connections = 200'
  } >> "$conf"
  change "set max_connections = 200 in $conf"
  restart=1
fi
if ! pg_ctlcluster "$ver" "$name" status >/dev/null 2>&1; then
  pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" start
elif [ -n "${restart:-}" ]; then
  pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" restart
fi
for _ in $(seq 1 30); do
  pg_isready -q -h 127.0.0.1 -p "$port" && break
  sleep 0.5
done
pg_isready -h 127.0.0.1 -p "$port" >/dev/null ||
  { echo "postgresql did not start: see /var/log/postgresql" >&2; exit 1; }

# libpq's password file of the user running this (under sudo: the user who called sudo).
owner=${SUDO_USER:-$(id -un)}
pgpass=${PGPASSFILE:-$(getent passwd "$owner" | cut -d: -f6)/.pgpass}
password=$(awk -F: -v p="$port" '$1 == "127.0.0.1" && $2 == p && $4 == "lapse" { print $5; exit }' \
           "$pgpass" 2>/dev/null || true)
new_password=
if [ -z "$password" ]; then
  password=$(od -An -tx1 -N24 /dev/urandom | tr -d ' \n')
  new_password=1
fi
write_pgpass() {
  local tmp
  tmp=$(mktemp)
  { if [ -f "$pgpass" ]; then grep -Ev "^(127\.0\.0\.1|localhost|\\\\:\\\\:1):$port:\\*:lapse:" "$pgpass" || true; fi
    for host in 127.0.0.1 localhost ::1; do
      # libpq reads a backslash before ':' in a host name as an escape.
      printf '%s:%s:*:lapse:%s\n' "${host//:/\\:}" "$port" "$password"
    done; } > "$tmp"
  install -m 0600 -o "$owner" "$tmp" "$pgpass"
  rm -f "$tmp"
}

# The role: LOGIN CREATEDB only; its password is the one in the password file.
state=$(admin_sql -c "SELECT rolsuper, rolcreaterole, rolcreatedb, rolcanlogin, rolpassword IS NOT NULL,
                              pg_has_role(oid, 'pg_signal_backend', 'MEMBER')
                       FROM pg_authid WHERE rolname = 'lapse'")
if [ -z "$state" ]; then
  # The password goes through psql's stdin: a command line is visible to every local user.
  printf "CREATE ROLE lapse LOGIN CREATEDB NOSUPERUSER NOCREATEROLE PASSWORD '%s';\n" "$password" | admin_sql
  write_pgpass
  change "created role lapse (LOGIN CREATEDB; password in $pgpass)"
else
  IFS='|' read -r super createrole createdb login has_password signal <<< "$state"
  if [ "$super$createrole$createdb$login" != "fftt" ]; then
    admin_sql -c "ALTER ROLE lapse LOGIN CREATEDB NOSUPERUSER NOCREATEROLE"
    was="login=$login superuser=$super createrole=$createrole createdb=$createdb"
    change "role lapse: was $was; now LOGIN CREATEDB only (no SUPERUSER, no CREATEROLE)"
  fi
  if [ "$signal" = t ]; then  # an earlier version of this script granted it
    admin_sql -c "REVOKE pg_signal_backend FROM lapse"
    change "role lapse: no longer a member of pg_signal_backend (it could end other roles' sessions)"
  fi
  if [ -n "$new_password" ] || [ "$has_password" != t ]; then
    printf "ALTER ROLE lapse PASSWORD '%s';\n" "$password" | admin_sql
    write_pgpass
    change "role lapse: new password, in $pgpass"
  fi
fi
if [ -z "$(admin_sql -c "SELECT 1 FROM pg_database WHERE datname = 'lapse'")" ]; then
  admin_sql -c "CREATE DATABASE lapse OWNER lapse"
  change "created database lapse (owner lapse)"
fi

# pg_hba.conf: only with --edit-hba.
login_works() { PGPASSFILE=$pgpass psql -X -w -h 127.0.0.1 -p "$port" -U lapse -d lapse -tAc 'SELECT 1' >/dev/null 2>&1; }
edit() {  # edit <description> <awk program>: rewrite $hba through awk, keeping a copy; reload
  local copy
  copy=$hba.before-lapse-$(date +%Y%m%d%H%M%S)
  cp -p "$hba" "$copy"
  awk "$2" "$copy" > "$hba.new" && cat "$hba.new" > "$hba" && rm -f "$hba.new"
  pg_ctlcluster --skip-systemctl-redirect "$ver" "$name" reload
  change "$hba: $1 (previous file: $copy)"
}
if grep -q '^# lapse: trust loopback' "$hba"; then
  if [ -n "$edit_hba" ]; then
    edit "removed the lines trusting every role on loopback" '
      /^# lapse: trust loopback/ { skip = 1; next }
      skip && /^host all all (127\.0\.0\.1\/32|::1\/128) trust$/ { next }
      { skip = 0; print }'
  else
    say "WARNING: $hba still trusts every role on loopback (lines an earlier version of this script" \
        "added): any local process can log in as any role, postgres included. Remove them with" \
        "scripts/ensure-postgres.sh --edit-hba" >&2
  fi
fi
if ! login_works; then
  if [ -n "$edit_hba" ]; then
    edit "added a scram-sha-256 rule for role lapse on loopback" '
      NR == 1 { print "# lapse: role lapse logs in by password over loopback"
                print "host all lapse 127.0.0.1/32 scram-sha-256"
                print "host all lapse ::1/128 scram-sha-256" }
      { print }'
  fi
  login_works || { echo "ensure-postgres: role lapse cannot log in by password on 127.0.0.1:$port;" \
                        "$hba needs a password rule for it (scripts/ensure-postgres.sh --edit-hba adds one)" >&2
                   exit 1; }
fi
[ "$changed" = 1 ] || say "nothing to change"
echo "postgresql $ver/$name ready: postgresql+psycopg://lapse@127.0.0.1:$port/lapse (password in $pgpass)"

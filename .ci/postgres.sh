#!/usr/bin/env bash
# Bring up a local PostgreSQL for the bulkhead-store tests (Debian 12, run as root). Idempotent:
# installs `postgresql` only if missing, starts the existing cluster (or initdb's one under
# /var/tmp when there is none), (re)creates the role and database, then prints the URL on stdout.
#
#   export BULKHEAD_TEST_POSTGRES_URL="$(.ci/postgres.sh)"
#   cargo test -p bulkhead-store
#
# Settings (environment): BULKHEAD_PG_USER (bulkhead), BULKHEAD_PG_PASSWORD (bulkhead),
# BULKHEAD_PG_DB (bulkhead_test), BULKHEAD_PG_PORT (5432, only used for a fresh initdb cluster).
set -euo pipefail

PG_USER="${BULKHEAD_PG_USER:-bulkhead}"
PG_PASSWORD="${BULKHEAD_PG_PASSWORD:-bulkhead}"
PG_DB="${BULKHEAD_PG_DB:-bulkhead_test}"
PG_PORT="${BULKHEAD_PG_PORT:-5432}"
FALLBACK_DATA=/var/tmp/bulkhead-postgres

log() { echo "postgres.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root (it installs packages and starts the server as user postgres)"

# Role and database names go into SQL unquoted: keep them to plain identifiers.
for name in "$PG_USER" "$PG_DB"; do
    [[ "$name" =~ ^[a-z_][a-z0-9_]*$ ]] || die "invalid identifier '$name' (use [a-z_][a-z0-9_]*)"
done

if ! command -v pg_lsclusters >/dev/null 2>&1 || ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then
    log "installing postgresql via apt-get"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q >&2
    apt-get install -y -q postgresql >&2
fi

# Debian's postgresql-common keeps sockets here; a fresh container may lack the directory.
install -d -o postgres -g postgres -m 2775 /var/run/postgresql

as_postgres() { runuser -u postgres -- "$@"; }

port=""
# First cluster known to postgresql-common: "15 main 5432 down postgres /var/lib/... log".
read -r ver cluster cport status _ < <(pg_lsclusters -h 2>/dev/null | head -n 1) || true
if [ -n "${ver:-}" ]; then
    port="$cport"
    if [ "$status" != "online" ]; then
        log "starting cluster $ver/$cluster on port $port"
        pg_ctlcluster "$ver" "$cluster" start >&2
    else
        log "cluster $ver/$cluster already online on port $port"
    fi
else
    # No packaged cluster (e.g. the package was installed with cluster creation disabled).
    bindir="$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)"
    port="$PG_PORT"
    if [ ! -f "$FALLBACK_DATA/PG_VERSION" ]; then
        log "no cluster found; initdb into $FALLBACK_DATA"
        install -d -o postgres -g postgres -m 0700 "$FALLBACK_DATA"
        as_postgres "$bindir/initdb" -D "$FALLBACK_DATA" -U postgres \
            --auth-local=peer --auth-host=scram-sha-256 >&2
    fi
    if ! as_postgres "$bindir/pg_ctl" -D "$FALLBACK_DATA" status >/dev/null 2>&1; then
        log "starting $FALLBACK_DATA on port $port"
        as_postgres "$bindir/pg_ctl" -D "$FALLBACK_DATA" -w -l "$FALLBACK_DATA/server.log" \
            -o "-p $port -k /var/run/postgresql -c listen_addresses=127.0.0.1" start >&2
    fi
fi

for _ in $(seq 1 60); do
    pg_isready -q -h 127.0.0.1 -p "$port" && break
    sleep 0.5
done
pg_isready -q -h 127.0.0.1 -p "$port" || die "server on 127.0.0.1:$port did not become ready"

psql_admin() { as_postgres psql -X -q -v ON_ERROR_STOP=1 -h /var/run/postgresql -p "$port" "$@"; }

# Password goes in as a psql variable so quoting is handled by psql (:'pw').
psql_admin -d postgres -v pw="$PG_PASSWORD" >&2 <<SQL
SELECT format('CREATE ROLE %I LOGIN', '$PG_USER')
 WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$PG_USER') \gexec
ALTER ROLE $PG_USER WITH LOGIN PASSWORD :'pw';
SELECT format('CREATE DATABASE %I OWNER %I', '$PG_DB', '$PG_USER')
 WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = '$PG_DB') \gexec
SQL

url="postgres://$PG_USER:$PG_PASSWORD@127.0.0.1:$port/$PG_DB"
# Prove the URL works over TCP with password auth before handing it out.
PGPASSWORD="$PG_PASSWORD" psql -X -q -h 127.0.0.1 -p "$port" -U "$PG_USER" -d "$PG_DB" \
    -c 'SELECT 1' >/dev/null || die "cannot log in as $PG_USER over TCP (check pg_hba.conf)"

log "ready; export BULKHEAD_TEST_POSTGRES_URL=$url"
echo "$url"

#!/bin/sh
# deploy/docker/postgres.Dockerfile's entry point: make the cluster on the first start (the
# password from $POSTGRES_PASSWORD through a file that is removed at once, never a flag), then
# run the server in the foreground (it gets the container's SIGTERM and shuts down cleanly).
set -eu
: "${POSTGRES_USER:=postgres}"
: "${POSTGRES_DB:=$POSTGRES_USER}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
    umask 077
    pwfile="$(mktemp)"
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb --pgdata "$PGDATA" --username "$POSTGRES_USER" --pwfile "$pwfile" \
        --auth-local trust --auth-host scram-sha-256 --encoding UTF8 --locale C.UTF-8 >/dev/null
    rm -f "$pwfile"
    echo "host all all 0.0.0.0/0 scram-sha-256" >> "$PGDATA/pg_hba.conf"
    echo "host all all ::/0 scram-sha-256" >> "$PGDATA/pg_hba.conf"
    pg_ctl --pgdata "$PGDATA" --options "-c listen_addresses=''" --wait start >/dev/null
    if [ "$POSTGRES_DB" != postgres ]; then
        createdb --username "$POSTGRES_USER" --owner "$POSTGRES_USER" "$POSTGRES_DB"
    fi
    pg_ctl --pgdata "$PGDATA" --mode fast --wait stop >/dev/null
    echo "dpfl-postgres: cluster created (user $POSTGRES_USER, database $POSTGRES_DB)"
fi
unset POSTGRES_PASSWORD
exec postgres -D "$PGDATA" -c listen_addresses='*' -c unix_socket_directories=/run/postgresql

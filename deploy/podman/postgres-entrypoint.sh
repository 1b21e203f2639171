#!/bin/sh
# First start: a cluster in $PGDATA whose superuser is $POSTGRES_USER (password
# $POSTGRES_PASSWORD, required over TCP), with the database $POSTGRES_DB. Then the server.
set -eu
: "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
: "${POSTGRES_PASSWORD:?set POSTGRES_PASSWORD}"
bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)

if [ ! -s "$PGDATA/PG_VERSION" ]; then
    pwfile=$(mktemp)
    printf '%s\n' "$POSTGRES_PASSWORD" > "$pwfile"
    "$bin/initdb" --pgdata="$PGDATA" --username="$POSTGRES_USER" --pwfile="$pwfile" \
        --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
    if [ "$POSTGRES_DB" != postgres ]; then
        echo "CREATE DATABASE \"$POSTGRES_DB\"" |
            "$bin/postgres" --single -D "$PGDATA" postgres > /dev/null
    fi
fi
exec "$bin/postgres" -D "$PGDATA"

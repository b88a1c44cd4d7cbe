# Start a private PostgreSQL cluster on loopback for the test suite.
# Usage: source .ci/postgres.sh; start_postgres; ...; stop_postgres
# Exports TEST_DATABASE_URL.

start_postgres() {
  local bin
  bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
  # A free loopback port unless PG_PORT is given, so a server already running
  # elsewhere on this machine cannot get in the way.
  PG_PORT=${PG_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
  PG_DIR=$(mktemp -d /tmp/kssched-pg.XXXXXX)
  chown postgres: "$PG_DIR"
  runuser -u postgres -- "$bin/initdb" -D "$PG_DIR/data" -A trust -U postgres >/dev/null
  runuser -u postgres -- "$bin/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/log" -w \
    -o "-p $PG_PORT -k $PG_DIR -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" \
    start >/dev/null
  PG_BIN=$bin
  runuser -u postgres -- "$bin/createdb" -h 127.0.0.1 -p "$PG_PORT" -U postgres kssched
  export TEST_DATABASE_URL="postgres://postgres@127.0.0.1:$PG_PORT/kssched"
  echo "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$PG_PORT"
}

stop_postgres() {
  if [ -n "${PG_DIR:-}" ]; then
    runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m fast -w stop >/dev/null || true
    rm -rf "$PG_DIR"
  fi
}

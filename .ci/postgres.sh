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

# PgBouncer in transaction mode in front of the server above (or of the one at
# PGB_TARGET_PORT), as a deployment behind a transaction pooler has it. Any database
# name is passed through (`*`), so pytest-django can create and use its test
# database. Exports PGBOUNCER_DATABASE_URL (the database of TEST_DATABASE_URL, through
# the pooler). PgBouncer refuses to run as root: it runs as the postgres user.
# Usage: start_pgbouncer; ...; stop_pgbouncer
start_pgbouncer() {
  local target_port=${PGB_TARGET_PORT:-${PG_PORT:?start_postgres first, or set PGB_TARGET_PORT}}
  local database=${PGB_DATABASE:-kssched}
  PGB_PORT=${PGB_PORT:-$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')}
  PGB_DIR=$(mktemp -d /tmp/kssched-pgbouncer.XXXXXX)
  printf '"postgres" ""\n' > "$PGB_DIR/userlist.txt"
  cat > "$PGB_DIR/pgbouncer.ini" <<INI
[databases]
* = host=127.0.0.1 port=$target_port
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = $PGB_PORT
unix_socket_dir =
auth_type = trust
auth_file = $PGB_DIR/userlist.txt
pool_mode = transaction
default_pool_size = 10
max_client_conn = 200
; Server sessions are handed out most recently used first (server_round_robin = 0),
; the default, which the pooler tests rely on to reach another session.
server_round_robin = 0
; The test database is dropped and created again by each run.
server_idle_timeout = 1
logfile = $PGB_DIR/pgbouncer.log
pidfile = $PGB_DIR/pgbouncer.pid
admin_users = postgres
INI
  chown -R postgres: "$PGB_DIR"
  runuser -u postgres -- pgbouncer -d "$PGB_DIR/pgbouncer.ini"
  for _ in $(seq 50); do
    if python3 -c "import socket; socket.create_connection(('127.0.0.1', $PGB_PORT), 1)" 2>/dev/null; then
      break
    fi
    sleep 0.1
  done
  if ! python3 -c "import socket; socket.create_connection(('127.0.0.1', $PGB_PORT), 1)" 2>/dev/null; then
    echo "PgBouncer did not start:" >&2
    cat "$PGB_DIR/pgbouncer.log" >&2 || true
    return 1
  fi
  export PGBOUNCER_DATABASE_URL="postgres://postgres@127.0.0.1:$PGB_PORT/$database"
  echo "PgBouncer $(pgbouncer --version | awk 'NR == 1 {print $2}') (transaction mode) on 127.0.0.1:$PGB_PORT"
}

stop_pgbouncer() {
  if [ -n "${PGB_DIR:-}" ]; then
    if [ -f "$PGB_DIR/pgbouncer.pid" ]; then
      kill "$(cat "$PGB_DIR/pgbouncer.pid")" 2>/dev/null || true
    fi
    rm -rf "$PGB_DIR"
  fi
}

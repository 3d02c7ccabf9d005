#!/usr/bin/env bash
# Local Redis and embedded Neo4j for the demo, the tests and the benchmarks.
#   deploy/local/services.sh up|down|status [redis|neo4j]
# Idempotent. Data, logs, pids and generated passwords live under .var/ (kept by `down`).
# After `up`, .var/services.env holds MEMORY_REDIS_URL, MEMORY_NEO4J_URI/USER/PASSWORD.
# Ports: MEMORY_LOCAL_REDIS_PORT (16379) and MEMORY_LOCAL_NEO4J_PORT (17687).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
VAR="${MEMORY_LOCAL_VAR:-$ROOT/.var}"
REDIS_PORT="${MEMORY_LOCAL_REDIS_PORT:-16379}"
NEO4J_PORT="${MEMORY_LOCAL_NEO4J_PORT:-17687}"
NEO4J_PROJECT="$ROOT/deploy/neo4j"
NEO4J_HEAP="${MEMORY_LOCAL_NEO4J_HEAP:-1g}"
NEO4J_PAGECACHE="${MEMORY_LOCAL_NEO4J_PAGECACHE:-512m}"  # holds the store of the 100k-episode benchmarks
NEO4J_START_TIMEOUT_S="${MEMORY_LOCAL_NEO4J_START_TIMEOUT_S:-120}"

log() { printf 'services: %s\n' "$*" >&2; }
die() { log "$*"; exit 1; }

secret() {  # secret NAME -> prints a password generated once and kept under .var/secrets
  local file="$VAR/secrets/$1"
  if [ ! -s "$file" ]; then
    mkdir -p "$VAR/secrets" && chmod 700 "$VAR/secrets"
    (umask 077; head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' > "$file")
  fi
  cat "$file"
}

alive() {  # alive PIDFILE PATTERN -> 0 when the recorded pid runs and is ours
  local pidfile="$1" pattern="$2" pid
  [ -s "$pidfile" ] || return 1
  pid="$(cat "$pidfile")"
  [ -r "/proc/$pid/cmdline" ] || return 1
  tr '\0' ' ' < "/proc/$pid/cmdline" | grep -q -- "$pattern"
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

stop_pid() {  # stop_pid PIDFILE PATTERN NAME: SIGTERM, wait for a clean exit, SIGKILL as last resort
  local pidfile="$1" pattern="$2" name="$3" pid i
  if ! alive "$pidfile" "$pattern"; then rm -f "$pidfile"; log "$name not running"; return 0; fi
  pid="$(cat "$pidfile")"
  kill -TERM "$pid" 2>/dev/null || true
  for i in $(seq 1 600); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$pid" 2>/dev/null; then log "$name did not stop in 60 s; killing"; kill -KILL "$pid" || true; fi
  rm -f "$pidfile"
  log "$name stopped"
}

# ---------------------------------------------------------------- redis
redis_pidfile="$VAR/redis/redis.pid"

ensure_redis_installed() {
  command -v redis-server >/dev/null 2>&1 && return 0
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    log "installing the Debian package redis-server"
    apt-get update -qq >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null
    # The package starts a system service on 6379; ours runs on its own port, so leave that one alone.
  else
    die "redis-server is missing: install the Debian package 'redis-server' (sudo apt-get install redis-server)"
  fi
}

redis_up() {
  # the AOF holds every queued conversation: readable by this user only (also for an older .var/)
  mkdir -p "$VAR/redis" && chmod 700 "$VAR/redis"
  if alive "$redis_pidfile" redis-server; then log "redis already running on 127.0.0.1:$REDIS_PORT"; return 0; fi
  ensure_redis_installed
  if port_open "$REDIS_PORT"; then die "port $REDIS_PORT is taken by another process; set MEMORY_LOCAL_REDIS_PORT"; fi
  local conf="$VAR/redis/redis.conf"
  (umask 077; cat > "$conf" <<CONF
bind 127.0.0.1
port $REDIS_PORT
protected-mode yes
daemonize yes
pidfile $redis_pidfile
logfile $VAR/redis/redis.log
dir $VAR/redis
appendonly yes
appendfsync everysec
save ""
maxmemory-policy noeviction
requirepass $(secret redis)
CONF
)
  (umask 077; redis-server "$conf")  # files it creates (AOF, log) are private too
  local i
  for i in $(seq 1 100); do
    if REDISCLI_AUTH="$(secret redis)" redis-cli -p "$REDIS_PORT" ping 2>/dev/null | grep -q PONG; then
      log "redis up on 127.0.0.1:$REDIS_PORT (AOF on)"; return 0
    fi
    sleep 0.1
  done
  die "redis did not answer PING in 10 s; see $VAR/redis/redis.log"
}

# ---------------------------------------------------------------- neo4j
neo4j_pidfile="$VAR/neo4j/launcher.pid"
neo4j_log="$VAR/neo4j/launcher.log"

neo4j_build() {
  local stamp="$NEO4J_PROJECT/target/.built"
  if [ -f "$stamp" ] && [ -z "$(find "$NEO4J_PROJECT/pom.xml" "$NEO4J_PROJECT/src" -newer "$stamp" -print -quit)" ]; then
    return 0
  fi
  command -v mvn >/dev/null 2>&1 || die "Maven (mvn) is needed to build the Neo4j launcher"
  command -v java >/dev/null 2>&1 || die "Java 17 is needed to run Neo4j"
  log "building the Neo4j launcher (first time downloads Neo4j from Maven Central)"
  mvn -q -B -f "$NEO4J_PROJECT/pom.xml" package -DskipTests >"$VAR/neo4j/build.log" 2>&1 \
    || { tail -n 40 "$VAR/neo4j/build.log" >&2; die "Maven build failed; full log in $VAR/neo4j/build.log"; }
  touch "$stamp"
}

neo4j_up() {
  mkdir -p "$VAR/neo4j" && chmod 700 "$VAR/neo4j"  # the store holds every conversation
  if alive "$neo4j_pidfile" memory.Neo4jLauncher; then log "neo4j already running on 127.0.0.1:$NEO4J_PORT"; return 0; fi
  neo4j_build
  if port_open "$NEO4J_PORT"; then die "port $NEO4J_PORT is taken by another process; set MEMORY_LOCAL_NEO4J_PORT"; fi
  : > "$neo4j_log"
  NEO4J_HOME_DIR="$VAR/neo4j/data" NEO4J_BOLT_PORT="$NEO4J_PORT" NEO4J_PAGECACHE="$NEO4J_PAGECACHE" \
  NEO4J_PASSWORD="$(secret neo4j)" \
    nohup java -Xms256m "-Xmx$NEO4J_HEAP" -XX:+UseG1GC -XX:+ExitOnOutOfMemoryError \
      -cp "$NEO4J_PROJECT/target/classes:$NEO4J_PROJECT/target/lib/*" memory.Neo4jLauncher \
      >>"$neo4j_log" 2>&1 < /dev/null &
  echo $! > "$neo4j_pidfile"
  local i
  for i in $(seq 1 $((NEO4J_START_TIMEOUT_S * 10))); do
    kill -0 "$(cat "$neo4j_pidfile")" 2>/dev/null || { tail -n 40 "$neo4j_log" >&2; die "neo4j exited during start"; }
    if grep -q 'neo4j-launcher: ready' "$neo4j_log" && port_open "$NEO4J_PORT" && neo4j_query_ok; then
      log "neo4j up on bolt://127.0.0.1:$NEO4J_PORT"; return 0
    fi
    sleep 0.1
  done
  tail -n 40 "$neo4j_log" >&2
  die "neo4j did not answer a Cypher query in $NEO4J_START_TIMEOUT_S s; see $neo4j_log"
}

neo4j_query_ok() {  # a Cypher round trip over Bolt when the project's venv exists; the launcher's own query otherwise
  local py="$ROOT/.venv/bin/python"
  [ -x "$py" ] || return 0
  # the password in the environment, not on the command line (where `ps` shows it to every user)
  NEO4J_CHECK_PASSWORD="$(secret neo4j)" "$py" - "$NEO4J_PORT" <<'PY' >/dev/null 2>&1
import os, sys
from neo4j import GraphDatabase
with GraphDatabase.driver(f"bolt://127.0.0.1:{sys.argv[1]}", auth=("neo4j", os.environ["NEO4J_CHECK_PASSWORD"]),
                          connection_timeout=2) as d:
    d.execute_query("RETURN 1")
PY
}

write_env() {
  mkdir -p "$VAR"
  (umask 077; cat > "$VAR/services.env" <<ENV
MEMORY_REDIS_URL=redis://:$(secret redis)@127.0.0.1:$REDIS_PORT/0
MEMORY_NEO4J_URI=bolt://127.0.0.1:$NEO4J_PORT
MEMORY_NEO4J_USER=neo4j
MEMORY_NEO4J_PASSWORD=$(secret neo4j)
ENV
)
}

status_one() {
  case "$1" in
    redis) if alive "$redis_pidfile" redis-server; then echo "redis: running (127.0.0.1:$REDIS_PORT, pid $(cat "$redis_pidfile"))"; else echo "redis: stopped"; return 1; fi ;;
    neo4j) if alive "$neo4j_pidfile" memory.Neo4jLauncher; then echo "neo4j: running (bolt://127.0.0.1:$NEO4J_PORT, pid $(cat "$neo4j_pidfile"))"; else echo "neo4j: stopped"; return 1; fi ;;
  esac
}

usage() { echo "usage: $0 up|down|status [redis|neo4j]" >&2; exit 2; }

action="${1:-}"; target="${2:-all}"
case "$target" in redis|neo4j) names=("$target") ;; all) names=(redis neo4j) ;; *) usage ;; esac
case "$action" in
  up)     mkdir -p "$VAR"; for n in "${names[@]}"; do "${n}_up"; done; write_env ;;
  down)   for n in "${names[@]}"; do
            case "$n" in redis) stop_pid "$redis_pidfile" redis-server redis ;;
                         neo4j) stop_pid "$neo4j_pidfile" memory.Neo4jLauncher neo4j ;; esac
          done ;;
  status) rc=0; for n in "${names[@]}"; do status_one "$n" || rc=1; done; exit "$rc" ;;
  *)      usage ;;
esac

#!/usr/bin/env bash
# tools/loadgen-cluster.sh: the load generator's concurrency phase (500 runs started within 1 s,
# 200 text chunks each at one per 20 ms) against single-node SQLite, single-node PostgreSQL and
# two nodes on PostgreSQL behind a round-robin HAProxy (HTTP/1.1 streaming and h2c), beside the
# same client reading the fake provider directly; prints one Markdown table (failed runs, events
# more than 100 ms late, time to first token p50/p99, event latency p99, both transports) and the
# SQL statements and commits one run makes on PostgreSQL.
#
#   cargo build --release -p cursor-server      # figures come from release builds
#   tools/loadgen-cluster.sh                    # ≈ 3 min on 2 cores
#   CONC=200 REPS=3 SETUPS="pg pg2" tools/loadgen-cluster.sh
#
# Env: SERVER_BIN (default $CARGO_TARGET_DIR or target/release/cursor-server), LOADGEN_DIR
# (../shared/tools/loadgen), CONC (500), REPS (1), SETUPS ("direct sqlite pg pg2"; also pg1lb: one
# node behind the same HAProxy, the balancer's own cost; and pgfull: the load generator's own
# run.sh, every phase, with the store on PostgreSQL, its summary in $OUT/pgfull), HAPROXY_DELAY (1: without
# `option http-no-delay`, HAProxy's default, to measure what it holds back), OUT (results
# directory), NODE_EXTRA (top-level lines added to each node's config, e.g.
# "database_max_connections = 4"), PG_BIN (the newest /usr/lib/postgresql/*/bin), BASE_PORT (3930: it uses the next 8).
# Needs PostgreSQL's server binaries (Debian's `postgresql`) and `haproxy`; starts everything on
# loopback in a temporary directory (PostgreSQL as `nobody` when run as root, as the tests do),
# stops everything it started by PID, and bounds every wait.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
LOADGEN_DIR=${LOADGEN_DIR:-$ROOT/../shared/tools/loadgen}
SERVER_BIN=${SERVER_BIN:-${CARGO_TARGET_DIR:-$ROOT/target}/release/cursor-server}
CONC=${CONC:-500}
REPS=${REPS:-1}
SETUPS=${SETUPS:-"direct sqlite pg pg2"}
BASE_PORT=${BASE_PORT:-3930}
PG_BIN=${PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)}
OUT=${OUT:-${TMPDIR:-/tmp}/loadgen-cluster-$(date +%Y%m%d-%H%M%S)}
PPORT=$BASE_PORT; LBPORT=$((BASE_PORT + 1)); APORT=$((BASE_PORT + 2)); BPORT=$((BASE_PORT + 3))
PGPORT=$((BASE_PORT + 4))
SECRET=loadgen-cluster-secret-0123456789

[ -x "$SERVER_BIN" ] || { echo "no server binary at $SERVER_BIN: cargo build --release -p cursor-server" >&2; exit 1; }
[ -x "$PG_BIN/initdb" ] || { echo "no PostgreSQL under /usr/lib/postgresql: apt-get install postgresql" >&2; exit 1; }
command -v haproxy >/dev/null || { echo "no haproxy: apt-get install haproxy" >&2; exit 1; }
mkdir -p "$OUT"
echo "results in $OUT; server $SERVER_BIN"

export CARGO_TARGET_DIR_LOADGEN=${LOADGEN_TARGET:-${TMPDIR:-/tmp}/loadgen-target}
(cd "$LOADGEN_DIR" && CARGO_TARGET_DIR=$CARGO_TARGET_DIR_LOADGEN cargo build --release --locked -q)
LG=$CARGO_TARGET_DIR_LOADGEN/release/loadgen
FP=$CARGO_TARGET_DIR_LOADGEN/release/fakeprov

PIDS=()
PGDIR=""
as_pg() { if [ "$(id -u)" = 0 ]; then setpriv --reuid=65534 --regid=65534 --clear-groups -- "$@"; else "$@"; fi; }
stop_all() {
  for pid in "${PIDS[@]:-}"; do [ -n "$pid" ] && kill "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]:-}"; do [ -n "$pid" ] && wait "$pid" 2>/dev/null || true; done
  PIDS=()
}
stop_pg() {
  if [ -n "$PGDIR" ]; then
    as_pg "$PG_BIN/pg_ctl" -D "$PGDIR/data" -m fast -w -t 60 stop >/dev/null 2>&1 || true
    rm -rf "$PGDIR"; PGDIR=""
  fi
}
trap 'stop_all; stop_pg' EXIT

wait_for() { # file needle seconds
  for _ in $(seq 1 $(($3 * 10))); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  echo "timed out waiting for '$2' in $1" >&2; tail -20 "$1" >&2; return 1
}

start_pg() {
  PGDIR=$(mktemp -d "${TMPDIR:-/tmp}/loadgen-cluster-pg-XXXXXX")
  [ "$(id -u)" = 0 ] && chown 65534:65534 "$PGDIR"
  (cd "$PGDIR" && as_pg "$PG_BIN/initdb" -D data -U postgres -A trust -E UTF8 --no-sync --no-instructions >/dev/null)
  # Commits are not flushed one by one (synchronous_commit=off): the durability class of SQLite's
  # WAL with synchronous=NORMAL that the server uses, so the two compare.
  (cd "$PGDIR" && as_pg "$PG_BIN/pg_ctl" -D data -l "$PGDIR/postgres.log" -w -t 60 \
    -o "-h 127.0.0.1 -p $PGPORT -k $PGDIR -c synchronous_commit=off -c max_connections=200" start >/dev/null)
}
pg_url() { echo "postgres://postgres@127.0.0.1:$PGPORT/$1"; }
new_db() { "$PG_BIN/createdb" -h 127.0.0.1 -p "$PGPORT" -U postgres "$1"; }

config() { # file port database [node]
  cat > "$1" <<TOML
listen = "127.0.0.1:$2"
database_url = "$3"
default_model = "lg-model"
pass_through = false
${NODE_EXTRA:-}

[[providers]]
name = "fake"
kind = "openai-chat"
base_url = "http://127.0.0.1:$PPORT/v1"
api_key = "lg-key"

[[providers.models]]
id = "lg-model"
display_name = "LG Model"
context_window = 10000000
TOML
  if [ -n "${4:-}" ]; then
    printf '\n[cluster]\nnode_name = "%s"\ninternal_url = "http://127.0.0.1:%s"\n' "$4" "$2" >> "$1"
  fi
}

server() { # tag port database [node] [log filter]
  local dir=$OUT/$1; mkdir -p "$dir"
  config "$dir/${4:-node}.toml" "$2" "$3" "${4:-}"
  CURSOR_BYOK_CLUSTER_SECRET=$SECRET CURSOR_BYOK_LOG=${5:-info} \
    "$SERVER_BIN" --config "$dir/${4:-node}.toml" > "$dir/${4:-node}.log" 2>&1 &
  PIDS+=($!)
  wait_for "$dir/${4:-node}.log" "listening" 60
}

# The nodes behind the balancer: a and b, or a alone (pg1lb, the balancer's own cost).
servers() { # suffix
  echo "  server a 127.0.0.1:$APORT$1"
  [ "$LB_NODES" = 2 ] && echo "  server b 127.0.0.1:$BPORT$1"
  return 0
}

haproxy_up() { # tag
  local dir=$OUT/$1
  # Without http-no-delay HAProxy sends a streamed HTTP/1.1 response's data with MSG_MORE until
  # the response ends, and the kernel holds each RunSSE frame up to its 200 ms cork timeout.
  local NODELAY="  option http-no-delay
"
  [ "${HAPROXY_DELAY:-0}" = 1 ] && NODELAY=""
  cat > "$dir/haproxy.cfg" <<CFG
global
  maxconn 6000
defaults
  mode http
  timeout connect 5s
  timeout client 1h
  timeout server 1h
  timeout tunnel 1h
frontend cursor
  bind 127.0.0.1:$LBPORT
  # The CLI's HTTP/2 Run (h2c with prior knowledge) stays one stream end to end; RunSSE and
  # BidiAppend are HTTP/1.1, streamed. No stickiness: a run's requests land on either node.
  http-request deny if { path_beg /internal/ }
  use_backend nodes_h2 if { req.ver 2.0 }
  default_backend nodes_h1
backend nodes_h1
  balance roundrobin
$NODELAY$(servers "")
backend nodes_h2
  balance roundrobin
$(servers " proto h2")
CFG
  haproxy -f "$dir/haproxy.cfg" -db > "$dir/haproxy.log" 2>&1 &
  PIDS+=($!)
  for _ in $(seq 1 50); do (exec 3<>/dev/tcp/127.0.0.1/$LBPORT) 2>/dev/null && return 0; sleep 0.1; done
  echo "haproxy did not listen" >&2; cat "$dir/haproxy.log" >&2; return 1
}

measure() { # setup target addr pid
  for r in $(seq 1 "$REPS"); do
    "$LG" stream --target "$2" --addr "$3" --pid "$4" --label "$1-$2" --json "$OUT/cluster.jsonl" \
      --conc "$CONC" --n 200 --iv 20000 --ramp-ms 1000 --settle-ms 2000 > /dev/null
  done
}

"$FP" 127.0.0.1:$PPORT 2> "$OUT/prov.log" & FPID=$!
trap 'stop_all; stop_pg; kill $FPID 2>/dev/null || true' EXIT
case " $SETUPS " in *" pg "*|*" pg1lb "*|*" pg2 "*|*" pgfull "*) start_pg ;; esac

for setup in $SETUPS; do
  echo "[$setup] $(cut -d' ' -f1-3 /proc/loadavg)"
  case $setup in
  direct) measure direct direct 127.0.0.1:$PPORT "$FPID" ;;
  sqlite)
    server sqlite "$APORT" "sqlite://$OUT/sqlite/lg.db"
    for t in run sse; do measure sqlite "$t" 127.0.0.1:$APORT "${PIDS[0]}"; done
    stop_all ;;
  pg)
    new_db lg_single
    server pg "$APORT" "$(pg_url lg_single)"
    for t in run sse; do measure pg "$t" 127.0.0.1:$APORT "${PIDS[0]}"; done
    stop_all ;;
  pg1lb)
    new_db lg_lb
    server pg1lb "$APORT" "$(pg_url lg_lb)"
    LB_NODES=1 haproxy_up pg1lb
    for t in run sse; do measure pg1lb "$t" 127.0.0.1:$LBPORT "${PIDS[0]}"; done
    stop_all ;;
  pg2)
    new_db lg_nodes
    server pg2 "$APORT" "$(pg_url lg_nodes)" a
    server pg2 "$BPORT" "$(pg_url lg_nodes)" b
    LB_NODES=2 haproxy_up pg2
    for t in run sse; do measure pg2 "$t" 127.0.0.1:$LBPORT "${PIDS[0]}"; done
    stop_all ;;
  pgfull)
    # The load generator's full table (every phase, its own server.toml) with the store on
    # PostgreSQL: the database URL's environment override replaces the file's SQLite URL. Every
    # server run.sh starts uses the same database; its conversations are new each time.
    new_db lg_full
    CURSOR_BYOK_DATABASE_URL=$(pg_url lg_full) SERVER_BIN=$SERVER_BIN OUT=$OUT/pgfull \
      CARGO_TARGET_DIR=$CARGO_TARGET_DIR_LOADGEN "$LOADGEN_DIR/run.sh" > "$OUT/pgfull.log" 2>&1 ||
      { echo "run.sh failed; see $OUT/pgfull.log" >&2; tail -20 "$OUT/pgfull.log" >&2; exit 1; }
    echo "PostgreSQL, every phase of run.sh:"; cat "$OUT/pgfull/summary.txt" ;;
  esac
done

# SQL statements and commits of one run on PostgreSQL (a single node, one run at a time, sqlx's
# statement log): what a run start costs in round trips.
if [ -n "$PGDIR" ]; then
  new_db lg_sql
  server sql "$APORT" "$(pg_url lg_sql)" "" "info,sqlx::query=debug"
  "$LG" stream --target run --addr 127.0.0.1:$APORT --pid "${PIDS[0]}" --label sql-warmup --json "$OUT/sql.jsonl" \
    --conc 1 --n 5 --iv 0 --ramp-ms 0 --settle-ms 500 > /dev/null
  "$LG" stream --target run --addr 127.0.0.1:$APORT --pid "${PIDS[0]}" --label sql --json "$OUT/sql.jsonl" \
    --conc 10 --n 5 --iv 0 --ramp-ms 0 --settle-ms 1000 > /dev/null
  stop_all
fi

python3 - "$OUT" "$CONC" <<'PY'
import json, os, statistics, sys, re
out, conc = sys.argv[1], sys.argv[2]
rows = [json.loads(l) for l in open(os.path.join(out, "cluster.jsonl")) if l.strip()]
def med(rs, *path):
    vals = []
    for r in rs:
        v = r
        for k in path:
            v = v[k]
        vals.append(v)
    return statistics.median(vals) if vals else float("nan")
names = {"direct": "direct to the provider", "sqlite": "one node, SQLite", "pg": "one node, PostgreSQL",
         "pg1lb": "one node on PostgreSQL behind HAProxy",
         "pg2": "two nodes on PostgreSQL, HAProxy round robin"}
print(f"\n{conc} concurrent runs started within 1 s, 200 chunks each at 1 per 20 ms (median of reps):\n")
print("| setup | transport | failed runs | events >100 ms late / total | TTFT p50 / p99 | event latency p99 | load (1 min) |")
print("| --- | --- | --- | --- | --- | --- | --- |")
for setup in ("direct", "sqlite", "pg", "pg1lb", "pg2"):
    for t, tname in (("direct", "-"), ("run", "`Run` h2"), ("sse", "RunSSE")):
        rs = [r for r in rows if r["label"] == f"{setup}-{t}"]
        if not rs:
            continue
        failed = sum(r["runs"] - r["runs_ok"] for r in rs)
        print(f"| {names[setup]} | {tname} | {failed} | {med(rs, 'lat_over_100ms'):.0f} / {med(rs, 'events'):.0f} | "
              f"{med(rs, 'ttft_ms', 'p50'):.1f} / {med(rs, 'ttft_ms', 'p99'):.1f} ms | {med(rs, 'lat_ms', 'p99'):.2f} ms | "
              f"{' '.join(sorted({r['loadavg_before'].split()[0] for r in rs}))} |")
log = os.path.join(out, "sql", "node.log")
if os.path.exists(log):
    # Per run of the measured pass (not the warm-up): every statement sqlx logged under the run's
    # span (COMMIT included; sqlx does not log BEGIN), and those before its first provider call
    # ended (what a run start costs).
    runs = {}
    for line in open(log):
        m = re.search(r"request_id=(lg-sql-\S+?)[ }]", line)
        if not m or "warmup" in m.group(1):
            continue
        r = runs.setdefault(m.group(1), {"all": 0, "commits": 0, "start": None, "start_commits": None})
        if "sqlx::query" in line:
            r["all"] += 1
            r["commits"] += 'summary="COMMIT"' in line
        elif "provider call ended" in line and r["start"] is None:
            r["start"], r["start_commits"] = r["all"], r["commits"]
    done = [r for r in runs.values() if r["start"] is not None]
    if done:
        avg = lambda k: sum(r[k] for r in done) / len(done)
        print(f"\nPostgreSQL, one node, {len(done)} runs of 5 chunks: per run {avg('all'):.1f} SQL statements "
              f"({avg('commits'):.1f} write transactions); before its first provider call ended "
              f"{avg('start'):.1f} statements ({avg('start_commits'):.1f} write transactions); "
              f"each transaction also sends a BEGIN sqlx does not log")
PY

#!/usr/bin/env bash
# The HTTP figures of docs/PERFORMANCE.md: for each store, the same endpoint (POST /v1/orders,
# the single-phase transactional one) with the idempotency layer and without it
# (`serve --idempotency off`), unique keys, then replays (`--keys duplicate=1.0`), alternated
# over ROUNDS rounds so that both sides see the same machine noise. Over loopback, or with
# ONCELY_BENCH_RTT_MS=R (milliseconds, e.g. 1) through the latency proxy
# (`oncely-latency-proxy`, crates/oncely-bench/src/proxy.rs) between the servers and
# PostgreSQL or Redis, which adds R to every round trip; memory and SQLite have no network.
#
# Usage: crates/oncely-bench/scripts/http.sh [STORES] [SECONDS] [CONCURRENCY] [ROUNDS]
#   STORES: space-separated subset of "memory sqlite postgres postgres-fewest redis" (default:
#           memory sqlite postgres redis); postgres-fewest is postgres with the layer's server
#           started with --pg-fewest-round-trips (the claim sent with the BEGIN, the completion
#           with the COMMIT)
#   env ONCELY_BENCH_POSTGRES_URL (default postgres://postgres@127.0.0.1:5432/oncely_bench)
#   env ONCELY_BENCH_REDIS_URL    (default redis://127.0.0.1:6379?accept_volatile=true: benchmark
#                                 records are throwaway, so a Redis that persists nothing is accepted)
#   env ONCELY_BENCH_RTT_MS       (default 0: direct)
#   env ONCELY_PROXY_BIN          (default target/release/oncely-latency-proxy; build it with
#                                 `cargo build --release -p oncely-bench --bins`)
# Prints one JSON line per run: {"store", "round", "variant", "rtt_ms", "record": <oncely bench --json>}.
set -euo pipefail
STORES=${1:-"memory sqlite postgres redis"}
SECS=${2:-8}
CONC=${3:-16}
ROUNDS=${4:-2}
BIN=${ONCELY_BIN:-target/release/oncely}
PROXY_BIN=${ONCELY_PROXY_BIN:-target/release/oncely-latency-proxy}
RTT=${ONCELY_BENCH_RTT_MS:-0}
PG=${ONCELY_BENCH_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/oncely_bench}
REDIS=${ONCELY_BENCH_REDIS_URL:-redis://127.0.0.1:6379?accept_volatile=true}
BODY='{"items":[{"sku":"bench-sku","quantity":2},{"sku":"other-sku","quantity":1}]}'
TMP=$(mktemp -d)
PIDS=()
cleanup() {
  for p in "${PIDS[@]}" $(cat "$TMP/proxy.pids" 2>/dev/null); do kill "$p" 2>/dev/null || true; done
  rm -rf "$TMP"
}
trap cleanup EXIT

# start NAME ARGS...: starts `oncely serve ARGS --addr 127.0.0.1:0`, sets URL.
start() {
  local name=$1; shift
  "$BIN" serve --addr 127.0.0.1:0 "$@" >"$TMP/$name.out" 2>"$TMP/$name.err" &
  PIDS+=($!)
  for _ in $(seq 1 200); do
    if grep -q '^oncely: listening on ' "$TMP/$name.out" 2>/dev/null; then
      URL=$(sed -n 's/^oncely: listening on //p' "$TMP/$name.out" | head -1)
      return 0
    fi
    sleep 0.1
  done
  echo "server $name did not start:" >&2; cat "$TMP/$name.err" >&2; exit 1
}

# via URL: prints URL with its host and port replaced by a latency proxy's (started here, with
# ONCELY_BENCH_RTT_MS added to each round trip); URL itself when the round trip is 0.
via() {
  if [ "$RTT" = 0 ]; then echo "$1"; return; fi
  local hostport out
  hostport=$(python3 -c 'import sys, urllib.parse as u; p = u.urlsplit(sys.argv[1]); d = {"postgres": 5432, "postgresql": 5432, "mysql": 3306}.get(p.scheme, 6379); print("%s:%s" % (p.hostname, p.port or d))' "$1")
  out="$TMP/proxy-$RANDOM.out"
  # Started in a subshell ($(via ...)): its pid goes to a file the cleanup reads.
  "$PROXY_BIN" --upstream "$hostport" --rtt-ms "$RTT" >"$out" 2>&1 &
  echo $! >>"$TMP/proxy.pids"
  for _ in $(seq 1 100); do
    if grep -q 'listening on ' "$out" 2>/dev/null; then
      python3 -c 'import sys, urllib.parse as u; p = u.urlsplit(sys.argv[1]); a = sys.argv[2]; user = (p.username + "@") if p.username else ""; print(u.urlunsplit(p._replace(netloc=user + a)))' \
        "$1" "$(sed -n 's/^oncely-latency-proxy: listening on //p' "$out" | head -1)"
      return 0
    fi
    sleep 0.1
  done
  echo "the latency proxy did not start:" >&2; cat "$out" >&2; exit 1
}

run() { # run STORE ROUND VARIANT URL KEYS
  local rec
  rec=$("$BIN" bench --url "$4/v1/orders" --auth 'Bearer acct_bench' --body "$BODY" \
        --concurrency "$CONC" --duration-secs "$SECS" --keys "$5" --json || true)
  printf '{"store":"%s","round":%s,"variant":"%s","rtt_ms":%s,"record":%s}\n' "$1" "$2" "$3" "$RTT" "$rec"
}

for store in $STORES; do
  case $store in
    memory)   on=(--store memory);                 off=(--store memory) ;;
    sqlite)   on=(--store "$TMP/on.sqlite3");      off=(--store "$TMP/off.sqlite3") ;;
    postgres) pg=$(via "$PG")
              on=(--store "$pg");                  off=(--store "$pg") ;;
    postgres-fewest) pg=$(via "$PG")
              on=(--store "$pg" --pg-fewest-round-trips); off=(--store "$pg") ;;
    redis)    redis=$(via "$REDIS")
              on=(--store "$redis" --business-db "$TMP/on-biz.sqlite3")
              off=(--store "$redis" --business-db "$TMP/off-biz.sqlite3") ;;
    *) echo "unknown store $store" >&2; exit 2 ;;
  esac
  start "$store-on" "${on[@]}";                    URL_ON=$URL
  start "$store-off" "${off[@]}" --idempotency off; URL_OFF=$URL
  # Warm up both (connection pools, prepared statements, page cache).
  for u in "$URL_ON" "$URL_OFF"; do
    "$BIN" bench --url "$u/v1/orders" --auth 'Bearer acct_bench' --body "$BODY" \
      --concurrency "$CONC" --requests 500 --keys unique --json >/dev/null
  done
  for round in $(seq 1 "$ROUNDS"); do
    run "$store" "$round" baseline "$URL_OFF" unique
    run "$store" "$round" layer "$URL_ON" unique
    run "$store" "$round" replay "$URL_ON" duplicate=1.0
  done
  for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done
  PIDS=()
done

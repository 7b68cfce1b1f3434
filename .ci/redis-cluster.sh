#!/usr/bin/env bash
# A local Redis Cluster for the tests and for developers: 3 primaries and 3 replicas on loopback,
# every node with an append-only file, so the Redis store's persistence check accepts it.
#
#   .ci/redis-cluster.sh start    # start it, or reuse it when it is already running and healthy
#   .ci/redis-cluster.sh stop     # shut its nodes down and delete their files
#   .ci/redis-cluster.sh status   # exit 0 when it is running and healthy
#   .ci/redis-cluster.sh node P   # (re)start the one node on port P with its existing files
#                                 # (the failover test brings a killed primary back this way)
#
# `start` prints the store URL on its last line of stdout:
#   redis+cluster://127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102
# (use it as ONCELY_TEST_REDIS_CLUSTER_URL, or `oncely gates --store <URL>`).
#
# Environment (defaults in brackets):
#   ONCELY_REDIS_CLUSTER_PORT          first port; the nodes use PORT..PORT+5 [7100]
#   ONCELY_REDIS_CLUSTER_DIR           data, logs, pid and nodes.conf files [/tmp/oncely-redis-cluster-PORT]
#   ONCELY_REDIS_CLUSTER_NODE_TIMEOUT  cluster-node-timeout in milliseconds: how long a primary may
#                                      be unreachable before its replica is promoted [3000]
#
# `start` is idempotent: a healthy cluster on those ports is reused as is; anything else on them
# that this script started (stale files, a half-created cluster, a node that died) is shut down
# and the cluster is created again from empty directories.
set -euo pipefail

PORT=${ONCELY_REDIS_CLUSTER_PORT:-7100}
DIR=${ONCELY_REDIS_CLUSTER_DIR:-/tmp/oncely-redis-cluster-$PORT}
NODE_TIMEOUT=${ONCELY_REDIS_CLUSTER_NODE_TIMEOUT:-3000}
PORTS=()
for i in 0 1 2 3 4 5; do PORTS+=($((PORT + i))); done

cli() { redis-cli -h 127.0.0.1 -p "$1" "${@:2}"; }

url() {
  echo "redis+cluster://127.0.0.1:${PORTS[0]},127.0.0.1:${PORTS[1]},127.0.0.1:${PORTS[2]}"
}

healthy() {
  local p info
  for p in "${PORTS[@]}"; do
    cli "$p" ping 2>/dev/null | grep -q PONG || return 1
    info=$(cli "$p" cluster info 2>/dev/null) || return 1
    grep -q '^cluster_state:ok' <<<"$info" || return 1
    grep -q '^cluster_known_nodes:6' <<<"$info" || return 1
    grep -q '^cluster_size:3' <<<"$info" || return 1
    cli "$p" config get appendonly 2>/dev/null | grep -qx yes || return 1
  done
  # Every primary has a connected replica (so WAIT 1 can succeed), and every replica is in sync.
  local primaries=0 synced=0 role
  for p in "${PORTS[@]}"; do
    role=$(cli "$p" info replication 2>/dev/null | tr -d '\r')
    if grep -q '^role:master' <<<"$role"; then
      grep -q '^connected_slaves:[1-9]' <<<"$role" && primaries=$((primaries + 1))
    else
      grep -q '^master_link_status:up' <<<"$role" && synced=$((synced + 1))
    fi
  done
  [[ $primaries -eq 3 && $synced -eq 3 ]]
}

stop() {
  local p
  for p in "${PORTS[@]}"; do
    # Only nodes this script started: they keep their pid file in $DIR.
    if [[ -f "$DIR/$p.pid" ]]; then
      cli "$p" shutdown nosave >/dev/null 2>&1 || true
      local pid
      pid=$(cat "$DIR/$p.pid" 2>/dev/null || true)
      for _ in $(seq 1 50); do
        [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null || break
        sleep 0.1
      done
    fi
  done
  rm -rf "$DIR"
}

start_node() {
  local p=$1
  mkdir -p "$DIR/$p"
  # The daemons outlive this script: they must not inherit its descriptors beyond stdio (a
  # caller's flock(1) lock file, a pipe a caller waits on), or they hold them for ever. Closed
  # in a subshell, so the script's own (bash reads it from fd 255) stay open.
  (
    for fd in /proc/self/fd/*; do
      fd=${fd##*/}
      if [[ $fd -gt 2 ]]; then eval "exec $fd>&-" 2>/dev/null || true; fi
    done
    exec redis-server --port "$p" --bind 127.0.0.1 --daemonize yes \
      --dir "$DIR/$p" --pidfile "$DIR/$p.pid" --logfile "$DIR/$p.log" \
      --cluster-enabled yes --cluster-config-file "$DIR/$p/nodes.conf" \
      --cluster-node-timeout "$NODE_TIMEOUT" \
      --appendonly yes --appendfsync everysec --save ""
  )
  for _ in $(seq 1 50); do cli "$p" ping 2>/dev/null | grep -q PONG && break; sleep 0.1; done
  cli "$p" ping >/dev/null
}

start() {
  if healthy; then
    echo "redis cluster on ports ${PORTS[0]}-${PORTS[5]} is running and healthy: reused" >&2
    url
    return
  fi
  echo "starting a redis cluster on ports ${PORTS[0]}-${PORTS[5]} (files in $DIR)" >&2
  stop
  local p
  for p in "${PORTS[@]}"; do
    if cli "$p" ping >/dev/null 2>&1; then
      echo "port $p is taken by a Redis this script did not start; stop it or set ONCELY_REDIS_CLUSTER_PORT" >&2
      exit 1
    fi
  done
  mkdir -p "$DIR"
  for p in "${PORTS[@]}"; do start_node "$p"; done
  local nodes=()
  for p in "${PORTS[@]}"; do nodes+=("127.0.0.1:$p"); done
  redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >"$DIR/create.log" 2>&1 || {
    cat "$DIR/create.log" >&2
    exit 1
  }
  for _ in $(seq 1 150); do
    healthy && break
    sleep 0.2
  done
  if ! healthy; then
    echo "the redis cluster did not become healthy within 30 s; see $DIR/*.log" >&2
    exit 1
  fi
  echo "redis cluster on ports ${PORTS[0]}-${PORTS[5]} is up" >&2
  url
}

case "${1:-start}" in
  start) start ;;
  stop) stop ;;
  status) healthy ;;
  node) start_node "${2:?usage: $0 node PORT}" ;;
  *)
    echo "usage: $0 [start|stop|status|node PORT]" >&2
    exit 2
    ;;
esac

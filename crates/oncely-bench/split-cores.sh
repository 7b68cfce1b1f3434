#!/usr/bin/env bash
# Runs the transactional bench (docs/PERFORMANCE.md, "The transactional layer against its floor")
# with the database and the application on separate CPU cores: every process of this machine's
# database server on core 0 (PostgreSQL's postmaster and backends; MySQL's or MariaDB's one `mysqld`
# / `mariadbd` process, with all its threads, also the ones it starts later, which inherit the
# affinity), the bench on core 1. That is the split of a deployment where the database has a host of
# its own; the plain `cargo bench` run shares both cores between the two, so there every microsecond
# of the application's CPU is also taken from the database. See docs/PERFORMANCE.md, "The
# transactional layer against its floor".
#
# Usage (from the workspace root, as a user allowed to change the database processes'
# affinity, e.g. root on the CI machine):
#
#   ONCELY_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/oncely_bench \
#     crates/oncely-bench/split-cores.sh [extra cargo bench arguments]
#
#   ONCELY_BENCH_DBS=mysql ONCELY_BENCH_MYSQL_URL=mysql://root@127.0.0.1:3306/oncely_bench \
#     crates/oncely-bench/split-cores.sh
#
# The usual ONCELY_BENCH_* variables apply (ONCELY_BENCH_DBS defaults to `postgres` here:
# SQLite runs inside the bench's own process, so there is nothing to split). The servers of the
# databases ONCELY_BENCH_DBS names are pinned; they get every core back when the bench ends, also
# when it fails or is interrupted.
set -euo pipefail

export ONCELY_BENCH_DBS="${ONCELY_BENCH_DBS:-postgres}"

if [ "$(nproc)" -lt 2 ]; then
  echo "split-cores.sh: needs at least 2 CPU cores, this machine has $(nproc)" >&2
  exit 2
fi

# The database servers' process names, from ONCELY_BENCH_DBS.
names=()
case ",$ONCELY_BENCH_DBS," in *,postgres,*) names+=(postgres) ;; esac
case ",$ONCELY_BENCH_DBS," in *,mysql,*) names+=(mariadbd mysqld) ;; esac
if [ "${#names[@]}" -eq 0 ]; then
  echo "split-cores.sh: ONCELY_BENCH_DBS=$ONCELY_BENCH_DBS names no database server (postgres, mysql)" >&2
  exit 2
fi

server_pids() {
  for n in "${names[@]}"; do
    pgrep -x "$n" || true
  done
}

case ",$ONCELY_BENCH_DBS," in *,postgres,*)
  if ! pgrep -x postgres >/dev/null; then
    echo "split-cores.sh: no running postgres process found; start PostgreSQL first" >&2
    exit 2
  fi ;;
esac
case ",$ONCELY_BENCH_DBS," in *,mysql,*)
  if ! pgrep -x 'mariadbd|mysqld' >/dev/null; then
    echo "split-cores.sh: no running mariadbd or mysqld process found; start MySQL / MariaDB first" >&2
    exit 2
  fi ;;
esac
pids=$(server_pids)
all="0-$(($(nproc) - 1))"

restore() {
  for p in $(server_pids); do
    taskset -a -p -c "$all" "$p" >/dev/null 2>&1 || true
  done
  echo "split-cores.sh: ${names[*]} may run on cores $all again" >&2
}
trap restore EXIT

for p in $pids; do
  taskset -a -p -c 0 "$p" >/dev/null
done
echo "split-cores.sh: ${names[*]} on core 0 ($(echo "$pids" | wc -w) processes), the bench on core 1" >&2

taskset -c 1 cargo bench -p oncely-bench --bench transactional "$@"

#!/usr/bin/env bash
# Runs issue 11's transactional bench with the database and the application on separate CPU
# cores: every PostgreSQL process of this machine (the postmaster, so also the backends it
# forks for the bench's connections) on core 0, the bench on core 1. That is the split of a
# deployment where the database has a host of its own; the plain `cargo bench` run shares both
# cores between the two, so there every microsecond of the application's CPU is also taken from
# the database. See docs/PERFORMANCE.md, "issue 11, round 6".
#
# Usage (from the workspace root, as a user allowed to change the PostgreSQL processes'
# affinity, e.g. root on the CI machine):
#
#   ONCELY_BENCH_POSTGRES_URL=postgres://postgres@127.0.0.1:5432/oncely_bench \
#     crates/oncely-bench/split-cores.sh [extra cargo bench arguments]
#
# The usual ONCELY_BENCH_* variables apply (ONCELY_BENCH_DBS defaults to `postgres` here:
# SQLite runs inside the bench's own process, so there is nothing to split). The PostgreSQL
# processes get both cores back when the bench ends, also when it fails or is interrupted.
set -euo pipefail

if [ "$(nproc)" -lt 2 ]; then
  echo "split-cores.sh: needs at least 2 CPU cores, this machine has $(nproc)" >&2
  exit 2
fi
pids=$(pgrep -x postgres || true)
if [ -z "$pids" ]; then
  echo "split-cores.sh: no running postgres process found; start PostgreSQL first" >&2
  exit 2
fi
all="0-$(($(nproc) - 1))"

restore() {
  for p in $(pgrep -x postgres || true); do
    taskset -a -p -c "$all" "$p" >/dev/null 2>&1 || true
  done
  echo "split-cores.sh: PostgreSQL may run on cores $all again" >&2
}
trap restore EXIT

for p in $pids; do
  taskset -a -p -c 0 "$p" >/dev/null
done
echo "split-cores.sh: PostgreSQL on core 0 ($(echo "$pids" | wc -w) processes), the bench on core 1" >&2

export ONCELY_BENCH_DBS="${ONCELY_BENCH_DBS:-postgres}"
taskset -c 1 cargo bench -p oncely-bench --bench transactional "$@"

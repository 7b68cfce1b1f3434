#!/usr/bin/env bash
# Schemathesis (pinned, from PyPI, in a venv under target/) against a running `oncely serve`'s
# /openapi.json: every stateless phase (examples, coverage, fuzzing), every check, a bounded
# number of examples per operation and a fixed seed, so a run is reproducible. Starts the
# server on a free loopback port with the memory store and stops it on exit. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."

SCHEMATHESIS_VERSION=4.32.5
VENV=target/ci-venv
if ! "$VENV/bin/st" --version 2>/dev/null | grep -q "version $SCHEMATHESIS_VERSION\$"; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q "schemathesis==$SCHEMATHESIS_VERSION"
fi

cargo build -q --bin oncely
work=$(mktemp -d)
target/debug/oncely serve --store memory --addr 127.0.0.1:0 >"$work/out" 2>"$work/err" &
pid=$!
cleanup() {
  kill "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
url=""
for _ in $(seq 1 100); do
  url=$(sed -n 's/^oncely: listening on //p' "$work/out" | head -n1)
  [ -n "$url" ] && break
  kill -0 "$pid" 2>/dev/null || { cat "$work/err"; echo "oncely serve exited"; exit 1; }
  sleep 0.1
done
[ -n "$url" ] || { cat "$work/err"; echo "oncely serve did not print its address"; exit 1; }
echo "schemathesis $SCHEMATHESIS_VERSION against $url/openapi.json"

# `ignored_auth` is left out: the reference server's authentication is a documented stand-in
# that takes any bearer token as the caller's account, so no credential is "invalid" to it.
SCHEMATHESIS_HOOKS=schemathesis_hooks PYTHONPATH=.ci "$VENV/bin/st" --config-file .ci/schemathesis.toml \
  run "$url/openapi.json" \
  --url "$url" \
  --phases examples,coverage,fuzzing \
  --checks all \
  --exclude-checks ignored_auth \
  --max-examples "${SCHEMATHESIS_MAX_EXAMPLES:-50}" \
  --seed 14 \
  --workers 1 \
  --no-color

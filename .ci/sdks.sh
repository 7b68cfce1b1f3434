#!/usr/bin/env bash
# The Python and Node SDKs against the Rust side: builds the `oncely` binary, starts
# `oncely testbench` (the scripted fault server of conformance/retry/), and runs each SDK's own
# CI script with ONCELY_TESTBENCH_URL and ONCELY_BIN set:
#   sdks/python/ci.sh  a venv under target/ with pinned httpx and pytest from PyPI, ./sdks/python
#                      installed into it; its tests, the conformance runner, the fleet run
#   sdks/node/ci.sh    npm ci in sdks/node; its tests, the conformance runner, the fleet run
# (the fleet runs: `oncely gates --only fleet --client-command ...`, conformance/README.md).
# Both SDKs run even if the first fails; any failure, or a missing script, exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

if ! python3 -c "import venv, ensurepip" 2>/dev/null; then
  apt-get install -y -q python3-venv
fi
command -v node >/dev/null && command -v npm >/dev/null || {
  echo "sdks.sh: node and npm are needed for sdks/node" >&2
  exit 2
}

echo "== sdks: build the oncely binary"
cargo build -q -p oncely-cli
export ONCELY_BIN="$root/target/debug/oncely"

echo "== sdks: start oncely testbench"
tb_out=$(mktemp)
"$ONCELY_BIN" testbench --addr 127.0.0.1:0 --scenarios conformance/retry/scenarios.json >"$tb_out" &
tb_pid=$!
cleanup() {
  kill "$tb_pid" 2>/dev/null || true
  wait "$tb_pid" 2>/dev/null || true
  rm -f "$tb_out"
}
trap cleanup EXIT
url=""
for _ in $(seq 1 300); do
  url=$(head -n 1 "$tb_out" 2>/dev/null || true)
  [[ "$url" == http://* ]] && break
  kill -0 "$tb_pid" 2>/dev/null || { echo "sdks.sh: the testbench exited before it was listening" >&2; exit 1; }
  sleep 0.1
done
[[ "$url" == http://* ]] || { echo "sdks.sh: the testbench printed no URL in 30 s" >&2; exit 1; }
export ONCELY_TESTBENCH_URL="$url"
echo "testbench at $ONCELY_TESTBENCH_URL ($(curl -fsS "$url/_testbench/info" 2>/dev/null | tr -d ' \n' || echo 'info not read'))"

failed=()
for sdk in python node; do
  script="sdks/$sdk/ci.sh"
  echo "== sdks: $script"
  if [[ ! -f "$script" ]]; then
    echo "sdks.sh: $script is missing" >&2
    failed+=("$sdk (no ci.sh)")
    continue
  fi
  if ! bash "$script"; then
    failed+=("$sdk")
  fi
done

if ((${#failed[@]})); then
  echo "sdks: FAILED: ${failed[*]}" >&2
  exit 1
fi
echo "sdks: python and node passed"

#!/usr/bin/env bash
# The Node SDK's CI: install, build, check the shipped dist/, unit and socket tests, the README's
# code, the conformance suite against the testbench, and the fleet run against `oncely serve`.
#
# Environment:
#   ONCELY_TESTBENCH_URL  a running `oncely testbench` (else the runner starts one from ONCELY_BIN)
#   ONCELY_BIN            the built `oncely` binary (the fleet run, and the testbench if no URL)
#   ONCELY_CONFORMANCE_SLACK_MS  timing slack of the conformance runner (default 250 ms)
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")"

if [[ -z "${ONCELY_TESTBENCH_URL:-}" && -z "${ONCELY_BIN:-}" ]]; then
  echo "sdks/node/ci.sh: set ONCELY_TESTBENCH_URL or ONCELY_BIN" >&2
  exit 2
fi

echo "== sdks/node: npm ci"
npm ci --no-audit --no-fund
echo "== sdks/node: build, and check that the shipped dist/ is what src/ compiles to"
npm run --silent build
npm run --silent check-dist
echo "== sdks/node: the declarations as a TypeScript consumer sees them"
npx tsc -p test/types
echo "== sdks/node: unit, socket-level and README tests"
node --test test/unit/*.test.mjs test/http/*.test.mjs test/readme.test.mjs
echo "== sdks/node: conformance suite"
ONCELY_CONFORMANCE_REQUIRE=1 node --test test/conformance.test.mjs
echo "== sdks/node: fleet run through the fault proxy"
node test/fleet_client.mjs

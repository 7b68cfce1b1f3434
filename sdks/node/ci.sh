#!/usr/bin/env bash
# The Node SDK's CI: install, build, check the shipped dist/, unit and socket tests, the README's
# code, the conformance suite against the testbench, and the fleet run against `oncely serve`
# (`oncely gates --only fleet --client-command`, with test/fleet_client.mjs as the clients:
# conformance/README.md, "The fleet run").
#
# Environment:
#   ONCELY_TESTBENCH_URL  a running `oncely testbench` (else the runner starts one from ONCELY_BIN)
#   ONCELY_BIN            the built `oncely` binary (required: the fleet run; the testbench if no URL)
#   ONCELY_FLEET_CLIENTS, ONCELY_FLEET_CALLS  the fleet's size (default 20 x 10, the Rust gate's)
#   ONCELY_CONFORMANCE_SLACK_MS  timing slack of the conformance runner (default 250 ms)
# Exits non-zero on any failure.
set -euo pipefail

if [[ -z "${ONCELY_BIN:-}" || ! -x "${ONCELY_BIN:-}" ]]; then
  echo "sdks/node/ci.sh: set ONCELY_BIN to the built oncely binary (the fleet run needs it)" >&2
  exit 2
fi
# Absolute, as given relative to the caller's directory, before the cd below.
ONCELY_BIN=$(realpath "$ONCELY_BIN")
export ONCELY_BIN
cd "$(dirname "$0")"

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
echo "== sdks/node: fleet of payments through oncely serve and the fleet gate's fault proxy"
client=$(printf '%q ' "$(command -v node)" "$PWD/test/fleet_client.mjs")
report=$(mktemp)
trap 'rm -f "$report"' EXIT
status=0
"$ONCELY_BIN" gates --only fleet --json \
  --fleet-clients "${ONCELY_FLEET_CLIENTS:-20}" --fleet-calls "${ONCELY_FLEET_CALLS:-10}" \
  --client-command "$client" >"$report" || status=$?
# The gate's exit status decides; the report is read for the summary, and a report that does not
# show 0 duplicate side effects and every payment made fails the run even if the status says pass.
GATE_STATUS=$status node - "$report" <<'JS'
const { readFileSync } = require('node:fs');
const text = readFileSync(process.argv[2], 'utf8');
let gate;
try {
  gate = JSON.parse(text).gates[0];
} catch {
  console.error(`fleet (node): the gate printed no report (exit ${process.env.GATE_STATUS}):\n${text}`);
  process.exit(1);
}
const d = gate.details ?? {};
console.log(JSON.stringify({ sdk: 'node', ...d }));
const passed =
  process.env.GATE_STATUS === '0' && gate.passed === true && d.duplicate_side_effects === 0 &&
  d.unresolved === 0 && d.payments === d.logical_calls && d.charged_keys === d.logical_calls;
console.log(
  `fleet (node): ${d.logical_calls} logical payments, ${d.duplicate_side_effects} duplicate side effects, ` +
    `${d.payments} payments, ${d.sdk_successes} finished within the SDK's retries, ${d.unresolved} unresolved ` +
    `(gate exit ${process.env.GATE_STATUS}): ${passed ? 'PASS' : 'FAIL'}`,
);
if (!passed) console.error(`fleet (node): ${gate.summary}`);
process.exit(passed ? 0 : 1);
JS

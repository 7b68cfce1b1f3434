// One fleet client process for the Node SDK, speaking the external-client interface of
// `oncely gates --only fleet --client-command CMD` (conformance/README.md, "The fleet run"; the
// Rust reference is `oncely fleet-client`, crates/oncely-cli/src/gates/fleet_client.rs).
//
// The gate starts the card processor, `oncely serve` and its fault proxy (responses dropped
// after the side effect, injected 503s with Retry-After, 502 while the server is down), kills and
// restarts the server a third of the way through, runs `--fleet-clients` of these processes,
// retries each call the SDK gave up on once with the same key, and counts the side effects per
// key in the processor's ledger: it passes with 0 duplicate side effects and every payment made.
//
// This process makes ONCELY_FLEET_CALLS payments one after the other through one
// `withRetries(fetch, policy)` (one retry budget for the process, as in production), the policy
// read from ONCELY_FLEET_MAX_ATTEMPTS, ONCELY_FLEET_DEADLINE_MS, ONCELY_FLEET_ATTEMPT_TIMEOUT_MS,
// ONCELY_FLEET_BASE_MS and ONCELY_FLEET_CAP_MS (milliseconds), each call with its event-derived
// key `${ONCELY_FLEET_KEY_PREFIX}-${n}` passed as `init.oncely.idempotencyKey`, and prints one
// JSON line per call to standard output: `{"key", "amount", "status", "error", "ms"}` (`status`
// null and `error` the error kind, the `OncelyRetryError` code in lower case, when the call
// ended in the SDK's retry error). Logs go to standard error. Any other exception, or a 201
// whose payment does not carry the call's amount (a response replayed for the wrong request),
// ends the process with exit status 1, which fails the gate.
//
// Usage (sdks/node/ci.sh does this):
//   "$ONCELY_BIN" gates --only fleet --client-command "node $PWD/sdks/node/test/fleet_client.mjs"
import { withRetries, isOncelyRetryError } from '../dist/index.js';

function variable(name) {
  const value = process.env[name];
  if (value === undefined || value === '') {
    throw new Error(`${name} is not set (run me through \`oncely gates --only fleet --client-command\`)`);
  }
  return value;
}

function number(name) {
  const text = variable(name);
  const value = Number(text);
  if (!Number.isSafeInteger(value) || value < 0) throw new Error(`${name} is not a whole number: ${JSON.stringify(text)}`);
  return value;
}

const url = variable('ONCELY_FLEET_URL').replace(/\/+$/, '');
const account = variable('ONCELY_FLEET_ACCOUNT');
const prefix = variable('ONCELY_FLEET_KEY_PREFIX');
const index = process.env.ONCELY_FLEET_CLIENT ?? '?';
const calls = number('ONCELY_FLEET_CALLS');
const retrying = withRetries(fetch, {
  maxAttempts: number('ONCELY_FLEET_MAX_ATTEMPTS'),
  deadlineMs: number('ONCELY_FLEET_DEADLINE_MS'),
  attemptTimeoutMs: number('ONCELY_FLEET_ATTEMPT_TIMEOUT_MS'),
  backoff: { jitter: 'full', baseMs: number('ONCELY_FLEET_BASE_MS'), capMs: number('ONCELY_FLEET_CAP_MS') },
});

const problems = [];
for (let n = 0; n < calls; n++) {
  const key = `${prefix}-${n}`;
  const amount = 100 + n;
  const began = performance.now();
  let status = null;
  let error = null;
  try {
    const response = await retrying(`${url}/v1/payments`, {
      method: 'POST',
      headers: { authorization: `Bearer ${account}`, 'content-type': 'application/json' },
      body: JSON.stringify({ amount, currency: 'EUR', source: 'tok_visa', description: 'gate' }),
      oncely: { idempotencyKey: key },
    });
    // Read the whole answer, as a caller would.
    const text = await response.text();
    status = response.status;
    if (status === 201) {
      const paid = JSON.parse(text).amount;
      if (paid !== amount) problems.push(`${key}: 201 for amount ${amount} carried amount ${paid}`);
    }
  } catch (e) {
    if (!isOncelyRetryError(e)) throw e;
    error = e.code.toLowerCase();
    console.error(`node fleet client ${index}: ${key}: ${e.message}`);
  }
  const ms = performance.now() - began;
  process.stdout.write(`${JSON.stringify({ key, amount, status, error, ms })}\n`);
}

console.error(`node fleet client ${index}: ${calls} calls, ${JSON.stringify(retrying.metrics())}`);
if (problems.length > 0) {
  for (const p of problems) console.error(`node fleet client ${index}: ${p}`);
  process.exitCode = 1;
}

// The Node runner of the language-neutral retry conformance suite (conformance/retry/README.md):
// reads conformance/retry/scenarios.json, checks `defaults` and `jitter` scenarios offline and runs
// every `http` scenario through `withRetries(fetch)` against `oncely testbench`.
//
// The testbench: ONCELY_TESTBENCH_URL if set (then it must answer); otherwise this runner starts
// `target/debug/oncely testbench --addr 127.0.0.1:0` itself when that binary exists (ONCELY_BIN
// names another one), and skips the `http` scenarios, saying why, when there is none (unless
// ONCELY_CONFORMANCE_REQUIRE is set: then that is a failure).
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createHash, randomUUID } from 'node:crypto';
import { existsSync, readFileSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import path from 'node:path';
import { withRetries, resolvePolicy, delayMs, RetryBudget, isOncelyRetryError, isValidKey } from '../dist/index.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const FILE = path.join(ROOT, 'conformance/retry/scenarios.json');
const SLACK = Number(process.env.ONCELY_CONFORMANCE_SLACK_MS ?? 250);

const suite = JSON.parse(readFileSync(FILE, 'utf8'));
assert.equal(suite.format, 1, `${FILE}: format ${suite.format}, this runner reads format 1`);
checkFields('file', suite, ['$schema', 'format', 'policy', 'scenarios'], ['format', 'scenarios']);
console.log(`conformance: ${suite.scenarios.length} scenarios in conformance/retry/scenarios.json`);

// ---------------------------------------------------------------------------------------------
// The testbench.

let bench; // { url, refusedUrl } or undefined
let benchProcess;
let skipReason;

async function startTestbench() {
  if (process.env.ONCELY_TESTBENCH_URL) return process.env.ONCELY_TESTBENCH_URL.replace(/\/$/, '');
  const bin = process.env.ONCELY_BIN || path.join(ROOT, 'target/debug/oncely');
  if (!existsSync(bin)) {
    skipReason = `no testbench: ONCELY_TESTBENCH_URL is unset and ${bin} does not exist (cargo build -p oncely-cli)`;
    return undefined;
  }
  benchProcess = spawn(bin, ['testbench', '--addr', '127.0.0.1:0', '--scenarios', FILE], { stdio: ['ignore', 'pipe', 'pipe'] });
  let stderr = '';
  benchProcess.stderr.on('data', (c) => (stderr += c));
  const line = await new Promise((resolve) => {
    const rl = createInterface({ input: benchProcess.stdout });
    rl.once('line', (l) => resolve(l.trim()));
    benchProcess.once('exit', () => resolve(undefined));
    setTimeout(() => resolve(undefined), 20_000).unref();
  });
  if (!line || !/^https?:\/\//.test(line)) {
    benchProcess.kill();
    benchProcess = undefined;
    skipReason = `no testbench: ${bin} testbench did not print its URL (${stderr.trim().split('\n').at(-1) ?? 'no output'})`;
    return undefined;
  }
  return line;
}

before(async () => {
  const url = await startTestbench();
  if (url === undefined) {
    // CI (ci.sh) sets ONCELY_CONFORMANCE_REQUIRE=1: there a missing testbench is a failure.
    assert.ok(!process.env.ONCELY_CONFORMANCE_REQUIRE, `conformance: the testbench is required: ${skipReason}`);
    console.log(`conformance: SKIPPING the http scenarios: ${skipReason}`);
    return;
  }
  const info = await (await fetch(`${url}/_testbench/info`)).json();
  assert.equal(info.format, 1, 'the testbench speaks another format');
  bench = { url, refusedUrl: String(info.refused_url).replace(/\/$/, '') };
  console.log(`conformance: testbench ${url} (${info.scenarios} scenarios loaded, refused_url ${bench.refusedUrl})`);
});

after(() => benchProcess?.kill());

// ---------------------------------------------------------------------------------------------
// The format's checks on the file itself: unknown fields are an error.

function checkFields(where, object, allowed, required = []) {
  assert.ok(object !== null && typeof object === 'object' && !Array.isArray(object), `${where}: not an object`);
  for (const k of Object.keys(object)) assert.ok(allowed.includes(k), `${where}: unknown field ${JSON.stringify(k)}`);
  for (const k of required) assert.ok(k in object, `${where}: missing field ${JSON.stringify(k)}`);
}

const POLICY_FIELDS = ['max_attempts', 'deadline_ms', 'attempt_timeout_ms', 'base_ms', 'cap_ms', 'retry_500', 'mint_keys', 'budget'];
const BUDGET_FIELDS = ['capacity', 'transient_cost', 'throttle_cost', 'success_refund'];

/** The SDK's options for a file policy (merged over the SDK's defaults, key by key). */
function sdkOptions(...policies) {
  const merged = {};
  let budget = {};
  for (const p of policies) {
    if (p === undefined) continue;
    checkFields('policy', p, POLICY_FIELDS);
    for (const [k, v] of Object.entries(p)) {
      if (k !== 'budget') merged[k] = v;
      else if (v === null) budget = null;
      else {
        checkFields('policy.budget', v, BUDGET_FIELDS);
        budget = { ...(budget ?? {}), ...v };
      }
    }
  }
  const options = {};
  if (merged.max_attempts !== undefined) options.maxAttempts = merged.max_attempts;
  if (merged.deadline_ms !== undefined) options.deadlineMs = merged.deadline_ms;
  if (merged.attempt_timeout_ms !== undefined) options.attemptTimeoutMs = merged.attempt_timeout_ms;
  if (merged.base_ms !== undefined || merged.cap_ms !== undefined) {
    options.backoff = {};
    if (merged.base_ms !== undefined) options.backoff.baseMs = merged.base_ms;
    if (merged.cap_ms !== undefined) options.backoff.capMs = merged.cap_ms;
  }
  if (merged.retry_500 !== undefined) options.retry500 = merged.retry_500;
  if (merged.mint_keys !== undefined) options.mintKeys = merged.mint_keys;
  if (budget === null) options.budget = null;
  else {
    const b = {};
    if (budget.capacity !== undefined) b.capacity = budget.capacity;
    if (budget.transient_cost !== undefined) b.transientCost = budget.transient_cost;
    if (budget.throttle_cost !== undefined) b.throttleCost = budget.throttle_cost;
    if (budget.success_refund !== undefined) b.successRefund = budget.success_refund;
    options.budget = new RetryBudget(b);
  }
  return options;
}

// ---------------------------------------------------------------------------------------------
// Kind `defaults`.

function runDefaults(s) {
  checkFields(s.id, s, ['id', 'kind', 'rule', 'sources', 'expect'], ['expect']);
  const p = resolvePolicy();
  const actual = {
    max_attempts: p.maxAttempts,
    deadline_ms: p.deadlineMs,
    attempt_timeout_ms: p.attemptTimeoutMs,
    jitter: p.backoff.jitter,
    base_ms: p.backoff.baseMs,
    cap_ms: p.backoff.capMs,
    retry_500: p.retry500,
    mint_keys: p.mintKeys,
    budget: {
      capacity: p.budget.config.capacity,
      transient_cost: p.budget.config.transientCost,
      throttle_cost: p.budget.config.throttleCost,
      success_refund: p.budget.config.successRefund,
    },
  };
  checkFields(`${s.id}.expect`, s.expect, Object.keys(actual));
  for (const [k, v] of Object.entries(s.expect)) assert.deepEqual(actual[k], v, `${s.id}: default ${k}`);
}

// ---------------------------------------------------------------------------------------------
// Kind `jitter`.

function runJitter(s) {
  checkFields(s.id, s, ['id', 'kind', 'rule', 'sources', 'policy', 'draws', 'retries'], ['draws', 'retries']);
  const options = sdkOptions(s.policy);
  const backoff = resolvePolicy({ backoff: options.backoff }).backoff;
  for (const r of s.retries) {
    checkFields(`${s.id}.retries`, r, ['retry', 'expect'], ['retry', 'expect']);
    checkFields(`${s.id}.retries.expect`, r.expect, ['max_ms', 'some_below_ms', 'some_above_ms', 'mean_ms']);
    const draws = Array.from({ length: s.draws }, () => delayMs(backoff, r.retry, undefined, Math.random));
    const where = `${s.id}: retry ${r.retry}`;
    for (const d of draws) {
      assert.ok(Number.isFinite(d) && d >= 0, `${where}: draw ${d} is below 0`);
      if (r.expect.max_ms !== undefined) assert.ok(d <= r.expect.max_ms + 0.001, `${where}: draw ${d} > max_ms ${r.expect.max_ms}`);
    }
    if (r.expect.some_below_ms !== undefined) {
      assert.ok(draws.some((d) => d < r.expect.some_below_ms), `${where}: no draw below ${r.expect.some_below_ms} (min ${Math.min(...draws)})`);
    }
    if (r.expect.some_above_ms !== undefined) {
      assert.ok(draws.some((d) => d > r.expect.some_above_ms), `${where}: no draw above ${r.expect.some_above_ms} (max ${Math.max(...draws)})`);
    }
    if (r.expect.mean_ms !== undefined) {
      const mean = draws.reduce((a, d) => a + d, 0) / draws.length;
      if (r.expect.mean_ms.min !== undefined) assert.ok(mean >= r.expect.mean_ms.min, `${where}: mean ${mean} < ${r.expect.mean_ms.min}`);
      if (r.expect.mean_ms.max !== undefined) assert.ok(mean <= r.expect.mean_ms.max, `${where}: mean ${mean} > ${r.expect.mean_ms.max}`);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Kind `http`.

const CALL_FIELDS = ['method', 'path', 'key', 'body', 'headers', 'deadline_ms', 'max_attempts', 'layers', 'repeat', 'server', 'expect'];
const EXPECT_FIELDS = ['attempts', 'key', 'waits_ms', 'total_wait_ms', 'attempt_ms', 'elapsed_ms', 'result'];

const lower = (ms) => ms - 5;
const upper = (ms) => ms + SLACK;

function within(where, value, min, max) {
  if (min !== undefined && min !== null) assert.ok(value >= lower(min), `${where}: ${value.toFixed(1)} ms < min ${min} ms`);
  if (max !== undefined && max !== null) assert.ok(value <= upper(max), `${where}: ${value.toFixed(1)} ms > max ${max} ms (+${SLACK} ms slack)`);
}

/** Makes one logical call and keeps what it returned. */
async function makeCall(client, base, s, call, index, run) {
  const headers = { ...(call.headers ?? {}), 'x-oncely-scenario': s.id, 'x-oncely-run': run, 'x-oncely-call': String(index) };
  const oncely = {};
  if (call.key === 'none') oncely.mintKeys = false;
  else if (call.key !== undefined && call.key !== 'auto') {
    checkFields(`${s.id}.key`, call.key, ['value'], ['value']);
    oncely.idempotencyKey = call.key.value;
  }
  if (call.deadline_ms !== undefined) oncely.deadlineMs = call.deadline_ms;
  if (call.max_attempts !== undefined) oncely.maxAttempts = call.max_attempts;
  const init = { method: call.method, headers, oncely };
  if (call.body !== undefined && call.body !== null) {
    checkFields(`${s.id}.body`, call.body, ['text', 'content_type'], ['text']);
    init.body = call.body.text;
    if (call.body.content_type !== undefined) headers['content-type'] = call.body.content_type;
  }
  const started = performance.now();
  try {
    const response = await client(`${base}${call.path}`, init);
    const text = await response.text();
    return { elapsed: performance.now() - started, response: { status: response.status, headers: response.headers, text } };
  } catch (error) {
    const elapsed = performance.now() - started;
    if (!isOncelyRetryError(error)) throw new Error(`${s.id}: call ${index} raised something other than the SDK's retry error: ${error?.stack ?? error}`);
    return { elapsed, error };
  }
}

async function fetchRun(run) {
  for (let i = 0; ; i++) {
    const answer = await (await fetch(`${bench.url}/_testbench/runs/${encodeURIComponent(run)}`)).json();
    if (!answer.attempts.some((a) => a.answer === 'in_progress') || i >= 40) return answer;
    await new Promise((r) => setTimeout(r, 50));
  }
}

const sha256 = (text) => createHash('sha256').update(Buffer.from(text, 'utf8')).digest('hex');

function checkCall(s, call, index, outcome, attempts, mintedKeys) {
  const where = `${s.id}: call ${index}`;
  const expect = call.expect;
  checkFields(`${where}.expect`, expect, EXPECT_FIELDS, ['attempts', 'result']);
  assert.equal(attempts.length, expect.attempts, `${where}: the testbench saw ${attempts.length} attempts, expected ${expect.attempts}`);

  // Implicit checks: the x-oncely headers and the body, byte for byte, on every attempt.
  const bodyText = call.body?.text ?? '';
  for (const a of attempts) {
    const h = (name) => a.headers.filter(([n]) => n === name).map(([, v]) => v);
    assert.deepEqual(h('x-oncely-scenario'), [s.id], `${where}, attempt ${a.attempt}: x-oncely-scenario`);
    assert.deepEqual(h('x-oncely-call'), [String(index)], `${where}, attempt ${a.attempt}: x-oncely-call`);
    assert.equal(h('x-oncely-run').length, 1, `${where}, attempt ${a.attempt}: x-oncely-run`);
    assert.equal(a.body_len, Buffer.byteLength(bodyText), `${where}, attempt ${a.attempt}: body length`);
    assert.equal(a.body_sha256, sha256(bodyText), `${where}, attempt ${a.attempt}: body bytes differ from the call's`);
  }

  // The key on the wire.
  const keyExpect = expect.key;
  if (keyExpect === 'minted') {
    for (const a of attempts) assert.equal(a.idempotency_key_count, 1, `${where}, attempt ${a.attempt}: ${a.idempotency_key_count} Idempotency-Key headers`);
    const keys = new Set(attempts.map((a) => a.idempotency_key));
    assert.equal(keys.size, attempts.length > 0 ? 1 : 0, `${where}: the attempts carried different keys ${[...keys]}`);
    for (const k of keys) assert.ok(isValidKey(k) && k === k.trim(), `${where}: minted key ${JSON.stringify(k)} is not valid`);
    for (const k of keys) mintedKeys.push(k);
  } else if (keyExpect === 'given') {
    for (const a of attempts) {
      assert.equal(a.idempotency_key_count, 1, `${where}, attempt ${a.attempt}: key count`);
      assert.equal(a.idempotency_key, call.key.value, `${where}, attempt ${a.attempt}: key`);
    }
  } else if (keyExpect === 'none') {
    for (const a of attempts) assert.equal(a.idempotency_key, null, `${where}, attempt ${a.attempt}: carried a key ${a.idempotency_key}`);
  } else {
    assert.equal(keyExpect, undefined, `${where}: unknown expect.key ${JSON.stringify(keyExpect)}`);
  }

  // Timing, as the testbench measured it.
  const waits = attempts.slice(1).map((a, i) => a.arrived_ms - attempts[i].ended_ms);
  if (expect.waits_ms !== undefined) {
    assert.equal(expect.waits_ms.length, waits.length, `${where}: waits_ms has ${expect.waits_ms.length} pairs for ${waits.length} waits`);
    expect.waits_ms.forEach(([min, max], i) => within(`${where}: the wait before attempt ${i + 2}`, waits[i], min, max));
  }
  if (expect.total_wait_ms !== undefined) {
    within(`${where}: total wait`, waits.reduce((a, w) => a + w, 0), expect.total_wait_ms.min, expect.total_wait_ms.max);
  }
  if (expect.attempt_ms !== undefined) {
    assert.equal(expect.attempt_ms.length, attempts.length, `${where}: attempt_ms length`);
    // The client's attempt timer starts before the testbench sees the request (the connect and
    // the send): the first attempt's lower bound is checked with the call's time the testbench
    // did not see added (conformance/retry/README.md, "How a runner checks a scenario"); the
    // upper bound with the held time alone.
    const unseen = attempts.length === 0 ? 0 : Math.max(0, outcome.elapsed - (attempts[attempts.length - 1].ended_ms - attempts[0].arrived_ms));
    expect.attempt_ms.forEach(([min, max], i) => {
      const held = attempts[i].ended_ms - attempts[i].arrived_ms;
      const credit = i === 0 ? unseen : 0;
      within(`${where}: attempt ${i + 1} held (+${credit.toFixed(1)} ms the testbench did not see)`, held + credit, min, null);
      within(`${where}: attempt ${i + 1} held`, held, null, max);
    });
  }
  if (expect.elapsed_ms !== undefined) within(`${where}: elapsed`, outcome.elapsed, expect.elapsed_ms.min, expect.elapsed_ms.max);

  // What the call returned.
  const result = expect.result;
  if ('status' in result) {
    checkFields(`${where}.result`, result, ['status', 'body_json', 'body_text', 'headers'], ['status']);
    assert.ok(outcome.response, `${where}: expected a ${result.status} response, got ${outcome.error?.code}: ${outcome.error?.message}`);
    assert.equal(outcome.response.status, result.status, `${where}: status`);
    if ('body_json' in result) assert.deepEqual(JSON.parse(outcome.response.text), result.body_json, `${where}: body`);
    if ('body_text' in result) assert.equal(outcome.response.text, result.body_text, `${where}: body text`);
    for (const [name, value] of Object.entries(result.headers ?? {})) {
      assert.equal(outcome.response.headers.get(name), value, `${where}: header ${name}`);
    }
  } else {
    checkFields(`${where}.result`, result, ['error', 'outcome_unknown', 'attempts', 'last_status', 'key', 'retry_after_ms'], ['error']);
    const e = outcome.error;
    assert.ok(e, `${where}: expected the error ${result.error}, got a ${outcome.response?.status} response`);
    assert.equal(e.code.toLowerCase(), result.error, `${where}: error kind (${e.message})`);
    if ('outcome_unknown' in result) assert.equal(e.outcomeUnknown, result.outcome_unknown, `${where}: outcomeUnknown`);
    if ('attempts' in result) assert.equal(e.attempts, result.attempts, `${where}: error attempts`);
    if ('last_status' in result) assert.equal(e.lastStatus ?? null, result.last_status, `${where}: lastStatus`);
    if (result.key === 'minted') {
      assert.ok(typeof e.idempotencyKey === 'string' && isValidKey(e.idempotencyKey), `${where}: the error carries no valid key`);
      if (attempts.length > 0) assert.equal(e.idempotencyKey, attempts[0].idempotency_key, `${where}: the error's key is not the attempts'`);
    } else if (result.key === 'given') {
      assert.equal(e.idempotencyKey, call.key.value, `${where}: the error's key`);
    } else if (result.key === 'none') {
      assert.equal(e.idempotencyKey, undefined, `${where}: the error carries a key ${e.idempotencyKey}`);
    }
    if (result.retry_after_ms !== undefined) {
      assert.ok(e.retryAfterMs !== undefined, `${where}: the error carries no Retry-After hint`);
      // The hint is the server's number (or a date's distance), not a measured time: no slack.
      if (result.retry_after_ms.min !== undefined) assert.ok(e.retryAfterMs >= result.retry_after_ms.min, `${where}: hint ${e.retryAfterMs} < ${result.retry_after_ms.min}`);
      if (result.retry_after_ms.max !== undefined) assert.ok(e.retryAfterMs <= result.retry_after_ms.max, `${where}: hint ${e.retryAfterMs} > ${result.retry_after_ms.max}`);
    }
  }
}

async function runHttp(s, t) {
  checkFields(s.id, s, ['id', 'kind', 'rule', 'sources', 'policy', 'target', 'distinct_keys', 'calls'], ['calls']);
  if (bench === undefined) {
    t.skip(skipReason);
    return;
  }
  const target = s.target ?? 'testbench';
  assert.ok(target === 'testbench' || target === 'refused', `${s.id}: unknown target ${target}`);
  const base = target === 'refused' ? bench.refusedUrl : bench.url;
  // One client per scenario: one budget shared by all its calls (and by both layers when stacked).
  const options = sdkOptions(suite.policy, s.policy);
  const one = withRetries(fetch, options);
  const two = withRetries(withRetries(fetch, options), options);
  const run = `node-${s.id}-${randomUUID()}`.slice(0, 128);
  const calls = [];
  for (const call of s.calls) {
    checkFields(`${s.id}.call`, call, CALL_FIELDS, ['method', 'path', 'expect']);
    for (let i = 0; i < (call.repeat ?? 1); i++) calls.push(call);
  }
  const outcomes = [];
  for (const [index, call] of calls.entries()) {
    const layers = call.layers ?? 1;
    assert.ok(layers === 1 || layers === 2, `${s.id}: layers ${layers}`);
    outcomes.push(await makeCall(layers === 2 ? two : one, base, s, call, index, run));
  }
  const seen = await fetchRun(run);
  const mintedKeys = [];
  for (const [index, call] of calls.entries()) {
    const attempts = seen.attempts.filter((a) => a.call === index).sort((a, b) => a.attempt - b.attempt);
    checkCall(s, call, index, outcomes[index], attempts, mintedKeys);
  }
  if (s.distinct_keys) assert.equal(new Set(mintedKeys).size, mintedKeys.length, `${s.id}: minted keys repeat across calls: ${mintedKeys}`);
  await fetch(`${bench.url}/_testbench/runs/${encodeURIComponent(run)}`, { method: 'DELETE' }).catch(() => {});
}

for (const s of suite.scenarios) {
  test(s.id, async (t) => {
    checkFields(s.id, s, ['id', 'kind', 'rule', 'sources', 'policy', 'target', 'distinct_keys', 'calls', 'expect', 'draws', 'retries']);
    if (s.kind === 'defaults') runDefaults(s);
    else if (s.kind === 'jitter') runJitter(s);
    else if (s.kind === 'http') await runHttp(s, t);
    else assert.fail(`${s.id}: unknown kind ${s.kind}`);
  });
}

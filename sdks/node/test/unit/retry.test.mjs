// withRetries against a scripted fake fetch and a simulated clock: each rule of the loop.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { withRetries, OncelyRetryError, OncelyAbortError, RetryBudget, sendGuard } from '../../dist/index.js';
import { FakeClock, scriptedFetch, answer, problem, networkError, hang, fixedRandom } from '../helpers.mjs';

const URL_ = 'http://api.test/v1/payments';

function setup(script, options = {}) {
  const clock = new FakeClock();
  const fetch = scriptedFetch(script);
  const retrying = withRetries(fetch, { clock, random: fixedRandom(0.5), ...options });
  return { clock, fetch, retrying };
}

async function rejection(promise) {
  try {
    await promise;
  } catch (e) {
    return e;
  }
  assert.fail('expected a rejection');
}

test('a POST gets one key minted, the same on every attempt; a new logical call gets a new one', async () => {
  const { fetch, retrying } = setup([answer(503), answer(503), answer(201)]);
  const r = await retrying(URL_, { method: 'POST', body: '{"amount":1000}' });
  assert.equal(r.status, 201);
  const keys = fetch.requests.map((q) => q.key);
  assert.equal(keys.length, 3);
  assert.match(keys[0], /^[0-9a-f-]{36}$/);
  assert.deepEqual(new Set(keys).size, 1);
  const second = scriptedFetch([answer(201)]);
  const again = withRetries(second);
  await again(URL_, { method: 'POST', body: '{}' });
  await again(URL_, { method: 'POST', body: '{}' });
  assert.notEqual(second.requests[0].key, second.requests[1].key);
  assert.notEqual(second.requests[0].key, keys[0]);
});

test('PATCH gets a key; GET, PUT, DELETE get none', async () => {
  const { fetch, retrying } = setup([answer(200)]);
  for (const method of ['PATCH', 'patch', 'GET', 'PUT', 'DELETE']) await retrying(URL_, { method });
  assert.deepEqual(fetch.requests.map((q) => q.key !== null), [true, true, false, false, false]);
});

test("the caller's key is kept verbatim on every attempt, by header or by option", async () => {
  const { fetch, retrying } = setup([answer(503), answer(429), answer(201)]);
  await retrying(URL_, { method: 'POST', headers: { 'Idempotency-Key': 'order-confirm-42' }, body: '{}' });
  assert.deepEqual(fetch.requests.map((q) => q.key), ['order-confirm-42', 'order-confirm-42', 'order-confirm-42']);
  const b = setup([answer(503), answer(201)]);
  await b.retrying(URL_, { method: 'POST', body: '{}', oncely: { idempotencyKey: 'order-confirm-43' } });
  assert.deepEqual(b.fetch.requests.map((q) => q.key), ['order-confirm-43', 'order-confirm-43']);
  assert.equal(b.fetch.requests[0].init.oncely, undefined, 'the oncely member is not passed down');
});

test('unknown option names and a non-object oncely member are TypeErrors naming the option, nothing sent', async () => {
  assert.throws(() => withRetries(scriptedFetch([answer(201)]), { maxAtempts: 5 }), { name: 'TypeError', message: /"maxAtempts"/ });
  assert.throws(() => withRetries({ deadlinMs: 5 }), { name: 'TypeError', message: /"deadlinMs"/ });
  assert.throws(() => withRetries(fetch, { backoff: { base: 200 } }), { name: 'TypeError', message: /"base" in backoff/ });
  assert.throws(() => withRetries(fetch, { budget: { cap: 1 } }), { name: 'TypeError', message: /"cap" in budget/ });
  assert.throws(() => withRetries(fetch, 'fast'), TypeError);
  const { fetch: f, retrying } = setup([answer(201)]);
  for (const [oncely, pattern] of [
    [{ deadlinMs: 100 }, /"deadlinMs" in init.oncely/],
    [{ attempt_timeout_ms: 500 }, /"attempt_timeout_ms"/],
    ['garbage', /init.oncely must be an object, got string/],
    [null, /init.oncely must be an object, got null/],
    [{ idempotencyKey: 42 }, /idempotencyKey must be a string, got number/],
  ]) {
    await assert.rejects(retrying(URL_, { method: 'POST', oncely }), { name: 'TypeError', message: pattern }, JSON.stringify(oncely));
  }
  assert.equal(f.requests.length, 0);
});

test('a key with leading or trailing whitespace is refused before sending, by option or header', async () => {
  for (const init of [
    { oncely: { idempotencyKey: 'abc ' } },
    { oncely: { idempotencyKey: ' abc' } },
    { oncely: { idempotencyKey: 'abc\t' } },
    { headers: { 'Idempotency-Key': 'abc ' } },
    { headers: [['idempotency-key', ' abc']] },
  ]) {
    const { fetch, retrying } = setup([answer(201)]);
    const e = await rejection(retrying(URL_, { method: 'POST', body: '{}', ...init }));
    assert.ok(e instanceof OncelyRetryError, JSON.stringify(init));
    assert.equal(e.code, 'INVALID_IDEMPOTENCY_KEY', JSON.stringify(init));
    assert.equal(e.attempts, 0);
    assert.match(e.message, /leading or trailing whitespace/);
    assert.equal(fetch.requests.length, 0);
  }
});

test('a per-call attemptTimeoutMs replaces the policy\'s; an attempt timeout of 0 is refused', async () => {
  const { clock, retrying } = setup([answer(503), answer(201)]);
  assert.equal((await retrying(URL_, { method: 'POST', oncely: { attemptTimeoutMs: 2_000 } })).status, 201);
  assert.deepEqual(clock.timeouts, [2_000, 2_000]);
  assert.throws(() => withRetries(fetch, { attemptTimeoutMs: 0 }), { name: 'RangeError', message: /more than 0/ });
  await assert.rejects(retrying(URL_, { oncely: { attemptTimeoutMs: 0 } }), RangeError);
});

test('an invalid key is refused before anything is sent', async () => {
  for (const key of ['', 'a'.repeat(256), 'order 42', 'café-42', '"unbalanced']) {
    const { fetch, retrying } = setup([answer(201)]);
    const e = await rejection(retrying(URL_, { method: 'POST', body: '{}', oncely: { idempotencyKey: key } }));
    assert.ok(e instanceof OncelyRetryError);
    assert.equal(e.code, 'INVALID_IDEMPOTENCY_KEY', key);
    assert.equal(e.attempts, 0);
    assert.equal(e.idempotencyKey, key);
    assert.equal(e.outcomeUnknown, false);
    assert.equal(fetch.requests.length, 0);
  }
  const { fetch, retrying } = setup([answer(201)]);
  const e = await rejection(retrying(URL_, { method: 'POST', headers: { 'idempotency-key': 'a' }, oncely: { idempotencyKey: 'b' } }));
  assert.equal(e.code, 'INVALID_IDEMPOTENCY_KEY');
  const twice = new Headers();
  twice.append('idempotency-key', 'a');
  twice.append('idempotency-key', 'b');
  assert.equal((await rejection(retrying(URL_, { method: 'POST', headers: twice }))).code, 'INVALID_IDEMPOTENCY_KEY');
  assert.equal(fetch.requests.length, 0);
  const minted = setup([answer(201)], { makeKey: () => 'not valid' });
  assert.equal((await rejection(minted.retrying(URL_, { method: 'POST' }))).code, 'INVALID_IDEMPOTENCY_KEY');
  assert.equal(minted.fetch.requests.length, 0);
});

test('key minting can be turned off per policy or per call', async () => {
  const { fetch, retrying } = setup([answer(201)], { mintKeys: false });
  await retrying(URL_, { method: 'POST' });
  await retrying(URL_, { method: 'POST', oncely: { mintKeys: true } });
  assert.deepEqual(fetch.requests.map((q) => q.key !== null), [false, true]);
  const b = setup([answer(201)]);
  await b.retrying(URL_, { method: 'POST', oncely: { mintKeys: false } });
  assert.equal(b.fetch.requests[0].key, null);
});

test('client errors get exactly one attempt and come back as the response', async () => {
  for (const status of [400, 401, 403, 404, 409, 422]) {
    const { fetch, retrying } = setup([answer(status, { body: 'nope' }), answer(201)]);
    const r = await retrying(URL_, { method: 'POST', body: '{}' });
    assert.equal(r.status, status);
    assert.equal(await r.text(), 'nope');
    assert.equal(fetch.requests.length, 1);
  }
});

test('attempts run out on a retryable status: ATTEMPTS_EXHAUSTED with the last status and the key', async () => {
  const { fetch, retrying, clock } = setup([answer(503)]);
  const e = await rejection(retrying(URL_, { method: 'POST', body: '{}' }));
  assert.equal(e.code, 'ATTEMPTS_EXHAUSTED');
  assert.equal(e.attempts, 3);
  assert.equal(e.lastStatus, 503);
  assert.equal(e.outcomeUnknown, false);
  assert.equal(e.idempotencyKey, fetch.requests[0].key);
  assert.equal(fetch.requests.length, 3);
  // Full jitter with the draw 0.5: half of 500 ms, then half of 1000 ms.
  assert.deepEqual(clock.sleeps, [250, 500]);
  assert.match(e.message, /^all 3 attempts failed \(after 3 attempts in 750 ms; last response 503; idempotency key "/);
});

test('each attempt gets min(10 s, time left) as its timeout; one deadline for the whole call', async () => {
  const { clock, retrying } = setup([answer(503), answer(503), answer(200)], { deadlineMs: 12_000, random: fixedRandom(1) });
  clock.sleep = async (ms) => {
    clock.sleeps.push(ms);
    clock.advance(ms + 5000); // slow attempts: 5 s more pass around each sleep
  };
  assert.equal((await retrying(URL_)).status, 200);
  // 500 ms of backoff and 5 s pass before the second attempt, 1 s and 5 s more before the third.
  assert.deepEqual(clock.timeouts, [10_000, 6500, 500]);
  const late = setup([answer(503)], { deadlineMs: 12_000, random: fixedRandom(1) });
  late.clock.sleep = async (ms) => {
    late.clock.sleeps.push(ms);
    late.clock.advance(ms + 6000); // a sleep that overran the deadline: no attempt is started
  };
  const e = await rejection(late.retrying(URL_));
  assert.deepEqual(late.clock.timeouts, [10_000, 5500]);
  assert.equal(e.code, 'DEADLINE_EXHAUSTED');
  assert.equal(e.attempts, 2);
  assert.equal(e.lastStatus, 503);
});

test('Retry-After is a lower bound: a longer hint is waited, 0 still waits the backoff', async () => {
  const a = setup([answer(503, { headers: { 'retry-after': '2' } }), answer(201)]);
  await a.retrying(URL_, { method: 'POST' });
  assert.deepEqual(a.clock.sleeps, [2000]);
  const b = setup([answer(429, { headers: { 'retry-after': '0' } }), answer(201)]);
  await b.retrying(URL_, { method: 'POST' });
  assert.deepEqual(b.clock.sleeps, [250]);
  // An HTTP-date 120 s ahead of the (simulated) wall clock, within a 200 s deadline.
  const c = setup([answer(503, { headers: { 'retry-after': 'Wed, 02 Dec 2026 08:02:00 GMT' } }), answer(201)], { deadlineMs: 200_000 });
  await c.retrying(URL_, { method: 'POST' });
  assert.deepEqual(c.clock.sleeps, [120_000]);
  const d = setup([answer(503, { headers: { 'retry-after': '-5' } }), answer(201)]);
  await d.retrying(URL_, { method: 'POST' });
  assert.deepEqual(d.clock.sleeps, [250], 'a negative hint is ignored');
});

test('a Retry-After past the deadline fails fast, carrying the hint', async () => {
  const { retrying, clock, fetch } = setup([answer(503, { headers: { 'retry-after': '120' } }), answer(201)]);
  const e = await rejection(retrying(URL_, { method: 'POST' }));
  assert.equal(e.code, 'RETRY_AFTER_BEYOND_DEADLINE');
  assert.equal(e.retryAfterMs, 120_000);
  assert.equal(e.remainingMs, 30_000);
  assert.equal(e.attempts, 1);
  assert.equal(e.lastStatus, 503);
  assert.deepEqual(clock.sleeps, []);
  assert.equal(fetch.requests.length, 1);
});

test('a wait that does not fit the deadline is not started', async () => {
  const { retrying, clock } = setup([answer(503), answer(201)], { deadlineMs: 300, backoff: { baseMs: 86_400_000, capMs: 86_400_000 } });
  const e = await rejection(retrying(URL_));
  assert.equal(e.code, 'DEADLINE_EXHAUSTED');
  assert.equal(e.attempts, 1);
  assert.deepEqual(clock.sleeps, []);
});

test('per-call attempts and deadline override the policy', async () => {
  const a = setup([answer(503), answer(503), answer(503), answer(503), answer(201)]);
  assert.equal((await rejection(a.retrying(URL_, { method: 'POST', oncely: { maxAttempts: 1 } }))).attempts, 1);
  const b = setup([answer(503), answer(503), answer(503), answer(503), answer(201)]);
  assert.equal((await b.retrying(URL_, { method: 'POST', oncely: { maxAttempts: 5 } })).status, 201);
  assert.equal(b.fetch.requests.length, 5);
  const c = setup([answer(200)]);
  await c.retrying(URL_, { oncely: { deadlineMs: 1500 } });
  assert.deepEqual(c.clock.timeouts, [1500]);
  await assert.rejects(c.retrying(URL_, { oncely: { deadlineMs: -1 } }), RangeError);
});

test('an attempt timeout: a keyless POST ends OUTCOME_UNKNOWN, a keyed one is retried with its key', async () => {
  const a = setup([hang(), answer(201)], { mintKeys: false });
  const pending = a.retrying(URL_, { method: 'POST', body: '{}' });
  await new Promise((r) => setImmediate(r));
  a.clock.fireLatestTimeout();
  const e = await rejection(pending);
  assert.equal(e.code, 'OUTCOME_UNKNOWN');
  assert.equal(e.outcomeUnknown, true);
  assert.equal(e.attempts, 1);
  assert.equal(e.lastStatus, undefined);
  assert.equal(a.fetch.requests.length, 1);

  const b = setup([hang(), answer(201)]);
  const keyed = b.retrying(URL_, { method: 'POST', body: '{}' });
  await new Promise((r) => setImmediate(r));
  b.clock.fireLatestTimeout();
  assert.equal((await keyed).status, 201);
  assert.equal(b.fetch.requests[0].key, b.fetch.requests[1].key);
});

test('a fetch that ignores its signal still ends at the attempt timeout', async () => {
  const clock = new FakeClock();
  let calls = 0;
  const deaf = async () => {
    calls++;
    if (calls === 1) return new Promise(() => {}); // never settles, ignores the signal
    return new Response('ok');
  };
  const retrying = withRetries(deaf, { clock, random: fixedRandom(0) });
  const pending = retrying(URL_);
  await new Promise((r) => setImmediate(r));
  clock.fireLatestTimeout();
  assert.equal(await (await pending).text(), 'ok');
  assert.equal(calls, 2);
});

test('connection failures: refused is retried for a keyless POST, a reset after sending is not', async () => {
  const a = setup([networkError('ECONNREFUSED', { syscall: 'connect' }), answer(201)], { mintKeys: false });
  assert.equal((await a.retrying(URL_, { method: 'POST' })).status, 201);
  const b = setup([networkError('ECONNRESET', { syscall: 'read' }), answer(201)], { mintKeys: false });
  const e = await rejection(b.retrying(URL_, { method: 'POST' }));
  assert.equal(e.code, 'OUTCOME_UNKNOWN');
  assert.equal(e.cause.cause.code, 'ECONNRESET');
  assert.equal(b.fetch.requests.length, 1);
  const c = setup([networkError('UND_ERR_SOCKET'), answer(200)]);
  assert.equal((await c.retrying(URL_, { method: 'GET' })).status, 200, 'an idempotent method is retried after a reset');
  const d = setup([networkError('ECONNREFUSED', { syscall: 'connect' })], { mintKeys: false });
  const refused = await rejection(d.retrying(URL_, { method: 'POST' }));
  assert.equal(refused.code, 'ATTEMPTS_EXHAUSTED');
  assert.equal(refused.attempts, 3);
  assert.equal(refused.lastStatus, undefined);
});

test('a failure that is a bug is not retried', async () => {
  const bad = async () => {
    throw new TypeError('Failed to parse URL from nope');
  };
  const retrying = withRetries(bad, { clock: new FakeClock() });
  const e = await rejection(retrying('nope'));
  assert.equal(e.code, 'NOT_RETRYABLE');
  assert.equal(e.attempts, 1);
  assert.equal(e.cause.message, 'Failed to parse URL from nope');
});

test('problem+json: the in-flight 409 is retried with the same key, retryable false is returned', async () => {
  const a = setup([problem(409, { code: 'idempotency_request_in_flight', retryable: true }, { 'retry-after': '1' }), answer(201)]);
  const r = await a.retrying(URL_, { method: 'POST', oncely: { idempotencyKey: 'order-confirm-42' } });
  assert.equal(r.status, 201);
  assert.deepEqual(a.clock.sleeps, [1000]);
  const b = setup([problem(503, { code: 'not_now', retryable: false }), answer(201)]);
  const r2 = await b.retrying(URL_, { method: 'POST' });
  assert.equal(r2.status, 503);
  assert.deepEqual(await r2.json(), { type: 'about:blank', status: 503, code: 'not_now', retryable: false }, 'the body read for classification is handed back whole');
  assert.equal(b.fetch.requests.length, 1);
});

test('in-flight 409s do not count against maxAttempts: five under the default 3, then the replay', async () => {
  // docs/DESIGN.md, "In-use answer treated as failure".
  const inFlight = () => problem(409, { code: 'idempotency_request_in_flight', retryable: true }, { 'retry-after': '1' });
  const a = setup([inFlight(), inFlight(), inFlight(), inFlight(), inFlight(), answer(201)]);
  const r = await a.retrying(URL_, { method: 'POST', body: '{}' });
  assert.equal(r.status, 201);
  assert.equal(a.fetch.requests.length, 6);
  assert.equal(new Set(a.fetch.requests.map((q) => q.key)).size, 1);
  // Each wait is max(Retry-After, the jittered backoff, which keeps growing with every retry).
  assert.deepEqual(a.clock.sleeps, [1000, 1000, 1000, 2000, 4000]);
  // Other failures still count: 503, two in-flight answers, 503, 503 ends after five attempts.
  const bare = () => problem(409, { code: 'idempotency_request_in_flight', retryable: true });
  const b = setup([answer(503), bare(), bare(), answer(503), answer(503), answer(201)]);
  const e = await rejection(b.retrying(URL_, { method: 'POST', body: '{}' }));
  assert.equal(e.code, 'ATTEMPTS_EXHAUSTED');
  assert.equal(e.attempts, 5);
  assert.equal(e.lastStatus, 503);
  assert.equal(b.fetch.requests.length, 5);
});

test('a broken error body on a retryable status counts as that status', async () => {
  const broken = () =>
    new Response(
      new ReadableStream({
        pulls: 0,
        pull(c) {
          // The first chunk arrives, then the connection breaks (as undici reports it).
          if (this.pulls++ === 0) c.enqueue(new TextEncoder().encode('{"retryable": fal'));
          else c.error(new TypeError('terminated'));
        },
      }),
      { status: 503, headers: { 'content-type': 'application/problem+json' } },
    );
  const { retrying, fetch } = setup([broken, answer(201)]);
  assert.equal((await retrying(URL_, { method: 'POST' })).status, 201);
  assert.equal(fetch.requests.length, 2);
  // A broken body on a response that is returned still yields the bytes that came, then the error.
  const b = setup([() => { const r = broken(); return new Response(r.body, { status: 400, headers: r.headers }); }]);
  const r = await b.retrying(URL_, { method: 'POST' });
  assert.equal(r.status, 400);
  const reader = r.body.getReader();
  assert.equal(new TextDecoder().decode((await reader.read()).value), '{"retryable": fal');
  await assert.rejects(reader.read(), /terminated/);
});

test('the bodies of responses that are not returned are cancelled', async () => {
  let cancelled = 0;
  const tracked = () =>
    new Response(new ReadableStream({ pull(c) { c.enqueue(new Uint8Array(10)); }, cancel() { cancelled++; } }), { status: 503 });
  const { retrying } = setup([tracked, tracked, answer(200)]);
  await retrying(URL_);
  assert.equal(cancelled, 2);
});

test('buffered bodies are resent byte-identically: string, bytes, Blob, URLSearchParams, FormData, a Request', async () => {
  const form = new FormData();
  form.append('amount', '1000');
  form.append('file', new Blob(['abc'], { type: 'text/plain' }), 'a.txt');
  const bodies = ['{"amount":1000}', new Uint8Array([0, 1, 2, 255]), new Blob(['blob-bytes']), new URLSearchParams({ a: '1' }), form];
  for (const body of bodies) {
    const { retrying, fetch } = setup([answer(503), answer(503), answer(201)]);
    await retrying(URL_, { method: 'POST', body });
    const [first, ...rest] = fetch.requests;
    assert.ok(first.body.byteLength > 0);
    for (const q of rest) {
      assert.deepEqual(q.body, first.body, `${body.constructor.name} resent identically`);
      assert.equal(q.headers['content-type'], first.headers['content-type']);
    }
  }
  const { retrying, fetch } = setup([answer(503), answer(201)]);
  await retrying(new Request(URL_, { method: 'POST', body: 'from-a-request', headers: { 'x-a': '1' } }));
  assert.deepEqual(fetch.requests.map((q) => new TextDecoder().decode(q.body)), ['from-a-request', 'from-a-request']);
  assert.deepEqual(fetch.requests.map((q) => q.headers['x-a']), ['1', '1']);
  assert.equal(fetch.requests[0].key, fetch.requests[1].key);
  assert.ok(fetch.requests[0].key);
});

test('a streaming body is sent once; a retryable outcome then ends BODY_NOT_REPLAYABLE', async () => {
  const { retrying, fetch } = setup([answer(503), answer(201)]);
  const stream = new ReadableStream({ start(c) { c.enqueue(new TextEncoder().encode('streamed')); c.close(); } });
  const e = await rejection(retrying(URL_, { method: 'POST', body: stream, duplex: 'half' }));
  assert.equal(e.code, 'BODY_NOT_REPLAYABLE');
  assert.equal(e.attempts, 1);
  assert.equal(e.lastStatus, 503);
  assert.match(e.message, /stream and cannot be resent/);
  assert.equal(fetch.requests.length, 1);
  assert.equal(new TextDecoder().decode(fetch.requests[0].body), 'streamed');
  // A stream whose one attempt succeeds is fine.
  const ok = setup([answer(201)]);
  const s2 = new ReadableStream({ start(c) { c.enqueue(new Uint8Array([1])); c.close(); } });
  assert.equal((await ok.retrying(URL_, { method: 'POST', body: s2, duplex: 'half' })).status, 201);
});

test('the budget is shared by every call of one wrapped function, drains and refills', async () => {
  const budget = { capacity: 20, transientCost: 10, throttleCost: 5, successRefund: 1 };
  const { retrying } = setup([answer(503)], { budget });
  assert.equal((await rejection(retrying(URL_))).code, 'ATTEMPTS_EXHAUSTED');
  assert.equal(retrying.budget.available, 0);
  const e = await rejection(retrying(URL_));
  assert.equal(e.code, 'BUDGET_EMPTY');
  assert.equal(e.attempts, 1);
  assert.equal(e.budgetAvailable, 0);
  assert.equal(e.budgetCost, 10);
  const ok = withRetries(scriptedFetch([answer(200)]), { budget: retrying.budget, clock: new FakeClock() });
  for (let i = 0; i < 10; i++) await ok(URL_);
  assert.equal(retrying.budget.available, 10, 'first-attempt successes refund 1 each, in the shared bucket');
  const again = setup([answer(503), answer(200)], { budget: retrying.budget });
  await again.retrying(URL_);
  assert.equal(retrying.budget.available, 10, 'a success after a retry refunds its cost');
  const fail5xx = withRetries(scriptedFetch([answer(500)]), { budget: retrying.budget, clock: new FakeClock() });
  assert.equal((await fail5xx(URL_)).status, 500);
  assert.equal(retrying.budget.available, 10, 'a 5xx response refunds nothing');
  assert.ok(retrying.budget instanceof RetryBudget);
});

test('abort during a sleep stops at once and refunds the retry it paid for', async () => {
  const controller = new AbortController();
  const { retrying, clock, fetch } = setup([answer(503), answer(201)]);
  clock.sleep = (ms, signal) =>
    new Promise((_, reject) => {
      clock.sleeps.push(ms);
      signal.addEventListener('abort', () => reject(signal.reason), { once: true });
    });
  const pending = retrying(URL_, { method: 'POST', signal: controller.signal });
  await new Promise((r) => setTimeout(r, 5));
  assert.equal(retrying.budget.available, 486, 'the retry was paid for');
  controller.abort(new Error('user gave up'));
  const e = await rejection(pending);
  assert.ok(e instanceof OncelyAbortError && e instanceof OncelyRetryError);
  assert.equal(e.name, 'AbortError');
  assert.equal(e.code, 'ABORTED');
  assert.equal(e.cause.message, 'user gave up');
  assert.equal(e.attempts, 1);
  assert.equal(e.outcomeUnknown, false);
  assert.ok(e.idempotencyKey);
  assert.equal(retrying.budget.available, 500, 'refunded');
  assert.equal(fetch.requests.length, 1);
});

test('abort during an attempt stops at once, refunds nothing it spent, and says the outcome is unknown', async () => {
  const controller = new AbortController();
  const { retrying, clock } = setup([answer(503), hang()]);
  const pending = retrying(URL_, { method: 'POST', signal: controller.signal });
  while (clock.timers.length < 2) await new Promise((r) => setImmediate(r));
  controller.abort();
  const e = await rejection(pending);
  assert.equal(e.code, 'ABORTED');
  assert.equal(e.attempts, 2);
  assert.equal(e.outcomeUnknown, true);
  assert.equal(retrying.budget.available, 486, 'the retry that was sent stays spent');
  // Already aborted: nothing is sent.
  const b = setup([answer(200)]);
  const e2 = await rejection(b.retrying(URL_, { signal: AbortSignal.abort() }));
  assert.equal(e2.code, 'ABORTED');
  assert.equal(e2.attempts, 0);
  assert.equal(b.fetch.requests.length, 0);
});

test('onRetry is told attempt, cause, next wait and key; a hook that throws changes nothing', async () => {
  const events = [];
  const { retrying, fetch } = setup([answer(503, { headers: { 'retry-after': '1' } }), networkError('ECONNREFUSED', { syscall: 'connect' }), answer(201)], {
    onRetry: (e) => {
      events.push(e);
      throw new Error('hook bug');
    },
  });
  assert.equal((await retrying(URL_ + '?secret=1', { method: 'POST' })).status, 201);
  assert.equal(events.length, 2);
  assert.deepEqual(
    events.map(({ attempt, nextAttempt, reason, status, waitMs, waitSource, tokensLeft, cost, idempotencyKey, method, url }) => ({
      attempt, nextAttempt, reason, status, waitMs, waitSource, tokensLeft, cost, idempotencyKey, method, url,
    })),
    [
      { attempt: 1, nextAttempt: 2, reason: '503', status: 503, waitMs: 1000, waitSource: 'retry-after', tokensLeft: 486, cost: 14, idempotencyKey: fetch.requests[0].key, method: 'POST', url: URL_ },
      { attempt: 2, nextAttempt: 3, reason: 'connection failed before sending', status: undefined, waitMs: 500, waitSource: 'backoff', tokensLeft: 472, cost: 14, idempotencyKey: fetch.requests[0].key, method: 'POST', url: URL_ },
    ],
  );
  assert.equal(events[1].error.cause.code, 'ECONNREFUSED');
  assert.deepEqual(retrying.metrics(), { calls: 1, attempts: 3, retries: 2, retryAfterWaits: 1, keysMinted: 1, errors: {} });
});

test('an async onRetry hook that rejects changes nothing and leaves no unhandled rejection', async () => {
  const unhandled = [];
  const onUnhandled = (reason) => unhandled.push(reason);
  process.on('unhandledRejection', onUnhandled);
  try {
    const events = [];
    const { retrying, fetch } = setup([answer(503), answer(503), answer(201)], {
      onRetry: async (e) => {
        events.push(e.attempt);
        throw new Error('async hook bug');
      },
    });
    assert.equal((await retrying(URL_, { method: 'POST' })).status, 201);
    assert.deepEqual(events, [1, 2]);
    assert.equal(fetch.requests.length, 3);
    // Unhandled rejections are reported after the microtask queue drains.
    await new Promise((resolve) => setImmediate(resolve));
    await new Promise((resolve) => setImmediate(resolve));
    assert.deepEqual(unhandled, []);
  } finally {
    process.off('unhandledRejection', onUnhandled);
  }
});

test('two layers of ours never multiply attempts and keep one key', async () => {
  const fetch = scriptedFetch([answer(503)]);
  const clock = new FakeClock();
  const inner = withRetries(fetch, { clock });
  const outer = withRetries(inner, { clock });
  const e = await rejection(outer(URL_, { method: 'POST', body: '{}' }));
  assert.equal(e.code, 'ATTEMPTS_EXHAUSTED');
  assert.equal(e.attempts, 3);
  assert.equal(fetch.requests.length, 3);
  assert.equal(new Set(fetch.requests.map((q) => q.key)).size, 1);
  assert.equal(e.idempotencyKey, fetch.requests[0].key);
  assert.equal(inner.metrics().calls, 0, 'the inner layer passed through');
  // Even with a wrapper between them that rebuilds init and drops what it does not know.
  const f2 = scriptedFetch([answer(503), networkError('ECONNRESET'), answer(201)]);
  const rebuilding = (fetchLike) => (input, init) => fetchLike(input, { method: init.method, headers: init.headers, body: init.body, signal: init.signal });
  const stacked = withRetries(rebuilding(withRetries(f2, { clock })), { clock });
  assert.equal((await stacked(URL_, { method: 'POST', body: '{}' })).status, 201);
  assert.equal(f2.requests.length, 3);
  assert.equal(new Set(f2.requests.map((q) => q.key)).size, 1);
});

test('a foreign retry layer under ours is caught by the guard: NESTED_RETRY_LAYER, no multiplication', async () => {
  const fetch = scriptedFetch([answer(503)]);
  const clock = new FakeClock();
  // A naive retry loop: up to 5 tries on any 5xx.
  const naive = (next) => async (input, init) => {
    let r;
    for (let i = 0; i < 5; i++) {
      try {
        r = await next(input, init);
      } catch (e) {
        throw new Error('naive layer gave up', { cause: e });
      }
      if (r.status < 500) return r;
    }
    return r;
  };
  const retrying = withRetries(naive(sendGuard(fetch)), { clock });
  const e = await rejection(retrying(URL_, { method: 'POST' }));
  assert.equal(e.code, 'NESTED_RETRY_LAYER');
  assert.equal(fetch.requests.length, 3, 'the guard refused sends beyond the 3 attempts');
  assert.equal(e.attempts, 3);
  assert.equal(e.lastStatus, 503);
  // Outside a call of ours the guard passes everything through.
  assert.equal((await sendGuard(scriptedFetch([answer(204)]))(URL_)).status, 204);
});

test('invalid options are refused when the function is made', () => {
  assert.throws(() => withRetries(fetch, { maxAttempts: 1.5 }), RangeError);
  assert.throws(() => withRetries(fetch, { deadlineMs: Infinity }), RangeError);
  assert.throws(() => withRetries(fetch, { attemptTimeoutMs: -1 }), RangeError);
  assert.equal(withRetries(fetch, { maxAttempts: 0 }).policy.maxAttempts, 1);
  assert.equal(withRetries({ maxAttempts: 4 }).policy.maxAttempts, 4, 'options alone: the platform fetch');
  const p = withRetries().policy;
  assert.deepEqual(
    { maxAttempts: p.maxAttempts, deadlineMs: p.deadlineMs, attemptTimeoutMs: p.attemptTimeoutMs, retry500: p.retry500, mintKeys: p.mintKeys },
    { maxAttempts: 3, deadlineMs: 30_000, attemptTimeoutMs: 10_000, retry500: false, mintKeys: true },
  );
});

test('a long-lived caller signal keeps no listener per call (no AbortSignal.any build-up)', async () => {
  const { getEventListeners } = await import('node:events');
  const shutdown = new AbortController();
  const { retrying, clock } = setup([answer(503), answer(200)], { backoff: { baseMs: 0, capMs: 0 } });
  const failing = setup([answer(503)], { backoff: { baseMs: 0, capMs: 0 }, budget: null });
  for (let i = 0; i < 200; i++) {
    await failing.retrying(URL_, { signal: shutdown.signal }).catch(() => {});
  }
  assert.equal(getEventListeners(shutdown.signal, 'abort').length, 0, 'failed calls leave nothing behind');
  for (let i = 0; i < 200; i++) await retrying(URL_, { signal: shutdown.signal });
  // A returned response stays linked (its body may still be read) until its attempt's timeout.
  assert.equal(getEventListeners(shutdown.signal, 'abort').length, 200);
  clock.advance(10_000);
  assert.equal(getEventListeners(shutdown.signal, 'abort').length, 0);
});

test('a layer below that edits the headers it is given cannot change the next attempt', async () => {
  const fetch = scriptedFetch([answer(503), answer(503), answer(201)]);
  let n = 0;
  // A vendor wrapper that overwrites the key on the headers object it receives.
  const meddling = (input, init) => {
    const seenKey = init.headers.get('idempotency-key');
    init.headers.set('idempotency-key', `vendor-${++n}`);
    return fetch(input, { ...init, headers: new Headers({ ...Object.fromEntries(init.headers), 'x-seen-key': seenKey }) });
  };
  const retrying = withRetries(meddling, { clock: new FakeClock() });
  await retrying(URL_, { method: 'POST', oncely: { idempotencyKey: 'order-confirm-42' } });
  assert.deepEqual(fetch.requests.map((q) => q.headers['x-seen-key']), ['order-confirm-42', 'order-confirm-42', 'order-confirm-42']);
});

test('a request that cannot be built is NOT_RETRYABLE with nothing sent', async () => {
  const { retrying, fetch } = setup([answer(200)]);
  const e = await rejection(retrying(URL_, { headers: { 'x-bad': 'a\nb' } }));
  assert.equal(e.code, 'NOT_RETRYABLE');
  assert.equal(e.attempts, 0);
  assert.ok(e.cause instanceof TypeError);
  const used = new Request(URL_, { method: 'POST', body: 'x' });
  await used.text();
  assert.equal((await rejection(retrying(used))).code, 'NOT_RETRYABLE');
  assert.equal(fetch.requests.length, 0);
});

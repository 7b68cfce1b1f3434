import { test } from 'node:test';
import assert from 'node:assert/strict';
import { CallState, Deadline, RetryBudget, combineWait } from '../../dist/index.js';

const policy = (over = {}) => ({ maxAttempts: 3, backoff: { jitter: 'full', baseMs: 100, capMs: 400 }, ...over });
const throttled = { kind: 'throttled' };
const unavailable = { kind: 'server-error', status: 503 };

test('the deadline: remaining, attempt limit cut to the time left, no sleep that ends at or past it', () => {
  const d = new Deadline(1000, 12_000);
  assert.equal(d.remaining(11_000), 2000);
  assert.equal(d.attemptLimit(11_000, 5000), 2000);
  assert.equal(d.attemptLimit(2000, 5000), 5000);
  assert.equal(d.remaining(20_000), 0);
  assert.ok(!d.fits(11_000, 2000));
  assert.ok(d.fits(11_000, 1999));
});

test('Retry-After is a lower bound on the backoff, not a replacement', () => {
  for (let i = 0; i < 100; i++) {
    const j = Math.random() * 400;
    assert.deepEqual(combineWait(0, j), { waitMs: j, source: 'backoff' });
    assert.deepEqual(combineWait(undefined, j), { waitMs: j, source: 'backoff' });
    assert.deepEqual(combineWait(1000, j), { waitMs: 1000, source: 'retry-after' });
  }
});

test('attempts are bounded first', () => {
  const c = new CallState(new Deadline(0, 5000));
  c.attempts = 1;
  assert.ok('plan' in c.planRetry(policy(), null, throttled, 0, 0, Math.random));
  c.attempts = 2;
  assert.ok('plan' in c.planRetry(policy(), null, throttled, 0, 0, Math.random));
  c.attempts = 3;
  assert.deepEqual(c.planRetry(policy(), null, throttled, undefined, 0, Math.random), {
    stop: { code: 'ATTEMPTS_EXHAUSTED', maxAttempts: 3 },
  });
});

test('the first retry draws from [0, base], the second from [0, 2 x base]', () => {
  const c = new CallState(new Deadline(0, 5000));
  c.attempts = 1;
  assert.equal(c.planRetry(policy(), null, unavailable, undefined, 0, () => 0.999999).plan.backoffMs <= 100, true);
  assert.ok(c.planRetry(policy(), null, unavailable, undefined, 0, () => 0.99).plan.backoffMs >= 98.9);
  c.attempts = 2;
  const second = c.planRetry(policy(), null, unavailable, undefined, 0, () => 0.99).plan.backoffMs;
  assert.ok(second > 150 && second <= 200, `${second}`);
});

test('a hint beyond the deadline stops at once with the hint', () => {
  const c = new CallState(new Deadline(0, 5000));
  c.attempts = 1;
  assert.deepEqual(c.planRetry(policy(), null, unavailable, 120_000, 1000, Math.random), {
    stop: { code: 'RETRY_AFTER_BEYOND_DEADLINE', hintMs: 120_000, remainingMs: 4000 },
  });
  // A hint exactly equal to the time left does not fit either.
  assert.equal(c.planRetry(policy(), null, unavailable, 4000, 1000, Math.random).stop.code, 'RETRY_AFTER_BEYOND_DEADLINE');
  assert.ok('plan' in c.planRetry(policy(), null, unavailable, 3999, 1000, () => 0));
});

test('no sleep past the deadline, and none when no time is left', () => {
  const c = new CallState(new Deadline(0, 1));
  c.attempts = 1;
  const big = policy({ backoff: { jitter: 'full', baseMs: 10_000, capMs: 10_000 } });
  assert.equal(c.planRetry(big, null, unavailable, undefined, 0, () => 0.5).stop.code, 'DEADLINE_EXHAUSTED');
  assert.equal(c.planRetry(big, null, unavailable, undefined, 2, () => 0).stop.code, 'DEADLINE_EXHAUSTED');
});

test('the budget pays after the other checks, or stops the call; a refused retry costs nothing', () => {
  const budget = new RetryBudget({ capacity: 20 });
  const c = new CallState(new Deadline(0, 3_600_000));
  const p = policy({ maxAttempts: 1000 });
  c.attempts = 1;
  const plan = c.planRetry(p, budget, { kind: 'connect-failed' }, undefined, 0, Math.random).plan;
  assert.deepEqual([plan.tokensLeft, plan.cost], [6, 14]);
  c.attempts = 2;
  assert.deepEqual(c.planRetry(p, budget, { kind: 'connect-failed' }, undefined, 0, Math.random), {
    stop: { code: 'BUDGET_EMPTY', available: 6, cost: 14 },
  });
  assert.equal(c.planRetry(p, budget, throttled, undefined, 0, Math.random).plan.tokensLeft, 1);
  // Out of attempts: the budget is not touched.
  c.attempts = 1000;
  assert.equal(c.planRetry(p, budget, throttled, undefined, 0, Math.random).stop.code, 'ATTEMPTS_EXHAUSTED');
  assert.equal(budget.available, 1);
});

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { RetryBudget, DEFAULT_BUDGET, resolvePolicy } from '../../dist/index.js';

test('the default budget: 500 tokens, 14 per transient retry, 5 per throttle retry, 1 back per success', () => {
  assert.deepEqual({ ...DEFAULT_BUDGET }, { capacity: 500, transientCost: 14, throttleCost: 5, successRefund: 1 });
  const policy = resolvePolicy();
  assert.ok(policy.budget instanceof RetryBudget);
  assert.equal(policy.budget.available, 500);
});

test('drains after 35 transient retries, a throttle retry still fits, successes refill it', () => {
  const b = new RetryBudget();
  let n = 0;
  while (b.tryWithdraw('transient').ok) n++;
  assert.equal(n, 35);
  assert.deepEqual(b.tryWithdraw('transient'), { ok: false, available: 10, cost: 14 });
  assert.deepEqual(b.tryWithdraw('throttle'), { ok: true, left: 5, cost: 5 });
  // A success after a throttle retry refunds that retry's cost.
  b.onSuccess(5);
  assert.equal(b.available, 10);
  // Four first-attempt successes: 10 + 4 = 14, one more transient retry.
  for (let i = 0; i < 4; i++) b.onSuccess();
  assert.deepEqual(b.tryWithdraw('transient'), { ok: true, left: 0, cost: 14 });
  for (let i = 0; i < 1000; i++) b.onSuccess();
  assert.equal(b.available, 500, 'never above capacity');
});

test('a refused withdrawal takes nothing', () => {
  const b = new RetryBudget({ capacity: 20, transientCost: 14 });
  assert.equal(b.tryWithdraw('transient').ok, true);
  assert.equal(b.available, 6);
  assert.deepEqual(b.tryWithdraw('transient'), { ok: false, available: 6, cost: 14 });
  assert.equal(b.available, 6);
  assert.deepEqual(b.tryWithdraw('throttle'), { ok: true, left: 1, cost: 5 });
});

test('invalid amounts are refused', () => {
  assert.throws(() => new RetryBudget({ capacity: -1 }), RangeError);
  assert.throws(() => new RetryBudget({ transientCost: 1.5 }), RangeError);
  assert.throws(() => resolvePolicy({ budget: { throttleCost: NaN } }), RangeError);
  assert.equal(resolvePolicy({ budget: null }).budget, null);
  const shared = new RetryBudget({ capacity: 7 });
  assert.equal(resolvePolicy({ budget: shared }).budget, shared);
});

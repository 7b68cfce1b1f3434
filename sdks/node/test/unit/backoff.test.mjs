import { test } from 'node:test';
import assert from 'node:assert/strict';
import { ceilingMs, delayMs, DEFAULT_BACKOFF, resolvePolicy } from '../../dist/index.js';

/** A small seeded generator (mulberry32), so a failing draw can be reproduced. */
function seeded(seed) {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

test('the default backoff is full jitter from 500 ms capped at 8 s', () => {
  assert.deepEqual({ ...DEFAULT_BACKOFF }, { jitter: 'full', baseMs: 500, capMs: 8000 });
  assert.deepEqual({ ...resolvePolicy().backoff }, { jitter: 'full', baseMs: 500, capMs: 8000 });
});

test('the ceiling doubles per retry, then saturates at the cap', () => {
  const b = { jitter: 'full', baseMs: 5, capMs: 2000 };
  assert.equal(ceilingMs(b, 0), 5);
  assert.equal(ceilingMs(b, 1), 10);
  assert.equal(ceilingMs(b, 8), 1280);
  assert.equal(ceilingMs(b, 9), 2000);
  for (const retry of [31, 32, 63, 64, 65, 126, 127, 128, 1023, 1024, 1025, 2 ** 32 - 1, Number.MAX_SAFE_INTEGER, Infinity]) {
    assert.equal(ceilingMs(b, retry), 2000, `retry ${retry}`);
  }
  // Nonsense retry numbers count as 0, never NaN.
  for (const retry of [-1, NaN, -Infinity]) assert.equal(ceilingMs(b, retry), 5);
  const d = { jitter: 'full', baseMs: 500, capMs: 8000 };
  assert.deepEqual([0, 1, 2, 3, 4, 5].map((r) => ceilingMs(d, r)), [500, 1000, 2000, 4000, 8000, 8000]);
});

test('high retry numbers with a tiny cap never overflow nor wrap to zero', () => {
  const b = { jitter: 'full', baseMs: 1, capMs: 10 };
  const random = seeded(6);
  for (const retry of [32, 33, 63, 64, 65, 2 ** 32 - 2, 2 ** 32 - 1, Number.MAX_SAFE_INTEGER]) {
    assert.equal(ceilingMs(b, retry), 10);
    const draws = Array.from({ length: 400 }, () => delayMs(b, retry, undefined, random));
    assert.ok(draws.every((d) => d >= 0 && d <= 10), `retry ${retry}: ${Math.max(...draws)}`);
    assert.ok(draws.some((d) => d > 5), `retry ${retry}: draws stuck near zero`);
    assert.ok(draws.some((d) => d < 1), `retry ${retry}: draws never near zero`);
  }
  // The largest configuration Node's timers allow, at the largest retry number.
  const max = { jitter: 'full', baseMs: 2 ** 31 - 1, capMs: 2 ** 31 - 1 };
  assert.equal(ceilingMs(max, Number.MAX_SAFE_INTEGER), 2 ** 31 - 1);
  assert.ok(delayMs(max, Number.MAX_SAFE_INTEGER, undefined, Math.random) <= 2 ** 31 - 1);
});

test('full jitter over many draws: within [0, ceiling], spread across it, mean about half of it', () => {
  const b = { jitter: 'full', baseMs: 500, capMs: 8000 };
  const random = seeded(42);
  for (const retry of [0, 1, 2, 3, 4, 10, 64, 2 ** 32 - 1]) {
    const ceiling = ceilingMs(b, retry);
    const draws = Array.from({ length: 5000 }, () => delayMs(b, retry, undefined, random));
    assert.ok(draws.every((d) => d >= 0 && d <= ceiling));
    const mean = draws.reduce((a, d) => a + d, 0) / draws.length;
    // The mean of 5000 uniform draws is within 3% of the ceiling of ceiling/2 with a probability
    // far above 1 - 1e-9 (its standard deviation is ceiling * 0.0041).
    assert.ok(Math.abs(mean - ceiling / 2) < ceiling * 0.03, `retry ${retry}: mean ${mean} of ceiling ${ceiling}`);
    assert.ok(Math.min(...draws) < ceiling * 0.01);
    assert.ok(Math.max(...draws) > ceiling * 0.99);
  }
});

test('property: for random configurations and retry numbers, 0 <= delay <= cap', () => {
  const random = seeded(7);
  const pick = (values) => values[Math.floor(random() * values.length)];
  for (let i = 0; i < 20000; i++) {
    const baseMs = pick([0, 1, random() * 10, random() * 1e4, random() * 2 ** 31, 2 ** 31 - 1]);
    const capMs = pick([0, 1, random() * 10, random() * 1e4, random() * 2 ** 31, 2 ** 31 - 1]);
    const jitter = pick(['full', 'decorrelated']);
    const retry = pick([0, 1, Math.floor(random() * 200), Math.floor(random() * 2 ** 32), 2 ** 32 - 1, Number.MAX_SAFE_INTEGER]);
    const previous = pick([undefined, 0, random() * capMs, capMs, 2 ** 31 - 1]);
    const b = { jitter, baseMs, capMs };
    const d = delayMs(b, retry, previous, random);
    assert.ok(Number.isFinite(d) && d >= 0 && d <= capMs, JSON.stringify({ b, retry, previous, d }));
    assert.ok(ceilingMs(b, retry) <= capMs);
    if (baseMs > 0 && capMs > 0 && retry >= 1024) assert.equal(ceilingMs(b, retry), capMs);
  }
});

test('a misbehaving random source cannot push a delay outside [0, cap]', () => {
  const b = { jitter: 'full', baseMs: 500, capMs: 8000 };
  for (const r of [NaN, -1, 1, 2, Infinity, -Infinity]) {
    const d = delayMs(b, 3, undefined, () => r);
    assert.ok(d >= 0 && d <= 4000, `random ${r} gave ${d}`);
  }
});

test('decorrelated jitter stays between base and cap and grows from the previous delay', () => {
  const b = { jitter: 'decorrelated', baseMs: 5, capMs: 100 };
  const random = seeded(1);
  let previous;
  for (let retry = 0; retry < 1000; retry++) {
    const d = delayMs(b, retry, previous, random);
    assert.ok(d >= 5 && d <= 100, `${d}`);
    assert.ok(d <= Math.max(5, Math.min(100, (previous ?? 5) * 3)));
    previous = d;
  }
  // A cap below the base bounds it too.
  assert.equal(delayMs({ jitter: 'decorrelated', baseMs: 50, capMs: 10 }, 0, undefined, () => 0.5), 10);
});

test('invalid backoff settings are refused when the policy is built', () => {
  assert.throws(() => resolvePolicy({ backoff: { baseMs: -1 } }), RangeError);
  assert.throws(() => resolvePolicy({ backoff: { capMs: Infinity } }), RangeError);
  assert.throws(() => resolvePolicy({ backoff: { capMs: 2 ** 31 } }), RangeError);
  assert.throws(() => resolvePolicy({ backoff: { jitter: 'none' } }), RangeError);
  assert.equal(resolvePolicy({ backoff: { jitter: 'decorrelated' } }).backoff.baseMs, 500);
});

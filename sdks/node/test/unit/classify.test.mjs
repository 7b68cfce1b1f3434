import { test } from 'node:test';
import assert from 'node:assert/strict';
import { classifyResponse, classifyTransport, parseProblem, reasonCost, explicitWord } from '../../dist/index.js';

const POST = { method: 'POST', hasKey: false };
const KEYED_POST = { method: 'POST', hasKey: true };
const GET = { method: 'GET', hasKey: false };
const resp = (status, problem, headers = {}) => ({ status, headers: new Headers(headers), problem });
const verdict = (req, status, problem, headers, retry500 = false) => classifyResponse(req, resp(status, problem, headers), retry500);

test('client errors are never retried, whatever the method or key', () => {
  for (const status of [400, 401, 403, 404, 405, 409, 410, 412, 413, 422]) {
    for (const req of [POST, KEYED_POST, GET]) assert.deepEqual(verdict(req, status, undefined, {}, true), { type: 'done' });
  }
});

test('429, 408 and 503 are retried for every request', () => {
  for (const req of [POST, KEYED_POST, GET]) {
    assert.deepEqual(verdict(req, 429), { type: 'retry', reason: { kind: 'throttled' } });
    assert.deepEqual(verdict(req, 408), { type: 'retry', reason: { kind: 'request-timeout' } });
    assert.deepEqual(verdict(req, 503), { type: 'retry', reason: { kind: 'server-error', status: 503 } });
  }
});

test('502 and 504 need a request that is safe to repeat; 500 is off by default', () => {
  assert.deepEqual(verdict(POST, 502), { type: 'done' });
  assert.deepEqual(verdict(POST, 504), { type: 'done' });
  assert.equal(verdict(KEYED_POST, 504).type, 'retry');
  assert.equal(verdict(GET, 502).type, 'retry');
  assert.equal(verdict(GET, 500).type, 'done');
  assert.equal(verdict(GET, 500, undefined, {}, true).type, 'retry');
  assert.equal(verdict(POST, 500, undefined, {}, true).type, 'done');
  for (const status of [200, 201, 204, 301, 304]) assert.equal(verdict(GET, status).type, 'done');
});

test('problem+json: the in-flight 409 is retried at the throttle price, retryable: false wins', () => {
  const inFlight = parseProblem('{"type":"about:blank","status":409,"code":"idempotency_request_in_flight","retryable":true}');
  assert.deepEqual(inFlight, { code: 'idempotency_request_in_flight', retryable: true });
  const v = verdict(KEYED_POST, 409, inFlight);
  assert.deepEqual(v, { type: 'retry', reason: { kind: 'in-flight' } });
  assert.equal(reasonCost(v.reason), 'throttle');
  assert.equal(reasonCost({ kind: 'throttled' }), 'throttle');
  assert.equal(reasonCost({ kind: 'server-error', status: 503 }), 'transient');
  assert.equal(reasonCost({ kind: 'server-asked', status: 429, signal: 'x-should-retry' }), 'throttle');
  const mismatch = { code: 'idempotency_key_mismatch', retryable: false };
  assert.equal(verdict(KEYED_POST, 422, mismatch).type, 'done');
  assert.equal(verdict(KEYED_POST, 409, mismatch).type, 'done');
  assert.equal(verdict(GET, 503, { retryable: false }).type, 'done');
  assert.equal(verdict(GET, 429, { retryable: false }).type, 'done');
});

test('problem parsing reads code and retryable the way the Rust SDK does', () => {
  assert.equal(parseProblem('not json'), undefined);
  assert.equal(parseProblem('[1,2]'), undefined);
  assert.equal(parseProblem('"text"'), undefined);
  assert.equal(parseProblem('{"retryable":"false"}'), undefined, 'a string is not a boolean');
  assert.equal(parseProblem('{"code":5,"retryable":false}'), undefined);
  assert.deepEqual(parseProblem('{"code":null,"retryable":null}'), {});
  assert.deepEqual(parseProblem('{"title":"x"}'), {});
});

test('the server word comes first, in order: problem retryable, x-should-retry, Stripe-Should-Retry', () => {
  const both = { 'x-should-retry': 'false', 'stripe-should-retry': 'true' };
  assert.equal(verdict(KEYED_POST, 503, undefined, both).type, 'done');
  assert.equal(verdict(KEYED_POST, 503, { retryable: true }, both).type, 'retry');
  assert.equal(verdict(GET, 503, undefined, { 'stripe-should-retry': 'false' }).type, 'done');
  assert.equal(verdict(GET, 503, { retryable: false }, { 'x-should-retry': 'true' }).type, 'done');
  const reversed = { 'x-should-retry': 'true', 'stripe-should-retry': 'false' };
  assert.equal(verdict(GET, 503, undefined, reversed).type, 'retry');
  // `true` on a status the allowlist returns: retried only when safe to repeat.
  assert.deepEqual(verdict(KEYED_POST, 400, undefined, { 'x-should-retry': 'true' }), {
    type: 'retry',
    reason: { kind: 'server-asked', status: 400, signal: 'x-should-retry' },
  });
  assert.equal(verdict(POST, 400, undefined, { 'x-should-retry': 'true' }).type, 'done');
  assert.equal(verdict(POST, 500, undefined, { 'x-should-retry': 'true' }).type, 'done');
  assert.equal(verdict(GET, 500, undefined, { 'stripe-should-retry': 'true' }).type, 'retry');
  // Success and redirects are never turned into retries.
  assert.equal(verdict(GET, 200, undefined, { 'x-should-retry': 'true' }).type, 'done');
  assert.equal(verdict(GET, 304, undefined, { 'x-should-retry': 'true' }).type, 'done');
});

test('malformed or repeated should-retry headers count as absent', () => {
  for (const value of ['yes', '1', '0', 'TRUE ', ' False']) {
    const expected = value.trim().toLowerCase() === 'true' ? true : value.trim().toLowerCase() === 'false' ? false : undefined;
    assert.equal(explicitWord(resp(503, undefined, { 'x-should-retry': value }))?.retry, expected, value);
  }
  const twice = new Headers();
  twice.append('x-should-retry', 'true');
  twice.append('x-should-retry', 'false');
  assert.equal(explicitWord({ status: 503, headers: twice }), undefined);
});

test("the caller's classifier comes after the server's headers and before the allowlist", () => {
  const teapot = (r) => (r.status === 418 ? true : undefined);
  assert.deepEqual(classifyResponse(GET, resp(418), false, teapot), {
    type: 'retry',
    reason: { kind: 'server-asked', status: 418, signal: 'classifier' },
  });
  const refuse = () => false;
  assert.equal(classifyResponse(GET, resp(503, undefined, { 'x-should-retry': 'true' }), false, refuse).type, 'retry');
  assert.equal(classifyResponse(GET, resp(503), false, refuse).type, 'done');
});

test('transport failures: before sending retried for all; after sending only when safe', () => {
  assert.deepEqual(classifyTransport(POST, 'before-send', 'connect'), { type: 'retry', reason: { kind: 'connect-failed' } });
  assert.deepEqual(classifyTransport(POST, 'after-send', 'timeout'), { type: 'outcome-unknown' });
  assert.deepEqual(classifyTransport(POST, 'after-send', 'reset'), { type: 'outcome-unknown' });
  assert.deepEqual(classifyTransport({ method: 'PATCH', hasKey: false }, 'after-send', 'timeout'), { type: 'outcome-unknown' });
  assert.deepEqual(classifyTransport(KEYED_POST, 'after-send', 'timeout'), { type: 'retry', reason: { kind: 'timed-out' } });
  for (const method of ['GET', 'PUT', 'DELETE', 'HEAD', 'OPTIONS']) {
    assert.deepEqual(classifyTransport({ method, hasKey: false }, 'after-send', 'reset'), { type: 'retry', reason: { kind: 'connection-reset' } });
  }
  assert.deepEqual(classifyTransport(GET, 'before-send', 'other'), { type: 'not-retryable' });
});

import { test } from 'node:test';
import assert from 'node:assert/strict';
import { isValidKey, keyProblem, needsKey, isIdempotentMethod, uuidV4Key } from '../../dist/index.js';

test('minted keys are UUID v4, valid and distinct', () => {
  const a = uuidV4Key();
  const b = uuidV4Key();
  assert.match(a, /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
  assert.ok(isValidKey(a));
  assert.notEqual(a, b);
});

test('key rules: 1 to 255 visible ASCII characters, the quoted form accepted', () => {
  assert.ok(isValidKey('order-confirm-42'));
  assert.ok(isValidKey('a'.repeat(255)));
  assert.ok(isValidKey('"abc"'));
  assert.ok(isValidKey('"a\\"b"'));
  assert.ok(isValidKey('  padded\t'));
  assert.equal(keyProblem('')?.problem, 'empty');
  assert.equal(keyProblem('""')?.problem, 'empty');
  assert.equal(keyProblem('a'.repeat(256))?.problem, 'too-long');
  assert.equal(keyProblem('has space')?.problem, 'not-visible-ascii');
  assert.equal(keyProblem('café-42')?.problem, 'not-visible-ascii');
  assert.equal(keyProblem('a\u0000b')?.problem, 'not-visible-ascii');
  assert.equal(keyProblem('a, b')?.problem, 'not-visible-ascii', 'a header sent twice');
  assert.equal(keyProblem('"abc')?.problem, 'bad-quoting');
  assert.equal(keyProblem('"a"b"')?.problem, 'bad-quoting');
  assert.equal(keyProblem('"a\\b"')?.problem, 'bad-quoting');
});

test('only POST and PATCH get keys minted; RFC 9110 idempotent methods are safe to repeat', () => {
  assert.ok(needsKey('POST') && needsKey('patch') && needsKey('Post'));
  for (const m of ['GET', 'HEAD', 'OPTIONS', 'TRACE', 'PUT', 'DELETE']) {
    assert.ok(!needsKey(m));
    assert.ok(isIdempotentMethod(m) && isIdempotentMethod(m.toLowerCase()));
  }
  assert.ok(!isIdempotentMethod('POST') && !isIdempotentMethod('PATCH') && !isIdempotentMethod('CONNECT'));
});

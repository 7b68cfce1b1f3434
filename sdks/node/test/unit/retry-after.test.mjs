import { test } from 'node:test';
import assert from 'node:assert/strict';
import { parseRetryAfter, parseHttpDate, retryAfterFromHeaders } from '../../dist/index.js';

// Sun, 06 Nov 1994 08:47:37 GMT
const NOW = Date.UTC(1994, 10, 6, 8, 47, 37);

test('delay-seconds', () => {
  assert.equal(parseRetryAfter('0', NOW), 0);
  assert.equal(parseRetryAfter(' 7 ', NOW), 7000);
  assert.equal(parseRetryAfter('86400', NOW), 86_400_000);
  // Too large to mean anything but "not within any deadline": it stays huge, never wraps.
  assert.ok(parseRetryAfter('99999999999999999999999', NOW) > 1e25);
});

test('all three HTTP-date forms (RFC 9110 section 5.6.7)', () => {
  const twoMinutes = 120_000;
  assert.equal(parseRetryAfter('Sun, 06 Nov 1994 08:49:37 GMT', NOW), twoMinutes);
  assert.equal(parseRetryAfter('Sunday, 06-Nov-94 08:49:37 GMT', NOW), twoMinutes);
  assert.equal(parseRetryAfter('Sun Nov  6 08:49:37 1994', NOW), twoMinutes);
  assert.equal(parseHttpDate('Wed, 02 Dec 2026 08:00:00 GMT'), Date.UTC(2026, 11, 2, 8, 0, 0));
  assert.equal(parseHttpDate('Wednesday, 02-Dec-26 08:00:00 GMT'), Date.UTC(2026, 11, 2, 8, 0, 0));
  assert.equal(parseHttpDate('Wed Dec  2 08:00:00 2026'), Date.UTC(2026, 11, 2, 8, 0, 0));
  assert.equal(parseHttpDate('Thu Dec 10 08:00:00 2026'), Date.UTC(2026, 11, 10, 8, 0, 0));
});

test('a date in the past is a hint of zero', () => {
  assert.equal(parseRetryAfter('Sun, 06 Nov 1994 08:00:00 GMT', NOW), 0);
});

test('malformed or negative values are ignored', () => {
  for (const bad of [
    '',
    '   ',
    '-1',
    '-120',
    '1.5',
    '+5',
    'soon',
    '12s',
    '0x10',
    'Sun, 32 Nov 1994 08:49:37 GMT',
    'Sun, 31 Nov 1994 08:49:37 GMT', // November has 30 days
    'Mon, 06 Nov 1994 08:49:37 GMT', // 6 Nov 1994 was a Sunday
    'Sun, 06 Nov 1994 24:00:00 GMT',
    'Sun, 06 Nov 1994 08:49:37 UTC',
    'Sun, 6 Nov 1994 08:49:37 GMT',
    'sun, 06 nov 1994 08:49:37 gmt',
    'Sun Nov 6 08:49:37 1994',
    '2026-12-02T08:00:00Z',
    'Sun, 06 Nov 1960 08:49:37 GMT',
  ]) {
    assert.equal(parseRetryAfter(bad, NOW), undefined, JSON.stringify(bad));
  }
});

test('from headers: absent or repeated is no hint', () => {
  assert.equal(retryAfterFromHeaders(new Headers(), NOW), undefined);
  assert.equal(retryAfterFromHeaders(new Headers({ 'retry-after': '3' }), NOW), 3000);
  const twice = new Headers();
  twice.append('retry-after', '3');
  twice.append('retry-after', '4');
  assert.equal(retryAfterFromHeaders(twice, NOW), undefined);
});

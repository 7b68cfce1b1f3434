import { test } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { promisify } from 'node:util';

const run = promisify(execFile);
const program = `
import { withRetries } from ${JSON.stringify(new URL('../../dist/index.js', import.meta.url).href)};
let n = 0;
const fake = async () => (++n < 3 ? new Response('', { status: 503, headers: { 'retry-after': '0' } }) : new Response('ok'));
const retrying = withRetries(fake, { backoff: { baseMs: 1, capMs: 1 } });
await retrying('http://api.test/v1/payments', { method: 'POST', body: '{}', oncely: { idempotencyKey: 'order-confirm-42' } });
`;

test('NODE_DEBUG=oncely logs every retry: attempt, cause, next wait, key', async () => {
  const { stderr } = await run(process.execPath, ['--input-type=module', '-e', program], { env: { ...process.env, NODE_DEBUG: 'oncely' } });
  const lines = stderr.split('\n').filter((l) => l.includes('retrying:'));
  assert.equal(lines.length, 2, stderr);
  assert.match(lines[0], /^ONCELY \d+: retrying: attempt=1 next_attempt=2 reason=503 .*wait_ms=\d+ wait_source=backoff .*key=order-confirm-42$/);
  assert.match(lines[1], /attempt=2 next_attempt=3 reason=503/);
  const quiet = await run(process.execPath, ['--input-type=module', '-e', program], { env: { ...process.env, NODE_DEBUG: '' } });
  assert.equal(quiet.stderr, '');
});

// withRetries and the platform fetch against real local servers: socket-level faults.
import { test, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import net from 'node:net';
import { withRetries, transportOf } from '../../dist/index.js';

const servers = [];
after(() => {
  for (const s of servers) s.close();
});

/** A raw TCP server: `onRequest(socket, requestText, n)` for each request head received. */
function rawServer(onRequest) {
  const seen = [];
  const server = net.createServer((socket) => {
    let buffer = '';
    socket.on('data', (chunk) => {
      buffer += chunk.toString('latin1');
      const end = buffer.indexOf('\r\n\r\n');
      if (end < 0) return;
      const head = buffer.slice(0, end);
      const length = Number(/content-length: *(\d+)/i.exec(head)?.[1] ?? 0);
      if (buffer.length < end + 4 + length) return;
      const body = buffer.slice(end + 4, end + 4 + length);
      buffer = buffer.slice(end + 4 + length);
      const key = /idempotency-key: *(\S+)/i.exec(head)?.[1] ?? null;
      seen.push({ head, body, key });
      onRequest(socket, seen.length);
    });
    socket.on('error', () => {});
  });
  servers.push(server);
  return new Promise((resolve) => server.listen(0, '127.0.0.1', () => resolve({ url: `http://127.0.0.1:${server.address().port}`, seen, server })));
}

const respond = (socket, status, body = '', headers = {}) => {
  const lines = [`HTTP/1.1 ${status} X`, `content-length: ${Buffer.byteLength(body)}`, ...Object.entries(headers).map(([k, v]) => `${k}: ${v}`)];
  socket.write(`${lines.join('\r\n')}\r\n\r\n${body}`);
};

async function freePort() {
  const s = net.createServer();
  await new Promise((r) => s.listen(0, '127.0.0.1', r));
  const port = s.address().port;
  await new Promise((r) => s.close(r));
  return port;
}

const fast = { backoff: { baseMs: 5, capMs: 20 } };

test('a refused connection was not sent: retried even for a keyless POST', async () => {
  const port = await freePort();
  const retrying = withRetries(fetch, { ...fast, mintKeys: false });
  const e = await retrying(`http://127.0.0.1:${port}/v1/payments`, { method: 'POST', body: '{}' }).catch((x) => x);
  assert.equal(e.code, 'ATTEMPTS_EXHAUSTED');
  assert.equal(e.attempts, 3);
  assert.equal(e.outcomeUnknown, false);
  assert.equal(e.cause.cause.code, 'ECONNREFUSED');
  assert.deepEqual(transportOf(e.cause), { phase: 'before-send', failure: 'connect' });
});

test('a name that does not resolve was not sent', async () => {
  const e = await fetch('http://oncely-test.invalid/').catch((x) => x);
  assert.deepEqual(transportOf(e), { phase: 'before-send', failure: 'connect' });
});

test('a blocked port or unknown scheme is a bug, not retried', async () => {
  const retrying = withRetries(fetch, fast);
  const e = await retrying('http://127.0.0.1:1/').catch((x) => x);
  assert.equal(e.code, 'NOT_RETRYABLE');
  assert.equal(e.attempts, 1);
});

test('a reset after the server read the request: a keyless POST is outcome unknown, sent once', async () => {
  const { url, seen } = await rawServer((socket) => socket.resetAndDestroy());
  const retrying = withRetries(fetch, { ...fast, mintKeys: false });
  const e = await retrying(`${url}/v1/payments`, { method: 'POST', body: '{"amount":1}' }).catch((x) => x);
  assert.equal(e.code, 'OUTCOME_UNKNOWN');
  assert.equal(e.outcomeUnknown, true);
  assert.equal(e.attempts, 1);
  assert.equal(e.idempotencyKey, undefined);
  assert.equal(seen.length, 1);
  assert.equal(e.cause.cause.code, 'ECONNRESET');
});

test('a connection closed after the request was read (FIN, "other side closed"): the same', async () => {
  const { url, seen } = await rawServer((socket) => socket.end());
  const retrying = withRetries(fetch, { ...fast, mintKeys: false });
  const e = await retrying(`${url}/v1/payments`, { method: 'POST', body: '{}' }).catch((x) => x);
  assert.equal(e.code, 'OUTCOME_UNKNOWN');
  assert.equal(e.cause.cause.code, 'UND_ERR_SOCKET');
  assert.equal(seen.length, 1);
});

test('a keyed POST is retried after a reset, with the same key and the same body', async () => {
  const { url, seen } = await rawServer((socket, n) => (n === 1 ? socket.resetAndDestroy() : respond(socket, 201, '{"id":"pay_1"}')));
  const retrying = withRetries(fetch, fast);
  const r = await retrying(`${url}/v1/payments`, { method: 'POST', body: '{"amount":1000}' });
  assert.equal(r.status, 201);
  assert.deepEqual(await r.json(), { id: 'pay_1' });
  assert.equal(seen.length, 2);
  assert.ok(seen[0].key);
  assert.equal(seen[0].key, seen[1].key);
  assert.deepEqual(seen.map((s) => s.body), ['{"amount":1000}', '{"amount":1000}']);
});

test('a hang: the attempt timeout ends it; the server sees the connection closed', async () => {
  let closed = 0;
  const { url, seen } = await rawServer((socket, n) => {
    if (n === 1) socket.on('close', () => closed++);
    else respond(socket, 201, 'ok');
  });
  const retrying = withRetries(fetch, { ...fast, attemptTimeoutMs: 150 });
  const r = await retrying(`${url}/v1/payments`, { method: 'POST', body: '{}' });
  assert.equal(r.status, 201);
  assert.equal(seen.length, 2);
  assert.equal(seen[0].key, seen[1].key);
  // A bounded wait for the server to notice the client's close.
  for (let i = 0; i < 100 && closed === 0; i++) await new Promise((res) => setTimeout(res, 20));
  assert.equal(closed, 1);
  const keyless = withRetries(fetch, { ...fast, attemptTimeoutMs: 150, mintKeys: false });
  const hangAll = await rawServer(() => {});
  const e = await keyless(`${hangAll.url}/v1/payments`, { method: 'POST', body: '{}' }).catch((x) => x);
  assert.equal(e.code, 'OUTCOME_UNKNOWN');
  assert.equal(e.attempts, 1);
  assert.equal(hangAll.seen.length, 1);
});

test('the deadline cuts the attempt timeout: a 300 ms call with 1 s attempts ends near 300 ms', async () => {
  const { url } = await rawServer(() => {});
  const retrying = withRetries(fetch, { ...fast, deadlineMs: 300, attemptTimeoutMs: 1000 });
  const started = performance.now();
  const e = await retrying(`${url}/`, { method: 'GET' }).catch((x) => x);
  const took = performance.now() - started;
  assert.equal(e.code, 'DEADLINE_EXHAUSTED');
  assert.equal(e.attempts, 1);
  // The rule is a bound: within the deadline plus generous slack for a loaded machine.
  assert.ok(took >= 290 && took < 300 + 1500, `took ${took} ms`);
});

test('a 503 whose problem body is cut off is still a 503: retried', async () => {
  const { url, seen } = await rawServer((socket, n) => {
    if (n === 1) {
      socket.write('HTTP/1.1 503 X\r\ncontent-type: application/problem+json\r\ncontent-length: 200\r\n\r\n{"retryable": fal');
      setTimeout(() => socket.end(), 20);
    } else respond(socket, 201, 'ok');
  });
  const retrying = withRetries(fetch, fast);
  const r = await retrying(`${url}/v1/payments`, { method: 'POST', body: '{}' });
  assert.equal(r.status, 201);
  assert.equal(seen.length, 2);
});

test('a 503 whose body trickles past the attempt timeout is still a 503: retried', async () => {
  const { url, seen } = await rawServer((socket, n) => {
    if (n === 1) {
      const body = '{"type":"about:blank","status":503,"retryable":false,"detail":"' + 'x'.repeat(100) + '"}';
      socket.write(`HTTP/1.1 503 X\r\ncontent-type: application/problem+json\r\ncontent-length: ${body.length}\r\n\r\n`);
      let at = 0;
      const timer = setInterval(() => {
        if (socket.destroyed || at >= body.length) return clearInterval(timer);
        socket.write(body.slice(at, at + 8));
        at += 8;
      }, 100);
    } else respond(socket, 201, 'ok');
  });
  const retrying = withRetries(fetch, { ...fast, attemptTimeoutMs: 300 });
  const r = await retrying(`${url}/v1/payments`, { method: 'POST', body: '{}' });
  assert.equal(r.status, 201, 'the retryable: false never arrived in time, so the status decided');
  assert.equal(seen.length, 2);
});

test('a problem body that arrives in time is read: retryable false on a 503 is obeyed, the body handed back', async () => {
  const body = JSON.stringify({ type: 'about:blank', status: 503, code: 'x', retryable: false });
  const { url, seen } = await rawServer((socket) => respond(socket, 503, body, { 'content-type': 'application/problem+json' }));
  const retrying = withRetries(fetch, fast);
  const r = await retrying(`${url}/v1/payments`, { method: 'POST', body: '{}' });
  assert.equal(r.status, 503);
  assert.equal(await r.text(), body);
  assert.equal(r.url, `${url}/v1/payments`);
  assert.equal(seen.length, 1);
});

test('no socket leaks: the bodies of retried responses are released', async () => {
  let open = 0;
  let peak = 0;
  let n = 0;
  const server = http.createServer((req, res) => {
    n++;
    if (n % 3 !== 0) {
      res.writeHead(503, { 'content-type': 'text/plain' });
      res.end('x'.repeat(64 * 1024));
    } else {
      res.writeHead(200);
      res.end('ok');
    }
  });
  server.on('connection', (socket) => {
    open++;
    peak = Math.max(peak, open);
    socket.on('close', () => open--);
  });
  servers.push(server);
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  const retrying = withRetries(fetch, fast);
  for (let i = 0; i < 20; i++) {
    const r = await retrying(`http://127.0.0.1:${server.address().port}/`);
    assert.equal(r.status, 200);
    await r.text();
  }
  assert.equal(n, 60);
  // Sequential calls whose discarded bodies were released reuse or close their sockets: a
  // leak would leave one stuck socket per retried response (40 here).
  assert.ok(peak <= 6, `peak open sockets ${peak}`);
});

test('Retry-After as an HTTP-date on a real response is waited (within slack)', async () => {
  const { url, seen } = await rawServer((socket, n) => {
    if (n === 1) respond(socket, 503, '', { 'retry-after': new Date(Math.ceil((Date.now() + 1000) / 1000) * 1000).toUTCString() });
    else respond(socket, 201, 'ok');
  });
  const retrying = withRetries(fetch, fast);
  const started = performance.now();
  const r = await retrying(`${url}/v1/payments`, { method: 'POST', body: '{}' });
  const took = performance.now() - started;
  assert.equal(r.status, 201);
  assert.equal(seen.length, 2);
  assert.ok(took >= 900, `waited only ${took} ms for a date 1-2 s ahead`);
});

test('the caller aborting mid-attempt on a real socket stops at once', async () => {
  const { url } = await rawServer(() => {});
  const retrying = withRetries(fetch, fast);
  const controller = new AbortController();
  setTimeout(() => controller.abort(), 100);
  const started = performance.now();
  const e = await retrying(`${url}/v1/payments`, { method: 'POST', body: '{}', signal: controller.signal }).catch((x) => x);
  assert.equal(e.name, 'AbortError');
  assert.equal(e.code, 'ABORTED');
  assert.equal(e.outcomeUnknown, true);
  assert.ok(e.idempotencyKey);
  assert.ok(performance.now() - started < 2000);
});

test("the caller's signal still aborts reading the body of the response handed back", async () => {
  const { url } = await rawServer((socket) => {
    socket.write('HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nfirst-bytes');
  });
  const retrying = withRetries(fetch, fast);
  const controller = new AbortController();
  const r = await retrying(`${url}/`, { signal: controller.signal });
  assert.equal(r.status, 200);
  const reader = r.body.getReader();
  assert.equal(new TextDecoder().decode((await reader.read()).value), 'first-bytes');
  setTimeout(() => controller.abort(new Error('stop reading')), 50);
  await assert.rejects(reader.read(), /stop reading|aborted/);
});

test("a returned response's body is still readable after the attempt timeout has passed", async () => {
  const { url } = await rawServer((socket) => respond(socket, 201, '{"id":"pay_1"}', { 'content-type': 'application/json' }));
  const retrying = withRetries(fetch, { attemptTimeoutMs: 100 });
  const res = await retrying(`${url}/v1/payments`, { method: 'POST', body: '{}' });
  assert.equal(res.status, 201);
  // Other work, past the attempt's 100 ms: the attempt is over, its timeout must not abort the body.
  await new Promise((resolve) => setTimeout(resolve, 300));
  assert.deepEqual(await res.json(), { id: 'pay_1' });
  // The caller's own signal still cancels a read within the attempt's time.
  const controller = new AbortController();
  const slow = await rawServer((socket) => {
    socket.write('HTTP/1.1 200 X\r\ncontent-length: 10\r\n\r\n12345');
  });
  const res2 = await retrying(`${slow.url}/v1/payments/pay_1`, { signal: controller.signal });
  const reading = res2.text();
  controller.abort(new Error('caller gave up'));
  await assert.rejects(reading);
});

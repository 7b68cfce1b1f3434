// The fleet run for the Node SDK: retrying clients (withRetries around the platform fetch) make
// payments through a fault-injecting proxy to a real `oncely serve`, whose API server is killed
// (SIGKILL) and restarted mid-run; then the card processor's ledger is read and every charge
// executed more than once for one Idempotency-Key is a duplicate. The run passes with 0
// duplicates, every payment made once and none lost.
//
// The same run as the Rust fleet gate (`oncely gates`, crates/oncely-cli/src/gates/fleet.rs),
// with the SDK under test in Node: the same fault mix (per request, by a seeded draw: 10% are
// forwarded and then their response dropped, the connection closed without an answer; 5% are
// answered 503 with Retry-After: 1 without being forwarded; while the API server is down every
// request is answered 502), the same SDK settings (10 attempts, a 60 s deadline, 10 s per
// attempt, full jitter from 100 ms to 2 s: generous bounds for a run that injects faults on
// purpose), one SDK instance (one retry budget) for the whole fleet, and one patient retry by
// hand, with the same key, for each call the SDK gave up on (a drained budget during the outage
// is the budget doing its job).
//
// Usage: node sdks/node/test/fleet_client.mjs
//   ONCELY_BIN            the `oncely` binary (default: target/debug/oncely of this repository)
//   ONCELY_FLEET_CLIENTS  concurrent clients (default 20, as the Rust fleet gate)
//   ONCELY_FLEET_CALLS    sequential payments per client (default 10, as the Rust fleet gate)
//   ONCELY_FLEET_SEED     the fault draw's seed (default 0x5eed)
// Prints a JSON summary; exits 1 unless the run was exact.
import { spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import http from 'node:http';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { randomUUID } from 'node:crypto';
import { withRetries } from '../dist/index.js';

const ROOT = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '../../..');
const BIN = process.env.ONCELY_BIN || path.join(ROOT, 'target/debug/oncely');
const CLIENTS = Number(process.env.ONCELY_FLEET_CLIENTS ?? 20);
const CALLS = Number(process.env.ONCELY_FLEET_CALLS ?? 10);
const SEED = Number(process.env.ONCELY_FLEET_SEED ?? 0x5eed);
const DROP_PCT = 10;
const UNAVAILABLE_PCT = 5;
const dir = mkdtempSync(path.join(tmpdir(), 'oncely-node-fleet-'));
const children = new Set();

const log = (...a) => console.error('fleet:', ...a);

/** Starts `oncely <args> --addr 127.0.0.1:0` and waits for its "listening on" line. */
async function start(name, args) {
  const child = spawn(BIN, [...args, '--addr', '127.0.0.1:0'], {
    stdio: ['ignore', 'pipe', 'inherit'],
    env: { ...process.env, RUST_LOG: process.env.ONCELY_CHILD_LOG ?? 'warn' },
  });
  children.add(child);
  child.once('exit', () => children.delete(child));
  const url = await new Promise((resolve, reject) => {
    const timer = setTimeout(() => reject(new Error(`${name} did not start within 60 s`)), 60_000);
    const lines = createInterface({ input: child.stdout });
    lines.on('line', (line) => {
      const m = /^oncely: listening on (\S+)/.exec(line);
      if (m) {
        clearTimeout(timer);
        resolve(m[1]);
      }
    });
    child.once('exit', (code) => {
      clearTimeout(timer);
      reject(new Error(`${name} exited (${code}) before it was listening`));
    });
  });
  return { child, url };
}

const kill = (proc) =>
  new Promise((resolve) => {
    if (proc.child.exitCode !== null || proc.child.signalCode !== null) return resolve();
    proc.child.once('exit', resolve);
    proc.child.kill('SIGKILL');
  });

const startApi = (processorUrl) =>
  start('the API server', [
    'serve',
    '--store', path.join(dir, 'keys.sqlite3'),
    '--processor-url', processorUrl,
    '--lease-ms', '2000',
    '--business-db', path.join(dir, 'business.sqlite3'),
  ]);

/** A seeded generator (xorshift32): the same fault sequence for the same seed. */
function xorshift(seed) {
  let x = seed >>> 0 || 1;
  return () => {
    x ^= x << 13;
    x >>>= 0;
    x ^= x >>> 17;
    x ^= x << 5;
    x >>>= 0;
    return x % 100;
  };
}

/** The fault proxy: forwards, drops responses after forwarding, injects 503s, 502 while down. */
function startProxy() {
  const stats = { forwarded: 0, dropped: 0, unavailable: 0, upstream_down: 0 };
  const draw = xorshift(SEED);
  const proxy = { upstream: undefined, stats };
  const server = http.createServer((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', async () => {
      const roll = draw();
      if (proxy.upstream === undefined) {
        stats.upstream_down++;
        res.writeHead(502, { 'content-type': 'text/plain' });
        return res.end('upstream down');
      }
      if (roll < UNAVAILABLE_PCT) {
        stats.unavailable++;
        res.writeHead(503, { 'retry-after': '1', 'content-type': 'text/plain' });
        return res.end('injected');
      }
      const headers = { ...req.headers };
      delete headers.host;
      delete headers.connection;
      delete headers['content-length'];
      let upstream;
      try {
        upstream = await fetch(`${proxy.upstream}${req.url}`, {
          method: req.method,
          headers,
          body: chunks.length ? Buffer.concat(chunks) : undefined,
          signal: AbortSignal.timeout(30_000),
        });
      } catch {
        stats.upstream_down++;
        res.writeHead(502, { 'content-type': 'text/plain' });
        return res.end('upstream failed');
      }
      const body = Buffer.from(await upstream.arrayBuffer().catch(() => new ArrayBuffer(0)));
      if (roll < UNAVAILABLE_PCT + DROP_PCT) {
        // The side effect happened; the client never learns.
        stats.dropped++;
        return req.socket.destroy();
      }
      stats.forwarded++;
      const out = {};
      upstream.headers.forEach((v, k) => {
        if (k !== 'content-length' && k !== 'transfer-encoding' && k !== 'connection' && k !== 'content-encoding') out[k] = v;
      });
      res.writeHead(upstream.status, out);
      res.end(body);
    });
  });
  return new Promise((resolve) =>
    server.listen(0, '127.0.0.1', () => {
      proxy.url = `http://127.0.0.1:${server.address().port}`;
      proxy.close = () => server.close();
      resolve(proxy);
    }),
  );
}

const paymentBody = (amount) => JSON.stringify({ amount, currency: 'EUR', source: 'tok_visa', description: 'node fleet' });

/** One patient retry by hand for a call the SDK gave up on: the same key until a final answer. */
async function untilFinal(base, account, key, amount, limitMs = 30_000) {
  const started = performance.now();
  for (;;) {
    try {
      const r = await fetch(`${base}/v1/payments`, {
        method: 'POST',
        headers: { authorization: `Bearer ${account}`, 'content-type': 'application/json', 'idempotency-key': key },
        body: paymentBody(amount),
        signal: AbortSignal.timeout(10_000),
      });
      const text = await r.text();
      const code = r.headers.get('content-type')?.includes('json') ? JSON.parse(text || '{}').code : undefined;
      if (!(r.status === 503 || (r.status === 409 && code === 'idempotency_request_in_flight'))) return r.status;
    } catch {
      // Not answered: try again with the same key.
    }
    if (performance.now() - started > limitMs) return undefined;
    await new Promise((res) => setTimeout(res, 250));
  }
}

async function main() {
  log(`${CLIENTS} clients x ${CALLS} payments through the fault proxy (seed ${SEED}), ${BIN}`);
  const processor = await start('the processor', ['processor']);
  let api = await startApi(processor.url);
  const proxy = await startProxy();
  proxy.upstream = api.url;
  const account = `acct_node_fleet_${randomUUID().replaceAll('-', '')}`;
  const retrying = withRetries(fetch, {
    maxAttempts: 10,
    deadlineMs: 60_000,
    attemptTimeoutMs: 10_000,
    backoff: { baseMs: 100, capMs: 2_000 },
  });
  const total = CLIENTS * CALLS;
  let done = 0;
  const errors = {};
  const clients = Array.from({ length: CLIENTS }, async (_, c) => {
    const out = [];
    for (let n = 0; n < CALLS; n++) {
      const key = `node-fleet-${c}-${n}`;
      const amount = 100 + n;
      let ok = false;
      try {
        const r = await retrying(`${proxy.url}/v1/payments`, {
          method: 'POST',
          headers: { authorization: `Bearer ${account}`, 'content-type': 'application/json' },
          body: paymentBody(amount),
          oncely: { idempotencyKey: key },
        });
        ok = r.status === 201;
        await r.arrayBuffer();
      } catch (e) {
        errors[e.code ?? e.name] = (errors[e.code ?? e.name] ?? 0) + 1;
      }
      out.push({ key, amount, ok });
      done++;
    }
    return out;
  });

  // Kill the API server a third of the way through and bring it back on a new port.
  while (done < total / 3) await new Promise((r) => setTimeout(r, 50));
  log('killing the API server mid-run');
  proxy.upstream = undefined;
  await kill(api);
  await new Promise((r) => setTimeout(r, 500));
  api = await startApi(processor.url);
  proxy.upstream = api.url;
  log('API server restarted');

  const calls = (await Promise.all(clients)).flat();
  let unresolved = 0;
  for (const call of calls.filter((c) => !c.ok)) {
    if ((await untilFinal(api.url, account, call.key, call.amount)) !== 201) unresolved++;
  }
  const ledger = await (await fetch(`${processor.url}/charges`)).json();
  const executions = new Map();
  for (const e of ledger.entries ?? []) {
    if (e.metadata?.account !== account) continue;
    const k = e.metadata?.idempotency_key;
    executions.set(k, (executions.get(k) ?? 0) + (e.executions ?? 0));
  }
  let duplicates = 0;
  let charged = 0;
  for (const call of calls) {
    const n = executions.get(call.key) ?? 0;
    duplicates += Math.max(0, n - 1);
    if (n > 0) charged++;
  }
  const listing = await (await fetch(`${api.url}/v1/payments`, { headers: { authorization: `Bearer ${account}` } })).json();
  const payments = (listing.data ?? []).length;
  const summary = {
    sdk: 'node',
    logical_calls: total,
    duplicate_side_effects: duplicates,
    payments,
    charged_keys: charged,
    sdk_successes: calls.filter((c) => c.ok).length,
    unresolved,
    sdk_errors: errors,
    proxy: proxy.stats,
    sdk_metrics: retrying.metrics(),
  };
  console.log(JSON.stringify(summary));
  const exact = duplicates === 0 && unresolved === 0 && payments === total && charged === total;
  console.log(
    `fleet (node): ${total} logical payments, ${duplicates} duplicate side effects, ${payments} payments, ` +
      `${summary.sdk_successes} finished within the SDK's retries, ${unresolved} unresolved: ${exact ? 'PASS' : 'FAIL'}`,
  );
  proxy.close();
  await kill(api);
  await kill(processor);
  return exact;
}

let exact = false;
try {
  exact = await main();
} catch (e) {
  console.error('fleet: the run failed:', e);
} finally {
  for (const child of children) child.kill('SIGKILL');
  rmSync(dir, { recursive: true, force: true });
}
process.exit(exact ? 0 : 1);

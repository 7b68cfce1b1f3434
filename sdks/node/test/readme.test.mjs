// The README's code runs as written: the package is installed into fresh folders with
// `npm install <path>` (as a link, the README's command, and as a packed copy), and every `js`
// block of README.md runs there, against a local server standing in for the API.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import http from 'node:http';
import { execFile } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync, existsSync, lstatSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const run = promisify(execFile);
const PKG = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const readme = readFileSync(path.join(PKG, 'README.md'), 'utf8');
const blocks = [...readme.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]);

let server;
let base;
const seen = [];
const folders = [];

before(async () => {
  let posts = 0;
  server = http.createServer((req, res) => {
    let body = '';
    req.on('data', (c) => (body += c));
    req.on('end', () => {
      seen.push({ method: req.method, url: req.url, key: req.headers['idempotency-key'] ?? null, body });
      res.setHeader('content-type', 'application/json');
      if (req.method === 'POST' && req.url === '/v1/payments') {
        // The first attempt of every call is answered 503: the README's call must retry it.
        if (posts++ % 2 === 0) {
          res.writeHead(503, { 'retry-after': '0' });
          return res.end('{"type":"about:blank","status":503,"code":"upstream_unavailable","retryable":true}');
        }
        res.writeHead(201);
        return res.end('{"id":"pay_1","status":"succeeded"}');
      }
      if (req.method === 'GET' && req.url === '/v1/payments/pay_1') {
        res.writeHead(200);
        return res.end('{"id":"pay_1","status":"succeeded"}');
      }
      res.writeHead(404);
      res.end('{}');
    });
  });
  await new Promise((r) => server.listen(0, '127.0.0.1', r));
  base = `http://127.0.0.1:${server.address().port}`;
});

after(() => {
  server?.close();
  for (const f of folders) rmSync(f, { recursive: true, force: true });
});

async function freshInstall(extraArgs) {
  const folder = mkdtempSync(path.join(tmpdir(), 'oncely-readme-'));
  folders.push(folder);
  writeFileSync(path.join(folder, 'package.json'), JSON.stringify({ name: 'readme-check', version: '1.0.0', private: true }));
  await run('npm', ['install', '--no-audit', '--no-fund', '--offline', ...extraArgs, PKG], { cwd: folder, timeout: 120_000 });
  return folder;
}

async function runBlocks(folder) {
  assert.ok(blocks.length >= 3, `README.md has ${blocks.length} js blocks`);
  const outputs = [];
  for (const [i, block] of blocks.entries()) {
    const file = path.join(folder, `block-${i}.mjs`);
    writeFileSync(file, block.replaceAll('http://127.0.0.1:8080', base));
    const { stdout } = await run(process.execPath, [file], { cwd: folder, timeout: 60_000 });
    outputs.push(stdout);
  }
  return outputs;
}

function checkOutputs(outputs, from) {
  // Block 2: the keyed payment, retried once after the 503, with its own key both times.
  assert.match(outputs[1], /^201 \{ id: 'pay_1', status: 'succeeded' \}/);
  const posts = seen.slice(from).filter((s) => s.method === 'POST');
  assert.deepEqual(posts.map((p) => p.key), ['order-confirm-42', 'order-confirm-42']);
  assert.deepEqual(posts.map((p) => p.body), ['{"amount":1000,"currency":"EUR"}', '{"amount":1000,"currency":"EUR"}']);
  // Block 3: the configured function, its policy and budget.
  assert.equal(outputs[2].trim(), '200 4 100');
}

test('npm install ./sdks/node (a link) works in a fresh folder, and the README blocks run as written', async () => {
  const folder = await freshInstall([]);
  assert.ok(lstatSync(path.join(folder, 'node_modules/oncely')).isSymbolicLink());
  const from = seen.length;
  checkOutputs(await runBlocks(folder), from);
});

test('npm install --install-links (a packed copy, as from a registry) ships dist/ and runs the same', async () => {
  const folder = await freshInstall(['--install-links']);
  const installed = path.join(folder, 'node_modules/oncely');
  assert.ok(!lstatSync(installed).isSymbolicLink());
  assert.ok(existsSync(path.join(installed, 'dist/index.js')) && existsSync(path.join(installed, 'dist/index.d.ts')));
  assert.ok(!existsSync(path.join(installed, 'node_modules')), 'no runtime dependency installed');
  const from = seen.length;
  checkOutputs(await runBlocks(folder), from);
});

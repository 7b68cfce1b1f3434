// Test helpers: a simulated clock and a scripted fake fetch.

/**
 * A simulated clock: `sleep` advances time at once and records the wait; attempt timeouts are
 * signals the test fires with `fireTimeouts()` (or that fire when a sleep passes them).
 */
export class FakeClock {
  constructor(wallMs = Date.UTC(2026, 11, 2, 8, 0, 0)) {
    this.t = 0;
    this.wall = wallMs;
    this.sleeps = [];
    this.timers = [];
  }
  now() {
    return this.t;
  }
  systemNow() {
    return this.wall + this.t;
  }
  async sleep(ms, signal) {
    if (signal?.aborted) throw signal.reason;
    this.sleeps.push(ms);
    this.advance(ms);
    if (signal?.aborted) throw signal.reason;
  }
  advance(ms) {
    this.t += ms;
    for (const timer of this.timers) {
      if (!timer.controller.signal.aborted && timer.at <= this.t) timer.controller.abort(new DOMException('timed out', 'TimeoutError'));
    }
  }
  timeout(ms) {
    const controller = new AbortController();
    this.timers.push({ at: this.t + ms, ms, controller });
    return controller.signal;
  }
  /** The timeouts asked for, in milliseconds, in order. */
  get timeouts() {
    return this.timers.map((t) => t.ms);
  }
  /** Fires the latest attempt timeout. */
  fireLatestTimeout() {
    this.timers.at(-1).controller.abort(new DOMException('timed out', 'TimeoutError'));
  }
}

/** Records every request it gets and answers from a script: one function per attempt (the last repeats). */
export function scriptedFetch(script) {
  const requests = [];
  const fn = async (input, init = {}) => {
    const request = new Request(input, init);
    const body = request.body === null ? null : new Uint8Array(await request.arrayBuffer());
    const seen = {
      method: request.method,
      url: request.url,
      headers: Object.fromEntries(request.headers),
      key: request.headers.get('idempotency-key'),
      body,
      init,
      signal: init.signal,
    };
    requests.push(seen);
    const step = script[Math.min(requests.length, script.length) - 1];
    return step(seen, requests.length);
  };
  fn.requests = requests;
  return fn;
}

/** A response step. */
export const answer = (status, { headers = {}, body = null } = {}) => () => new Response(body, { status, headers });

/** A problem+json response step. */
export const problem = (status, fields, headers = {}) => () =>
  new Response(JSON.stringify({ type: 'about:blank', status, ...fields }), {
    status,
    headers: { 'content-type': 'application/problem+json', ...headers },
  });

/** A step that rejects like undici's fetch on a socket error with this cause. */
export const networkError = (code, extra = {}) => () => {
  const cause = Object.assign(new Error(`${code} (simulated)`), { code, ...extra });
  throw new TypeError('fetch failed', { cause });
};

/** A step that never answers until its signal aborts. */
export const hang = () => (seen) =>
  new Promise((_, reject) => {
    if (seen.signal?.aborted) return reject(seen.signal.reason);
    seen.signal?.addEventListener('abort', () => reject(seen.signal.reason), { once: true });
  });

/** Always the same random draw. */
export const fixedRandom = (r) => () => r;

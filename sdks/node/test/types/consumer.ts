// Type-level test of the published declarations, as a TypeScript consumer imports them (by the
// package's own name, through its `exports` map). Compiled with `tsc -p test/types` (no output).
import { withRetries, OncelyRetryError, OncelyAbortError, RetryBudget, sendGuard, type OncelyErrorCode, type OncelyRequestInit, type RetryEvent } from 'oncely';

const retrying = withRetries(fetch, {
  maxAttempts: 4,
  budget: new RetryBudget({ capacity: 10 }),
  backoff: { jitter: 'decorrelated', baseMs: 100 },
  onRetry: (e: RetryEvent) => console.log(e.waitMs, e.idempotencyKey, e.reason),
});
// The wrapped function has fetch's signature: it can stand in for fetch anywhere.
const asFetch: typeof fetch = retrying;
const guarded: typeof fetch = sendGuard(fetch);
const stacked: typeof fetch = withRetries(withRetries(fetch));
const init: OncelyRequestInit = { method: 'POST', body: '{}', oncely: { idempotencyKey: 'order-confirm-42', deadlineMs: 5000, maxAttempts: 2, mintKeys: false } };

export async function consumer(): Promise<number | OncelyErrorCode> {
  try {
    const r: Response = await retrying('http://127.0.0.1:8080/v1/payments', init);
    return r.status;
  } catch (e) {
    if (e instanceof OncelyAbortError) return e.code;
    if (e instanceof OncelyRetryError) {
      const unknown: boolean = e.outcomeUnknown;
      const key: string | undefined = e.idempotencyKey;
      const last: number | undefined = e.lastStatus;
      void unknown, key, last;
      return e.code;
    }
    throw e;
  }
}
void asFetch, guarded, stacked;
// @ts-expect-error: an unknown per-call option is a type error
const bad: OncelyRequestInit = { oncely: { deadline: 5 } };
void bad;

/**
 * `withRetries`: the retry loop around a `fetch`.
 *
 * What one logical call does (the Rust SDK's middleware, step for step):
 *
 * 1. Starts the deadline (default 30 s, or `init.oncely.deadlineMs`).
 * 2. Checks a caller's `Idempotency-Key` (the header, or `init.oncely.idempotencyKey`) with the
 *    server's rules; a bad one ends the call with `INVALID_IDEMPOTENCY_KEY` before anything is
 *    sent.
 * 3. For `POST` and `PATCH` without a key, mints one (`crypto.randomUUID()`, unless
 *    `mintKeys: false`); every attempt of this call carries that same key.
 * 4. Sends an attempt with the timeout `min(attemptTimeoutMs, time left)`, as an `AbortSignal`
 *    combined with the caller's `init.signal`. As with `fetch`'s own signal, it also bounds
 *    reading the body of the response that is finally returned (`attempt`).
 * 5. Classifies the outcome (`classify`): for an error response (400 to 599) with a JSON body of
 *    at most 64 KiB, it reads the body within what is left of the attempt's time, for the
 *    problem+json `code` and `retryable`, and hands the response back with the same bytes. A
 *    body that breaks, stalls or is too large never changes the verdict: the status and headers
 *    decide.
 * 6. Returns the response, throws an {@link OncelyRetryError}, or plans a retry (`schedule`),
 *    tells `onRetry` and the debug log (`NODE_DEBUG=oncely`), sleeps and repeats. The body of
 *    every response that is not returned is cancelled, so its socket is freed.
 *
 * An inner layer of ours under this loop passes each attempt through (`guard`).
 *
 * @module
 */
import type { RetryBudget } from './budget.js';
import { type OncelyErrorCode } from './errors.js';
import { type FetchLike, type OncelyRequestInit } from './options.js';
import { type RetryPolicy, type RetryPolicyOptions } from './policy.js';
/** Counters of one wrapped function, since it was made. */
export interface RetryMetrics {
    /** Logical calls started. */
    readonly calls: number;
    /** Attempts sent (or tried). */
    readonly attempts: number;
    /** Retries planned (each one slept, then sent another attempt). */
    readonly retries: number;
    /** Retries whose wait was set by a `Retry-After` longer than the backoff. */
    readonly retryAfterWaits: number;
    /** Keys minted for `POST` / `PATCH` calls without one. */
    readonly keysMinted: number;
    /** Calls that ended in an {@link OncelyRetryError}, by code. */
    readonly errors: Readonly<Partial<Record<OncelyErrorCode, number>>>;
}
/** The function `withRetries` returns: `fetch`'s signature, plus what it shares. */
export interface RetryingFetch {
    /** One logical call: attempts, sleeps and retries inside, a `Response` or an {@link OncelyRetryError} out. */
    (input: string | URL | Request, init?: OncelyRequestInit): Promise<Response>;
    /** The validated policy. */
    readonly policy: RetryPolicy;
    /** The retry budget shared by every call of this function, or `null` if disabled. */
    readonly budget: RetryBudget | null;
    /** A snapshot of the counters. */
    metrics(): RetryMetrics;
}
/**
 * Wraps a `fetch` (default: the platform's `globalThis.fetch`) with the retry loop.
 *
 * ```js
 * import { withRetries } from 'oncely';
 * const retrying = withRetries(fetch); // 3 attempts, 30 s deadline, keys for POST and PATCH
 * const response = await retrying('http://127.0.0.1:8080/v1/payments', { method: 'POST', body: '{}' });
 * ```
 *
 * The function returned has `fetch`'s signature. Responses that are not retried (2xx, 3xx,
 * 4xx, a `retryable: false` problem) come back as they are, whatever their status. Everything
 * else rejects with an {@link OncelyRetryError}: deadline, attempts, budget, not retryable,
 * outcome unknown, a `Retry-After` beyond the deadline (with the hint), a body that cannot be
 * replayed, an invalid key, a nested retry layer, or the caller's abort
 * ({@link OncelyAbortError}). A retryable response that ends the call (its last attempt, or a
 * budget that cannot pay) is reported as an error with `lastStatus` set; its body is cancelled.
 *
 * Stacking: `withRetries(withRetries(fetch))` makes the policy's attempts, not their product:
 * the inner one sees the outer call and passes through.
 *
 * @throws RangeError (synchronously) for invalid options.
 */
export declare function withRetries(fetchImpl?: FetchLike, options?: RetryPolicyOptions): RetryingFetch;
export declare function withRetries(options: RetryPolicyOptions): RetryingFetch;

/**
 * # oncely: retry writes safely from Node
 *
 * A retry loop around the platform `fetch` that is safe to leave on by default:
 *
 * - an explicit allowlist of what is retried (`classify`), keyed on the method, on whether the
 *   request carries an `Idempotency-Key`, and on whether a failure happened before or after the
 *   request was sent; an ambiguous failure that cannot be retried safely is reported as
 *   "outcome unknown", never silently repeated;
 * - idempotency keys minted once per logical call for `POST` and `PATCH` and reused on every
 *   attempt, or your own (an event-derived key is best);
 * - full-jitter backoff that stays within `[0, cap]` for any attempt number;
 * - `Retry-After` in all its RFC 9110 forms, as a lower bound on the jittered backoff;
 * - two bounds per call: at most 3 attempts and one overall deadline, each attempt's timeout
 *   cut to the time left;
 * - a retry budget shared by every call of one wrapped function.
 *
 * What it promises is effectively-once with a server that honours `Idempotency-Key`:
 * at-least-once delivery plus duplicate collapse on the server. It does not promise
 * exactly-once execution, which no client can: a request that timed out may have run, and only
 * the key lets a retry find out without running it twice.
 *
 * ```js
 * import { withRetries } from 'oncely';
 * const retrying = withRetries(fetch);
 * const response = await retrying('http://127.0.0.1:8080/v1/payments', { method: 'POST', body: '{}' });
 * ```
 *
 * @module
 */
export { withRetries } from './retry.js';
export type { RetryingFetch, RetryMetrics } from './retry.js';
export { sendGuard } from './guard.js';
export type { CallOptions, FetchLike, OncelyRequestInit } from './options.js';
export { resolvePolicy, DEFAULT_MAX_ATTEMPTS, DEFAULT_DEADLINE_MS, DEFAULT_ATTEMPT_TIMEOUT_MS, } from './policy.js';
export type { RetryEvent, RetryPolicy, RetryPolicyOptions } from './policy.js';
export { ceilingMs, delayMs, DEFAULT_BACKOFF, DEFAULT_BASE_DELAY_MS, DEFAULT_MAX_DELAY_MS } from './backoff.js';
export type { Backoff, Jitter, RandomSource } from './backoff.js';
export { RetryBudget, DEFAULT_BUDGET } from './budget.js';
export type { BudgetConfig, RetryCost, Withdrawal } from './budget.js';
export { classifyResponse, classifyTransport, explicitWord, parseProblem, reasonCost, IN_FLIGHT_CODE, } from './classify.js';
export type { Phase, Problem, RequestFacts, ResponseClassifier, ResponseFacts, RetryReason, Signal, TransportFailure, Verdict, } from './classify.js';
export { systemClock, MAX_TIMER_MS } from './clock.js';
export type { Clock } from './clock.js';
export { OncelyRetryError, OncelyAbortError, isOncelyRetryError } from './errors.js';
export type { OncelyErrorCode, OncelyRetryErrorDetails } from './errors.js';
export { IDEMPOTENCY_KEY, MAX_KEY_LENGTH, isValidKey, keyProblem, needsKey, isIdempotentMethod, uuidV4Key } from './key.js';
export type { KeyProblem, MakeIdempotencyKey } from './key.js';
export { parseRetryAfter, parseHttpDate, retryAfterFromHeaders } from './retry-after.js';
export { CallState, Deadline, combineWait } from './schedule.js';
export type { RetryPlan, StopPlan } from './schedule.js';
export { transportOf } from './transport.js';
export { MAX_PROBLEM_BODY } from './body.js';

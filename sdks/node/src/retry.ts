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

import { debuglog } from 'node:util';

import { Aborted, linkSignals, sendAttempt, type Attempt, type AttemptContext } from './attempt.js';
import { discard, prepareRequest, type PreparedRequest } from './body.js';
import type { RetryBudget } from './budget.js';
import { describeReason, type RequestFacts, type RetryReason } from './classify.js';
import { isOncelyRetryError, OncelyAbortError, OncelyRetryError, type OncelyErrorCode } from './errors.js';
import { activeCall, guardedSend, nestedReason, type ActiveCall } from './guard.js';
import { callerKey, IDEMPOTENCY_KEY, keyProblem, needsKey } from './key.js';
import { callOptions, withoutOncely, type FetchLike, type OncelyRequestInit } from './options.js';
import { attemptCount, attemptTimeout, callDeadline, resolvePolicy, type RetryEvent, type RetryPolicy, type RetryPolicyOptions } from './policy.js';
import { CallState, Deadline, type StopPlan } from './schedule.js';

const debug = debuglog('oncely');

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

function urlOf(input: string | URL | Request): string {
  try {
    const u = new URL(input instanceof Request ? input.url : String(input));
    return `${u.origin}${u.pathname}`;
  } catch {
    return '';
  }
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
export function withRetries(fetchImpl?: FetchLike, options?: RetryPolicyOptions): RetryingFetch;
export function withRetries(options: RetryPolicyOptions): RetryingFetch;
export function withRetries(
  first?: FetchLike | RetryPolicyOptions,
  second?: RetryPolicyOptions,
): RetryingFetch {
  const fetchImpl: FetchLike = typeof first === 'function' ? first : (i, n) => globalThis.fetch(i, n);
  const policy = resolvePolicy(typeof first === 'function' || first === undefined ? second : first);
  const counters = { calls: 0, attempts: 0, retries: 0, retryAfterWaits: 0, keysMinted: 0 };
  const errorCounts: Partial<Record<OncelyErrorCode, number>> = {};

  const retrying = async (input: string | URL | Request, init?: OncelyRequestInit): Promise<Response> => {
    const outer = activeCall.getStore();
    if (outer !== undefined) {
      // An outer layer of ours runs this call's retry loop: one attempt of it is one pass
      // through here, or the two loops would multiply.
      debug('an outer oncely layer is retrying this call; passing through');
      return guardedSend(outer, fetchImpl, input, withoutOncely(init));
    }
    return runCall(input, init);
  };

  async function runCall(input: string | URL | Request, init: OncelyRequestInit | undefined): Promise<Response> {
    const options = callOptions(init?.oncely);
    const maxAttempts = attemptCount('oncely.maxAttempts', options.maxAttempts, policy.maxAttempts);
    const deadlineMs = callDeadline(options.deadlineMs, policy.deadlineMs);
    const attemptTimeoutMs = attemptTimeout('oncely.attemptTimeoutMs', options.attemptTimeoutMs, policy.attemptTimeoutMs);
    const mint = options.mintKeys ?? policy.mintKeys;
    const classifier = options.classifier ?? policy.classifier;
    const { clock, budget } = policy;
    counters.calls += 1;
    const call = new CallState(new Deadline(clock.now(), deadlineMs));
    const isRequest = input instanceof Request;
    const callerSignal: AbortSignal | undefined = init?.signal ?? (isRequest ? input.signal : undefined);
    const method = (init?.method ?? (isRequest ? input.method : 'GET')).toUpperCase();
    const url = urlOf(input);
    let key: string | undefined;
    let ambiguous = false;

    const giveUp = (
      code: OncelyErrorCode,
      reason: string,
      extra: { lastStatus?: number | undefined; cause?: unknown; retryAfterMs?: number; remainingMs?: number; budgetAvailable?: number; budgetCost?: number; outcomeUnknown?: boolean } = {},
    ): OncelyRetryError => {
      errorCounts[code] = (errorCounts[code] ?? 0) + 1;
      const details = {
        code,
        reason,
        attempts: call.attempts,
        elapsedMs: call.deadline.elapsed(clock.now()),
        idempotencyKey: key,
        ...extra,
      };
      const error = code === 'ABORTED' ? new OncelyAbortError(details) : new OncelyRetryError(details);
      debug(
        'giving up: code=%s attempts=%d last_status=%s elapsed_ms=%d tokens_left=%s key=%s: %s',
        code,
        call.attempts,
        extra.lastStatus ?? '-',
        Math.round(details.elapsedMs),
        budget ? budget.available : '-',
        key ?? '-',
        error.message,
      );
      return error;
    };
    const aborted = (inAttempt: boolean): OncelyRetryError =>
      giveUp('ABORTED', 'the caller aborted the call', {
        cause: callerSignal?.reason,
        outcomeUnknown: inAttempt || ambiguous,
      });

    if (callerSignal?.aborted) throw aborted(false);

    // The attempt's header set, the key in it, and how each attempt gets its body.
    let headers: Headers;
    let prepared: PreparedRequest;
    try {
      headers = new Headers(init?.headers ?? (isRequest ? input.headers : undefined));
      const caller = callerKey(headers, init?.headers, options.idempotencyKey);
      key = caller.key;
      if (caller.invalid !== undefined) throw giveUp('INVALID_IDEMPOTENCY_KEY', caller.invalid);
      if (key !== undefined) {
        headers.set(IDEMPOTENCY_KEY, key);
      } else if (mint && needsKey(method)) {
        // One key per logical call, set before the first attempt: every attempt carries it.
        const minted = policy.makeKey();
        key = minted;
        const problem = keyProblem(minted);
        if (problem) throw giveUp('INVALID_IDEMPOTENCY_KEY', `invalid minted idempotency key, nothing sent: ${problem.detail}`);
        headers.set(IDEMPOTENCY_KEY, minted);
        counters.keysMinted += 1;
      }
      prepared = await prepareRequest(input, init, headers);
    } catch (error) {
      if (isOncelyRetryError(error)) throw error;
      // Invalid headers or a body that cannot be read: a bug in the request, nothing was sent.
      throw giveUp('NOT_RETRYABLE', 'the request cannot be sent, nothing sent (failure is not retryable)', { cause: error });
    }
    const facts: RequestFacts = { method, hasKey: key !== undefined };
    const rest: RequestInit = { ...withoutOncely(init) };
    delete rest.headers;
    delete rest.body;
    delete rest.signal;

    const active: ActiveCall = { sends: 0, maxSends: maxAttempts, inFlight: 0, deadline: call.deadline, clock, lastStatus: undefined };
    const context: AttemptContext = { fetchImpl, policy, facts, classifier, active, callerSignal };

    // The status of the previous attempt's response, if it got one (for an error raised before
    // the next attempt is sent).
    let previousStatus: number | undefined;
    for (;;) {
      const started = clock.now();
      const limit = call.deadline.attemptLimit(started, attemptTimeoutMs);
      if (limit <= 0) {
        throw giveUp('DEADLINE_EXHAUSTED', `overall deadline of ${deadlineMs} ms exhausted`, { lastStatus: previousStatus });
      }
      const next = prepared.next();
      if (next === undefined) throw giveUp('BODY_NOT_REPLAYABLE', BODY_NOT_REPLAYABLE);
      const timeout = clock.timeout(limit);
      const { signal, unlink, release } = linkSignals(callerSignal, timeout);
      // A copy per attempt: a layer below that edits the headers it is given (a vendor wrapper
      // setting its own key) cannot change what the next attempt sends.
      const attemptInit: RequestInit = { ...rest, headers: new Headers(headers), signal };
      if (next.body !== undefined) attemptInit.body = next.body;
      call.attempts += 1;
      counters.attempts += 1;
      const sendsBefore = active.sends;

      let attempt: Attempt;
      try {
        attempt = await sendAttempt(context, next.input, attemptInit, signal, timeout, limit);
      } catch (e) {
        unlink();
        if (e instanceof Aborted) throw aborted(e.inAttempt);
        throw e;
      }
      // A response handed back is final: the attempt's timeout no longer aborts it, so its body
      // can be read later (it stays linked to the caller's signal until the timeout would have
      // fired); any other outcome is done with the signal now.
      if (attempt.kind === 'response' && attempt.verdict.type !== 'retry') release();
      else unlink();

      // More requests went out than this attempt: a retry layer below us re-sent it.
      const sent = active.sends - sendsBefore;
      if (!(attempt.kind === 'response' && attempt.verdict.type === 'done') && sent > 1) {
        if (attempt.kind === 'response') discard(attempt.response);
        call.attempts = Math.max(call.attempts, active.sends);
        throw giveUp('NESTED_RETRY_LAYER', nestedReason(active.sends), {
          lastStatus: active.lastStatus,
          cause: attempt.kind === 'response' ? undefined : attempt.error,
        });
      }

      let reason: RetryReason;
      let hintMs: number | undefined;
      let lastStatus: number | undefined;
      let lastError: unknown;
      switch (attempt.kind) {
        case 'decided':
          throw attempt.error;
        case 'stop':
          if (attempt.code === 'NESTED_RETRY_LAYER') call.attempts = Math.max(call.attempts, active.sends);
          throw giveUp(
            attempt.code,
            attempt.code === 'NESTED_RETRY_LAYER' ? nestedReason(active.sends) : `overall deadline of ${deadlineMs} ms exhausted`,
            { lastStatus: active.lastStatus, cause: attempt.error },
          );
        case 'response': {
          const { response, verdict } = attempt;
          if (verdict.type !== 'retry') {
            if (response.status < 500) budget?.onSuccess(call.lastRetryCost);
            return response;
          }
          discard(response);
          reason = verdict.reason;
          hintMs = attempt.hintMs;
          lastStatus = response.status;
          ambiguous = false;
          break;
        }
        case 'failed': {
          const { verdict, error } = attempt;
          if (verdict.type === 'outcome-unknown') {
            throw giveUp(
              'OUTCOME_UNKNOWN',
              'outcome unknown: the request was sent and may have taken effect; it was not retried because it is not safe to repeat without an idempotency key',
              { cause: error },
            );
          }
          if (verdict.type !== 'retry') throw giveUp('NOT_RETRYABLE', 'failure is not retryable', { cause: error });
          reason = verdict.reason;
          lastError = error;
          ambiguous = reason.kind === 'timed-out' || reason.kind === 'connection-reset';
          break;
        }
      }

      previousStatus = lastStatus;
      if (!prepared.replayable) {
        throw giveUp('BODY_NOT_REPLAYABLE', BODY_NOT_REPLAYABLE, { lastStatus, cause: lastError });
      }
      if (reason.kind === 'in-flight') active.inFlight += 1;
      const planned = call.planRetry({ maxAttempts, backoff: policy.backoff }, budget, reason, hintMs, clock.now(), policy.random);
      if ('stop' in planned) throw giveUp(planned.stop.code, stopReason(planned.stop), { lastStatus, cause: lastError, ...stopExtra(planned.stop) });
      const plan = planned.plan;
      counters.retries += 1;
      if (plan.source === 'retry-after') counters.retryAfterWaits += 1;
      reportRetry(policy, {
        attempt: call.attempts,
        nextAttempt: call.attempts + 1,
        reason: describeReason(reason),
        reasonKind: reason.kind,
        status: lastStatus,
        error: lastError,
        waitMs: plan.waitMs,
        waitSource: plan.source,
        backoffMs: plan.backoffMs,
        retryAfterMs: plan.hintMs,
        tokensLeft: plan.tokensLeft,
        cost: plan.cost,
        idempotencyKey: key,
        method,
        url,
      });
      try {
        await clock.sleep(plan.waitMs, callerSignal);
      } catch (sleepError) {
        // The retry was paid for and never made: its tokens go back to the budget.
        if (plan.cost !== undefined) budget?.deposit(plan.cost);
        if (callerSignal?.aborted) throw aborted(false);
        throw sleepError;
      }
      if (callerSignal?.aborted) {
        if (plan.cost !== undefined) budget?.deposit(plan.cost);
        throw aborted(false);
      }
    }
  }

  return Object.assign(retrying, {
    policy,
    budget: policy.budget,
    metrics: (): RetryMetrics => Object.freeze({ ...counters, errors: Object.freeze({ ...errorCounts }) }),
  });
}

/**
 * Tells the debug log (`NODE_DEBUG=oncely`) and the policy's `onRetry` hook about a planned
 * retry. An async hook is not awaited (it never delays the retry), but its rejection is caught
 * like a throw: a hook's bug never ends the process or the call.
 */
function reportRetry(policy: RetryPolicy, event: RetryEvent): void {
  const { error } = event;
  debug(
    'retrying: attempt=%d next_attempt=%d reason=%s error=%s method=%s url=%s wait_ms=%d wait_source=%s backoff_ms=%d retry_after_ms=%s tokens_left=%s cost=%s key=%s',
    event.attempt,
    event.nextAttempt,
    event.reason,
    error === undefined ? '-' : String((error as { message?: unknown })?.message ?? error),
    event.method,
    event.url,
    Math.round(event.waitMs),
    event.waitSource,
    Math.round(event.backoffMs),
    event.retryAfterMs === undefined ? '-' : Math.round(event.retryAfterMs),
    event.tokensLeft ?? '-',
    event.cost ?? '-',
    event.idempotencyKey ?? '-',
  );
  if (!policy.onRetry) return;
  try {
    const returned: unknown = policy.onRetry(event);
    if (returned !== null && typeof returned === 'object' && typeof (returned as PromiseLike<unknown>).then === 'function') {
      Promise.resolve(returned).catch((hookError: unknown) => {
        debug('the onRetry hook rejected; ignored: %s', String(hookError));
      });
    }
  } catch (hookError) {
    debug('the onRetry hook threw; ignored: %s', String(hookError));
  }
}

const BODY_NOT_REPLAYABLE = 'request body is a stream and cannot be resent, so it was sent once and not retried';

function stopReason(stop: StopPlan): string {
  switch (stop.code) {
    case 'ATTEMPTS_EXHAUSTED':
      return `all ${stop.maxAttempts} attempts failed`;
    case 'DEADLINE_EXHAUSTED':
      return `overall deadline of ${stop.deadlineMs} ms exhausted`;
    case 'RETRY_AFTER_BEYOND_DEADLINE':
      return `server asked to retry after ${Math.round(stop.hintMs)} ms but only ${Math.round(stop.remainingMs)} ms of the deadline were left`;
    case 'BUDGET_EMPTY':
      return `retry budget empty (${stop.available} tokens left, a retry costs ${stop.cost})`;
  }
}

function stopExtra(stop: StopPlan): { retryAfterMs?: number; remainingMs?: number; budgetAvailable?: number; budgetCost?: number } {
  switch (stop.code) {
    case 'RETRY_AFTER_BEYOND_DEADLINE':
      return { retryAfterMs: stop.hintMs, remainingMs: stop.remainingMs };
    case 'BUDGET_EMPTY':
      return { budgetAvailable: stop.available, budgetCost: stop.cost };
    default:
      return {};
  }
}

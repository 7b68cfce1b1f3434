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
 *    reading the body of the response that is finally returned.
 * 5. Classifies the outcome (`classify`): for an error response (400 to 599) with a JSON body of
 *    at most 64 KiB, it reads the body within what is left of the attempt's time, for the
 *    problem+json `code` and `retryable`, and hands the response back with the same bytes. A
 *    body that breaks, stalls or is too large never changes the verdict: the status and headers
 *    decide.
 * 6. Returns the response, throws an {@link OncelyRetryError}, or plans a retry (`schedule`),
 *    tells `onRetry` and the debug log (`NODE_DEBUG=oncely`), sleeps and repeats. The body of
 *    every response that is not returned is cancelled, so its socket is freed.
 *
 * @module
 */

import { AsyncLocalStorage } from 'node:async_hooks';
import { debuglog } from 'node:util';

import {
  discard,
  isJson,
  MAX_PROBLEM_BODY,
  prepareRequest,
  raceSignal,
  readSmallBody,
  rebuildResponse,
  replayedBody,
  type PreparedRequest,
} from './body.js';
import type { RetryBudget } from './budget.js';
import {
  classifyResponse,
  classifyTransport,
  describeReason,
  parseProblem,
  type Problem,
  type RequestFacts,
  type ResponseClassifier,
  type RetryReason,
  type Verdict,
} from './classify.js';
import type { Clock } from './clock.js';
import { isOncelyRetryError, OncelyAbortError, OncelyRetryError, type OncelyErrorCode } from './errors.js';
import { hasSurroundingWhitespace, IDEMPOTENCY_KEY, keyProblem, needsKey, rawKeyValues } from './key.js';
import { attemptCount, attemptTimeout, callDeadline, knownOptions, resolvePolicy, type RetryEvent, type RetryPolicy, type RetryPolicyOptions } from './policy.js';
import { retryAfterFromHeaders } from './retry-after.js';
import { CallState, Deadline, type StopPlan } from './schedule.js';
import { transportOf } from './transport.js';

const debug = debuglog('oncely');

/** Anything with `fetch`'s signature: the platform `fetch`, or a wrapper around it. */
export type FetchLike = (input: string | URL | Request, init?: RequestInit) => Promise<Response>;

/**
 * Per-call overrides, passed as `init.oncely`:
 *
 * ```js
 * await retrying('https://api.example.com/v1/payments', {
 *   method: 'POST',
 *   body: JSON.stringify({ amount: 1000 }),
 *   oncely: { idempotencyKey: 'order-confirm-42', deadlineMs: 5_000 },
 * });
 * ```
 */
export interface CallOptions {
  /** This call's overall deadline instead of the policy's, in milliseconds. */
  deadlineMs?: number;
  /** This call's total attempts instead of the policy's (1 disables retries for it). */
  maxAttempts?: number;
  /** This call's per-attempt timeout instead of the policy's, in milliseconds (above 0). */
  attemptTimeoutMs?: number;
  /**
   * This call's `Idempotency-Key` (the same as setting the header; an event-derived key such as
   * `order-confirm-${orderId}` is best). Checked with the server's rules before sending.
   */
  idempotencyKey?: string;
  /** Whether this call gets a key minted (a `POST` or `PATCH` without one). Default: the policy's. */
  mintKeys?: boolean;
  /** This call's response hook instead of the policy's. */
  classifier?: ResponseClassifier;
}

const CALL_OPTIONS: readonly (keyof CallOptions)[] = ['deadlineMs', 'maxAttempts', 'attemptTimeoutMs', 'idempotencyKey', 'mintKeys', 'classifier'];

/**
 * Checks `init.oncely`: an object of known {@link CallOptions} members, a string key.
 *
 * @throws TypeError naming an unknown option (`deadlinMs`), for a value that is not an object,
 * or for an `idempotencyKey` that is not a string.
 */
function callOptions(value: unknown): CallOptions {
  if (value === undefined) return {};
  knownOptions('init.oncely', value, CALL_OPTIONS);
  const options = value as CallOptions;
  if (options.idempotencyKey !== undefined && typeof options.idempotencyKey !== 'string') {
    throw new TypeError(`oncely: init.oncely.idempotencyKey must be a string, got ${typeof options.idempotencyKey}`);
  }
  return options;
}

/** `RequestInit` with this SDK's per-call options. */
export interface OncelyRequestInit extends RequestInit {
  /** Per-call overrides (see {@link CallOptions}). */
  oncely?: CallOptions;
}

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

/** What the outermost layer shares with everything below it for one logical call. */
interface ActiveCall {
  sends: number;
  readonly maxSends: number;
  /** Attempts answered 409 in flight: each allows one more send (the schedule does not count them). */
  inFlight: number;
  readonly deadline: Deadline;
  readonly clock: Clock;
  lastStatus: number | undefined;
}

/**
 * One logical call at a time per async context: an inner `withRetries` (or a
 * {@link sendGuard}) sees the outer call and passes each attempt straight through.
 * `AsyncLocalStorage` follows the call through any wrapper between the two, even one that
 * rebuilds `init` and drops members it does not know.
 */
const activeCall = new AsyncLocalStorage<ActiveCall>();

/** A send refused by a guard below the retry loop (another retry layer re-sent the request). */
class GuardRefusal extends Error {
  readonly kind: 'deadline' | 'attempt-cap';
  constructor(kind: 'deadline' | 'attempt-cap', max: number) {
    super(
      kind === 'deadline'
        ? "oncely: not sent: the call's deadline has passed"
        : `oncely: not sent: the call's ${max} requests are spent (another retry layer re-sent it)`,
    );
    this.name = 'GuardRefusal';
    this.kind = kind;
  }
}

/** The attempt timeout this SDK enforced. */
class AttemptTimeoutError extends Error {
  constructor(ms: number) {
    super(`attempt timed out after ${Math.round(ms)} ms`);
    this.name = 'AttemptTimeoutError';
  }
}

function findInChain<T>(error: unknown, test: (e: unknown) => e is T): T | undefined {
  let current: unknown = error;
  for (let depth = 0; depth < 16 && current !== undefined && current !== null; depth++) {
    if (test(current)) return current;
    current = (current as { cause?: unknown }).cause;
  }
  return undefined;
}

const isGuardRefusal = (e: unknown): e is GuardRefusal => e instanceof GuardRefusal;

async function guardedSend(active: ActiveCall, next: FetchLike, input: string | URL | Request, init?: RequestInit): Promise<Response> {
  if (active.deadline.remaining(active.clock.now()) <= 0) throw new GuardRefusal('deadline', active.maxSends);
  if (active.sends >= active.maxSends + active.inFlight) throw new GuardRefusal('attempt-cap', active.maxSends);
  active.sends += 1;
  const response = await next(input, init);
  active.lastStatus = response.status;
  return response;
}

function withoutOncely(init: OncelyRequestInit | undefined): RequestInit | undefined {
  if (init === undefined || !('oncely' in init)) return init;
  const { oncely: _ignored, ...rest } = init;
  return rest;
}

/**
 * The bottom of a stack built by hand: counts the requests of each logical call that really go
 * out and refuses (without sending) any beyond the call's attempt limit or past its deadline.
 * Outside a call of `withRetries` it passes everything through.
 *
 * `withRetries` needs it only under a retry layer that is not ours:
 * `withRetries(otherRetryLayer(sendGuard(fetch)))`. When one attempt of ours turned into
 * several requests, our loop stops with `NESTED_RETRY_LAYER` instead of retrying. (An inner
 * `withRetries` does the same counting by itself.)
 */
export function sendGuard(fetchImpl: FetchLike = (i, n) => globalThis.fetch(i, n)): FetchLike {
  return (input, init) => {
    const active = activeCall.getStore();
    if (active === undefined) return fetchImpl(input, withoutOncely(init));
    return guardedSend(active, fetchImpl, input, withoutOncely(init));
  };
}

/**
 * The attempt's signal: aborts when the caller's signal or the attempt's timeout does.
 *
 * Not `AbortSignal.any`: in Node 20 every signal it makes stays registered on its sources until
 * they abort, so a long-lived caller signal (one shutdown signal for every request) would grow
 * by one entry per attempt. Here the link to the caller's signal is removed when the attempt
 * is over (`unlink`) or when its timeout fires, whichever comes first.
 */
/**
 * The signal of one attempt: aborted by the caller's signal or by the attempt's timeout.
 * `unlink` detaches both; `release` is for an attempt whose response is handed back to the
 * caller: from then on the timeout no longer aborts it (the caller reads the body when it likes,
 * even after the attempt's time is over), while the caller's signal still does until the
 * timeout would have fired, when both are detached.
 */
function linkSignals(
  caller: AbortSignal | undefined,
  timeout: AbortSignal,
): { signal: AbortSignal; unlink: () => void; release: () => void } {
  const controller = new AbortController();
  let released = false;
  const unlink = () => {
    caller?.removeEventListener('abort', onCaller);
    timeout.removeEventListener('abort', onTimeout);
  };
  const onCaller = () => {
    unlink();
    controller.abort(caller?.reason);
  };
  const onTimeout = () => {
    unlink();
    if (!released) controller.abort(timeout.reason);
  };
  if (caller?.aborted) controller.abort(caller.reason);
  else if (timeout.aborted) controller.abort(timeout.reason);
  else {
    caller?.addEventListener('abort', onCaller, { once: true });
    timeout.addEventListener('abort', onTimeout, { once: true });
  }
  return {
    signal: controller.signal,
    unlink,
    release: () => {
      released = true;
    },
  };
}

/** One attempt's result, classified. */
type Attempt =
  | { kind: 'response'; response: Response; verdict: Verdict; hintMs: number | undefined }
  | { kind: 'failed'; error: unknown; verdict: Verdict }
  | { kind: 'stop'; code: OncelyErrorCode; error: unknown }
  | { kind: 'decided'; error: unknown };

/** The caller's signal fired: stop now. */
class Aborted {
  readonly inAttempt: boolean;
  constructor(inAttempt: boolean) {
    this.inAttempt = inAttempt;
  }
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
      const headerKey = headers.get(IDEMPOTENCY_KEY) ?? undefined;
      key = headerKey;
      if (options.idempotencyKey !== undefined) {
        key = options.idempotencyKey;
        if (headerKey !== undefined && headerKey !== options.idempotencyKey) {
          throw giveUp(
            'INVALID_IDEMPOTENCY_KEY',
            'invalid idempotency key, nothing sent: the Idempotency-Key header and oncely.idempotencyKey differ',
          );
        }
      }
      const spaced = [...rawKeyValues(init?.headers), ...(options.idempotencyKey === undefined ? [] : [options.idempotencyKey])].find(hasSurroundingWhitespace);
      if (spaced !== undefined) {
        key = spaced;
        throw giveUp(
          'INVALID_IDEMPOTENCY_KEY',
          'invalid idempotency key, nothing sent: the key has leading or trailing whitespace, which the server drops (RFC 9110 section 5.5), so it would store another key than this one',
        );
      }
      if (key !== undefined) {
        const problem = keyProblem(key);
        if (problem) throw giveUp('INVALID_IDEMPOTENCY_KEY', `invalid idempotency key, nothing sent: ${problem.detail}`);
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
        attempt = await runAttempt(next.input, attemptInit, signal, timeout, callerSignal, limit, facts, classifier, active);
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
      const event: RetryEvent = {
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
      };
      debug(
        'retrying: attempt=%d next_attempt=%d reason=%s error=%s method=%s url=%s wait_ms=%d wait_source=%s backoff_ms=%d retry_after_ms=%s tokens_left=%s cost=%s key=%s',
        event.attempt,
        event.nextAttempt,
        event.reason,
        lastError === undefined ? '-' : String((lastError as { message?: unknown })?.message ?? lastError),
        method,
        url,
        Math.round(plan.waitMs),
        plan.source,
        Math.round(plan.backoffMs),
        plan.hintMs === undefined ? '-' : Math.round(plan.hintMs),
        plan.tokensLeft ?? '-',
        plan.cost ?? '-',
        key ?? '-',
      );
      if (policy.onRetry) {
        try {
          // An async hook is not awaited (it never delays the retry), but its rejection is
          // caught like a throw: a hook's bug never ends the process or the call.
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

  /** Sends one attempt and classifies what came back. Throws {@link Aborted} for the caller's abort. */
  async function runAttempt(
    input: string | URL | Request,
    init: RequestInit,
    signal: AbortSignal,
    timeout: AbortSignal,
    callerSignal: AbortSignal | undefined,
    limit: number,
    facts: RequestFacts,
    classifier: ResponseClassifier | undefined,
    active: ActiveCall,
  ): Promise<Attempt> {
    let response: Response;
    try {
      const sent = activeCall.run(active, () => {
        try {
          return Promise.resolve(fetchImpl(input, init));
        } catch (syncError) {
          return Promise.reject(syncError);
        }
      });
      // A fetch that ignores its signal still ends the attempt at the timeout; its late
      // response's body is cancelled.
      response = await raceSignal(sent, signal, discard);
    } catch (error) {
      if (callerSignal?.aborted) throw new Aborted(true);
      if (isOncelyRetryError(error)) return { kind: 'decided', error };
      const refusal = findInChain(error, isGuardRefusal);
      if (refusal) {
        return { kind: 'stop', code: refusal.kind === 'deadline' ? 'DEADLINE_EXHAUSTED' : 'NESTED_RETRY_LAYER', error };
      }
      if (timeout.aborted) {
        return {
          kind: 'failed',
          error: new AttemptTimeoutError(limit),
          verdict: classifyTransport(facts, 'after-send', 'timeout'),
        };
      }
      const { phase, failure } = transportOf(error);
      return { kind: 'failed', error, verdict: classifyTransport(facts, phase, failure) };
    }
    const status = response.status;
    const hintMs = retryAfterFromHeaders(response.headers, policy.clock.systemNow());
    let problem: Problem | undefined;
    if (status >= 400 && status <= 599 && response.body !== null && isJson(response.headers)) {
      const declared = response.headers.get('content-length');
      const declaredSmall = declared === null || !(Number(declared) > MAX_PROBLEM_BODY);
      if (declaredSmall) {
        // Reading the body is part of the attempt: bounded by what is left of its time.
        const inspected = await readSmallBody(response.body, signal);
        if (callerSignal?.aborted) {
          inspected.reader?.cancel().catch(() => {});
          throw new Aborted(true);
        }
        if (inspected.read === 'complete') {
          problem = parseProblem(new TextDecoder('utf-8', { fatal: false, ignoreBOM: true }).decode(inspected.bytes));
          response = rebuildResponse(response, inspected.bytes);
        } else {
          debug(
            'the error body of a %d response %s after %d bytes; the status decides',
            status,
            inspected.read === 'too-large' ? 'is over 64 KiB' : inspected.read === 'timed-out' ? 'did not arrive in time' : 'broke',
            inspected.bytes.byteLength,
          );
          response = rebuildResponse(response, replayedBody(inspected));
        }
      }
    }
    const verdict = classifyResponse(facts, { status, headers: response.headers, problem }, policy.retry500, classifier);
    return { kind: 'response', response, verdict, hintMs };
  }

  return Object.assign(retrying, {
    policy,
    budget: policy.budget,
    metrics: (): RetryMetrics => Object.freeze({ ...counters, errors: Object.freeze({ ...errorCounts }) }),
  });
}

const BODY_NOT_REPLAYABLE = 'request body is a stream and cannot be resent, so it was sent once and not retried';

function nestedReason(requests: number): string {
  return `another retry layer below this one re-sent the request (${requests} requests in all); two retry layers in one stack are not supported, so this one did not retry`;
}

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

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
import { Aborted, linkSignals, sendAttempt } from './attempt.js';
import { discard, prepareRequest } from './body.js';
import { describeReason } from './classify.js';
import { isOncelyRetryError, OncelyAbortError, OncelyRetryError } from './errors.js';
import { activeCall, guardedSend, nestedReason } from './guard.js';
import { callerKey, IDEMPOTENCY_KEY, keyProblem, needsKey } from './key.js';
import { callOptions, withoutOncely } from './options.js';
import { attemptCount, attemptTimeout, callDeadline, resolvePolicy } from './policy.js';
import { CallState, Deadline } from './schedule.js';
const debug = debuglog('oncely');
function urlOf(input) {
    try {
        const u = new URL(input instanceof Request ? input.url : String(input));
        return `${u.origin}${u.pathname}`;
    }
    catch {
        return '';
    }
}
export function withRetries(first, second) {
    const fetchImpl = typeof first === 'function' ? first : (i, n) => globalThis.fetch(i, n);
    const policy = resolvePolicy(typeof first === 'function' || first === undefined ? second : first);
    const counters = { calls: 0, attempts: 0, retries: 0, retryAfterWaits: 0, keysMinted: 0 };
    const errorCounts = {};
    const retrying = async (input, init) => {
        const outer = activeCall.getStore();
        if (outer !== undefined) {
            // An outer layer of ours runs this call's retry loop: one attempt of it is one pass
            // through here, or the two loops would multiply.
            debug('an outer oncely layer is retrying this call; passing through');
            return guardedSend(outer, fetchImpl, input, withoutOncely(init));
        }
        return runCall(input, init);
    };
    async function runCall(input, init) {
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
        const callerSignal = init?.signal ?? (isRequest ? input.signal : undefined);
        const method = (init?.method ?? (isRequest ? input.method : 'GET')).toUpperCase();
        const url = urlOf(input);
        let key;
        let ambiguous = false;
        const giveUp = (code, reason, extra = {}) => {
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
            debug('giving up: code=%s attempts=%d last_status=%s elapsed_ms=%d tokens_left=%s key=%s: %s', code, call.attempts, extra.lastStatus ?? '-', Math.round(details.elapsedMs), budget ? budget.available : '-', key ?? '-', error.message);
            return error;
        };
        const aborted = (inAttempt) => giveUp('ABORTED', 'the caller aborted the call', {
            cause: callerSignal?.reason,
            outcomeUnknown: inAttempt || ambiguous,
        });
        if (callerSignal?.aborted)
            throw aborted(false);
        // The attempt's header set, the key in it, and how each attempt gets its body.
        let headers;
        let prepared;
        try {
            headers = new Headers(init?.headers ?? (isRequest ? input.headers : undefined));
            const caller = callerKey(headers, init?.headers, options.idempotencyKey);
            key = caller.key;
            if (caller.invalid !== undefined)
                throw giveUp('INVALID_IDEMPOTENCY_KEY', caller.invalid);
            if (key !== undefined) {
                headers.set(IDEMPOTENCY_KEY, key);
            }
            else if (mint && needsKey(method)) {
                // One key per logical call, set before the first attempt: every attempt carries it.
                const minted = policy.makeKey();
                key = minted;
                const problem = keyProblem(minted);
                if (problem)
                    throw giveUp('INVALID_IDEMPOTENCY_KEY', `invalid minted idempotency key, nothing sent: ${problem.detail}`);
                headers.set(IDEMPOTENCY_KEY, minted);
                counters.keysMinted += 1;
            }
            prepared = await prepareRequest(input, init, headers);
        }
        catch (error) {
            if (isOncelyRetryError(error))
                throw error;
            // Invalid headers or a body that cannot be read: a bug in the request, nothing was sent.
            throw giveUp('NOT_RETRYABLE', 'the request cannot be sent, nothing sent (failure is not retryable)', { cause: error });
        }
        const facts = { method, hasKey: key !== undefined };
        const rest = { ...withoutOncely(init) };
        delete rest.headers;
        delete rest.body;
        delete rest.signal;
        const active = { sends: 0, maxSends: maxAttempts, inFlight: 0, deadline: call.deadline, clock, lastStatus: undefined };
        const context = { fetchImpl, policy, facts, classifier, active, callerSignal };
        // The status of the previous attempt's response, if it got one (for an error raised before
        // the next attempt is sent).
        let previousStatus;
        for (;;) {
            const started = clock.now();
            const limit = call.deadline.attemptLimit(started, attemptTimeoutMs);
            if (limit <= 0) {
                throw giveUp('DEADLINE_EXHAUSTED', `overall deadline of ${deadlineMs} ms exhausted`, { lastStatus: previousStatus });
            }
            const next = prepared.next();
            if (next === undefined)
                throw giveUp('BODY_NOT_REPLAYABLE', BODY_NOT_REPLAYABLE);
            const timeout = clock.timeout(limit);
            const { signal, unlink, release } = linkSignals(callerSignal, timeout);
            // A copy per attempt: a layer below that edits the headers it is given (a vendor wrapper
            // setting its own key) cannot change what the next attempt sends.
            const attemptInit = { ...rest, headers: new Headers(headers), signal };
            if (next.body !== undefined)
                attemptInit.body = next.body;
            call.attempts += 1;
            counters.attempts += 1;
            const sendsBefore = active.sends;
            let attempt;
            try {
                attempt = await sendAttempt(context, next.input, attemptInit, signal, timeout, limit);
            }
            catch (e) {
                unlink();
                if (e instanceof Aborted)
                    throw aborted(e.inAttempt);
                throw e;
            }
            // A response handed back is final: the attempt's timeout no longer aborts it, so its body
            // can be read later (it stays linked to the caller's signal until the timeout would have
            // fired); any other outcome is done with the signal now.
            if (attempt.kind === 'response' && attempt.verdict.type !== 'retry')
                release();
            else
                unlink();
            // More requests went out than this attempt: a retry layer below us re-sent it.
            const sent = active.sends - sendsBefore;
            if (!(attempt.kind === 'response' && attempt.verdict.type === 'done') && sent > 1) {
                if (attempt.kind === 'response')
                    discard(attempt.response);
                call.attempts = Math.max(call.attempts, active.sends);
                throw giveUp('NESTED_RETRY_LAYER', nestedReason(active.sends), {
                    lastStatus: active.lastStatus,
                    cause: attempt.kind === 'response' ? undefined : attempt.error,
                });
            }
            let reason;
            let hintMs;
            let lastStatus;
            let lastError;
            switch (attempt.kind) {
                case 'decided':
                    throw attempt.error;
                case 'stop':
                    if (attempt.code === 'NESTED_RETRY_LAYER')
                        call.attempts = Math.max(call.attempts, active.sends);
                    throw giveUp(attempt.code, attempt.code === 'NESTED_RETRY_LAYER' ? nestedReason(active.sends) : `overall deadline of ${deadlineMs} ms exhausted`, { lastStatus: active.lastStatus, cause: attempt.error });
                case 'response': {
                    const { response, verdict } = attempt;
                    if (verdict.type !== 'retry') {
                        if (response.status < 500)
                            budget?.onSuccess(call.lastRetryCost);
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
                        throw giveUp('OUTCOME_UNKNOWN', 'outcome unknown: the request was sent and may have taken effect; it was not retried because it is not safe to repeat without an idempotency key', { cause: error });
                    }
                    if (verdict.type !== 'retry')
                        throw giveUp('NOT_RETRYABLE', 'failure is not retryable', { cause: error });
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
            if (reason.kind === 'in-flight')
                active.inFlight += 1;
            const planned = call.planRetry({ maxAttempts, backoff: policy.backoff }, budget, reason, hintMs, clock.now(), policy.random);
            if ('stop' in planned)
                throw giveUp(planned.stop.code, stopReason(planned.stop), { lastStatus, cause: lastError, ...stopExtra(planned.stop) });
            const plan = planned.plan;
            counters.retries += 1;
            if (plan.source === 'retry-after')
                counters.retryAfterWaits += 1;
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
            }
            catch (sleepError) {
                // The retry was paid for and never made: its tokens go back to the budget.
                if (plan.cost !== undefined)
                    budget?.deposit(plan.cost);
                if (callerSignal?.aborted)
                    throw aborted(false);
                throw sleepError;
            }
            if (callerSignal?.aborted) {
                if (plan.cost !== undefined)
                    budget?.deposit(plan.cost);
                throw aborted(false);
            }
        }
    }
    return Object.assign(retrying, {
        policy,
        budget: policy.budget,
        metrics: () => Object.freeze({ ...counters, errors: Object.freeze({ ...errorCounts }) }),
    });
}
/**
 * Tells the debug log (`NODE_DEBUG=oncely`) and the policy's `onRetry` hook about a planned
 * retry. An async hook is not awaited (it never delays the retry), but its rejection is caught
 * like a throw: a hook's bug never ends the process or the call.
 */
function reportRetry(policy, event) {
    const { error } = event;
    debug('retrying: attempt=%d next_attempt=%d reason=%s error=%s method=%s url=%s wait_ms=%d wait_source=%s backoff_ms=%d retry_after_ms=%s tokens_left=%s cost=%s key=%s', event.attempt, event.nextAttempt, event.reason, error === undefined ? '-' : String(error?.message ?? error), event.method, event.url, Math.round(event.waitMs), event.waitSource, Math.round(event.backoffMs), event.retryAfterMs === undefined ? '-' : Math.round(event.retryAfterMs), event.tokensLeft ?? '-', event.cost ?? '-', event.idempotencyKey ?? '-');
    if (!policy.onRetry)
        return;
    try {
        const returned = policy.onRetry(event);
        if (returned !== null && typeof returned === 'object' && typeof returned.then === 'function') {
            Promise.resolve(returned).catch((hookError) => {
                debug('the onRetry hook rejected; ignored: %s', String(hookError));
            });
        }
    }
    catch (hookError) {
        debug('the onRetry hook threw; ignored: %s', String(hookError));
    }
}
const BODY_NOT_REPLAYABLE = 'request body is a stream and cannot be resent, so it was sent once and not retried';
function stopReason(stop) {
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
function stopExtra(stop) {
    switch (stop.code) {
        case 'RETRY_AFTER_BEYOND_DEADLINE':
            return { retryAfterMs: stop.hintMs, remainingMs: stop.remainingMs };
        case 'BUDGET_EMPTY':
            return { budgetAvailable: stop.available, budgetCost: stop.cost };
        default:
            return {};
    }
}

/**
 * One attempt: its signal (the caller's and the attempt's timeout), the send, and what came
 * back, classified (`classify`) into an {@link Attempt} the retry loop acts on.
 *
 * For an error response (400 to 599) with a JSON body of at most 64 KiB, the attempt reads the
 * body within what is left of its time, for the problem+json `code` and `retryable`, and hands
 * the response back with the same bytes (`body`). The Rust SDK does the same in
 * `crates/oncely-client/src/middleware/call.rs`.
 *
 * @module
 */
import { debuglog } from 'node:util';
import { discard, isJson, MAX_PROBLEM_BODY, raceSignal, readSmallBody, rebuildResponse, replayedBody } from './body.js';
import { classifyResponse, classifyTransport, parseProblem, } from './classify.js';
import { isOncelyRetryError } from './errors.js';
import { activeCall, isGuardRefusal } from './guard.js';
import { retryAfterFromHeaders } from './retry-after.js';
import { transportOf } from './transport.js';
const debug = debuglog('oncely');
/** The caller's signal fired: stop now. */
export class Aborted {
    inAttempt;
    constructor(inAttempt) {
        this.inAttempt = inAttempt;
    }
}
/** The attempt timeout this SDK enforced. */
class AttemptTimeoutError extends Error {
    constructor(ms) {
        super(`attempt timed out after ${Math.round(ms)} ms`);
        this.name = 'AttemptTimeoutError';
    }
}
function findInChain(error, test) {
    let current = error;
    for (let depth = 0; depth < 16 && current !== undefined && current !== null; depth++) {
        if (test(current))
            return current;
        current = current.cause;
    }
    return undefined;
}
/**
 * The signal of one attempt: aborted by the caller's signal or by the attempt's timeout.
 * `unlink` detaches both; `release` is for an attempt whose response is handed back to the
 * caller: from then on the timeout no longer aborts it (the caller reads the body when it likes,
 * even after the attempt's time is over), while the caller's signal still does until the
 * timeout would have fired, when both are detached.
 *
 * Not `AbortSignal.any`: in Node 20 every signal it makes stays registered on its sources until
 * they abort, so a long-lived caller signal (one shutdown signal for every request) would grow
 * by one entry per attempt. Here the link to the caller's signal is removed when the attempt
 * is over (`unlink`) or when its timeout fires, whichever comes first.
 */
export function linkSignals(caller, timeout) {
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
        if (!released)
            controller.abort(timeout.reason);
    };
    if (caller?.aborted)
        controller.abort(caller.reason);
    else if (timeout.aborted)
        controller.abort(timeout.reason);
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
/**
 * Sends one attempt and classifies what came back. `signal` is the attempt's (from
 * {@link linkSignals}), `timeout` its timeout alone, `limit` its time in milliseconds.
 * Throws {@link Aborted} for the caller's abort.
 */
export async function sendAttempt(ctx, input, init, signal, timeout, limit) {
    const { fetchImpl, policy, facts, classifier, active, callerSignal } = ctx;
    let response;
    try {
        const sent = activeCall.run(active, () => {
            try {
                return Promise.resolve(fetchImpl(input, init));
            }
            catch (syncError) {
                return Promise.reject(syncError);
            }
        });
        // A fetch that ignores its signal still ends the attempt at the timeout; its late
        // response's body is cancelled.
        response = await raceSignal(sent, signal, discard);
    }
    catch (error) {
        if (callerSignal?.aborted)
            throw new Aborted(true);
        if (isOncelyRetryError(error))
            return { kind: 'decided', error };
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
    let problem;
    if (status >= 400 && status <= 599 && response.body !== null && isJson(response.headers)) {
        const declared = response.headers.get('content-length');
        const declaredSmall = declared === null || !(Number(declared) > MAX_PROBLEM_BODY);
        if (declaredSmall) {
            // Reading the body is part of the attempt: bounded by what is left of its time.
            const inspected = await readSmallBody(response.body, signal);
            if (callerSignal?.aborted) {
                inspected.reader?.cancel().catch(() => { });
                throw new Aborted(true);
            }
            if (inspected.read === 'complete') {
                problem = parseProblem(new TextDecoder('utf-8', { fatal: false, ignoreBOM: true }).decode(inspected.bytes));
                response = rebuildResponse(response, inspected.bytes);
            }
            else {
                debug('the error body of a %d response %s after %d bytes; the status decides', status, inspected.read === 'too-large' ? 'is over 64 KiB' : inspected.read === 'timed-out' ? 'did not arrive in time' : 'broke', inspected.bytes.byteLength);
                response = rebuildResponse(response, replayedBody(inspected));
            }
        }
    }
    const verdict = classifyResponse(facts, { status, headers: response.headers, problem }, policy.retry500, classifier);
    return { kind: 'response', response, verdict, hintMs };
}

/**
 * Two retry layers in one stack: the outer `withRetries` runs the call, everything of ours below
 * it passes each attempt straight through.
 *
 * The outermost layer puts an {@link ActiveCall} in an `AsyncLocalStorage` for the length of each
 * attempt. An inner `withRetries`, or a {@link sendGuard} at the bottom of a stack built by hand,
 * sees it, counts the requests that really go out, and refuses ({@link GuardRefusal}, without
 * sending) any beyond the call's attempt limit or past its deadline. When one attempt of the
 * outer loop turned into several requests, the loop stops with `NESTED_RETRY_LAYER` instead of
 * retrying. The Rust SDK's `SendGuard` (`crates/oncely-client/src/middleware/guard.rs`) does the
 * same.
 *
 * @module
 */
import { AsyncLocalStorage } from 'node:async_hooks';
import { withoutOncely } from './options.js';
/**
 * One logical call at a time per async context: an inner `withRetries` (or a
 * {@link sendGuard}) sees the outer call and passes each attempt straight through.
 * `AsyncLocalStorage` follows the call through any wrapper between the two, even one that
 * rebuilds `init` and drops members it does not know.
 */
export const activeCall = new AsyncLocalStorage();
/** A send refused by a guard below the retry loop (another retry layer re-sent the request). */
export class GuardRefusal extends Error {
    kind;
    constructor(kind, max) {
        super(kind === 'deadline'
            ? "oncely: not sent: the call's deadline has passed"
            : `oncely: not sent: the call's ${max} requests are spent (another retry layer re-sent it)`);
        this.name = 'GuardRefusal';
        this.kind = kind;
    }
}
/** Whether a value is a {@link GuardRefusal}. */
export const isGuardRefusal = (e) => e instanceof GuardRefusal;
/** Sends one request of the active call below the retry loop, or refuses it. */
export async function guardedSend(active, next, input, init) {
    if (active.deadline.remaining(active.clock.now()) <= 0)
        throw new GuardRefusal('deadline', active.maxSends);
    if (active.sends >= active.maxSends + active.inFlight)
        throw new GuardRefusal('attempt-cap', active.maxSends);
    active.sends += 1;
    const response = await next(input, init);
    active.lastStatus = response.status;
    return response;
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
export function sendGuard(fetchImpl = (i, n) => globalThis.fetch(i, n)) {
    return (input, init) => {
        const active = activeCall.getStore();
        if (active === undefined)
            return fetchImpl(input, withoutOncely(init));
        return guardedSend(active, fetchImpl, input, withoutOncely(init));
    };
}
/** The reason of `NESTED_RETRY_LAYER`: `requests` went out for one attempt's worth. */
export function nestedReason(requests) {
    return `another retry layer below this one re-sent the request (${requests} requests in all); two retry layers in one stack are not supported, so this one did not retry`;
}

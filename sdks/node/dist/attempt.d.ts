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
import { type RequestFacts, type ResponseClassifier, type Verdict } from './classify.js';
import { type OncelyErrorCode } from './errors.js';
import { type ActiveCall } from './guard.js';
import type { FetchLike } from './options.js';
import type { RetryPolicy } from './policy.js';
/** One attempt's result, classified. */
export type Attempt = {
    kind: 'response';
    response: Response;
    verdict: Verdict;
    hintMs: number | undefined;
} | {
    kind: 'failed';
    error: unknown;
    verdict: Verdict;
} | {
    kind: 'stop';
    code: OncelyErrorCode;
    error: unknown;
} | {
    kind: 'decided';
    error: unknown;
};
/** The caller's signal fired: stop now. */
export declare class Aborted {
    readonly inAttempt: boolean;
    constructor(inAttempt: boolean);
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
export declare function linkSignals(caller: AbortSignal | undefined, timeout: AbortSignal): {
    signal: AbortSignal;
    unlink: () => void;
    release: () => void;
};
/** What every attempt of one logical call shares. */
export interface AttemptContext {
    /** The wrapped `fetch`. */
    readonly fetchImpl: FetchLike;
    /** The policy (its clock, `retry500`). */
    readonly policy: RetryPolicy;
    /** The request's method and whether it carries a key. */
    readonly facts: RequestFacts;
    /** The call's response hook, if any. */
    readonly classifier: ResponseClassifier | undefined;
    /** What the layers below see of this call. */
    readonly active: ActiveCall;
    /** The caller's signal, if any. */
    readonly callerSignal: AbortSignal | undefined;
}
/**
 * Sends one attempt and classifies what came back. `signal` is the attempt's (from
 * {@link linkSignals}), `timeout` its timeout alone, `limit` its time in milliseconds.
 * Throws {@link Aborted} for the caller's abort.
 */
export declare function sendAttempt(ctx: AttemptContext, input: string | URL | Request, init: RequestInit, signal: AbortSignal, timeout: AbortSignal, limit: number): Promise<Attempt>;

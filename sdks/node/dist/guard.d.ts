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
import type { Clock } from './clock.js';
import { type FetchLike } from './options.js';
import type { Deadline } from './schedule.js';
/** What the outermost layer shares with everything below it for one logical call. */
export interface ActiveCall {
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
export declare const activeCall: AsyncLocalStorage<ActiveCall>;
/** A send refused by a guard below the retry loop (another retry layer re-sent the request). */
export declare class GuardRefusal extends Error {
    readonly kind: 'deadline' | 'attempt-cap';
    constructor(kind: 'deadline' | 'attempt-cap', max: number);
}
/** Whether a value is a {@link GuardRefusal}. */
export declare const isGuardRefusal: (e: unknown) => e is GuardRefusal;
/** Sends one request of the active call below the retry loop, or refuses it. */
export declare function guardedSend(active: ActiveCall, next: FetchLike, input: string | URL | Request, init?: RequestInit): Promise<Response>;
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
export declare function sendGuard(fetchImpl?: FetchLike): FetchLike;
/** The reason of `NESTED_RETRY_LAYER`: `requests` went out for one attempt's worth. */
export declare function nestedReason(requests: number): string;

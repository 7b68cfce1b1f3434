/**
 * The transport-agnostic core of the retry loop: after a retryable outcome, decide whether to
 * retry and how long to wait, or why to stop. The same checks, in the same order, as the Rust
 * SDK's `CallState::plan_retry`:
 *
 * 1. the attempt limit (`ATTEMPTS_EXHAUSTED`), which counts every attempt except those answered
 *    `409 idempotency_request_in_flight`: the server ran nothing for them, so the call keeps
 *    waiting for the first request's answer until the deadline, each conflict's `Retry-After` a
 *    lower bound on its wait (`docs/DESIGN.md`, "In-use answer treated as failure");
 * 2. the deadline: no time left (`DEADLINE_EXHAUSTED`);
 * 3. the jittered backoff, combined with the server's `Retry-After` as a lower bound:
 *    `wait = max(hint, jittered)` (RFC 9110 section 10.2.3 says how long to wait *at least*, so
 *    `Retry-After: 0` still waits the jittered backoff);
 * 4. a hint that does not fit in the time left ends the call at once, carrying the hint
 *    (`RETRY_AFTER_BEYOND_DEADLINE`); a wait that does not fit ends it with
 *    `DEADLINE_EXHAUSTED`: no sleep ever ends past the deadline;
 * 5. the retry budget pays for the retry, or the call stops (`BUDGET_EMPTY`).
 *
 * @module
 */
import { type RandomSource } from './backoff.js';
import type { RetryBudget } from './budget.js';
import { type RetryReason } from './classify.js';
import type { RetryPolicy } from './policy.js';
/** One logical call's overall deadline, on the monotonic clock (milliseconds). */
export declare class Deadline {
    /** When the call started (monotonic milliseconds). */
    readonly startMs: number;
    /** The whole budget of the call, in milliseconds. */
    readonly totalMs: number;
    /** A deadline `totalMs` after `startMs`. */
    constructor(startMs: number, totalMs: number);
    /** Time spent since the start, as of `nowMs`. */
    elapsed(nowMs: number): number;
    /** Time left as of `nowMs` (0 once the deadline has passed). */
    remaining(nowMs: number): number;
    /** The timeout of an attempt starting at `nowMs`: `min(limitMs, remaining)`. */
    attemptLimit(nowMs: number, limitMs: number): number;
    /** Whether a sleep of `waitMs` starting at `nowMs` ends strictly before the deadline. */
    fits(nowMs: number, waitMs: number): boolean;
}
/** A decided retry. */
export interface RetryPlan {
    /** How long to sleep before the next attempt, in milliseconds. */
    readonly waitMs: number;
    /** What set that length. */
    readonly source: 'backoff' | 'retry-after';
    /** The jittered backoff that was drawn, in milliseconds. */
    readonly backoffMs: number;
    /** The server's `Retry-After`, in milliseconds, if it sent a well-formed one. */
    readonly hintMs: number | undefined;
    /** Tokens left after paying, if a budget is in use. */
    readonly tokensLeft: number | undefined;
    /** Tokens this retry cost, if a budget is in use. */
    readonly cost: number | undefined;
}
/** Why a planned retry was refused. */
export type StopPlan = {
    readonly code: 'ATTEMPTS_EXHAUSTED';
    readonly maxAttempts: number;
} | {
    readonly code: 'DEADLINE_EXHAUSTED';
    readonly deadlineMs: number;
} | {
    readonly code: 'RETRY_AFTER_BEYOND_DEADLINE';
    readonly hintMs: number;
    readonly remainingMs: number;
} | {
    readonly code: 'BUDGET_EMPTY';
    readonly available: number;
    readonly cost: number;
};
/** `max(hint, jittered)`, and which of the two it was; a hint equal to the backoff counts as the backoff. */
export declare function combineWait(hintMs: number | undefined, jitteredMs: number): {
    waitMs: number;
    source: 'backoff' | 'retry-after';
};
/** The state of one logical call. */
export declare class CallState {
    /** The call's deadline. */
    readonly deadline: Deadline;
    /** Attempts made so far. */
    attempts: number;
    /** Attempts answered `409 idempotency_request_in_flight` so far (not counted against the limit). */
    inFlightAnswers: number;
    /** The delay drawn before the previous retry (decorrelated jitter starts from it). */
    previousDelayMs: number | undefined;
    /** What the last retry cost, if the call was retried and a budget is in use. */
    lastRetryCost: number | undefined;
    /** Attempts that count against `maxAttempts`: all but those answered in flight. */
    get countedAttempts(): number;
    /** A call that has made no attempt yet. */
    constructor(deadline: Deadline);
    /**
     * Decides the retry after a retryable outcome observed at `nowMs` (see the module docs for
     * the order of the checks). Returns the plan, or why the call must stop instead.
     */
    planRetry(policy: Pick<RetryPolicy, 'maxAttempts' | 'backoff'>, budget: RetryBudget | null, reason: RetryReason, hintMs: number | undefined, nowMs: number, random: RandomSource): {
        plan: RetryPlan;
    } | {
        stop: StopPlan;
    };
}

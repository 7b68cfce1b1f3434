/**
 * The retry policy: how many attempts, how long in total, how long each, how to back off.
 *
 * These defaults are the contract for callers who never read docs; they are the Rust SDK's
 * (`oncely-client`, `policy.rs`), default for default, and justified there against the
 * published defaults of the AWS SDKs (standard mode), Stripe's SDKs and the Stainless-generated
 * SDKs:
 *
 * | setting | default | option |
 * |---|---|---|
 * | attempts in total (the first included) | 3 | `maxAttempts` |
 * | overall deadline of one logical call | 30 s | `deadlineMs` |
 * | timeout of one attempt (cut to the time left) | 10 s | `attemptTimeoutMs` |
 * | backoff | full jitter, 500 ms base, 8 s cap | `backoff` |
 * | `Retry-After` | a lower bound on the jittered backoff | (always) |
 * | `500` retried | no (yes only when enabled and safe to repeat) | `retry500` |
 * | keys minted for `POST` and `PATCH` | yes, UUID v4, once per call | `mintKeys`, `makeKey` |
 * | retry budget | 500 tokens, 14 per transient retry, 5 per throttle retry, 1 back per first-attempt success | `budget` |
 *
 * @module
 */
import { type Backoff, type RandomSource } from './backoff.js';
import { RetryBudget, type BudgetConfig } from './budget.js';
import type { ResponseClassifier } from './classify.js';
import { type Clock } from './clock.js';
import { type MakeIdempotencyKey } from './key.js';
/** Default total attempts per logical call (the first one included): 3. */
export declare const DEFAULT_MAX_ATTEMPTS = 3;
/** Default overall deadline per logical call: 30 seconds (30000 milliseconds). */
export declare const DEFAULT_DEADLINE_MS = 30000;
/** Default per-attempt timeout: 10 seconds (10000 milliseconds), always cut to the time left. */
export declare const DEFAULT_ATTEMPT_TIMEOUT_MS = 10000;
/** What the `onRetry` hook and the debug log are told about each retry. */
export interface RetryEvent {
    /** The attempt that just failed (1 for the first). */
    readonly attempt: number;
    /** The attempt about to be made after the wait. */
    readonly nextAttempt: number;
    /** Why it is retried, for example `503` or `connection failed before sending`. */
    readonly reason: string;
    /** The machine form of the reason (`'throttled'`, `'server-error'`, `'timed-out'`...). */
    readonly reasonKind: string;
    /** The status of the failed attempt's response, if it got one. */
    readonly status: number | undefined;
    /** The failed attempt's error, if it got no response. */
    readonly error: unknown;
    /** How long the SDK sleeps before the next attempt, in milliseconds. */
    readonly waitMs: number;
    /** What set that length: the jittered backoff, or the server's longer `Retry-After`. */
    readonly waitSource: 'backoff' | 'retry-after';
    /** The jittered backoff that was drawn, in milliseconds. */
    readonly backoffMs: number;
    /** The server's `Retry-After`, in milliseconds, when it sent a well-formed one. */
    readonly retryAfterMs: number | undefined;
    /** Tokens left in the budget after paying for this retry (`undefined` without a budget). */
    readonly tokensLeft: number | undefined;
    /** What this retry cost, in tokens (`undefined` without a budget). */
    readonly cost: number | undefined;
    /** The `Idempotency-Key` every attempt of this call carries, if any. */
    readonly idempotencyKey: string | undefined;
    /** The request method. */
    readonly method: string;
    /** The request URL, without its query string. */
    readonly url: string;
}
/** The options of `withRetries`; every member is optional and defaults as in the module docs. */
export interface RetryPolicyOptions {
    /** Total attempts per logical call, the first included (an integer; 0 counts as 1; 1 disables retries). Default 3. */
    maxAttempts?: number;
    /** The overall deadline of one logical call, all attempts and sleeps included, in milliseconds. Default 30000. */
    deadlineMs?: number;
    /** The timeout of one attempt, in milliseconds; each attempt gets `min(this, time left)`. Default 10000. */
    attemptTimeoutMs?: number;
    /** The backoff: `{ jitter: 'full' | 'decorrelated', baseMs, capMs }`. Default full jitter, 500 ms, 8000 ms. */
    backoff?: Partial<Backoff>;
    /** Whether `500` is retried (only for requests safe to repeat). Default `false`. */
    retry500?: boolean;
    /**
     * Whether a `POST` or `PATCH` without an `Idempotency-Key` gets one minted, once per logical
     * call. Default `true`. Without a key, an ambiguous failure of such a request ends as
     * `OUTCOME_UNKNOWN` instead of a safe retry.
     */
    mintKeys?: boolean;
    /**
     * The retry budget: its numbers (a fresh bucket for this wrapped function), an existing
     * {@link RetryBudget} to share, or `null` to disable it (not recommended). Default
     * `{ capacity: 500, transientCost: 14, throttleCost: 5, successRefund: 1 }`.
     */
    budget?: Partial<BudgetConfig> | RetryBudget | null;
    /**
     * Called before every retry's sleep; an exception it throws, or a rejection of the promise
     * an `async` hook returns (not awaited: it never delays the retry), is logged and ignored.
     */
    onRetry?: (event: RetryEvent) => void | Promise<void>;
    /** An extra retry signal read from error responses (see `classify`). */
    classifier?: ResponseClassifier;
    /** Makes the key of a call that has none (default `crypto.randomUUID()`); checked like a caller's. */
    makeKey?: MakeIdempotencyKey;
    /** The clock (tests, simulations). Default: the system clock. */
    clock?: Clock;
    /** The jitter's random source, a number in `[0, 1)` (default `Math.random`). */
    random?: RandomSource;
}
/** A validated policy, as the retry loop uses it. */
export interface RetryPolicy {
    readonly maxAttempts: number;
    readonly deadlineMs: number;
    readonly attemptTimeoutMs: number;
    readonly backoff: Backoff;
    readonly retry500: boolean;
    readonly mintKeys: boolean;
    readonly budget: RetryBudget | null;
    readonly onRetry: ((event: RetryEvent) => void | Promise<void>) | undefined;
    readonly classifier: ResponseClassifier | undefined;
    readonly makeKey: MakeIdempotencyKey;
    readonly clock: Clock;
    readonly random: RandomSource;
}
/**
 * Checks an attempt timeout, in milliseconds: a duration above 0 (an attempt that may take no
 * time is never sent, so every call would end at once with `DEADLINE_EXHAUSTED`).
 */
export declare function attemptTimeout(name: string, value: unknown, fallback: number): number;
/** Normalises an attempt count: an integer `>= 1` (0 counts as 1, as in the Rust SDK). */
export declare function attemptCount(name: string, value: unknown, fallback: number): number;
/**
 * Checks that `value` is a plain options object whose members are all among `known`: a
 * misspelt option (`maxAtempts`) would otherwise be ignored without a word and its default
 * used. Members whose value is `undefined` count like absent ones only if their name is known.
 *
 * @throws TypeError naming the unknown option, or for a value that is not an object.
 */
export declare function knownOptions(what: string, value: unknown, known: readonly string[]): void;
/**
 * Validates options into a policy.
 *
 * @throws RangeError for a negative, non-finite or too large duration (more than 2^31 - 1
 * milliseconds, the limit of Node's timers), an attempt timeout of 0, a non-integer attempt
 * count, an unknown jitter.
 * @throws TypeError for an unknown option name (`maxAtempts`), or options that are not an object.
 */
export declare function resolvePolicy(options?: RetryPolicyOptions): RetryPolicy;
/** Checks a per-call deadline override, in milliseconds. */
export declare function callDeadline(value: unknown, fallback: number): number;

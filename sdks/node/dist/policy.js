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
import { DEFAULT_BACKOFF } from './backoff.js';
import { DEFAULT_BUDGET, RetryBudget } from './budget.js';
import { MAX_TIMER_MS, systemClock } from './clock.js';
import { uuidV4Key } from './key.js';
/** Default total attempts per logical call (the first one included): 3. */
export const DEFAULT_MAX_ATTEMPTS = 3;
/** Default overall deadline per logical call: 30 seconds (30000 milliseconds). */
export const DEFAULT_DEADLINE_MS = 30_000;
/** Default per-attempt timeout: 10 seconds (10000 milliseconds), always cut to the time left. */
export const DEFAULT_ATTEMPT_TIMEOUT_MS = 10_000;
function duration(name, value, fallback) {
    if (value === undefined)
        return fallback;
    if (typeof value !== 'number' || !Number.isFinite(value) || value < 0 || value > MAX_TIMER_MS) {
        throw new RangeError(`oncely: ${name} must be a number of milliseconds in [0, ${MAX_TIMER_MS}], got ${String(value)}`);
    }
    return value;
}
/**
 * Checks an attempt timeout, in milliseconds: a duration above 0 (an attempt that may take no
 * time is never sent, so every call would end at once with `DEADLINE_EXHAUSTED`).
 */
export function attemptTimeout(name, value, fallback) {
    const ms = duration(name, value, fallback);
    if (ms === 0)
        throw new RangeError(`oncely: ${name} must be more than 0 milliseconds`);
    return ms;
}
/** Normalises an attempt count: an integer `>= 1` (0 counts as 1, as in the Rust SDK). */
export function attemptCount(name, value, fallback) {
    if (value === undefined)
        return fallback;
    if (typeof value !== 'number' || !Number.isInteger(value) || value < 0) {
        throw new RangeError(`oncely: ${name} must be an integer >= 0, got ${String(value)}`);
    }
    return Math.max(1, value);
}
const POLICY_OPTIONS = [
    'maxAttempts', 'deadlineMs', 'attemptTimeoutMs', 'backoff', 'retry500', 'mintKeys', 'budget',
    'onRetry', 'classifier', 'makeKey', 'clock', 'random',
];
const BACKOFF_OPTIONS = ['jitter', 'baseMs', 'capMs'];
const BUDGET_OPTIONS = ['capacity', 'transientCost', 'throttleCost', 'successRefund'];
/**
 * Checks that `value` is a plain options object whose members are all among `known`: a
 * misspelt option (`maxAtempts`) would otherwise be ignored without a word and its default
 * used. Members whose value is `undefined` count like absent ones only if their name is known.
 *
 * @throws TypeError naming the unknown option, or for a value that is not an object.
 */
export function knownOptions(what, value, known) {
    if (value === null || typeof value !== 'object' || Array.isArray(value)) {
        throw new TypeError(`oncely: ${what} must be an object, got ${value === null ? 'null' : Array.isArray(value) ? 'an array' : typeof value}`);
    }
    for (const name of Object.keys(value)) {
        if (!known.includes(name)) {
            throw new TypeError(`oncely: unknown option ${JSON.stringify(name)} in ${what} (known: ${known.join(', ')})`);
        }
    }
}
/**
 * Validates options into a policy.
 *
 * @throws RangeError for a negative, non-finite or too large duration (more than 2^31 - 1
 * milliseconds, the limit of Node's timers), an attempt timeout of 0, a non-integer attempt
 * count, an unknown jitter.
 * @throws TypeError for an unknown option name (`maxAtempts`), or options that are not an object.
 */
export function resolvePolicy(options = {}) {
    knownOptions('the options of withRetries', options, POLICY_OPTIONS);
    if (options.backoff !== undefined)
        knownOptions('backoff', options.backoff, BACKOFF_OPTIONS);
    if (options.budget !== undefined && options.budget !== null && !(options.budget instanceof RetryBudget)) {
        knownOptions('budget', options.budget, BUDGET_OPTIONS);
    }
    const b = { ...DEFAULT_BACKOFF, ...options.backoff };
    if (b.jitter !== 'full' && b.jitter !== 'decorrelated') {
        throw new RangeError(`oncely: backoff.jitter must be 'full' or 'decorrelated', got ${String(b.jitter)}`);
    }
    const backoff = Object.freeze({
        jitter: b.jitter,
        baseMs: duration('backoff.baseMs', b.baseMs, DEFAULT_BACKOFF.baseMs),
        capMs: duration('backoff.capMs', b.capMs, DEFAULT_BACKOFF.capMs),
    });
    let budget;
    if (options.budget === null)
        budget = null;
    else if (options.budget instanceof RetryBudget)
        budget = options.budget;
    else
        budget = new RetryBudget({ ...DEFAULT_BUDGET, ...options.budget });
    return Object.freeze({
        maxAttempts: attemptCount('maxAttempts', options.maxAttempts, DEFAULT_MAX_ATTEMPTS),
        deadlineMs: duration('deadlineMs', options.deadlineMs, DEFAULT_DEADLINE_MS),
        attemptTimeoutMs: attemptTimeout('attemptTimeoutMs', options.attemptTimeoutMs, DEFAULT_ATTEMPT_TIMEOUT_MS),
        backoff,
        retry500: options.retry500 ?? false,
        mintKeys: options.mintKeys ?? true,
        budget,
        onRetry: options.onRetry,
        classifier: options.classifier,
        makeKey: options.makeKey ?? uuidV4Key,
        clock: options.clock ?? systemClock,
        random: options.random ?? Math.random,
    });
}
/** Checks a per-call deadline override, in milliseconds. */
export function callDeadline(value, fallback) {
    return duration('oncely.deadlineMs', value, fallback);
}

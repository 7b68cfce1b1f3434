/**
 * The clock plug point: every "now", every sleep and every attempt timeout of the retry loop
 * goes through it, so tests can use simulated time (a 120-second `Retry-After` checked without
 * waiting 120 seconds).
 *
 * @module
 */
/** Monotonic time, wall-clock time, sleeping and timeouts. All durations in milliseconds. */
export interface Clock {
    /** Monotonic now, in milliseconds (only differences matter), used for the deadline. */
    now(): number;
    /** Wall-clock now, in epoch milliseconds, used to turn a `Retry-After` date into a wait. */
    systemNow(): number;
    /**
     * Sleeps for `ms` milliseconds. Rejects as soon as `signal` aborts (with any error: the
     * retry loop checks the signal itself).
     */
    sleep(ms: number, signal?: AbortSignal): Promise<void>;
    /** A signal that aborts `ms` milliseconds from now: one attempt's timeout. */
    timeout(ms: number): AbortSignal;
}
/** The longest delay Node's timers take, in milliseconds (2^31 - 1, about 24.8 days). */
export declare const MAX_TIMER_MS = 2147483647;
/**
 * The default clock: `performance.now()`, `Date.now()`, `timers/promises.setTimeout` and
 * `AbortSignal.timeout`.
 */
export declare const systemClock: Clock;

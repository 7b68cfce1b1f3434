/**
 * Backoff with jitter: how long to sleep before the next attempt.
 *
 * Two strategies, both from Marc Brooker's AWS Architecture Blog post "Exponential Backoff And
 * Jitter" (2015):
 *
 * - **Full jitter** (the default): `sleep = random(0, min(cap, base * 2^retry))`. In the post's
 *   simulation it does the least total work of every strategy, which is what matters when many
 *   clients contend for one resource.
 * - **Decorrelated jitter**: `sleep = min(cap, random(base, previous * 3))`. It finishes slightly
 *   sooner at the price of a little more work; pick it for latency-bound callers.
 *
 * No un-jittered option is offered: clients that failed together and back off by the same
 * amount fail together again.
 *
 * Guarantee: for every retry number (`Number.MAX_SAFE_INTEGER`, `Infinity` and `NaN` included)
 * and every valid configuration, the delay is within `[0, capMs]`. The exponential ceiling
 * saturates at the cap instead of overflowing, so a high retry number never wraps to zero.
 *
 * @module
 */
/** Which jitter formula a {@link Backoff} uses. */
export type Jitter = 'full' | 'decorrelated';
/** A jittered exponential backoff. All durations in milliseconds. */
export interface Backoff {
    /** The jitter formula. Default `'full'`. */
    readonly jitter: Jitter;
    /** The base delay, in milliseconds. Default 500. */
    readonly baseMs: number;
    /** The cap: no delay is ever longer, in milliseconds. Default 8000. */
    readonly capMs: number;
}
/** Default backoff base delay: 500 milliseconds. */
export declare const DEFAULT_BASE_DELAY_MS = 500;
/** Default backoff cap: 8 seconds (8000 milliseconds). */
export declare const DEFAULT_MAX_DELAY_MS = 8000;
/** The default backoff: full jitter from 500 ms, capped at 8 s. */
export declare const DEFAULT_BACKOFF: Backoff;
/** A random source returning a number in `[0, 1)`, like `Math.random`. */
export type RandomSource = () => number;
/**
 * The un-jittered ceiling `min(cap, base * 2^retry)`, in milliseconds.
 *
 * `retry` counts retries from 0: the sleep before the first retry uses `retry = 0`, so its
 * ceiling is `base`. Saturates at the cap for any high `retry` (`2^1024` is `Infinity` in a
 * double, and `Math.min(cap, Infinity)` is the cap): never `NaN`, never a wrapped zero.
 */
export declare function ceilingMs(backoff: Backoff, retry: number): number;
/**
 * A uniformly random duration in `[low, high]`, in milliseconds; `low` if `high <= low` or
 * the random source misbehaves (returns `NaN` or a value outside `[0, 1)`, which is clamped).
 */
export declare function uniformMs(low: number, high: number, random: RandomSource): number;
/**
 * The jittered delay before retry number `retry` (counted from 0), in milliseconds.
 *
 * `previousMs` is the delay chosen before the previous retry of the same logical call, if any;
 * only decorrelated jitter uses it (it starts from `base`). The result is always within
 * `[0, capMs]`.
 */
export declare function delayMs(backoff: Backoff, retry: number, previousMs: number | undefined, random: RandomSource): number;

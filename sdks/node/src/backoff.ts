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
export const DEFAULT_BASE_DELAY_MS = 500;
/** Default backoff cap: 8 seconds (8000 milliseconds). */
export const DEFAULT_MAX_DELAY_MS = 8_000;

/** The default backoff: full jitter from 500 ms, capped at 8 s. */
export const DEFAULT_BACKOFF: Backoff = Object.freeze({
  jitter: 'full',
  baseMs: DEFAULT_BASE_DELAY_MS,
  capMs: DEFAULT_MAX_DELAY_MS,
});

/** A random source returning a number in `[0, 1)`, like `Math.random`. */
export type RandomSource = () => number;

/** A retry number as an integer `>= 0`: negative, fractional or `NaN` values count as 0. */
function retryIndex(retry: number): number {
  if (!(retry > 0)) return 0;
  return Math.floor(retry);
}

/**
 * The un-jittered ceiling `min(cap, base * 2^retry)`, in milliseconds.
 *
 * `retry` counts retries from 0: the sleep before the first retry uses `retry = 0`, so its
 * ceiling is `base`. Saturates at the cap for any high `retry` (`2^1024` is `Infinity` in a
 * double, and `Math.min(cap, Infinity)` is the cap): never `NaN`, never a wrapped zero.
 */
export function ceilingMs(backoff: Backoff, retry: number): number {
  const { baseMs, capMs } = backoff;
  if (baseMs <= 0 || capMs <= 0) return 0;
  const n = retryIndex(retry);
  const scaled = n >= 1024 ? Infinity : baseMs * 2 ** n;
  return Math.min(capMs, scaled);
}

/**
 * A uniformly random duration in `[low, high]`, in milliseconds; `low` if `high <= low` or
 * the random source misbehaves (returns `NaN` or a value outside `[0, 1)`, which is clamped).
 */
export function uniformMs(low: number, high: number, random: RandomSource): number {
  if (!(high > low)) return low;
  const r = random();
  if (!Number.isFinite(r)) return low;
  const v = low + Math.min(Math.max(r, 0), 1) * (high - low);
  return Math.min(high, Math.max(low, v));
}

/**
 * The jittered delay before retry number `retry` (counted from 0), in milliseconds.
 *
 * `previousMs` is the delay chosen before the previous retry of the same logical call, if any;
 * only decorrelated jitter uses it (it starts from `base`). The result is always within
 * `[0, capMs]`.
 */
export function delayMs(
  backoff: Backoff,
  retry: number,
  previousMs: number | undefined,
  random: RandomSource,
): number {
  if (backoff.jitter === 'decorrelated') {
    const cap = Math.max(0, backoff.capMs);
    const low = Math.min(Math.max(0, backoff.baseMs), cap);
    const previous = previousMs ?? backoff.baseMs;
    const high = Math.max(low, Math.min(cap, previous * 3));
    return Math.min(cap, uniformMs(low, high, random));
  }
  return uniformMs(0, ceilingMs(backoff, retry), random);
}

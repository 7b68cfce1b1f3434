/**
 * The clock plug point: every "now", every sleep and every attempt timeout of the retry loop
 * goes through it, so tests can use simulated time (a 120-second `Retry-After` checked without
 * waiting 120 seconds).
 *
 * @module
 */
import { setTimeout as sleepFor } from 'node:timers/promises';
/** The longest delay Node's timers take, in milliseconds (2^31 - 1, about 24.8 days). */
export const MAX_TIMER_MS = 2_147_483_647;
/** A delay for Node's timers: whole milliseconds in `[0, MAX_TIMER_MS]`. */
function timerMs(ms) {
    if (!(ms > 0))
        return 0;
    return Math.min(MAX_TIMER_MS, Math.ceil(ms));
}
/**
 * The default clock: `performance.now()`, `Date.now()`, `timers/promises.setTimeout` and
 * `AbortSignal.timeout`.
 */
export const systemClock = Object.freeze({
    now: () => performance.now(),
    systemNow: () => Date.now(),
    sleep: async (ms, signal) => {
        await sleepFor(timerMs(ms), undefined, signal ? { signal } : undefined);
    },
    timeout: (ms) => AbortSignal.timeout(timerMs(ms)),
});

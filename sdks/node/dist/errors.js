/**
 * The error a logical call ends with when it does not return a response.
 *
 * One class, {@link OncelyRetryError}, with a machine-readable `code` (the same stop reasons as
 * the Rust SDK's `StopReason`, spelled in `SCREAMING_SNAKE_CASE`), and one subclass,
 * {@link OncelyAbortError}, for the caller's `AbortSignal`. Every error says how many attempts
 * were made, the last status, whether the outcome is unknown, and carries the
 * `Idempotency-Key` every attempt sent: retry the same operation later with that key and the
 * server collapses the repeat.
 *
 * Nothing here promises exactly-once execution: `OUTCOME_UNKNOWN` exists because a request sent
 * once may or may not have run, and only an idempotency key lets a retry find out safely.
 *
 * @module
 */
function render(d) {
    let out = `${d.reason} (after ${d.attempts} attempt${d.attempts === 1 ? '' : 's'} in ${Math.round(d.elapsedMs)} ms`;
    if (d.lastStatus !== undefined)
        out += `; last response ${d.lastStatus}`;
    if (d.idempotencyKey !== undefined)
        out += `; idempotency key ${JSON.stringify(d.idempotencyKey)}`;
    if (d.cause !== undefined) {
        const c = d.cause;
        let text = typeof c?.message === 'string' ? c.message : String(d.cause);
        if (c?.cause && typeof c.cause.code === 'string')
            text += ` (${c.cause.code})`;
        else if (c?.cause && typeof c.cause.message === 'string')
            text += ` (${c.cause.message})`;
        out += `; last error: ${text}`;
    }
    return `${out})`;
}
/**
 * A logical call that ended without a response to return.
 *
 * The message reads like the Rust SDK's: the reason, then the attempts, the time spent, the
 * last status, the key and the last underlying error, for example `all 3 attempts failed (after
 * 3 attempts in 1520 ms; last response 503; idempotency key "order-confirm-42")`.
 */
export class OncelyRetryError extends Error {
    /** Why the call stopped. */
    code;
    /** Attempts made (sent or tried to send), the first included. */
    attempts;
    /** Time from the start of the logical call to the error, in milliseconds. */
    elapsedMs;
    /** The status of the last response, when the last attempt got one. */
    lastStatus;
    /**
     * The `Idempotency-Key` every attempt carried, if any: reuse it to retry the same logical
     * operation later and let the server collapse the repeat.
     */
    idempotencyKey;
    /**
     * Whether the request may have taken effect although no response says so: always for
     * `OUTCOME_UNKNOWN`, and for `ABORTED` when an attempt was in flight.
     */
    outcomeUnknown;
    /** The `Retry-After` hint that did not fit in the deadline, in milliseconds. */
    retryAfterMs;
    /** What was left of the deadline when the hint was refused, in milliseconds. */
    remainingMs;
    /** Tokens left in the budget when a retry was refused (`BUDGET_EMPTY`). */
    budgetAvailable;
    /** What the refused retry would have cost, in tokens (`BUDGET_EMPTY`). */
    budgetCost;
    /** Builds the error; the SDK makes them, callers read them. */
    constructor(details) {
        super(render(details), details.cause === undefined ? undefined : { cause: details.cause });
        this.name = 'OncelyRetryError';
        this.code = details.code;
        this.attempts = details.attempts;
        this.elapsedMs = details.elapsedMs;
        this.lastStatus = details.lastStatus;
        this.idempotencyKey = details.idempotencyKey;
        this.outcomeUnknown = details.outcomeUnknown ?? details.code === 'OUTCOME_UNKNOWN';
        this.retryAfterMs = details.retryAfterMs;
        this.remainingMs = details.remainingMs;
        this.budgetAvailable = details.budgetAvailable;
        this.budgetCost = details.budgetCost;
    }
}
/**
 * The caller's `AbortSignal` stopped the call (code `ABORTED`). Its `name` is `'AbortError'`,
 * as for a plain `fetch` aborted by its signal, so existing `err.name === 'AbortError'` checks
 * keep working; its `cause` is the signal's reason.
 */
export class OncelyAbortError extends OncelyRetryError {
    /** Builds the error. */
    constructor(details) {
        super({ ...details, code: 'ABORTED' });
        this.name = 'AbortError';
    }
}
/** Whether a value is an {@link OncelyRetryError} (of this or another copy of the package). */
export function isOncelyRetryError(error) {
    if (error instanceof OncelyRetryError)
        return true;
    return (typeof error === 'object' &&
        error !== null &&
        typeof error.code === 'string' &&
        typeof error.attempts === 'number' &&
        'outcomeUnknown' in error);
}

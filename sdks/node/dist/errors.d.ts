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
/** Why a logical call stopped without a response to return. */
export type OncelyErrorCode = 
/** The overall deadline ran out (or the next sleep would have ended past it). */
'DEADLINE_EXHAUSTED'
/** Every allowed attempt was made and the last one still failed retryably. */
 | 'ATTEMPTS_EXHAUSTED'
/** The retry budget could not pay for another retry (a fleet-wide outage guard). */
 | 'BUDGET_EMPTY'
/** The failure is not one that retrying can fix (a bug: invalid URL, invalid header...). */
 | 'NOT_RETRYABLE'
/**
 * The request was sent, then the attempt timed out or the connection broke, and repeating it
 * is not safe (no idempotency key, a non-idempotent method): it may or may not have taken
 * effect. Check before trying again, or send it with an idempotency key.
 */
 | 'OUTCOME_UNKNOWN'
/** The server's `Retry-After` asked for a wait that does not fit in the time left. */
 | 'RETRY_AFTER_BEYOND_DEADLINE'
/** The request body is a stream that cannot be sent again, so the one attempt made was all. */
 | 'BODY_NOT_REPLAYABLE'
/** The caller's `Idempotency-Key` breaks the server's rules: nothing was sent. */
 | 'INVALID_IDEMPOTENCY_KEY'
/** Another retry layer below this one re-sent the request; this one did not retry. */
 | 'NESTED_RETRY_LAYER'
/** The caller's `AbortSignal` fired (during an attempt or a sleep). */
 | 'ABORTED';
/** What an {@link OncelyRetryError} carries. All durations in milliseconds. */
export interface OncelyRetryErrorDetails {
    /** Why the call stopped. */
    readonly code: OncelyErrorCode;
    /** The one-line reason (the start of the message). */
    readonly reason: string;
    /** Attempts made (sent or tried to send), the first included. */
    readonly attempts: number;
    /** Time from the start of the logical call to the error, in milliseconds. */
    readonly elapsedMs: number;
    /** The status of the last response, when the last attempt got one. */
    readonly lastStatus?: number | undefined;
    /** The `Idempotency-Key` every attempt carried, if any. */
    readonly idempotencyKey?: string | undefined;
    /** Whether the request may have taken effect although no response says so. */
    readonly outcomeUnknown?: boolean | undefined;
    /** `RETRY_AFTER_BEYOND_DEADLINE`: the server's hint, in milliseconds. */
    readonly retryAfterMs?: number | undefined;
    /** `RETRY_AFTER_BEYOND_DEADLINE`: what was left of the deadline, in milliseconds. */
    readonly remainingMs?: number | undefined;
    /** `BUDGET_EMPTY`: tokens left in the bucket. */
    readonly budgetAvailable?: number | undefined;
    /** `BUDGET_EMPTY`: what the retry would have cost, in tokens. */
    readonly budgetCost?: number | undefined;
    /** The last underlying error (a `fetch` rejection, the signal's reason...). */
    readonly cause?: unknown;
}
/**
 * A logical call that ended without a response to return.
 *
 * The message reads like the Rust SDK's: the reason, then the attempts, the time spent, the
 * last status, the key and the last underlying error, for example `all 3 attempts failed (after
 * 3 attempts in 1520 ms; last response 503; idempotency key "order-confirm-42")`.
 */
export declare class OncelyRetryError extends Error {
    /** Why the call stopped. */
    readonly code: OncelyErrorCode;
    /** Attempts made (sent or tried to send), the first included. */
    readonly attempts: number;
    /** Time from the start of the logical call to the error, in milliseconds. */
    readonly elapsedMs: number;
    /** The status of the last response, when the last attempt got one. */
    readonly lastStatus: number | undefined;
    /**
     * The `Idempotency-Key` every attempt carried, if any: reuse it to retry the same logical
     * operation later and let the server collapse the repeat.
     */
    readonly idempotencyKey: string | undefined;
    /**
     * Whether the request may have taken effect although no response says so: always for
     * `OUTCOME_UNKNOWN`, and for `ABORTED` when an attempt was in flight.
     */
    readonly outcomeUnknown: boolean;
    /** The `Retry-After` hint that did not fit in the deadline, in milliseconds. */
    readonly retryAfterMs: number | undefined;
    /** What was left of the deadline when the hint was refused, in milliseconds. */
    readonly remainingMs: number | undefined;
    /** Tokens left in the budget when a retry was refused (`BUDGET_EMPTY`). */
    readonly budgetAvailable: number | undefined;
    /** What the refused retry would have cost, in tokens (`BUDGET_EMPTY`). */
    readonly budgetCost: number | undefined;
    /** Builds the error; the SDK makes them, callers read them. */
    constructor(details: OncelyRetryErrorDetails);
}
/**
 * The caller's `AbortSignal` stopped the call (code `ABORTED`). Its `name` is `'AbortError'`,
 * as for a plain `fetch` aborted by its signal, so existing `err.name === 'AbortError'` checks
 * keep working; its `cause` is the signal's reason.
 */
export declare class OncelyAbortError extends OncelyRetryError {
    /** Builds the error. */
    constructor(details: Omit<OncelyRetryErrorDetails, 'code'>);
}
/** Whether a value is an {@link OncelyRetryError} (of this or another copy of the package). */
export declare function isOncelyRetryError(error: unknown): error is OncelyRetryError;

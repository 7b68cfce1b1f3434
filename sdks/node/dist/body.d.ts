/**
 * Request bodies that can be resent byte for byte, and response bodies read for a problem.
 *
 * @module
 */
/** Largest problem+json body read to classify a response, in bytes (64 KiB, as in the Rust SDK). */
export declare const MAX_PROBLEM_BODY: number;
/** A request or response body, as `fetch` takes it. */
type Body = RequestInit['body'];
/** One step of a body reader. */
type ReadStep = Awaited<ReturnType<ReadableStreamDefaultReader<Uint8Array>['read']>>;
/** How one attempt's request is made from the caller's `(input, init)`. */
export interface PreparedRequest {
    /** Whether every attempt can carry the same bytes (`false`: a stream, sent once). */
    readonly replayable: boolean;
    /** The input and body of the next attempt, or `undefined` when a one-shot body was spent. */
    next(): {
        input: string | URL | Request;
        body: Body;
    } | undefined;
}
/**
 * Decides how each attempt gets its body:
 *
 * - a string, `ArrayBuffer`, typed array, `DataView`, `Blob` or `URLSearchParams` body is
 *   handed to every attempt as it is (`fetch` reads it without consuming it): the same bytes;
 * - a `FormData` body is encoded once, here, and every attempt sends those bytes with that
 *   `Content-Type`: encoding it per attempt would draw a new multipart boundary each time, a
 *   different body for the server's fingerprint;
 * - a `Request` input with a body is cloned for each attempt (`Request.clone`, which keeps
 *   the bytes in memory as they are sent), so every attempt sends the same bytes;
 * - any other body (a `ReadableStream`, an async iterable) cannot be sent twice: the first
 *   attempt takes it, and the call is not retried (`BODY_NOT_REPLAYABLE`).
 *
 * `headers` is the attempt's header set; a `Content-Type` for an encoded `FormData` is added
 * to it when the caller set none.
 */
export declare function prepareRequest(input: string | URL | Request, init: RequestInit | undefined, headers: Headers): Promise<PreparedRequest>;
/** Whether a response says its body is JSON (any `Content-Type` containing `json`). */
export declare function isJson(headers: Headers): boolean;
/** How reading a body for classification ended. */
export type BodyRead = 'complete' | 'too-large' | 'failed' | 'timed-out';
/** A response body read up to {@link MAX_PROBLEM_BODY} bytes. */
export interface InspectedBody {
    /** How the read ended. */
    readonly read: BodyRead;
    /** The bytes read. */
    readonly bytes: Uint8Array;
    /** The error that broke the body (`'failed'`, `'timed-out'`). */
    readonly error: unknown;
    /** The rest of the body, to hand to the caller after `bytes` (`'too-large'`, `'timed-out'`). */
    readonly reader: ReadableStreamDefaultReader<Uint8Array> | undefined;
    /** A read still under way when the time ran out: its chunk comes before the reader's next. */
    readonly pending: Promise<ReadStep> | undefined;
}
/** Rejects when `signal` aborts, whatever `promise` does (for a fetch that ignores its signal). */
export declare function raceSignal<T>(promise: Promise<T>, signal: AbortSignal, onLate?: (value: T) => void): Promise<T>;
/**
 * Reads a response body up to {@link MAX_PROBLEM_BODY} bytes, until `signal` aborts (the
 * attempt's time). Never throws: a body that breaks, stalls or is too large says so in `read`.
 */
export declare function readSmallBody(body: ReadableStream<Uint8Array>, signal: AbortSignal): Promise<InspectedBody>;
/**
 * A body stream that yields the bytes read, then the rest of the original body (or the error
 * that broke it), so a response handed back after inspection reads as it would have: the same
 * bytes, then the same end.
 */
export declare function replayedBody(inspected: InspectedBody): ReadableStream<Uint8Array>;
/** A response with the same status, headers, URL and the given body. */
export declare function rebuildResponse(original: Response, body: Body): Response;
/** Reads or cancels the body of a response that will not be returned, so its socket is freed. */
export declare function discard(response: Response): void;
export {};

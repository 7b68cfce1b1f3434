/**
 * Outcome classification: is this attempt's outcome retried, returned, or an unknown outcome?
 *
 * The verdict is keyed on three facts, and nothing else:
 *
 * - the **method**: `GET`, `HEAD`, `OPTIONS`, `TRACE`, `PUT` and `DELETE` are idempotent by
 *   RFC 9110 section 9.2.2, so repeating them is safe;
 * - whether the request carries an **`Idempotency-Key`**: with one the server collapses
 *   repeats (IETF HTTPAPI idempotency-key draft), so a `POST` becomes safe to repeat too;
 * - the **phase** of a transport failure: `'before-send'` (the connection was never made, so
 *   the server cannot have seen the request) or `'after-send'` (it may have run).
 *
 * The allowlist (the same table as the Rust SDK's `classify` module):
 *
 * | outcome | verdict |
 * |---|---|
 * | connection failure before sending | retry, any method |
 * | `429 Too Many Requests` | retry (throttle price) |
 * | `408 Request Timeout` | retry: the server did not receive the whole request |
 * | `503 Service Unavailable` | retry: the server did not handle the request |
 * | `502`, `504` | retry when safe to repeat (a gateway may have forwarded the request) |
 * | `409` with problem+json `code: "idempotency_request_in_flight"` | retry (throttle price) |
 * | `500` | retry only if `retry500` is on and the request is safe to repeat |
 * | timeout or reset after sending, safe to repeat | retry |
 * | timeout or reset after sending, not safe to repeat | outcome unknown |
 * | any other response (2xx, 3xx, other 4xx including `422`) | returned as is |
 * | any other failure (a bug: bad URL, invalid header) | not retryable |
 *
 * The server's explicit word comes first, for error responses (status 400 or above), in this
 * order; the first one present decides:
 *
 * 1. the problem+json (RFC 9457) extension `retryable` (`true` / `false`);
 * 2. the `x-should-retry` header (the Stainless-generated SDKs' convention);
 * 3. the `Stripe-Should-Retry` header (Stripe's documented signal);
 * 4. the caller's {@link ResponseClassifier}, if one is set;
 * 5. the allowlist.
 *
 * A header value other than `true` or `false` (ASCII case and surrounding spaces ignored), or a
 * header sent twice, counts as absent. `false` returns the response as is, even a `503`. `true`
 * retries what the allowlist retries, and also a status it would return (a `500`, a `400`) when
 * the request is safe to repeat: it never makes a keyless `POST` that may have run retryable.
 *
 * @module
 */

import type { RetryCost } from './budget.js';
import { isIdempotentMethod } from './key.js';

/** The problem+json `code` of the server's "a request with this key is still running". */
export const IN_FLIGHT_CODE = 'idempotency_request_in_flight';

/** When a transport failure happened. */
export type Phase = 'before-send' | 'after-send';

/** What kind of transport failure an attempt ended with. */
export type TransportFailure = 'connect' | 'timeout' | 'reset' | 'other';

/** The fields of an RFC 9457 problem+json body that classification reads. */
export interface Problem {
  /** The machine-readable `code` extension, such as `idempotency_request_in_flight`. */
  readonly code?: string;
  /** The `retryable` extension: `false` is the server's explicit "do not retry". */
  readonly retryable?: boolean;
}

/**
 * Parses a problem+json body; `undefined` unless it is a JSON object whose `code` (if present)
 * is a string or `null` and whose `retryable` (if present) is a boolean or `null` (the Rust
 * SDK's reading of the same body).
 */
export function parseProblem(text: string): Problem | undefined {
  let value: unknown;
  try {
    value = JSON.parse(text);
  } catch {
    return undefined;
  }
  if (value === null || typeof value !== 'object' || Array.isArray(value)) return undefined;
  const o = value as Record<string, unknown>;
  const code = o['code'];
  const retryable = o['retryable'];
  if (code !== undefined && code !== null && typeof code !== 'string') return undefined;
  if (retryable !== undefined && retryable !== null && typeof retryable !== 'boolean') return undefined;
  const problem: { code?: string; retryable?: boolean } = {};
  if (typeof code === 'string') problem.code = code;
  if (typeof retryable === 'boolean') problem.retryable = retryable;
  return problem;
}

/** Where an explicit "retry" / "do not retry" came from. */
export type Signal = 'problem+json retryable' | 'x-should-retry' | 'Stripe-Should-Retry' | 'classifier';

/** A response, as far as classification cares. */
export interface ResponseFacts {
  /** The status code. */
  readonly status: number;
  /** The headers (for `x-should-retry` and `Stripe-Should-Retry`). */
  readonly headers: Headers;
  /** The problem+json body, when the response had one and it was read in full. */
  readonly problem?: Problem | undefined;
}

/**
 * The caller's hook: an extra "retry" (`true`) / "do not retry" (`false`) signal read from an
 * error response, or `undefined` for no opinion. Read after the server's own signals and
 * before the allowlist, with the same limits: `true` retries only a request safe to repeat.
 */
export type ResponseClassifier = (response: ResponseFacts) => boolean | undefined;

/** The request facts classification depends on. */
export interface RequestFacts {
  /** The request method (any case). */
  readonly method: string;
  /** Whether the request carries an `Idempotency-Key` header. */
  readonly hasKey: boolean;
}

/** Whether repeating the request cannot cause a second side effect. */
export function safeToRepeat(request: RequestFacts): boolean {
  return request.hasKey || isIdempotentMethod(request.method);
}

/** Why an attempt is retried. */
export type RetryReason =
  | { readonly kind: 'connect-failed' }
  | { readonly kind: 'timed-out' }
  | { readonly kind: 'connection-reset' }
  | { readonly kind: 'throttled' }
  | { readonly kind: 'request-timeout' }
  | { readonly kind: 'in-flight' }
  | { readonly kind: 'server-error'; readonly status: number }
  | { readonly kind: 'server-asked'; readonly status: number; readonly signal: Signal };

/**
 * The budget price of retrying for this reason: throttling (`429`, the in-flight conflict)
 * pays the throttle price, everything else the transient price.
 */
export function reasonCost(reason: RetryReason): RetryCost {
  switch (reason.kind) {
    case 'throttled':
    case 'in-flight':
      return 'throttle';
    case 'server-asked':
      return reason.status === 429 ? 'throttle' : 'transient';
    default:
      return 'transient';
  }
}

/** A one-line description of a retry reason, for logs and errors. */
export function describeReason(reason: RetryReason): string {
  switch (reason.kind) {
    case 'connect-failed':
      return 'connection failed before sending';
    case 'timed-out':
      return 'timed out after sending';
    case 'connection-reset':
      return 'connection reset after sending';
    case 'throttled':
      return '429 Too Many Requests';
    case 'request-timeout':
      return '408 Request Timeout';
    case 'in-flight':
      return `409 ${IN_FLIGHT_CODE}`;
    case 'server-error':
      return `${reason.status}`;
    case 'server-asked':
      return `${reason.status} marked retryable by ${reason.signal}`;
  }
}

/** What to do with an attempt's outcome. */
export type Verdict =
  | { readonly type: 'retry'; readonly reason: RetryReason }
  | { readonly type: 'done' }
  | { readonly type: 'not-retryable' }
  | { readonly type: 'outcome-unknown' };

const DONE: Verdict = { type: 'done' };

/**
 * Reads a `true` / `false` header (ASCII case and surrounding spaces ignored); anything else,
 * or a header sent twice (joined by `Headers` into `"true, true"`), counts as absent.
 */
export function boolHeader(headers: Headers, name: string): boolean | undefined {
  const value = headers.get(name);
  if (value === null) return undefined;
  const v = value.trim().toLowerCase();
  if (v === 'true') return true;
  if (v === 'false') return false;
  return undefined;
}

/**
 * The first explicit word present, in the documented order: problem+json `retryable`,
 * `x-should-retry`, `Stripe-Should-Retry`, then the caller's hook.
 */
export function explicitWord(
  response: ResponseFacts,
  classifier?: ResponseClassifier,
): { signal: Signal; retry: boolean } | undefined {
  const fromProblem = response.problem?.retryable;
  if (fromProblem !== undefined) return { signal: 'problem+json retryable', retry: fromProblem };
  const x = boolHeader(response.headers, 'x-should-retry');
  if (x !== undefined) return { signal: 'x-should-retry', retry: x };
  const stripe = boolHeader(response.headers, 'stripe-should-retry');
  if (stripe !== undefined) return { signal: 'Stripe-Should-Retry', retry: stripe };
  if (classifier) {
    const r = classifier(response);
    if (r === true || r === false) return { signal: 'classifier', retry: r };
  }
  return undefined;
}

/** The allowlist alone (no explicit word). */
function allowlist(response: ResponseFacts, safe: boolean, retry500: boolean): Verdict {
  const status = response.status;
  switch (status) {
    case 429:
      return { type: 'retry', reason: { kind: 'throttled' } };
    case 408:
      return { type: 'retry', reason: { kind: 'request-timeout' } };
    case 409:
      return response.problem?.code === IN_FLIGHT_CODE ? { type: 'retry', reason: { kind: 'in-flight' } } : DONE;
    case 503:
      return { type: 'retry', reason: { kind: 'server-error', status } };
    case 502:
    case 504:
      return safe ? { type: 'retry', reason: { kind: 'server-error', status } } : DONE;
    case 500:
      return retry500 && safe ? { type: 'retry', reason: { kind: 'server-error', status } } : DONE;
    default:
      return DONE;
  }
}

/** Classifies a response (see the module docs for the order of the signals). */
export function classifyResponse(
  request: RequestFacts,
  response: ResponseFacts,
  retry500: boolean,
  classifier?: ResponseClassifier,
): Verdict {
  const safe = safeToRepeat(request);
  const allowed = allowlist(response, safe, retry500);
  if (response.status < 400) return allowed;
  const word = explicitWord(response, classifier);
  if (word === undefined) return allowed;
  if (!word.retry) return DONE;
  if (allowed.type === 'retry') return allowed;
  if (safe) return { type: 'retry', reason: { kind: 'server-asked', status: response.status, signal: word.signal } };
  return allowed;
}

/**
 * Classifies an attempt that got no response. A failure before sending is retried whatever
 * the request; a timeout or a reset after sending only when it is safe to repeat, otherwise
 * the outcome is unknown; any other failure is a bug and not retried.
 */
export function classifyTransport(request: RequestFacts, phase: Phase, failure: TransportFailure): Verdict {
  if (failure === 'other') return { type: 'not-retryable' };
  if (phase === 'before-send' || failure === 'connect') return { type: 'retry', reason: { kind: 'connect-failed' } };
  if (safeToRepeat(request)) {
    return { type: 'retry', reason: failure === 'timeout' ? { kind: 'timed-out' } : { kind: 'connection-reset' } };
  }
  return { type: 'outcome-unknown' };
}

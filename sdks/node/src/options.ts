/**
 * What a caller hands to one call: a `fetch`-shaped function to wrap ({@link FetchLike}), and
 * `init.oncely`, the per-call overrides ({@link CallOptions}, as the Rust SDK's `CallOptions`).
 *
 * @module
 */

import type { ResponseClassifier } from './classify.js';
import { knownOptions } from './policy.js';

/** Anything with `fetch`'s signature: the platform `fetch`, or a wrapper around it. */
export type FetchLike = (input: string | URL | Request, init?: RequestInit) => Promise<Response>;

/**
 * Per-call overrides, passed as `init.oncely`:
 *
 * ```js
 * await retrying('https://api.example.com/v1/payments', {
 *   method: 'POST',
 *   body: JSON.stringify({ amount: 1000 }),
 *   oncely: { idempotencyKey: 'order-confirm-42', deadlineMs: 5_000 },
 * });
 * ```
 */
export interface CallOptions {
  /** This call's overall deadline instead of the policy's, in milliseconds. */
  deadlineMs?: number;
  /** This call's total attempts instead of the policy's (1 disables retries for it). */
  maxAttempts?: number;
  /** This call's per-attempt timeout instead of the policy's, in milliseconds (above 0). */
  attemptTimeoutMs?: number;
  /**
   * This call's `Idempotency-Key` (the same as setting the header; an event-derived key such as
   * `order-confirm-${orderId}` is best). Checked with the server's rules before sending.
   */
  idempotencyKey?: string;
  /** Whether this call gets a key minted (a `POST` or `PATCH` without one). Default: the policy's. */
  mintKeys?: boolean;
  /** This call's response hook instead of the policy's. */
  classifier?: ResponseClassifier;
}

const CALL_OPTIONS: readonly (keyof CallOptions)[] = ['deadlineMs', 'maxAttempts', 'attemptTimeoutMs', 'idempotencyKey', 'mintKeys', 'classifier'];

/**
 * Checks `init.oncely`: an object of known {@link CallOptions} members, a string key.
 *
 * @throws TypeError naming an unknown option (`deadlinMs`), for a value that is not an object,
 * or for an `idempotencyKey` that is not a string.
 */
export function callOptions(value: unknown): CallOptions {
  if (value === undefined) return {};
  knownOptions('init.oncely', value, CALL_OPTIONS);
  const options = value as CallOptions;
  if (options.idempotencyKey !== undefined && typeof options.idempotencyKey !== 'string') {
    throw new TypeError(`oncely: init.oncely.idempotencyKey must be a string, got ${typeof options.idempotencyKey}`);
  }
  return options;
}

/** `RequestInit` with this SDK's per-call options. */
export interface OncelyRequestInit extends RequestInit {
  /** Per-call overrides (see {@link CallOptions}). */
  oncely?: CallOptions;
}

/** `init` without its `oncely` member, as the layers below the retry loop get it. */
export function withoutOncely(init: OncelyRequestInit | undefined): RequestInit | undefined {
  if (init === undefined || !('oncely' in init)) return init;
  const { oncely: _ignored, ...rest } = init;
  return rest;
}

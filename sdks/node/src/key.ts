/**
 * Idempotency keys: minted once per logical call, reused on every attempt.
 *
 * The `Idempotency-Key` request header (IETF HTTPAPI draft "The Idempotency-Key HTTP Header
 * Field") lets a server recognise a retried `POST` or `PATCH` and run its side effects once.
 * It only works if every attempt of one logical operation carries **the same** key.
 *
 * Which key to use, best first:
 *
 * 1. **Event-derived**: built from the business event the call performs, such as
 *    `order-confirm-${orderId}`. It survives a process restart, a queue redelivery, a double
 *    click. Recommended.
 * 2. **Request-scoped**: minted once when your own inbound request or job starts and passed
 *    down to this call.
 * 3. **Random, reused**: what the SDK does when you set nothing: a UUID v4
 *    (`crypto.randomUUID()`) minted once per logical call and sent on every attempt of it.
 *
 * Anti-pattern: a fresh key per attempt. The server sees each retry as a new request, and a
 * retried payment is charged twice.
 *
 * Keys follow the server's rules: 1 to 255 visible ASCII characters (`0x21` to `0x7E`), the
 * header sent once; the draft's structured-field string form `"abc"` is accepted, as the
 * server accepts it. A caller's key that breaks them ends the call before anything is sent.
 *
 * @module
 */

import { randomUUID } from 'node:crypto';

/** The header name (lower case, as `Headers` stores names). */
export const IDEMPOTENCY_KEY = 'idempotency-key';

/** The longest key the server accepts, in characters: 255. */
export const MAX_KEY_LENGTH = 255;

/** Why a key is invalid (the server would answer `400 idempotency_key_invalid`). */
export type KeyProblem = 'empty' | 'too-long' | 'not-visible-ascii' | 'bad-quoting';

/** Makes the key of a logical call that has none. Called once per call, never per attempt. */
export type MakeIdempotencyKey = () => string;

/** The default key maker: a random UUID v4 (36 characters), `crypto.randomUUID()`. */
export const uuidV4Key: MakeIdempotencyKey = () => randomUUID();

/** RFC 8941 section 4.2.5: a String is `DQUOTE *( chr / "\" ( DQUOTE / "\" ) ) DQUOTE`. */
function unquote(raw: string): string | undefined {
  if (raw.length < 2 || !raw.endsWith('"')) return undefined;
  const inner = raw.slice(1, -1);
  let out = '';
  for (let i = 0; i < inner.length; i++) {
    const c = inner[i];
    if (c === '\\') {
      const next = inner[i + 1];
      if (next !== '"' && next !== '\\') return undefined;
      out += next;
      i++;
    } else if (c === '"') {
      return undefined;
    } else {
      out += c;
    }
  }
  return out;
}

/**
 * Checks a key by the server's rules and explains what is wrong: `undefined` when it is valid.
 * Surrounding spaces and tabs are not part of a header value (RFC 9110 section 5.5).
 */
export function keyProblem(raw: string): { problem: KeyProblem; detail: string } | undefined {
  let value = raw.replace(/^[ \t]+|[ \t]+$/g, '');
  if (value.startsWith('"')) {
    const unquoted = unquote(value);
    if (unquoted === undefined) return { problem: 'bad-quoting', detail: 'the key is a malformed quoted string' };
    value = unquoted;
  }
  if (value.length === 0) return { problem: 'empty', detail: 'the key is empty' };
  for (let i = 0; i < value.length; i++) {
    const c = value.charCodeAt(i);
    if (c < 0x21 || c > 0x7e) {
      return {
        problem: 'not-visible-ascii',
        detail: `the key has a character that is not visible ASCII at position ${i} (a header sent twice is joined with ", ")`,
      };
    }
  }
  if (value.length > MAX_KEY_LENGTH) {
    return { problem: 'too-long', detail: `the key is ${value.length} characters long; the limit is ${MAX_KEY_LENGTH}` };
  }
  return undefined;
}

/**
 * Whether a caller's key has leading or trailing spaces or tabs. The server drops them (they are
 * not part of a header value, RFC 9110 section 5.5), so it would see another key than the one the
 * caller keeps to retry with later: such a key is refused before sending, in every Oncely SDK.
 */
export function hasSurroundingWhitespace(raw: string): boolean {
  return /^[ \t]|[ \t]$/.test(raw);
}

/**
 * The raw `Idempotency-Key` values of a `HeadersInit` given as a plain object or a list of
 * pairs (a `Headers` object has already dropped surrounding whitespace, as the Fetch standard
 * normalises values).
 */
export function rawKeyValues(init: unknown): string[] {
  if (init === undefined || init === null || typeof init !== 'object' || init instanceof Headers) return [];
  const pairs: unknown[] = Array.isArray(init) ? init : Object.entries(init);
  const values: string[] = [];
  for (const pair of pairs) {
    if (Array.isArray(pair) && pair.length === 2 && String(pair[0]).toLowerCase() === 'idempotency-key') values.push(String(pair[1]));
  }
  return values;
}

/**
 * The caller's key of one call and what is wrong with it: the `Idempotency-Key` of `headers`
 * (the attempt's header set) or `optionKey` (`init.oncely.idempotencyKey`), checked with the
 * server's rules; `rawHeaders` is the caller's `init.headers`, whose raw values still show
 * surrounding whitespace. `invalid` is the reason to refuse the call before anything is sent
 * (`INVALID_IDEMPOTENCY_KEY`), with `key` the key it refuses; `key` is `undefined` when the
 * caller set none.
 */
export function callerKey(
  headers: Headers,
  rawHeaders: unknown,
  optionKey: string | undefined,
): { key: string | undefined; invalid?: string } {
  const headerKey = headers.get(IDEMPOTENCY_KEY) ?? undefined;
  let key = headerKey;
  if (optionKey !== undefined) {
    key = optionKey;
    if (headerKey !== undefined && headerKey !== optionKey) {
      return { key, invalid: 'invalid idempotency key, nothing sent: the Idempotency-Key header and oncely.idempotencyKey differ' };
    }
  }
  const spaced = [...rawKeyValues(rawHeaders), ...(optionKey === undefined ? [] : [optionKey])].find(hasSurroundingWhitespace);
  if (spaced !== undefined) {
    return {
      key: spaced,
      invalid:
        'invalid idempotency key, nothing sent: the key has leading or trailing whitespace, which the server drops (RFC 9110 section 5.5), so it would store another key than this one',
    };
  }
  if (key !== undefined) {
    const problem = keyProblem(key);
    if (problem) return { key, invalid: `invalid idempotency key, nothing sent: ${problem.detail}` };
  }
  return { key };
}

/** Whether a key is a valid `Idempotency-Key` value by the server's rules. */
export function isValidKey(raw: string): boolean {
  return keyProblem(raw) === undefined;
}

/**
 * Whether a method gets a key minted when the caller did not set one: `POST` and `PATCH`, the
 * methods RFC 9110 does not define as idempotent (section 9.2.2). Case-insensitive.
 */
export function needsKey(method: string): boolean {
  const m = method.toUpperCase();
  return m === 'POST' || m === 'PATCH';
}

/**
 * `GET`, `HEAD`, `OPTIONS`, `TRACE`, `PUT`, `DELETE`: idempotent by RFC 9110 section 9.2.2, so
 * repeating them is safe. Case-insensitive.
 */
export function isIdempotentMethod(method: string): boolean {
  switch (method.toUpperCase()) {
    case 'GET':
    case 'HEAD':
    case 'OPTIONS':
    case 'TRACE':
    case 'PUT':
    case 'DELETE':
      return true;
    default:
      return false;
  }
}

/**
 * Parsing the `Retry-After` response header (RFC 9110, section 10.2.3).
 *
 * The header is either `delay-seconds` (a non-negative decimal integer of seconds) or an
 * `HTTP-date`. RFC 9110 section 5.6.7 requires recipients to accept all three date forms:
 *
 * | form | example |
 * |---|---|
 * | IMF-fixdate (preferred) | `Sun, 06 Nov 1994 08:49:37 GMT` |
 * | obsolete RFC 850 | `Sunday, 06-Nov-94 08:49:37 GMT` |
 * | ANSI C `asctime()` | `Sun Nov  6 08:49:37 1994` |
 *
 * A malformed value (a negative number, a fraction, garbage, a date whose weekday or day of the
 * month does not exist) is ignored: the retry then waits the jittered backoff alone. A date in
 * the past is a hint of zero. The rules are those of the Rust SDK (which uses the `httpdate`
 * crate): the same values are accepted and refused. A two-digit RFC 850 year below 70 is
 * 20xx, else 19xx.
 *
 * @module
 */
/** Parses an HTTP-date (any of the three forms) into epoch milliseconds. */
export declare function parseHttpDate(value: string): number | undefined;
/**
 * Parses one `Retry-After` value into a wait in milliseconds, measured from `nowMs` (epoch
 * milliseconds, the wall clock).
 *
 * Returns `undefined` for a malformed or negative value. A `delay-seconds` too large for a
 * double is `Infinity` (it fits no deadline, which is what such a server means). An HTTP-date
 * in the past gives 0.
 */
export declare function parseRetryAfter(value: string, nowMs: number): number | undefined;
/**
 * Reads the `Retry-After` header of a response, if present and well formed, as a wait in
 * milliseconds. A repeated header (which `Headers` joins with `", "`) is malformed and ignored.
 */
export declare function retryAfterFromHeaders(headers: Headers, nowMs: number): number | undefined;

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
const MONTHS = ['Jan', 'Feb', 'Mar', 'Apr', 'May', 'Jun', 'Jul', 'Aug', 'Sep', 'Oct', 'Nov', 'Dec'];
const SHORT_DAYS = ['Sun', 'Mon', 'Tue', 'Wed', 'Thu', 'Fri', 'Sat'];
const LONG_DAYS = ['Sunday', 'Monday', 'Tuesday', 'Wednesday', 'Thursday', 'Friday', 'Saturday'];
const IMF = /^(Mon|Tue|Wed|Thu|Fri|Sat|Sun), (\d\d) (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) (\d{4}) (\d\d):(\d\d):(\d\d) GMT$/;
const RFC850 = /^(Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), (\d\d)-(Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec)-(\d\d) (\d\d):(\d\d):(\d\d) GMT$/;
const ASCTIME = /^(Mon|Tue|Wed|Thu|Fri|Sat|Sun) (Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) ( \d|\d\d) (\d\d):(\d\d):(\d\d) (\d{4})$/;
/** Epoch milliseconds of a calendar date, or `undefined` if it does not exist as written. */
function epochMs(weekday, year, month, day, hour, minute, second) {
    if (year < 1970 || year > 9999 || hour > 23 || minute > 59 || second > 59 || day < 1 || day > 31) {
        return undefined;
    }
    const ms = Date.UTC(year, month, day, hour, minute, second);
    const d = new Date(ms);
    // The 31st of a 30-day month rolls over; a wrong weekday is a different date: both refused.
    if (d.getUTCMonth() !== month || d.getUTCDate() !== day || d.getUTCDay() !== weekday)
        return undefined;
    return ms;
}
/** Parses an HTTP-date (any of the three forms) into epoch milliseconds. */
export function parseHttpDate(value) {
    let m = IMF.exec(value);
    if (m) {
        return epochMs(SHORT_DAYS.indexOf(m[1]), Number(m[4]), MONTHS.indexOf(m[3]), Number(m[2]), Number(m[5]), Number(m[6]), Number(m[7]));
    }
    m = RFC850.exec(value);
    if (m) {
        const yy = Number(m[4]);
        return epochMs(LONG_DAYS.indexOf(m[1]), yy < 70 ? 2000 + yy : 1900 + yy, MONTHS.indexOf(m[3]), Number(m[2]), Number(m[5]), Number(m[6]), Number(m[7]));
    }
    m = ASCTIME.exec(value);
    if (m) {
        return epochMs(SHORT_DAYS.indexOf(m[1]), Number(m[7]), MONTHS.indexOf(m[2]), Number(m[3].trim()), Number(m[4]), Number(m[5]), Number(m[6]));
    }
    return undefined;
}
/**
 * Parses one `Retry-After` value into a wait in milliseconds, measured from `nowMs` (epoch
 * milliseconds, the wall clock).
 *
 * Returns `undefined` for a malformed or negative value. A `delay-seconds` too large for a
 * double is `Infinity` (it fits no deadline, which is what such a server means). An HTTP-date
 * in the past gives 0.
 */
export function parseRetryAfter(value, nowMs) {
    const v = value.trim();
    if (v === '')
        return undefined;
    if (/^[0-9]+$/.test(v))
        return Number(v) * 1000;
    const when = parseHttpDate(v);
    if (when === undefined)
        return undefined;
    return Math.max(0, when - nowMs);
}
/**
 * Reads the `Retry-After` header of a response, if present and well formed, as a wait in
 * milliseconds. A repeated header (which `Headers` joins with `", "`) is malformed and ignored.
 */
export function retryAfterFromHeaders(headers, nowMs) {
    const value = headers.get('retry-after');
    if (value === null)
        return undefined;
    return parseRetryAfter(value, nowMs);
}

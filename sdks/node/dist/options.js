/**
 * What a caller hands to one call: a `fetch`-shaped function to wrap ({@link FetchLike}), and
 * `init.oncely`, the per-call overrides ({@link CallOptions}, as the Rust SDK's `CallOptions`).
 *
 * @module
 */
import { knownOptions } from './policy.js';
const CALL_OPTIONS = ['deadlineMs', 'maxAttempts', 'attemptTimeoutMs', 'idempotencyKey', 'mintKeys', 'classifier'];
/**
 * Checks `init.oncely`: an object of known {@link CallOptions} members, a string key.
 *
 * @throws TypeError naming an unknown option (`deadlinMs`), for a value that is not an object,
 * or for an `idempotencyKey` that is not a string.
 */
export function callOptions(value) {
    if (value === undefined)
        return {};
    knownOptions('init.oncely', value, CALL_OPTIONS);
    const options = value;
    if (options.idempotencyKey !== undefined && typeof options.idempotencyKey !== 'string') {
        throw new TypeError(`oncely: init.oncely.idempotencyKey must be a string, got ${typeof options.idempotencyKey}`);
    }
    return options;
}
/** `init` without its `oncely` member, as the layers below the retry loop get it. */
export function withoutOncely(init) {
    if (init === undefined || !('oncely' in init))
        return init;
    const { oncely: _ignored, ...rest } = init;
    return rest;
}

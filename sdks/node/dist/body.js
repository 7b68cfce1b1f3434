/**
 * Request bodies that can be resent byte for byte, and response bodies read for a problem.
 *
 * @module
 */
/** Largest problem+json body read to classify a response, in bytes (64 KiB, as in the Rust SDK). */
export const MAX_PROBLEM_BODY = 64 * 1024;
function isBufferedBody(body) {
    return (typeof body === 'string' ||
        body instanceof ArrayBuffer ||
        ArrayBuffer.isView(body) ||
        body instanceof Blob ||
        body instanceof URLSearchParams ||
        (typeof SharedArrayBuffer !== 'undefined' && body instanceof SharedArrayBuffer));
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
export async function prepareRequest(input, init, headers) {
    const initBody = init?.body;
    if (initBody !== undefined && initBody !== null) {
        if (isBufferedBody(initBody)) {
            return { replayable: true, next: () => ({ input, body: initBody }) };
        }
        if (initBody instanceof FormData) {
            const encoded = new Request('http://localhost/', { method: 'POST', body: initBody });
            const bytes = new Uint8Array(await encoded.arrayBuffer());
            const type = encoded.headers.get('content-type');
            if (type !== null && !headers.has('content-type'))
                headers.set('content-type', type);
            return { replayable: true, next: () => ({ input, body: bytes }) };
        }
        let spent = false;
        return {
            replayable: false,
            next: () => {
                if (spent)
                    return undefined;
                spent = true;
                return { input, body: initBody };
            },
        };
    }
    if (input instanceof Request && input.body !== null) {
        if (input.bodyUsed)
            throw new TypeError('oncely: the Request body has already been read');
        return { replayable: true, next: () => ({ input: input.clone(), body: undefined }) };
    }
    return { replayable: true, next: () => ({ input, body: undefined }) };
}
/** Whether a response says its body is JSON (any `Content-Type` containing `json`). */
export function isJson(headers) {
    return (headers.get('content-type') ?? '').toLowerCase().includes('json');
}
/** Rejects when `signal` aborts, whatever `promise` does (for a fetch that ignores its signal). */
export function raceSignal(promise, signal, onLate) {
    if (signal.aborted) {
        promise.then(onLate, () => { });
        return Promise.reject(signal.reason);
    }
    return new Promise((resolve, reject) => {
        let settled = false;
        const onAbort = () => {
            if (settled)
                return;
            settled = true;
            reject(signal.reason);
        };
        signal.addEventListener('abort', onAbort, { once: true });
        promise.then((value) => {
            signal.removeEventListener('abort', onAbort);
            if (settled) {
                onLate?.(value);
                return;
            }
            settled = true;
            resolve(value);
        }, (error) => {
            signal.removeEventListener('abort', onAbort);
            if (settled)
                return;
            settled = true;
            reject(error);
        });
    });
}
function concat(chunks, total) {
    const out = new Uint8Array(total);
    let at = 0;
    for (const c of chunks) {
        out.set(c, at);
        at += c.byteLength;
    }
    return out;
}
/**
 * Reads a response body up to {@link MAX_PROBLEM_BODY} bytes, until `signal` aborts (the
 * attempt's time). Never throws: a body that breaks, stalls or is too large says so in `read`.
 */
export async function readSmallBody(body, signal) {
    const reader = body.getReader();
    const chunks = [];
    let total = 0;
    for (;;) {
        const pending = reader.read();
        let step;
        try {
            step = await raceSignal(pending, signal);
        }
        catch (error) {
            const bytes = concat(chunks, total);
            if (signal.aborted) {
                pending.catch(() => { });
                return { read: 'timed-out', bytes, error, reader, pending };
            }
            return { read: 'failed', bytes, error, reader: undefined, pending: undefined };
        }
        if (step.done) {
            return { read: 'complete', bytes: concat(chunks, total), error: undefined, reader: undefined, pending: undefined };
        }
        chunks.push(step.value);
        total += step.value.byteLength;
        if (total > MAX_PROBLEM_BODY) {
            return { read: 'too-large', bytes: concat(chunks, total), error: undefined, reader, pending: undefined };
        }
    }
}
/**
 * A body stream that yields the bytes read, then the rest of the original body (or the error
 * that broke it), so a response handed back after inspection reads as it would have: the same
 * bytes, then the same end.
 */
export function replayedBody(inspected) {
    const { bytes, reader, error } = inspected;
    let pending = inspected.pending;
    let prefixSent = bytes.byteLength === 0;
    return new ReadableStream({
        async pull(controller) {
            if (!prefixSent) {
                prefixSent = true;
                controller.enqueue(bytes);
                return;
            }
            if (reader === undefined) {
                if (error !== undefined)
                    controller.error(error);
                else
                    controller.close();
                return;
            }
            try {
                const read = pending ?? reader.read();
                pending = undefined;
                const step = await read;
                if (step.done)
                    controller.close();
                else
                    controller.enqueue(step.value);
            }
            catch (e) {
                controller.error(e);
            }
        },
        async cancel(reason) {
            await reader?.cancel(reason).catch(() => { });
        },
    });
}
/** A response with the same status, headers, URL and the given body. */
export function rebuildResponse(original, body) {
    const rebuilt = new Response(body, {
        status: original.status,
        statusText: original.statusText,
        headers: original.headers,
    });
    Object.defineProperty(rebuilt, 'url', { value: original.url, enumerable: true });
    Object.defineProperty(rebuilt, 'redirected', { value: original.redirected, enumerable: true });
    return rebuilt;
}
/** Reads or cancels the body of a response that will not be returned, so its socket is freed. */
export function discard(response) {
    if (response.body !== null && !response.bodyUsed) {
        response.body.cancel().catch(() => { });
    }
}

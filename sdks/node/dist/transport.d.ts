/**
 * What a `fetch` rejection means: was the request sent, and what kind of failure was it?
 *
 * Node's `fetch` (undici) rejects a network failure with `TypeError: fetch failed` whose `cause`
 * is the socket's error. Only a failure that provably happened before any byte of the request
 * was written counts as "not sent" (retried for any method):
 *
 * - the connect failed: `ECONNREFUSED`, `EHOSTUNREACH`, `ENETUNREACH`, `EADDRNOTAVAIL`,
 *   `ETIMEDOUT` on `connect`, any error of the `connect` system call;
 * - the name did not resolve: `ENOTFOUND`, `EAI_AGAIN`, any error of `getaddrinfo`;
 * - undici's own connect timeout (`UND_ERR_CONNECT_TIMEOUT`);
 * - a TLS handshake that refused the server's certificate (`ERR_TLS_*`, `CERT_*`...);
 * - undici's `UND_ERR_SOCKET` on a socket that had written nothing (`socket.bytesWritten` 0).
 *
 * Everything else is conservative: a reset (`ECONNRESET`, `EPIPE`, `UND_ERR_SOCKET` "other side
 * closed") may have come after the server read the request, so it is "after send", as is a
 * timeout (undici's `UND_ERR_HEADERS_TIMEOUT`, `UND_ERR_BODY_TIMEOUT`, or this SDK's attempt
 * timeout, which cannot tell a hung connect from a slow answer). A network error with an
 * unknown code is a reset after sending: "may have been sent" is the safe reading. A rejection
 * that is not a network error (an invalid URL or header, a body `fetch` refuses, a blocked
 * port) is a bug and not retried.
 *
 * @module
 */
import type { Phase, TransportFailure } from './classify.js';
/**
 * Classifies a `fetch` rejection that is neither the caller's abort nor this SDK's attempt
 * timeout (the retry loop checks those first).
 */
export declare function transportOf(error: unknown): {
    phase: Phase;
    failure: TransportFailure;
};

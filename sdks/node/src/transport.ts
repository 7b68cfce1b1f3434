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

const CONNECT_CODES = new Set([
  'ECONNREFUSED',
  'EHOSTUNREACH',
  'ENETUNREACH',
  'EHOSTDOWN',
  'ENETDOWN',
  'EADDRNOTAVAIL',
  'ENOTFOUND',
  'EAI_AGAIN',
  'EAI_FAIL',
  'EAI_NONAME',
  'EAI_NODATA',
  'UND_ERR_CONNECT_TIMEOUT',
]);

const TIMEOUT_CODES = new Set(['UND_ERR_HEADERS_TIMEOUT', 'UND_ERR_BODY_TIMEOUT', 'ETIMEDOUT']);

/** undici errors that are bugs in the request, not network conditions. */
const BUG_CODES = new Set([
  'UND_ERR_INVALID_ARG',
  'UND_ERR_INVALID_RETURN_VALUE',
  'UND_ERR_REQ_CONTENT_LENGTH_MISMATCH',
  'UND_ERR_RES_CONTENT_LENGTH_MISMATCH',
  'UND_ERR_NOT_SUPPORTED',
  'ERR_INVALID_ARG_TYPE',
  'ERR_INVALID_ARG_VALUE',
  'ERR_INVALID_URL',
]);

interface Cause {
  code?: unknown;
  syscall?: unknown;
  errors?: unknown;
  socket?: { bytesWritten?: unknown } | undefined;
  cause?: unknown;
  message?: unknown;
}

function isTlsCertificateCode(code: string): boolean {
  return (
    code.startsWith('ERR_TLS_') ||
    code.startsWith('CERT_') ||
    code.startsWith('UNABLE_TO_') ||
    code === 'DEPTH_ZERO_SELF_SIGNED_CERT' ||
    code === 'SELF_SIGNED_CERT_IN_CHAIN' ||
    code === 'ERR_SSL_WRONG_VERSION_NUMBER'
  );
}

/** Classifies one low-level cause. */
function classifyCause(c: Cause): { phase: Phase; failure: TransportFailure } {
  // Happy eyeballs (`autoSelectFamily`) reports every address's failure at once: not sent only
  // if none of them sent anything.
  if (Array.isArray(c.errors) && c.errors.length > 0) {
    const all = c.errors.map((e) => classifyCause((e ?? {}) as Cause));
    if (all.every((r) => r.phase === 'before-send')) return { phase: 'before-send', failure: 'connect' };
  }
  const code = typeof c.code === 'string' ? c.code : undefined;
  const syscall = typeof c.syscall === 'string' ? c.syscall : undefined;
  if (code !== undefined && BUG_CODES.has(code)) return { phase: 'before-send', failure: 'other' };
  if (syscall === 'connect' || syscall === 'getaddrinfo' || (code !== undefined && CONNECT_CODES.has(code))) {
    return { phase: 'before-send', failure: 'connect' };
  }
  if (code !== undefined && isTlsCertificateCode(code)) return { phase: 'before-send', failure: 'connect' };
  if (code === 'UND_ERR_SOCKET' && c.socket && c.socket.bytesWritten === 0) {
    return { phase: 'before-send', failure: 'connect' };
  }
  if (code !== undefined && TIMEOUT_CODES.has(code)) return { phase: 'after-send', failure: 'timeout' };
  return { phase: 'after-send', failure: 'reset' };
}

/**
 * Classifies a `fetch` rejection that is neither the caller's abort nor this SDK's attempt
 * timeout (the retry loop checks those first).
 */
export function transportOf(error: unknown): { phase: Phase; failure: TransportFailure } {
  if (!(error instanceof Error)) return { phase: 'before-send', failure: 'other' };
  const cause = (error as { cause?: unknown }).cause;
  // undici: `TypeError: fetch failed` (the request) or `TypeError: terminated` (the response
  // body), with the socket error as the cause.
  const network = error.name === 'TypeError' && (error.message === 'fetch failed' || error.message === 'terminated');
  if (network && cause !== null && typeof cause === 'object') {
    const c = cause as Cause;
    if (typeof c.code !== 'string' && typeof c.syscall !== 'string' && !Array.isArray(c.errors)) {
      // A cause without a code: undici's own refusals ("bad port", "unknown scheme") are bugs;
      // anything else may have been sent.
      const message = typeof c.message === 'string' ? c.message : '';
      if (/bad port|unknown scheme|invalid|not supported|redirect/i.test(message)) {
        return { phase: 'before-send', failure: 'other' };
      }
      return { phase: 'after-send', failure: 'reset' };
    }
    return classifyCause(c);
  }
  if (network) return { phase: 'after-send', failure: 'reset' };
  // A socket error surfaced directly by a custom fetch (node:http based, say).
  const own = error as Cause;
  if (typeof own.code === 'string' || typeof own.syscall === 'string') {
    const r = classifyCause(own);
    // An unknown code here is not a network error we recognise: a bug.
    if (r.phase === 'after-send' && !(typeof own.code === 'string' && /^E[A-Z]+$|^UND_ERR_/.test(own.code))) {
      return { phase: 'before-send', failure: 'other' };
    }
    return r;
  }
  return { phase: 'before-send', failure: 'other' };
}

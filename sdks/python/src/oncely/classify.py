"""Outcome classification: is an attempt's outcome retried, returned, or an unknown outcome?

The verdict is keyed on three facts, and nothing else:

- the **method**: ``GET``, ``HEAD``, ``OPTIONS``, ``TRACE``, ``PUT`` and ``DELETE`` are
  idempotent by RFC 9110 section 9.2.2, so repeating them is safe;
- whether the request carries an **Idempotency-Key**: with one the server collapses repeats
  (IETF HTTPAPI draft "The Idempotency-Key HTTP Header Field"), so a ``POST`` becomes safe too;
- the **phase** of a transport failure: :data:`BEFORE_SEND` (the connection was never made,
  so the server cannot have seen the request) or :data:`AFTER_SEND` (the request may have
  reached the server and run: the outcome is ambiguous).

The allowlist (the same as the Rust SDK ``oncely-client``):

=========================================================  =====================================
outcome                                                    verdict
=========================================================  =====================================
connection failure before sending                          retry, any method
``429 Too Many Requests``                                  retry (throttle price)
``408 Request Timeout``                                    retry: the server did not get it all
``503 Service Unavailable``                                retry: the server did not handle it
``502``, ``504``                                           retry when safe to repeat
``409`` problem+json ``code: idempotency_request_in_flight`` retry (throttle price)
``500``                                                    retry only if enabled and safe
timeout or reset after sending, safe to repeat             retry
timeout or reset after sending, *not* safe to repeat       :data:`OUTCOME_UNKNOWN`
any problem+json with ``retryable: false``                 returned as is
any other response (2xx, 3xx, other 4xx including 422)     returned as is
any other transport error (a bug: bad URL, protocol)       :data:`NOT_RETRYABLE`
=========================================================  =====================================

The server's explicit word comes first. For an error response (status 400 or above), the first
of these that is present decides:

1. the problem+json (RFC 9457) extension ``retryable`` (``true`` / ``false``), read from a JSON
   body of at most 64 KiB;
2. the ``x-should-retry`` header (the Stainless-generated SDKs' convention);
3. the ``Stripe-Should-Retry`` header (Stripe's documented signal);
4. the caller's classifier, if one is set;
5. the allowlist above.

A header value other than ``true`` or ``false`` (ASCII case and surrounding whitespace ignored),
or the header repeated, counts as absent. ``false`` returns the response as is, even a 503 or a
429. ``true`` retries what the allowlist retries and also a status it would return (a 500, a
400), but only for a request that is safe to repeat: a keyless ``POST`` that may have run is
never repeated. Whatever the word, the attempt limit, the deadline and the budget still bound
the call.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable, Mapping, Optional, Sequence, Union

from .budget import THROTTLE, TRANSIENT

__all__ = [
    "AFTER_SEND",
    "BEFORE_SEND",
    "CONNECT",
    "DONE",
    "IN_FLIGHT_CODE",
    "NOT_RETRYABLE",
    "OTHER",
    "OUTCOME_UNKNOWN",
    "Problem",
    "RESET",
    "ResponseFacts",
    "Retry",
    "RetryReason",
    "TIMEOUT",
    "Verdict",
    "bool_header",
    "classify_response",
    "classify_transport",
    "explicit_word",
    "is_idempotent_method",
]

#: The problem+json ``code`` of the server's "a request with this key is still running".
IN_FLIGHT_CODE = "idempotency_request_in_flight"

#: Phases of a transport failure.
BEFORE_SEND = "before_send"
AFTER_SEND = "after_send"

#: Kinds of transport failure.
CONNECT = "connect"
TIMEOUT = "timeout"
RESET = "reset"
OTHER = "other"

#: Verdicts other than :class:`Retry`: hand the response back as it is.
DONE = "done"
#: A transport error that must not be retried (a bug, not a transient condition).
NOT_RETRYABLE = "not_retryable"
#: The request may or may not have taken effect, and repeating it is not safe.
OUTCOME_UNKNOWN = "outcome_unknown"

_IDEMPOTENT = frozenset({"GET", "HEAD", "OPTIONS", "TRACE", "PUT", "DELETE"})

_REASON_TEXT = {
    "connect_failed": "connection failed before sending",
    "timed_out": "timed out after sending",
    "connection_reset": "connection reset after sending",
    "throttled": "429 Too Many Requests",
    "request_timeout": "408 Request Timeout",
    "in_flight": "409 idempotency_request_in_flight",
}


@dataclass(frozen=True)
class RetryReason:
    """Why an attempt is retried.

    ``kind`` is one of ``connect_failed``, ``timed_out``, ``connection_reset``, ``throttled``
    (429), ``request_timeout`` (408), ``in_flight`` (the 409 conflict), ``server_error`` (a
    retryable 5xx) and ``server_asked`` (a status the allowlist returns, on a request safe to
    repeat, that the server or the caller's classifier marked retryable; ``signal`` names which).
    """

    kind: str
    status: Optional[int] = None
    signal: Optional[str] = None

    @property
    def cost(self) -> str:
        """The budget price: :data:`~oncely.budget.THROTTLE` for a 429 or the in-flight
        conflict, :data:`~oncely.budget.TRANSIENT` for everything else."""
        if self.kind in ("throttled", "in_flight"):
            return THROTTLE
        if self.kind == "server_asked" and self.status == 429:
            return THROTTLE
        return TRANSIENT

    def __str__(self) -> str:
        if self.kind in _REASON_TEXT:
            return _REASON_TEXT[self.kind]
        if self.kind == "server_asked":
            return f"{self.status} marked retryable by {self.signal}"
        return f"{self.status}"


@dataclass(frozen=True)
class Retry:
    """The verdict "retry, if the attempt limit, the deadline and the budget allow it"."""

    reason: RetryReason


#: A verdict: :class:`Retry`, :data:`DONE`, :data:`NOT_RETRYABLE` or :data:`OUTCOME_UNKNOWN`.
Verdict = Union[Retry, str]


@dataclass(frozen=True)
class Problem:
    """The fields of an RFC 9457 problem+json body that classification reads."""

    code: Optional[str] = None
    """The machine-readable ``code`` extension, such as ``idempotency_request_in_flight``."""
    retryable: Optional[bool] = None
    """The ``retryable`` extension: ``False`` is the server's explicit "do not retry"."""

    @classmethod
    def from_json(cls, body: bytes) -> Optional[Problem]:
        """Parses a JSON body; ``None`` if it is not a JSON object, or if ``code`` is present and
        not a string (or null) or ``retryable`` present and not a boolean (or null), as the
        Rust SDK reads it."""
        try:
            value = json.loads(body)
        except (ValueError, UnicodeDecodeError, RecursionError):
            return None
        if not isinstance(value, dict):
            return None
        code = value.get("code")
        retryable = value.get("retryable")
        if code is not None and not isinstance(code, str):
            return None
        if retryable is not None and not isinstance(retryable, bool):
            return None
        return cls(code=code, retryable=retryable)


@dataclass(frozen=True)
class ResponseFacts:
    """A response, as far as classification cares: its status, its header lines (name, value;
    any case) and its problem+json body when it had one and it was read."""

    status: int
    headers: Mapping[str, Sequence[str]]
    """Lower-case header name to every value it was sent with."""
    problem: Optional[Problem] = None

    def header_values(self, name: str) -> Sequence[str]:
        """Every value of a header (``name`` in lower case)."""
        return self.headers.get(name, ())


#: The caller's hook: ``True`` (retry), ``False`` (do not retry) or ``None`` (no opinion), read
#: after the server's own signals and before the allowlist, for error responses only.
Classifier = Callable[[ResponseFacts], Optional[bool]]


def bool_header(values: Sequence[str]) -> Optional[bool]:
    """Reads a ``true`` / ``false`` header (ASCII case and surrounding whitespace ignored);
    anything else, or several values, counts as absent (``None``)."""
    if len(values) != 1:
        return None
    value = values[0].strip().lower()
    if value == "true":
        return True
    if value == "false":
        return False
    return None


def explicit_word(
    response: ResponseFacts, caller: Optional[Classifier] = None
) -> Optional[tuple[str, bool]]:
    """The first explicit word present, in the documented order, as ``(signal, retry?)``:
    problem+json ``retryable``, ``x-should-retry``, ``Stripe-Should-Retry``, then the hook."""
    if response.problem is not None and response.problem.retryable is not None:
        return "problem+json retryable", response.problem.retryable
    word = bool_header(response.header_values("x-should-retry"))
    if word is not None:
        return "x-should-retry", word
    word = bool_header(response.header_values("stripe-should-retry"))
    if word is not None:
        return "Stripe-Should-Retry", word
    if caller is not None:
        hook = caller(response)
        if hook is not None:
            return "the caller's classifier", bool(hook)
    return None


def is_idempotent_method(method: str) -> bool:
    """``GET``, ``HEAD``, ``OPTIONS``, ``TRACE``, ``PUT``, ``DELETE``: idempotent by RFC 9110
    section 9.2.2."""
    return method.upper() in _IDEMPOTENT


def safe_to_repeat(method: str, has_key: bool) -> bool:
    """Whether repeating a request cannot cause a second side effect: an idempotent method or
    an idempotency key."""
    return has_key or is_idempotent_method(method)


def _allowlist(response: ResponseFacts, safe: bool, retry_500: bool) -> Verdict:
    status = response.status
    if status == 429:
        return Retry(RetryReason("throttled", 429))
    if status == 408:
        return Retry(RetryReason("request_timeout", 408))
    if status == 409 and response.problem is not None and response.problem.code == IN_FLIGHT_CODE:
        return Retry(RetryReason("in_flight", 409))
    if status == 503:
        return Retry(RetryReason("server_error", 503))
    if status in (502, 504) and safe:
        return Retry(RetryReason("server_error", status))
    if status == 500 and retry_500 and safe:
        return Retry(RetryReason("server_error", 500))
    return DONE


def classify_response(
    method: str,
    has_key: bool,
    response: ResponseFacts,
    retry_500: bool = False,
    caller: Optional[Classifier] = None,
) -> Verdict:
    """Classifies an attempt that got a response (see the module docs for the order)."""
    safe = safe_to_repeat(method, has_key)
    allowed = _allowlist(response, safe, retry_500)
    if response.status < 400:
        return allowed
    word = explicit_word(response, caller)
    if word is None:
        return allowed
    signal, retry = word
    if not retry:
        return DONE
    if isinstance(allowed, Retry):
        return allowed
    if safe:
        return Retry(RetryReason("server_asked", response.status, signal))
    return allowed


def classify_transport(safe: bool, phase: str, failure: str) -> Verdict:
    """Classifies an attempt that got no response. A failure before sending is retried whatever
    the request; a timeout or a reset after sending only when ``safe``, otherwise the outcome is
    unknown; any other failure is a bug and is not retried."""
    if failure == OTHER:
        return NOT_RETRYABLE
    if phase == BEFORE_SEND or failure == CONNECT:
        return Retry(RetryReason("connect_failed"))
    if failure == TIMEOUT and safe:
        return Retry(RetryReason("timed_out"))
    if failure == RESET and safe:
        return Retry(RetryReason("connection_reset"))
    return OUTCOME_UNKNOWN

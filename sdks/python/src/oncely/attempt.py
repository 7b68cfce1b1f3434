"""One attempt's outcome, classified: the httpx glue around :mod:`oncely.classify`.

An attempt either raised (:func:`classify_error`: our own refusal below the loop, an httpx
transport error, or another layer's error around one), ran past the async transport's own bound
(:func:`attempt_timed_out`), or got a response (:func:`classify_reply`). Each gives an
:class:`Attempt`: the verdict and what the loop needs to act on it. The Rust SDK does the same in
``crates/oncely-client/src/middleware/call.rs``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional

import httpx

from .classify import (
    AFTER_SEND,
    BEFORE_SEND,
    CONNECT,
    NOT_RETRYABLE,
    OTHER,
    RESET,
    TIMEOUT,
    Classifier,
    Problem,
    ResponseFacts,
    Verdict,
    classify_response,
    classify_transport,
)
from .guard import Refused, nested_retry_layer
from .policy import RetryPolicy
from .retry_after import retry_after_from_values
from .schedule import Stop, deadline_exhausted

__all__ = ["Attempt", "attempt_timed_out", "classify_error", "classify_reply"]


@dataclass
class Attempt:
    """One attempt's result, classified: its ``verdict``, the ``response`` it got (if any), the
    server's ``Retry-After`` ``hint`` (seconds), the ``problem`` read from its body, the
    ``error`` it raised, and the ``stop`` that ends the call whatever the verdict."""

    verdict: Verdict
    response: Optional[httpx.Response] = None
    hint: Optional[float] = None
    problem: Optional[Problem] = None
    error: Optional[BaseException] = None
    stop: Optional[Stop] = None


def transport_of(error: BaseException) -> tuple[str, str]:
    """The phase and kind of an httpx transport error."""
    if isinstance(error, (httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout)):
        return BEFORE_SEND, CONNECT
    if isinstance(error, httpx.ProxyError):
        return BEFORE_SEND, CONNECT
    if isinstance(error, httpx.TimeoutException):
        return AFTER_SEND, TIMEOUT
    if isinstance(error, (httpx.NetworkError, httpx.RemoteProtocolError)):
        return AFTER_SEND, RESET
    return BEFORE_SEND, OTHER


def find_in_chain(error: BaseException, kind: type) -> Optional[BaseException]:
    """The first error of type ``kind`` in ``error``'s cause and context chain (32 deep)."""
    seen = 0
    current: Optional[BaseException] = error
    while current is not None and seen < 32:
        if isinstance(current, kind):
            return current
        current = current.__cause__ or current.__context__
        seen += 1
    return None


def _header_map(headers: httpx.Headers) -> Dict[str, List[str]]:
    out: Dict[str, List[str]] = {}
    for name, value in headers.multi_items():
        out.setdefault(name.lower(), []).append(value)
    return out


def classify_error(error: BaseException, safe: bool, policy: RetryPolicy) -> Optional[Attempt]:
    """Classifies an attempt that raised: our refusal, a transport error, or another layer's
    error around one (classified by that root cause). ``safe``: whether the request is safe to
    repeat. ``None`` for an error with no httpx error in its chain: a bug, raised to the caller
    unchanged."""
    refused = find_in_chain(error, Refused)
    if isinstance(refused, Refused):
        if refused.deadline:
            stop = deadline_exhausted(policy.deadline)
        else:
            stop = nested_retry_layer(policy.max_attempts)
        return Attempt(verdict=NOT_RETRYABLE, error=error, stop=stop)
    root = find_in_chain(error, httpx.HTTPError)
    if root is None:
        return None
    phase, kind = transport_of(root)
    return Attempt(verdict=classify_transport(safe, phase, kind), error=error)


def attempt_timed_out(request: httpx.Request, safe: bool, limit: float) -> Attempt:
    """The attempt ran past its limit of ``limit`` seconds (the async transport's own bound)."""
    error = httpx.ReadTimeout(f"attempt timed out after {int(limit * 1000)} ms", request=request)
    return Attempt(verdict=classify_transport(safe, AFTER_SEND, TIMEOUT), error=error)


def classify_reply(
    response: httpx.Response,
    problem: Optional[Problem],
    method: str,
    has_key: bool,
    policy: RetryPolicy,
    classifier: Optional[Classifier],
    wall_now: float,
) -> Attempt:
    """Classifies an attempt that got a response; ``wall_now`` is the wall clock in seconds
    since the epoch (for an HTTP-date ``Retry-After``)."""
    hint = retry_after_from_values(response.headers.get_list("retry-after"), wall_now)
    facts = ResponseFacts(response.status_code, _header_map(response.headers), problem)
    verdict = classify_response(method, has_key, facts, policy.retry_500, classifier)
    return Attempt(verdict=verdict, response=response, hint=hint, problem=problem)

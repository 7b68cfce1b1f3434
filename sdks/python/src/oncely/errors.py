"""The errors a logical call ends with when it does not return a response.

Every error is a :class:`RetryError` (itself an ``httpx.RequestError``, so an existing
``except httpx.RequestError`` still catches it), one subclass per reason the call stopped. Each
says how many attempts were made (:attr:`RetryError.attempts`), the status of the last response
if the last attempt got one (:attr:`RetryError.last_status`), whether the request may have taken
effect although no response says so (:attr:`RetryError.outcome_unknown`), and the
``Idempotency-Key`` every attempt carried (:attr:`RetryError.idempotency_key`): send the same
request later with that key and the server collapses the repeat. The last underlying error
(an ``httpx.TransportError``) is the exception's ``__cause__``.

Nothing here promises exactly-once execution, and no error claims it: :class:`OutcomeUnknown`
exists because a request sent once may or may not have run, and only an idempotency key lets a
retry find out safely.

===========================  =============================  ==========================================
class                        ``reason``                     why
===========================  =============================  ==========================================
:class:`DeadlineExhausted`   ``deadline_exhausted``         the overall deadline ran out (or the next
                                                            sleep would have ended past it)
:class:`RetryAfterBeyondDeadline` ``retry_after_beyond_deadline`` the server's ``Retry-After`` does not fit
                                                            in the time left (a :class:`DeadlineExhausted`)
:class:`AttemptsExhausted`   ``attempts_exhausted``         every attempt was made, the last still
                                                            failed retryably
:class:`BudgetExhausted`     ``budget_empty``               the retry budget could not pay for a retry
:class:`NotRetryable`        ``not_retryable``              a failure retrying cannot fix (a bug)
:class:`OutcomeUnknown`      ``outcome_unknown``            sent, then a timeout or reset, and not safe
                                                            to repeat (no key, not idempotent)
:class:`BodyNotReplayable`   ``body_not_replayable``        a streaming body, sent once, cannot be resent
:class:`InvalidIdempotencyKey` ``invalid_idempotency_key``  the key breaks the server's rules; nothing
                                                            was sent
:class:`NestedRetryLayer`    ``nested_retry_layer``         another retry layer below re-sent the request
===========================  =============================  ==========================================
"""

from __future__ import annotations

from typing import ClassVar, Optional

import httpx

from .classify import Problem

__all__ = [
    "AttemptsExhausted",
    "BodyNotReplayable",
    "BudgetExhausted",
    "DeadlineExhausted",
    "InvalidIdempotencyKey",
    "NestedRetryLayer",
    "NotRetryable",
    "OutcomeUnknown",
    "RetryAfterBeyondDeadline",
    "RetryError",
]


class RetryError(httpx.RequestError):
    """A logical call that ended without a response to return.

    ``str(error)`` is the reason, the attempts, the time spent, the last status and the last
    underlying error, for example ``all 3 attempts failed (after 3 attempts in 1520 ms; last
    response 503)``.
    """

    reason: ClassVar[str] = "retry_error"
    """Why the call stopped, as a machine-readable name (see the module docs)."""

    def __init__(
        self,
        message: str,
        *,
        attempts: int,
        elapsed: float,
        last_status: Optional[int] = None,
        idempotency_key: Optional[str] = None,
        problem: Optional[Problem] = None,
        request: Optional[httpx.Request] = None,
    ) -> None:
        self.detail = message
        """The reason alone, in words."""
        self.attempts = attempts
        """How many attempts were made (sent or tried to send), the first included."""
        self.elapsed = elapsed
        """Seconds from the start of the logical call to the error."""
        self.last_status = last_status
        """The HTTP status of the last response, when the last attempt got one."""
        self.idempotency_key = idempotency_key
        """The ``Idempotency-Key`` every attempt carried, if any: reuse it to retry the same
        logical operation later and let the server collapse the repeat."""
        self.problem = problem
        """The last response's problem+json fields, when it had a small JSON body."""
        super().__init__(self._render(), request=request)

    @property
    def outcome_unknown(self) -> bool:
        """Whether the request may have taken effect although no response says so, and was
        not repeated because repeating it was not safe (:class:`OutcomeUnknown`)."""
        return False

    @property
    def retry_after(self) -> Optional[float]:
        """The ``Retry-After`` hint in seconds that did not fit in the deadline, if that is why
        the call stopped."""
        return None

    def _render(self) -> str:
        out = (
            f"{self.detail} (after {self.attempts} attempt{'' if self.attempts == 1 else 's'}"
            f" in {int(self.elapsed * 1000)} ms"
        )
        if self.last_status is not None:
            out += f"; last response {self.last_status}"
        if self.idempotency_key is not None:
            out += f"; Idempotency-Key {self.idempotency_key}"
        return out + ")"

    def __str__(self) -> str:
        text = self._render()
        cause = self.__cause__
        if cause is not None:
            text = f"{text[:-1]}; last error: {type(cause).__name__}: {cause})"
        return text

    def __repr__(self) -> str:
        return f"{type(self).__name__}({str(self)!r})"


class DeadlineExhausted(RetryError):
    """The overall deadline ran out, or the next sleep would have ended past it."""

    reason = "deadline_exhausted"


class RetryAfterBeyondDeadline(DeadlineExhausted):
    """The server's ``Retry-After`` asked for a wait that does not fit in the time left; the
    call ended at once instead of sleeping. :attr:`retry_after` is the hint in seconds."""

    reason = "retry_after_beyond_deadline"

    def __init__(
        self,
        message: str,
        *,
        hint: float,
        remaining: float,
        attempts: int,
        elapsed: float,
        last_status: Optional[int] = None,
        idempotency_key: Optional[str] = None,
        problem: Optional[Problem] = None,
        request: Optional[httpx.Request] = None,
    ) -> None:
        self.hint = hint
        """The server's hint, in seconds."""
        self.remaining = remaining
        """What was left of the deadline, in seconds."""
        super().__init__(
            message,
            attempts=attempts,
            elapsed=elapsed,
            last_status=last_status,
            idempotency_key=idempotency_key,
            problem=problem,
            request=request,
        )

    @property
    def retry_after(self) -> Optional[float]:
        return self.hint


class AttemptsExhausted(RetryError):
    """Every allowed attempt was made and the last one still failed retryably (its status is
    :attr:`last_status`; its body was closed)."""

    reason = "attempts_exhausted"


class BudgetExhausted(RetryError):
    """The transport's retry budget could not pay for another retry (a fleet-wide outage
    guard: see :mod:`oncely.budget`)."""

    reason = "budget_empty"


class NotRetryable(RetryError):
    """A failure that retrying cannot fix (a bug: an invalid URL, a protocol error)."""

    reason = "not_retryable"


class OutcomeUnknown(RetryError):
    """The request was sent, then the attempt timed out or the connection broke, and repeating
    it is not safe (no idempotency key, a method that is not idempotent): it may or may not
    have taken effect. Check before trying again, or send it with an idempotency key."""

    reason = "outcome_unknown"

    @property
    def outcome_unknown(self) -> bool:
        return True


class BodyNotReplayable(RetryError):
    """The request body is a stream that cannot be sent again, so the one attempt made was
    all. Pass ``content=bytes`` (or call ``request.read()`` before sending) to make it
    replayable."""

    reason = "body_not_replayable"


class InvalidIdempotencyKey(RetryError):
    """The caller's ``Idempotency-Key`` (or one a custom key maker minted) breaks the server's
    rules: 1 to 255 visible ASCII characters, sent once. Nothing was sent: a server that treats
    an invalid key as absent would run a retried request twice."""

    reason = "invalid_idempotency_key"


class NestedRetryLayer(RetryError):
    """Another retry layer below this one re-sent the request (as counted by an inner
    :class:`~oncely.RetryTransport`, which passes through and counts what goes out). Two retry
    layers in one stack multiply attempts: this one stopped instead."""

    reason = "nested_retry_layer"

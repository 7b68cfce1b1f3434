"""One logical call, everything but the I/O: its key, its attempts' limits, what follows each
attempt, and how it ends. The sync and async transports (:mod:`oncely.transport`) run the loop
and do the sending and the sleeping.

:class:`Driver` is what one transport shares between its calls (policy, budget, clock, random
source, key maker, classifier, counters); :class:`Call` is one ``client.send``. The Rust SDK
splits them the same way (``crates/oncely-client/src/driver.rs``, ``middleware/call.rs``).
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Callable, Dict, List, Mapping, Optional, Type, Union

import httpx

from . import errors
from .attempt import Attempt, attempt_timed_out, classify_error, classify_reply
from .budget import RetryBudget
from .classify import DONE, OUTCOME_UNKNOWN, Classifier, Problem, Retry, safe_to_repeat
from .clock import Clock, SystemClock
from .guard import ACTIVE_EXTENSION, ActiveCall, nested_retry_layer
from .key import (
    IDEMPOTENCY_KEY,
    KeyRuleError,
    check_key,
    has_surrounding_whitespace,
    needs_key,
    parse_key,
    uuid4_key,
)
from .metrics import RetryMetrics
from .policy import EXTENSION, CallOptions, RetryPolicy
from .schedule import RETRY_AFTER, CallState, RetryPlan, Stop, deadline_exhausted
from .timeouts import attempt_timeouts, caller_timeouts

__all__ = ["FROM_POLICY", "Call", "Driver", "FromPolicy", "Step"]

logger = logging.getLogger("oncely")

_KEY_HEADER = IDEMPOTENCY_KEY.lower().encode("ascii")

_ERRORS: Dict[str, Type[errors.RetryError]] = {
    "deadline_exhausted": errors.DeadlineExhausted,
    "attempts_exhausted": errors.AttemptsExhausted,
    "budget_empty": errors.BudgetExhausted,
    "not_retryable": errors.NotRetryable,
    "outcome_unknown": errors.OutcomeUnknown,
    "body_not_replayable": errors.BodyNotReplayable,
    "invalid_idempotency_key": errors.InvalidIdempotencyKey,
    "nested_retry_layer": errors.NestedRetryLayer,
}

_OUTCOME_UNKNOWN_TEXT = (
    "outcome unknown: the request was sent and may have taken effect; it was not retried "
    "because it is not safe to repeat without an idempotency key"
)
_NOT_RETRYABLE_TEXT = "failure is not retryable"
_NOT_REPLAYABLE_TEXT = (
    "request body is a stream and cannot be resent, so it was sent once and not retried"
)


class FromPolicy:
    """The "take it from the policy" marker of ``budget=``."""


#: The default of the transports' ``budget=``: a new budget from ``policy.budget``.
FROM_POLICY = FromPolicy()


@dataclass
class Step:
    """What the loop does next: return ``response``, or close ``close`` and then raise
    ``error``, or close ``close`` and sleep ``plan``."""

    response: Optional[httpx.Response] = None
    close: Optional[httpx.Response] = None
    error: Optional[errors.RetryError] = None
    cause: Optional[BaseException] = None
    plan: Optional[RetryPlan] = None


class Driver:
    """The shared state of one transport: policy, budget, clock, random source, key maker,
    classifier and counters."""

    def __init__(
        self,
        policy: Optional[RetryPolicy],
        budget: Union[RetryBudget, None, FromPolicy],
        clock: Optional[Clock],
        rng_seed: Optional[int],
        key_maker: Optional[Callable[[], str]],
        classifier: Optional[Classifier],
    ) -> None:
        self.policy = policy if policy is not None else RetryPolicy()
        if isinstance(budget, FromPolicy):
            config = self.policy.budget
            self.budget: Optional[RetryBudget] = None if config is None else RetryBudget(config)
        else:
            self.budget = budget
        self.clock: Clock = clock if clock is not None else SystemClock()
        self.rng = random.Random(rng_seed)
        self.key_maker = key_maker if key_maker is not None else uuid4_key
        self.classifier = classifier
        self.metrics = RetryMetrics()


class Call:
    """One logical call: everything but the I/O, which the sync and async loops do."""

    def __init__(self, driver: Driver, request: httpx.Request) -> None:
        self.driver = driver
        self.request = request
        self.options = CallOptions.from_extension(request.extensions.get(EXTENSION))
        self.policy = self.options.apply(driver.policy)
        self.state = CallState(driver.clock.monotonic(), self.policy.deadline)
        driver.metrics.bump("calls")
        self.method = request.method.upper()
        self.path = request.url.path
        self.key: Optional[str] = None
        self.original_timeout = request.extensions.get("timeout")
        self.base_timeout: Mapping[str, object] = caller_timeouts(self.original_timeout)
        self.attempt_timeouts: Dict[str, Optional[float]] = {}
        self.active = ActiveCall(
            self.policy.max_attempts, self.state.start + self.policy.deadline, driver.clock
        )
        self._set_key()
        self.has_key = self.key is not None
        self.safe = safe_to_repeat(self.method, self.has_key)
        self.replayable = isinstance(request.stream, httpx.ByteStream)

    # -- keys -------------------------------------------------------------------------------

    def _raw_keys(self) -> List[bytes]:
        return [v for k, v in self.request.headers.raw if k.lower() == _KEY_HEADER]

    def _set_key(self) -> None:
        """Checks the caller's key (the header, or ``CallOptions.idempotency_key``) with the
        server's rules, or mints one for a ``POST`` or ``PATCH`` without one, and sets it on the
        request. Raises :class:`~oncely.InvalidIdempotencyKey` before anything is sent."""
        wanted = self.options.idempotency_key
        raw = self._raw_keys()
        given = raw + ([] if wanted is None else [wanted.encode("utf-8")])
        spaced = next((v for v in given if has_surrounding_whitespace(v)), None)
        if spaced is not None:
            raise self.give_up(
                Stop(
                    "invalid_idempotency_key",
                    "invalid idempotency key, nothing sent: the key has leading or trailing "
                    "whitespace, which the server drops (RFC 9110 section 5.5), so it would store "
                    "another key than this one",
                ),
                key=spaced.decode("latin-1"),
            )
        if wanted is not None:
            try:
                parse_key(wanted.encode("utf-8"))
            except KeyRuleError as e:
                raise self.give_up(
                    Stop("invalid_idempotency_key", f"invalid idempotency key, nothing sent: {e}"),
                    key=wanted,
                ) from None
            if raw and raw != [wanted.encode("utf-8")]:
                raise self.give_up(
                    Stop(
                        "invalid_idempotency_key",
                        "invalid idempotency key, nothing sent: the request has an "
                        "Idempotency-Key header and the call options another",
                    ),
                    key=wanted,
                )
            if not raw:
                self.request.headers[IDEMPOTENCY_KEY] = wanted
                raw = self._raw_keys()
        if raw:
            try:
                check_key(raw)
            except KeyRuleError as e:
                raise self.give_up(
                    Stop("invalid_idempotency_key", f"invalid idempotency key, nothing sent: {e}"),
                    key=raw[0].decode("latin-1"),
                ) from None
            self.key = raw[0].decode("ascii")
            return
        if self.policy.mint_keys and needs_key(self.method):
            minted = self.driver.key_maker()
            try:
                parse_key(minted.encode("utf-8"))
            except (KeyRuleError, AttributeError) as e:
                raise self.give_up(
                    Stop("invalid_idempotency_key", f"invalid idempotency key, nothing sent: {e}"),
                    key=str(minted),
                ) from None
            self.request.headers[IDEMPOTENCY_KEY] = minted
            self.key = minted
            self.driver.metrics.bump("keys_minted")

    # -- giving up --------------------------------------------------------------------------

    def give_up(
        self,
        stop: Stop,
        last_status: Optional[int] = None,
        problem: Optional[Problem] = None,
        cause: Optional[BaseException] = None,
        key: Optional[str] = None,
    ) -> errors.RetryError:
        """Ends the call: counts it, logs it at ``WARNING`` and builds the error."""
        elapsed = self.state.elapsed(self.driver.clock.monotonic())
        key = key if key is not None else self.key
        self.driver.metrics.gave_up_for(stop.kind)
        budget = self.driver.budget
        logger.warning(
            "oncely: giving up on %s %s: %s (attempts %d, last status %s, %d ms, "
            "Idempotency-Key %s)",
            self.method,
            self.path,
            stop.message,
            self.state.attempts,
            last_status,
            int(elapsed * 1000),
            key,
            extra={
                "oncely_reason": stop.kind,
                "oncely_attempts": self.state.attempts,
                "oncely_last_status": last_status,
                "oncely_elapsed": elapsed,
                "oncely_tokens_left": None if budget is None else budget.available,
                "oncely_idempotency_key": key,
                "oncely_error": None if cause is None else repr(cause),
            },
        )
        err: errors.RetryError
        if stop.kind == "retry_after_beyond_deadline":
            err = errors.RetryAfterBeyondDeadline(
                stop.message,
                hint=stop.fields["hint"],
                remaining=stop.fields["remaining"],
                attempts=self.state.attempts,
                elapsed=elapsed,
                last_status=last_status,
                idempotency_key=key,
                problem=problem,
                request=self.request,
            )
        else:
            err = _ERRORS[stop.kind](
                stop.message,
                attempts=self.state.attempts,
                elapsed=elapsed,
                last_status=last_status,
                idempotency_key=key,
                problem=problem,
                request=self.request,
            )
        if cause is not None:
            err.__cause__ = cause
        return err

    # -- one attempt ------------------------------------------------------------------------

    def begin_attempt(self) -> float:
        """Starts an attempt: its time limit in seconds, with the request's timeouts cut to
        it. Raises the deadline error when no time is left."""
        now = self.driver.clock.monotonic()
        limit = self.state.attempt_limit(now, self.policy.attempt_timeout)
        if limit <= 0:
            raise self.give_up(deadline_exhausted(self.policy.deadline))
        connect = min(limit, self.policy.effective_connect_timeout)
        self.attempt_timeouts = attempt_timeouts(self.base_timeout, limit, connect)
        self.request.extensions["timeout"] = dict(self.attempt_timeouts)
        self.state.record_attempt()
        self.driver.metrics.bump("attempts")
        return limit

    def failed(self, error: BaseException) -> Optional[Attempt]:
        """Classifies an attempt that raised (:func:`oncely.attempt.classify_error`); ``None``
        for a bug, raised to the caller unchanged."""
        return classify_error(error, self.safe, self.policy)

    def timed_out(self, limit: float) -> Attempt:
        """The attempt ran past its limit of ``limit`` seconds (the async transport's bound)."""
        return attempt_timed_out(self.request, self.safe, limit)

    def responded(self, response: httpx.Response, problem: Optional[Problem]) -> Attempt:
        """Classifies an attempt that got a response."""
        return classify_reply(
            response,
            problem,
            self.method,
            self.has_key,
            self.policy,
            self.driver.classifier,
            self.driver.clock.time(),
        )

    def time_left(self, started: float, limit: float) -> Callable[[], float]:
        """Seconds left, when called, of the attempt that started at ``started`` (monotonic
        seconds) with a limit of ``limit`` seconds."""
        clock = self.driver.clock
        return lambda: limit - (clock.monotonic() - started)

    # -- deciding ---------------------------------------------------------------------------

    def decide(self, outcome: Attempt, sends_before: int) -> Step:
        """What follows an attempt: return, give up, or retry after a planned sleep."""
        sent = self.active.sends - sends_before
        response = outcome.response
        done = response is not None and outcome.verdict == DONE
        if not done and sent > 1:
            outcome.stop = nested_retry_layer(self.active.sends)
        if outcome.stop is not None:
            self.state.attempts = max(self.state.attempts, int(outcome.stop.fields.get("requests", 0)))
            last = self.active.last_status if response is None else response.status_code
            return Step(
                close=response,
                error=self.give_up(outcome.stop, last, outcome.problem, outcome.error),
                cause=outcome.error,
            )
        if response is not None and outcome.verdict == DONE:
            if response.status_code < 500:
                self.state.on_success(self.driver.budget)
            return Step(response=response)
        if response is None and outcome.verdict == OUTCOME_UNKNOWN:
            stop = Stop("outcome_unknown", _OUTCOME_UNKNOWN_TEXT)
            return Step(error=self.give_up(stop, cause=outcome.error), cause=outcome.error)
        if not isinstance(outcome.verdict, Retry):
            stop = Stop("not_retryable", _NOT_RETRYABLE_TEXT)
            return Step(error=self.give_up(stop, cause=outcome.error), cause=outcome.error)
        reason = outcome.verdict.reason
        last_status = None if response is None else response.status_code
        if not self.replayable:
            stop = Stop("body_not_replayable", _NOT_REPLAYABLE_TEXT)
            err = self.give_up(stop, last_status, outcome.problem, outcome.error)
            return Step(close=response, error=err, cause=outcome.error)
        driver = self.driver
        if reason.kind == "in_flight":
            self.active.allow_in_flight()
        try:
            plan = self.state.plan_retry(
                self.policy, driver.budget, reason, outcome.hint, driver.clock.monotonic(), driver.rng
            )
        except Stop as stop:
            err = self.give_up(stop, last_status, outcome.problem, outcome.error)
            return Step(close=response, error=err, cause=outcome.error)
        driver.metrics.bump("retries")
        if plan.source == RETRY_AFTER:
            driver.metrics.bump("retry_after_waits")
        error_text = None if outcome.error is None else f"{type(outcome.error).__name__}: {outcome.error}"
        logger.info(
            "oncely: retrying %s %s: attempt %d of %d failed (%s), waiting %.3f s (%s), "
            "Idempotency-Key %s",
            self.method,
            self.path,
            self.state.attempts,
            self.policy.max_attempts,
            reason if error_text is None else f"{reason}: {error_text}",
            plan.wait,
            plan.source,
            self.key,
            extra={
                "oncely_attempt": self.state.attempts,
                "oncely_next_attempt": self.state.attempts + 1,
                "oncely_reason": str(reason),
                "oncely_status": last_status,
                "oncely_error": error_text,
                "oncely_method": self.method,
                "oncely_path": self.path,
                "oncely_wait": plan.wait,
                "oncely_wait_source": plan.source,
                "oncely_backoff": plan.backoff,
                "oncely_retry_after": plan.hint,
                "oncely_tokens_left": plan.tokens_left,
                "oncely_retry_cost": plan.cost,
                "oncely_idempotency_key": self.key,
            },
        )
        return Step(close=response, plan=plan)

    # -- the end ----------------------------------------------------------------------------

    def end(self) -> None:
        """Ends the call: the request's own timeouts come back (a redirect, and the reads of
        the returned response's body, use the client's timeouts), the marker goes."""
        ext = self.request.extensions
        if self.original_timeout is None:
            ext.pop("timeout", None)
        else:
            ext["timeout"] = self.original_timeout
        if ext.get(ACTIVE_EXTENSION) is self.active:
            del ext[ACTIVE_EXTENSION]

    def refund(self, plan: RetryPlan) -> None:
        """Gives a retry's tokens back: the call stopped during its sleep and never used it."""
        budget = self.driver.budget
        if budget is not None and plan.cost:
            budget.deposit(plan.cost)
            logger.debug(
                "oncely: call cancelled while waiting; %d tokens refunded", plan.cost,
                extra={"oncely_idempotency_key": self.key},
            )
